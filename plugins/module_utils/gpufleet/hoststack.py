"""Host stack decisions: NVIDIA repositories, driver packages and versions, per distribution.

Plain data in, plain data out, no Ansible. Used by plugins/modules/nvidia_driver_plan.py and
plugins/modules/nvidia_repo_info.py (roles nvidia_driver, cuda_toolkit, container_toolkit).
Driver-branch tables live in gpufleet.cuda_versions, architecture facts in gpufleet.arch; both
are imported, not copied.

Sources:
- CUDA network repository layout and keys: NVIDIA CUDA Installation Guide for Linux,
  "Network Repo Installation" (https://developer.download.nvidia.com/compute/cuda/repos/
  <distro>/<arch>/, distro ubuntu2204, ubuntu2404, debian12, rhel9; arch x86_64 or sbsa;
  apt key 3bf863cc.pub, dnf key D42D0685.pub; apt repos are flat: `deb URL /`).
- Driver packages: NVIDIA Driver Installation Guide. Up to R580 the CUDA repository
  carries per-branch metas, `nvidia-open-<branch>` (open kernel modules) and
  `cuda-drivers-<branch>` (proprietary); from R590 a branch is chosen with
  `nvidia-driver-pinning-<branch>` and the unversioned `nvidia-open` / `cuda-drivers`.
  Debian-family metas pull `nvidia-driver`, `nvidia-kernel-open-dkms` or
  `nvidia-kernel-dkms`; `nvidia-fabricmanager-<branch>` is fabric manager.
  RHEL 9 uses DNF module streams `nvidia-driver:<branch>-open` / `<branch>-dkms` with
  `kmod-nvidia-open-dkms` / `kmod-nvidia-latest-dkms` and `nvidia-fabric-manager`.
- Open kernel modules: Turing (7.5) and newer only; Blackwell requires them (NVIDIA
  driver README, "Using the Open GPU Kernel Modules"; Blackwell data-center guide).
- Container toolkit repository: NVIDIA Container Toolkit install guide
  (https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /, rpm/$basearch,
  key https://nvidia.github.io/libnvidia-container/gpgkey).
- Signing-key fingerprints (NVIDIA_KEY_FINGERPRINTS): see the comments there.
"""
import re
import tempfile

# Relative imports work both as gpufleet.hoststack (tests) and as
# ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.hoststack (modules;
# Ansible ships the siblings too).
from . import bounded
from .arch import ArchError, architecture_facts
from .cuda_versions import DRIVER_BRANCHES, branch_supports_architecture, parse_driver_version

CUDA_REPO_BASE = "https://developer.download.nvidia.com/compute/cuda/repos"
CTK_REPO_BASE = "https://nvidia.github.io/libnvidia-container/stable"
CTK_KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"

# (ansible_distribution, major version) -> CUDA repository name and package manager.
CUDA_REPO_DISTROS = {
    ("Ubuntu", "22.04"): ("ubuntu2204", "apt"),
    ("Ubuntu", "24.04"): ("ubuntu2404", "apt"),
    ("Debian", "12"): ("debian12", "apt"),
    ("RedHat", "9"): ("rhel9", "dnf"),
    ("Rocky", "9"): ("rhel9", "dnf"),
    ("AlmaLinux", "9"): ("rhel9", "dnf"),
}
CUDA_REPO_KEYS = {"apt": "3bf863cc.pub", "dnf": "D42D0685.pub"}

