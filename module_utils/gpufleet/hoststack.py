"""Host stack decisions: NVIDIA repositories, driver packages and versions, per distribution.

Plain data in, plain data out, no Ansible. Used by library/nvidia_driver_plan.py and
library/nvidia_repo_info.py (roles nvidia_driver, cuda_toolkit, container_toolkit).
Driver-branch tables live in gpufleet.cuda, architecture facts in gpufleet.arch; both
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
"""
import re

# Relative imports work both as gpufleet.hoststack (tests) and as
# ansible.module_utils.gpufleet.hoststack (modules; Ansible ships the siblings too).
from .arch import ArchError, architecture_facts
from .cuda import DRIVER_BRANCHES, branch_supports_architecture, parse_driver_version

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
    "timeout": {"type": "int", "default": 15},
}


def _distro(distribution, distribution_version):
    version = str(distribution_version)
    key = (distribution, version if distribution == "Ubuntu" else version.split(".")[0])
    if key not in CUDA_REPO_DISTROS:
        supported = ", ".join(f"{d} {v}" for d, v in CUDA_REPO_DISTROS)
        raise HostStackError(
            f"{distribution} {distribution_version} is not supported by gpufleet's host stack "
            f"(supported: {supported}); use a supported release or add it to "
            "module_utils/gpufleet/hoststack.py CUDA_REPO_DISTROS")
    return CUDA_REPO_DISTROS[key]


def _mirror(url):
    url = str(url or "").strip()
    if url and not re.match(r"^(https?|file)://", url):
        raise HostStackError(f"repository URL {url!r} is not an http(s):// or file:// URL")
    return url.rstrip("/") + "/" if url else ""


def _arch(table, architecture):
    if architecture not in table:
        raise HostStackError(f"architecture {architecture!r} has no NVIDIA repository here "
                             f"(supported: {', '.join(table)})")
    return table[architecture]


def cuda_repo(distribution, distribution_version, architecture, mirror_url=""):
    """NVIDIA's CUDA repository (driver and toolkit packages) for this host, or the mirror.

    Returns {"name", "manager", "url", "key_url", "probe_url"}; probe_url is the file
    whose download proves the repository answers (apt: Release, dnf: repomd.xml).
    """
    name, manager = _distro(distribution, distribution_version)
    url = _mirror(mirror_url) or f"{CUDA_REPO_BASE}/{name}/{_arch(CUDA_REPO_ARCH, architecture)}/"
    return {
        "name": name,
        "manager": manager,
        "url": url,
        "key_url": url + CUDA_REPO_KEYS[manager],
        "probe_url": url + ("Release" if manager == "apt" else "repodata/repomd.xml"),
    }


def container_toolkit_repo(distribution, distribution_version, architecture, mirror_url=""):
    """NVIDIA's libnvidia-container repository for this host, or the mirror."""
    _, manager = _distro(distribution, distribution_version)
    if manager == "apt":
        default = f"{CTK_REPO_BASE}/deb/{_arch(CTK_DEB_ARCH, architecture)}/"
    else:
        _arch(CTK_DEB_ARCH, architecture)
        default = f"{CTK_REPO_BASE}/rpm/{architecture}/"
    url = _mirror(mirror_url) or default
    return {
        "name": "libnvidia-container",
        "manager": manager,
        "url": url,
        "key_url": url + "gpgkey" if mirror_url else CTK_KEY_URL,
        "probe_url": url + ("Release" if manager == "apt" else "repodata/repomd.xml"),
    }


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
    epoch, _, rest = str(version).rpartition(":")
    return (int(epoch or 0), [int(p) for p in re.findall(r"\d+", rest)])


def upstream_version(version):
    """'1:580.95.05-1' -> '580.95.05'."""
    return str(version).rpartition(":")[2].split("-")[0]


# ---------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------

def parse_branch(branch):
    """'580' or 580 -> 580; ValueError naming the known branches otherwise."""
    text = str(branch).strip()
    if not text.isdigit() or int(text) not in DRIVER_BRANCHES:
        raise HostStackError(
            f"driver branch {branch!r} is not a known NVIDIA driver branch; known branches: "
            f"{', '.join(str(b) for b in sorted(DRIVER_BRANCHES))}. Set nvidia_driver_branch "
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
            f"nvidia_driver_branch to {requested.split('.')[0]} or pick a {branch}.x version")
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


def _installed_version(installed, name):
    entries = (installed or {}).get(name) or []
    if not entries:
        return None
    entry = entries[0]
    return entry.get("version") if isinstance(entry, dict) else str(entry)


_DRIVER_META_RE = re.compile(
    r"^(nvidia-open|cuda-drivers|nvidia-fabricmanager|nvidia-driver-pinning)(-\d+)?$")


def plan_driver(manager, branch, version, upgrade, flavor, fabricmanager, installed, available,
                distribution="Debian"):
    """What the driver role does: packages with versions, packages to remove, holds.

    installed: ansible_facts.packages (name -> [{"version": ...}]). available: the
    repository's {name: [versions]} (apt) or None (dnf). Returns a dict described in
    library/nvidia_driver_plan.py RETURN.
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