# Primary-key fingerprints of NVIDIA's repository signing keys: a downloaded key is used
# only when its fingerprint is this one (or the one the user pins for a mirror's own key).
NVIDIA_KEY_FINGERPRINTS = {
    # 3bf863cc.pub, "cudatools <cudatools@nvidia.com>", signs the Debian/Ubuntu CUDA
    # repositories: NVIDIA/cuda-repo-management SIGNATURES.md ("Debian repo method 1":
    # "Primary key fingerprint: EB69 3B30 35CD 5710 E231 E123 A4B4 6996 3BF8 63CC").
    ("cuda", "apt"): "EB693B3035CD5710E231E123A4B469963BF863CC",
    # D42D0685.pub, signs the RHEL CUDA repositories and RPMs: the same file ("RPM repo
    # method 1": "Primary key fingerprint: 610C 7B14 E068 A878 070D A4E9 9CD0 A493 D42D 0685").
    ("cuda", "dnf"): "610C7B14E068A878070DA4E99CD0A493D42D0685",
    # https://nvidia.github.io/libnvidia-container/gpgkey, "NVIDIA CORPORATION (Open Source
    # Projects) <cudatools@nvidia.com>", signs the deb and rpm repositories: pinned by that
    # fingerprint in GoogleCloudDataproc/initialization-actions gpu/install_gpu_driver.sh
    # (gpg --recv-keys 0xc95b321b61e88c1809c4f759ddcae044f796ecb0) and as the apt::key id of
    # the libnvidia-container source in public Puppet manifests.
    ("container_toolkit", "apt"): "C95B321B61E88C1809C4F759DDCAE044F796ECB0",
    ("container_toolkit", "dnf"): "C95B321B61E88C1809C4F759DDCAE044F796ECB0",
}
CUDA_REPO_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}
CTK_DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}

FIRST_PINNING_BRANCH = 590  # from R590 on: nvidia-driver-pinning-<branch> + unversioned metas
KERNEL_MODULES = ("auto", "open", "proprietary")


class HostStackError(ValueError):
    """A host-stack input is wrong; the message says what to do."""


# ---------------------------------------------------------------------------------------
# Repositories
# ---------------------------------------------------------------------------------------

# Module options that locate NVIDIA's repository for a host (nvidia_repo_info,
# nvidia_driver_plan); documented once in plugins/doc_fragments/gpufleet.py.
REPOSITORY_ARGUMENT_SPEC = {
    "distribution": {"type": "str", "required": True},
    "distribution_version": {"type": "str", "required": True},
    "architecture": {"type": "str", "required": True},
    "repo_url": {"type": "str", "default": ""},
    "trusted": {"type": "bool", "default": False},
    # an address and a public fingerprint, not secrets (said for ansible-test's no-log-needed)
    "key_url": {"type": "str", "default": "", "no_log": False},
    "key_fingerprint": {"type": "str", "default": "", "no_log": False},
    "timeout": {"type": "int", "default": 15},
}


def _distro(distribution, distribution_version):
    version = str(distribution_version)
    key = (distribution, version if distribution == "Ubuntu" else version.split(".", maxsplit=1)[0])
    if key not in CUDA_REPO_DISTROS:
        supported = ", ".join(f"{d} {v}" for d, v in CUDA_REPO_DISTROS)
        raise HostStackError(
            f"{distribution} {distribution_version} is not supported by gpufleet's host stack "
            f"(supported: {supported}); use a supported release or add it to "
            "plugins/module_utils/gpufleet/hoststack.py CUDA_REPO_DISTROS")
    return CUDA_REPO_DISTROS[key]


# What a repository URL may hold: RFC 3986 unreserved and sub-delims, ":", "@", "/" and
# percent-escapes. Not whitespace or control characters (a newline or a space would add
# lines or fields to the apt source / yum .repo file the URL is written into), not "#"
# or "?" (a comment or query has no meaning for a repository), not quotes, "<>", "[]"
# (apt's option brackets), "\\", "^", "`", "{}", "|". "$" stays: dnf expands $basearch.
_URL_RE = re.compile(r"^(?:https?://(?:[A-Za-z0-9\-._~%!$&'()*+,;=:]*@)?[A-Za-z0-9.\-]+(?::[0-9]+)?|file://)(/[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*)?$")


def repository_url(url, setting="the repository URL variable"):
    """The one check of a repository (or key) URL a user sets: "" or a clean URL.

    Returns the URL unchanged ("" stays ""); raises HostStackError naming `setting` and
    the offending character for anything that is not an http(s)://HOST/... or
    file:///PATH URL made of URL characters only.
    """
    text = "" if url is None else str(url)
    if not text:
        return ""
    bad = next((c for c in text if c.isspace() or ord(c) < 0x20 or ord(c) >= 0x7F), None)
    odd = sorted({c for c in text if not re.match(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/%]", c)})
    if bad is not None:
        what = f"the character {bad!r}, which is not part of a URL"
    elif not re.match(r"^(https?|file)://", text):
        what = "no http://, https:// or file:// scheme"
    elif odd:
        what = f"the character(s) {' '.join(odd)}, which a repository URL may not contain"
    elif re.search(r"%(?![0-9A-Fa-f]{2})", text):
        what = "a '%' that is not a %XX escape"
    elif not _URL_RE.match(text) or text.startswith("file://") and not text.startswith("file:///"):
        what = "no host (http(s)://HOST/...) or no absolute path (file:///PATH)"
    else:
        return text
    raise HostStackError(
        f"{setting} {text!r} is not a usable repository URL: it has {what}. Nothing was "
        "changed. Set it to an http://, https:// or file:/// URL of the mirror (no spaces, "
        "newlines, quotes, brackets, '#' or '?')")


def _mirror(url, setting="the repository URL variable"):
    url = repository_url(url, setting)
    return url.rstrip("/") + "/" if url else ""


def key_fingerprint(value, setting="the key fingerprint variable"):
    """'eb69 3b30 ... 63cc' -> 'EB693B30...63CC'; "" stays "" (NVIDIA's published key).

    A fingerprint is the full 40 (v4) or 64 (v6) hex digits of the primary key, never a
    short key id, which anyone can forge.
    """
    text = re.sub(r"\s+", "", str(value or "")).upper()
    if text.startswith("0X"):
        text = text[2:]
    if text and not re.fullmatch(r"[0-9A-F]{40}|[0-9A-F]{64}", text):
        raise HostStackError(
            f"{setting} {value!r} is not a key fingerprint: give the 40 hex digits of the "
            "primary key (gpg --show-keys --with-colons KEYFILE, the fpr line after pub), "
            "not a short key id")
    return text


def _arch(table, architecture):
    if architecture not in table:
        raise HostStackError(f"architecture {architecture!r} has no NVIDIA repository here "
                             f"(supported: {', '.join(table)})")
    return table[architecture]


def _key(repo, component, key_url, fingerprint, setting):
    prefix = setting[:-len("_url")] if setting.endswith("_url") else setting
    repo["key_url"] = repository_url(key_url, f"{prefix}_key_url") or repo["key_url"]
    repo["key_fingerprint"] = (key_fingerprint(fingerprint, f"{prefix}_key_fingerprint")
                               or NVIDIA_KEY_FINGERPRINTS[(component, repo["manager"])])
    return repo


def cuda_repo(distribution, distribution_version, architecture, mirror_url="",
              setting="nvidia_driver_repo_url", key_url="", fingerprint=""):
    """NVIDIA's CUDA repository (driver and toolkit packages) for this host, or the mirror.

    Returns {"name", "manager", "url", "key_url", "key_fingerprint", "probe_url"};
    probe_url is the file whose download proves the repository answers (apt: Release,
    dnf: repomd.xml). The key comes from the repository (NVIDIA's or the mirror's copy)
    unless `key_url` says where; it is used only with the fingerprint `fingerprint`
    (default: NVIDIA's published one). `setting` is the URL variable named in errors.
    """
    name, manager = _distro(distribution, distribution_version)
    url = (_mirror(mirror_url, setting)
           or f"{CUDA_REPO_BASE}/{name}/{_arch(CUDA_REPO_ARCH, architecture)}/")
    repo = {
        "name": name,
        "manager": manager,
        "url": url,
        "key_url": url + CUDA_REPO_KEYS[manager],
        "probe_url": url + ("Release" if manager == "apt" else "repodata/repomd.xml"),
    }
    return _key(repo, "cuda", key_url, fingerprint, setting)


def container_toolkit_repo(distribution, distribution_version, architecture, mirror_url="",
                           setting="container_toolkit_repo_url", key_url="", fingerprint=""):
    """NVIDIA's libnvidia-container repository for this host, or the mirror (as cuda_repo)."""
    _family, manager = _distro(distribution, distribution_version)
    if manager == "apt":
        default = f"{CTK_REPO_BASE}/deb/{_arch(CTK_DEB_ARCH, architecture)}/"
    else:
        _arch(CTK_DEB_ARCH, architecture)
        default = f"{CTK_REPO_BASE}/rpm/{architecture}/"
    mirror = _mirror(mirror_url, setting)
    url = mirror or default
    repo = {
        "name": "libnvidia-container",
        "manager": manager,
        "url": url,
        "key_url": url + "gpgkey" if mirror else CTK_KEY_URL,
        "probe_url": url + ("Release" if manager == "apt" else "repodata/repomd.xml"),
    }
    return _key(repo, "container_toolkit", key_url, fingerprint, setting)


REPOSITORIES = {"cuda": cuda_repo, "container_toolkit": container_toolkit_repo}


# One file read from a repository: the Packages index (NVIDIA's CUDA index, every driver
# and toolkit package of a distribution, is a few MiB), repomd.xml or the signing key (a
# few KiB). More than this is not a repository's file.
REPOSITORY_MAX_BYTES = 64 << 20


def repository_fetch(opener, timeout):
    """fetch(url) -> bytes for repository() (nvidia_repo_info, nvidia_driver_plan):
    `opener` (Ansible's open_url) reads one file within `timeout` seconds in all
    (connecting, waiting and reading, however slowly the server sends) and at most
    REPOSITORY_MAX_BYTES; past either it raises bounded.BoundError, which
    read_repository and verify_key report with the variable to fix."""
    def fetch(url):
        # read_repository and verify_key name the URL and quote this message in
        # parentheses: "the server", and no final period
        return bounded.open_capped(
            opener, url, REPOSITORY_MAX_BYTES, timeout, what="the server",
            advice="NVIDIA's Packages index is a few MiB and its key a few KiB, sent at "
                   "once: check that the URL is the repository or a mirror of it; over a "
                   "slow link, raise the module's timeout")
    return fetch


def repository(component, params, setting, fetch, show_keys):
    """What nvidia_repo_info and nvidia_driver_plan do with REPOSITORY_ARGUMENT_SPEC's
    parameters, in one place: check every URL and the fingerprint, resolve the
    repository, read it (read_repository) and, unless `trusted`, download and verify its
    signing key (verify_key). fetch(url) -> bytes. Returns (repo, index); repo["key"] is
    the verified armored key, or None for a trusted (unsigned) repository.
    """
    repo = REPOSITORIES[component](
        params["distribution"], params["distribution_version"], params["architecture"],
        params.get("repo_url") or "", setting, params.get("key_url") or "",
        params.get("key_fingerprint") or "")
    index = read_repository(repo, lambda url: fetch(url).decode("utf-8", "replace"), setting)
    repo["key"] = None if params.get("trusted") else verify_key(repo, fetch, show_keys, setting)
    return repo, index


def gpg_show_keys(run, gpg, data):
    """`gpg --show-keys --with-colons` on key bytes, in a throw-away GnuPG home (no keyring
    of the host is read or written). run(argv, data) -> (rc, stdout, stderr)."""
    if not gpg:
        raise HostStackError(
            "gpg is not installed on the host, so the repository's signing key cannot be "
            "checked. Nothing was changed. Install the gpg package (apt-get install gpg / "
            "dnf install gnupg2) and run again")
    with tempfile.TemporaryDirectory(prefix="gpufleet-gpg-") as home:
        rc, out, err = run([gpg, "--homedir", home, "--batch", "--no-tty", "--with-colons",
                            "--show-keys"], data)
    return out if rc == 0 else ""


def primary_fingerprints(colons):
    """Fingerprints of the primary keys in `gpg --show-keys --with-colons` output.

    Each primary key is a `pub` record followed by its `fpr` record (field 10); `sub`
    keys' fingerprints are not primary keys and are skipped.
    """
    found, last = [], None
    for line in str(colons).splitlines():
        fields = line.split(":")
        if fields[0] in ("pub", "sub", "sec", "ssb"):
            last = fields[0]
        elif fields[0] == "fpr" and last in ("pub", "sec") and len(fields) > 9:
            found.append(fields[9].upper())
            last = None
    return found


def verify_key(repo, fetch, show_keys, setting="the repository URL variable"):
    """Download the repository's signing key and accept it only with the pinned fingerprint.

    fetch(url) -> bytes (raises when unreachable); show_keys(bytes) -> the output of
    `gpg --show-keys --with-colons` on them. The file must hold exactly one primary key,
    the expected one: a second key would be trusted by apt too. Returns the key as
    ASCII-armored text (what deb822's Signed-By embeds). Raises HostStackError naming
    the expected and the found fingerprints, before anything is changed.
    """
    prefix = setting[:-len("_url")] if setting.endswith("_url") else setting
    expected = repo["key_fingerprint"]
    try:
        data = fetch(repo["key_url"])
    except Exception as exc:  # noqa: BLE001 (every failure means: no key)
        raise HostStackError(
            f"the signing key {repo['key_url']} cannot be downloaded ({exc}). Nothing was "
            f"changed. Check the host reaches it, or set {prefix}_key_url to where your "
            f"mirror publishes the key (or {prefix}_trusted: true for an unsigned mirror)") from exc
    found = primary_fingerprints(show_keys(data))
    if found != [expected]:
        raise HostStackError(
            f"the signing key {repo['key_url']} has the fingerprint(s) "
            f"{', '.join(found) or 'none (not an OpenPGP key)'}, expected exactly "
            f"{expected}. Nothing was changed. If the repository is your mirror signed with "
            f"its own key, set {prefix}_key_fingerprint to that key's fingerprint (and "
            f"{prefix}_key_url to where it is published); otherwise the key or the mirror "
            "is not NVIDIA's: do not use it")
    text = data.decode("ascii", "replace") if isinstance(data, bytes) else str(data)
    if "-----BEGIN PGP PUBLIC KEY BLOCK-----" not in text:
        raise HostStackError(
            f"the signing key {repo['key_url']} ({expected}) is binary; publish it "
            f"ASCII-armored (gpg --armor --export {expected}). Nothing was changed")
    return text.strip() + "\n"


def parse_packages_index(text):
    """Debian `Packages` index -> {package name: [versions]} (each version once)."""
    found = {}
    name = None
    for line in text.splitlines():
        if line.startswith("Package:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Version:") and name:
            versions = found.setdefault(name, [])
            version = line.split(":", 1)[1].strip()
            if version not in versions:
                versions.append(version)
        elif not line.strip():
            name = None
    return found


def version_key(version):
    """Sort key for Debian/RPM package versions of NVIDIA's packages ("580.95.05-1").

    NVIDIA's versions are dotted numbers with a numeric revision, so comparing the
    numeric fields is what dpkg and rpm do for them; an epoch ("1:") counts first.
    """
    epoch, _colon, rest = str(version).rpartition(":")
    return (int(epoch or 0), [int(p) for p in re.findall(r"\d+", rest)])


def upstream_version(version):
    """'1:580.95.05-1' -> '580.95.05'."""
    return str(version).rpartition(":")[2].split("-")[0]


# ---------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------

# The branches the driver role installs: those of CUDA 11 and later. The older rows of
# cuda_versions.DRIVER_BRANCHES give verdicts for hosts that still run them, not install targets.
INSTALLABLE_BRANCHES = tuple(b for b in sorted(DRIVER_BRANCHES) if b >= 450)


def parse_branch(branch):
    """'580' or 580 -> 580; ValueError naming the installable branches otherwise."""
    text = str(branch).strip()
    if not text.isdigit() or int(text) not in INSTALLABLE_BRANCHES:
        raise HostStackError(
            f"driver branch {branch!r} is not a known NVIDIA driver branch; known branches: "
            f"{', '.join(str(b) for b in INSTALLABLE_BRANCHES)}. Set nvidia_driver_branch "
            "to one of them (580 is the current long-term branch)")
    return int(text)


def kernel_module_flavor(branch, devices, requested="auto"):
    """Open or proprietary kernel modules for these GPUs on this branch.

    `devices` is ansible_facts.gpu.devices (each with compute_capability). Refuses a
    branch that dropped one of the GPUs, open modules for pre-Turing GPUs, proprietary
    modules for Blackwell, and a host that mixes both.
    """
    branch = parse_branch(branch)
    if requested not in KERNEL_MODULES:
        raise HostStackError(f"kernel module flavour {requested!r} is not one of "
                             f"{', '.join(KERNEL_MODULES)}")
    ccs = [d.get("compute_capability") for d in devices or []]
    if not ccs:
        if requested == "auto":
            raise HostStackError(
                "no NVIDIA GPU was found (PCI bus and nvidia-smi), so open or proprietary "
                "kernel modules cannot be chosen: check the host has a GPU, or set "
                "nvidia_driver_kernel_module to open or proprietary")
        return requested
    if any(cc is None for cc in ccs):
        raise HostStackError(
            "a GPU's compute capability is unknown (product not in gpufleet's tables), so "
            "the kernel module flavour cannot be chosen: set nvidia_driver_kernel_module to "
            "open (Turing and newer) or proprietary (Maxwell, Pascal, Volta)")
    try:
        facts = [architecture_facts(cc) for cc in ccs]
    except ArchError as exc:
        raise HostStackError(f"GPU facts: {exc}") from None
    dropped = sorted({cc for cc in ccs if not branch_supports_architecture(branch, cc)})
    if dropped:
        raise HostStackError(
            f"driver branch {branch} no longer supports the GPU(s) with compute capability "
            f"{', '.join(dropped)} (R580 is the last branch for Maxwell, Pascal and Volta; "
            "R470 for Kepler): set nvidia_driver_branch to 580 or older for this host")
    # gpufleet.arch: open modules unsupported before Turing, required on Blackwell.
    old = [cc for cc, f in zip(ccs, facts) if f["open_kernel_modules"] == "unsupported"]
    blackwell = [cc for cc, f in zip(ccs, facts) if f["open_kernel_modules"] == "required"]
    if old and blackwell:
        raise HostStackError(
            f"this host mixes pre-Turing GPUs ({', '.join(old)}: proprietary modules only) "
            f"with Blackwell GPUs ({', '.join(blackwell)}: open modules only); no driver "
            "flavour drives both: move one of them to another host")
    supported = not old
    if requested == "auto":
        return "open" if supported else "proprietary"
    if requested == "open" and not supported:
        raise HostStackError(
            f"open kernel modules do not support GPU(s) with compute capability "
            f"{', '.join(old)} (Turing 7.5 and newer only): set nvidia_driver_kernel_module "
            "to proprietary or auto")
    if requested == "proprietary" and blackwell:
        raise HostStackError(
            f"Blackwell GPUs ({', '.join(blackwell)}) need the open kernel modules: set "
            "nvidia_driver_kernel_module to open or auto")
    return requested


NVIDIA_PCI_VENDOR = 0x10DE
NVSWITCH_PCI_CLASS = 0x0680  # "bridge, other": how NVSwitch chips enumerate (lspci -d 10de: shows "Bridge")


def nvswitch_count(pci_devices):
    """Number of NVSwitch chips among (vendor, class) pairs read from sysfs.

    `class` is the 24-bit value of /sys/bus/pci/devices/*/class (0x068000); only its
    upper 16 bits name the class. Fabric manager is needed exactly when this is > 0.
    """
    return sum(1 for vendor, cls in pci_devices
               if vendor == NVIDIA_PCI_VENDOR and (cls >> 8) == NVSWITCH_PCI_CLASS)


def wants_fabricmanager(setting, nvswitches):
    """auto: install fabric manager when NVSwitches are present; enabled/disabled force it."""
    if setting not in ("auto", "enabled", "disabled"):
        raise HostStackError(f"fabric manager setting {setting!r} must be auto, enabled or disabled")
    return setting == "enabled" or (setting == "auto" and nvswitches > 0)


def driver_packages(manager, branch, flavor, fabricmanager=False, distribution="Debian"):
    """Package names for a driver branch: what to install and what to hold.

    Returns {"meta", "install": [names], "hold": [names], "stream"}: `install` gets the
    target version appended by the caller (apt), `hold` are the names apt-mark hold /
    dnf versionlock keep still, `stream` the DNF module stream (dnf only).
    """
    branch = parse_branch(branch)
    if flavor not in ("open", "proprietary"):
        raise HostStackError(f"kernel module flavour {flavor!r} must be open or proprietary")
    pinned = branch >= FIRST_PINNING_BRANCH
    if manager == "apt":
        if pinned:
            meta = "nvidia-open" if flavor == "open" else "cuda-drivers"
        else:
            meta = f"nvidia-open-{branch}" if flavor == "open" else f"cuda-drivers-{branch}"
        install = ([f"nvidia-driver-pinning-{branch}"] if pinned else []) + [meta]
        if distribution == "Ubuntu":
            # Ubuntu's CUDA repository uses Ubuntu's per-branch names
            # (nvidia-open-580 -> nvidia-driver-580-open -> nvidia-dkms-580-open, ...).
            suffix = "-open" if flavor == "open" else ""
            hold = [meta, f"nvidia-driver-{branch}{suffix}", f"nvidia-dkms-{branch}{suffix}",
                    f"nvidia-kernel-common-{branch}", f"nvidia-utils-{branch}",
                    f"nvidia-compute-utils-{branch}", f"libnvidia-compute-{branch}"]
        else:
            kmod = "nvidia-kernel-open-dkms" if flavor == "open" else "nvidia-kernel-dkms"
            hold = [meta, "nvidia-driver", "nvidia-driver-cuda", kmod, "nvidia-persistenced"]
        if fabricmanager:
            install.append(f"nvidia-fabricmanager-{branch}")
            hold.append(f"nvidia-fabricmanager-{branch}")
        return {"meta": meta, "install": install, "hold": hold, "stream": None}
    if manager == "dnf":
        stream = f"{branch}-open" if flavor == "open" else f"{branch}-dkms"
        kmod = "kmod-nvidia-open-dkms" if flavor == "open" else "kmod-nvidia-latest-dkms"
        meta = "nvidia-open" if flavor == "open" else "cuda-drivers"
        install = [f"@nvidia-driver:{stream}"]
        hold = ["nvidia-driver", "nvidia-driver-cuda", "nvidia-driver-libs", kmod,
                "nvidia-persistenced"]
        if fabricmanager:
            install.append("nvidia-fabric-manager")
            hold.append("nvidia-fabric-manager")
        return {"meta": meta, "install": install, "hold": hold, "stream": stream}
    raise HostStackError(f"package manager {manager!r} is not apt or dnf")


def resolve_driver_version(branch, requested, installed, available, upgrade=False):
    """The package version to install for the meta of `branch`.

    requested: "" (keep what is installed, else the newest available) or an upstream
    version of that branch ("580.65.06"). installed: the meta's installed package
    version or None. available: package versions in the repository (None: unknown, as
    for dnf, where the package manager decides). upgrade: move to the newest available.
    Never returns a newer version than installed unless `requested` or `upgrade` says so.
    """
    branch = parse_branch(branch)
    requested = str(requested or "").strip()
    if requested:
        try:
            parse_driver_version(requested)
        except ValueError:
            raise HostStackError(
                f"nvidia_driver_version {requested!r} is not a driver version like "
                f"{branch}.95.05 (MAJOR.MINOR[.PATCH], as nvidia-smi prints it): set it to a "
                f"version of branch {branch}, or leave it empty for the newest") from None
    if requested and not requested.startswith(f"{branch}."):
        raise HostStackError(
            f"nvidia_driver_version {requested} is not in branch {branch}: set "
            f"nvidia_driver_branch to {requested.split('.', maxsplit=1)[0]} or pick a {branch}.x version")
    if available is None:
        return installed if (installed and not requested and not upgrade) else None
    ordered = sorted(available, key=version_key)
    if not ordered:
        raise HostStackError(
            f"the repository carries no package of driver branch {branch}: check that the "
            "mirror (nvidia_driver_repo_url) holds this branch for this distribution, or "
            "choose a branch it has")
    if requested:
        matches = [v for v in ordered if upstream_version(v) == requested]
        if not matches:
            raise HostStackError(
                f"driver {requested} is not in the repository; branch {branch} versions "
                f"there: {', '.join(upstream_version(v) for v in ordered)}. Set "
                "nvidia_driver_version to one of them, or empty for the newest")
        return matches[-1]
    if installed and not upgrade:
        return installed
    return ordered[-1]


def _installed_versions(installed, name):
    """Every installed version of `name` in ansible_facts.packages (name -> entries, each a
    dict with "version" or a plain version string), in the facts' order."""
    return [e.get("version") if isinstance(e, dict) else str(e)
            for e in (installed or {}).get(name) or []]


def _installed_version(installed, name):
    versions = _installed_versions(installed, name)
    return versions[0] if versions else None


def missing_packages(installed, wanted):
    """The entries of `wanted` that `installed` does not satisfy, in their order.

    installed: ansible_facts.packages (name -> [{"version": ...}]). wanted: apt names as
    the roles give them to ansible.builtin.apt, "name" (any version) or "name=version"
    (exactly that version, epoch included as apt writes it). An empty answer means an
    apt install of `wanted` with state present would change nothing, so a role may skip
    it; a removed package or another version installed is in the answer (drift).
    """
    missing = []
    for entry in wanted or []:
        name, sep, version = str(entry).partition("=")
        versions = _installed_versions(installed, name)
        if not versions or (sep and version not in versions):
            missing.append(entry)
    return missing


def packages_to_hold(dpkg_query_lines, names):
    """The names of `names` that are installed but not held, in their order.

    dpkg_query_lines: the output lines of `dpkg-query --show --showformat='${Package}
    ${db:Status-Want} ${db:Status-Status}\n' NAME...` (one line per package dpkg knows;
    a name it does not know has no line). A package not installed (no line, or status
    not-installed / config-files) cannot be held, so it is not in the answer; one whose
    selection is already hold is not either. What is left is what dpkg_selections must
    set: a hold removed by hand is in the answer (drift).
    """
    state = {}
    for line in dpkg_query_lines or []:
        fields = line.split()
        if len(fields) == 3:
            state[fields[0]] = (fields[1], fields[2])
    return [n for n in names or []
            if n in state and state[n][1] not in ("not-installed", "config-files")
            and state[n][0] != "hold"]


_DRIVER_META_RE = re.compile(
    r"^(nvidia-open|cuda-drivers|nvidia-fabricmanager|nvidia-driver-pinning)(-\d+)?$")


def plan_driver(manager, branch, version, upgrade, flavor, fabricmanager, installed, available,
                distribution="Debian"):
    """What the driver role does: packages with versions, packages to remove, holds.

    installed: ansible_facts.packages (name -> [{"version": ...}]). available: the
    repository's {name: [versions]} (apt) or None (dnf). Returns a dict described in
    plugins/modules/nvidia_driver_plan.py RETURN.
    """
    pkgs = driver_packages(manager, branch, flavor, fabricmanager, distribution)
    current = _installed_version(installed, pkgs["meta"])
    if current and upstream_version(current).split(".")[0] != str(parse_branch(branch)):
        current = None  # unversioned meta (R590+) of another branch
    meta_available = None if available is None else (available or {}).get(pkgs["meta"], [])
    target = resolve_driver_version(branch, version, current, meta_available, upgrade)
    if manager == "apt":
        install = []
        for name in pkgs["install"]:
            if name.startswith("nvidia-driver-pinning-"):
                install.append(name)
            else:
                install.append(f"{name}={target}")
    else:
        install = list(pkgs["install"])
    wanted = set(pkgs["install"]) | set(pkgs["hold"])
    remove = sorted(name for name in (installed or {})
                    if _DRIVER_META_RE.match(name) and name not in wanted)
    kernel_module_installed = None
    for name in ("nvidia-kernel-open-dkms", "nvidia-kernel-dkms", "kmod-nvidia-open-dkms",
                 "kmod-nvidia-latest-dkms"):
        if _installed_version(installed, name):
            kernel_module_installed = {"package": name, "version": _installed_version(installed, name)}
    changes = bool(remove) or target is None or current != target
    return {
        "meta": pkgs["meta"],
        "flavor": flavor,
        "stream": pkgs["stream"],
        "install": install,
        "remove": remove,
        "hold": pkgs["hold"],
        "version": target,
        "driver_version": upstream_version(target) if target else None,
        "installed_version": current,
        "installed_kernel_module": kernel_module_installed,
        "changes": changes,
    }


def read_repository(repo, fetch, setting="the repository URL variable"):
    """Prove the repository answers and list its packages (apt) before anything changes.

    fetch(url) returns the body as text or raises (any exception: unreachable). Returns
    {name: [versions]} for apt repositories and None for dnf ones (only reachability is
    checked there). `setting` names the variable the user fixes.
    """
    url = repo["url"] + "Packages" if repo["manager"] == "apt" else repo["probe_url"]
    try:
        body = fetch(url)
    except Exception as exc:  # noqa: BLE001 (every failure means: unreachable)
        raise HostStackError(
            f"the package repository {repo['url']} cannot be read ({url}: {exc}). Nothing was "
            f"changed. Check the host reaches it, or set {setting} to a reachable mirror "
            "(air-gapped fleets: a copy of NVIDIA's repository on your network)") from exc
    return parse_packages_index(body) if repo["manager"] == "apt" else None
