"""The image's CUDA forward-compatibility libraries, and whether the container loads them.

Plain data in, plain data out; no Ansible imports.  The libcuda of /usr/local/cuda/compat
in an image (its version from the file name or its .note.cuda.fwd_compatibility ELF
note), the container toolkit version's rule for putting it on the loader path, and the
verdict gpufleet.cuda adds for it.  Sources are cited below.
"""
from __future__ import annotations

import re

from .cuda_versions import (DRIVER_BRANCHES, branch_of, cuda_str, forward_compat_branches,
                            min_driver_for_cuda, parse_cuda_version, parse_driver_version)
from .require_cuda import dsl_compare_version


# ---------------------------------------------------------------------------------------
# What the container really loads: the image's CUDA forward-compatibility libraries
# ---------------------------------------------------------------------------------------
#
# NVIDIA's CUDA base images install the cuda-compat-X-Y package, which puts a libcuda of
# the driver that shipped with CUDA X.Y (libcuda.so.<driver version>) in
# /usr/local/cuda/compat (dist/<cuda>/<os>/base/Dockerfile of
# gitlab.com/nvidia/container-images/cuda: "ENV NV_CUDA_COMPAT_PACKAGE cuda-compat-12-2",
# then `apt-get install cuda-cudart-12-2=... ${NV_CUDA_COMPAT_PACKAGE}`; the package name
# is not pinned to a version, so the image gets the newest build of that package; see
# tests/fixtures/images/nvidia-cuda-12.2.2-runtime.env.json).  vllm/vllm-openai images
# are built FROM nvidia/cuda and carry them too.  "cuda-compat-12-8 is built using the
# 570 driver" (NVIDIA CUDA Compatibility guide, Forward Compatibility,
# https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html), which
# also says forward compatibility applies only to NVIDIA data-center GPUs, select NGC
# Server Ready RTX SKUs and Jetson boards.
#
# Whether the container toolkit puts them on the loader path (sources:
# NVIDIA/nvidia-container-toolkit at d34b3046758cb1a5db606b2a39519c731bbf9f56, its tags,
# and NVIDIA/libnvidia-container src/cli/compat_mode.c at
# 0d289cb51cd2301661da9391150bf21c2e07f440):
#   docker --gpus / device_requests driver "nvidia" (gpu_runtime "nvidia"): the
#   nvidia-container-runtime-hook runs nvidia-container-cli, which globs
#   <cudart_dir>/compat/lib*.so.* in the image (nvc_container.c find_library_paths) and
#     < 1.17.4   mounts every one whose major differs from the host driver's over the
#                host libraries (nvc_mount.c filter_libraries; no setting turns it off);
#     1.17.4-1.17.6  passes --no-cntlibs unless features.allow-cuda-compat-libs-from-
#                container is set (commit f2b3e8d3 "Disable mounting of compat libs from
#                container"): the compat libraries are not used on this path;
#     >= 1.17.7  passes --cuda-compat-mode=<nvidia-container-runtime.modes.legacy.
#                cuda-compat-mode> (default "ldconfig", api/config/v1/runtime.go
#                defaultCUDACompatMode): filter_by_major_version keeps a library whose
#                major is greater than the host driver's (strncmp of the digits, >= 0 is
#                dropped) and its directory goes first on the ldconfig path; "disabled"
#                (or "hook", which only the nvidia runtime honours) turns it off.
#   CDI (gpu_runtime "cdi", the spec from `nvidia-ctk cdi generate`): the spec carries
#   the `nvidia-cdi-hook enable-cuda-compat --host-driver-version=<driver at generation>`
#   hook from 1.17.5 (pkg/nvcdi/driver-nvml.go) unless it was generated with
#   `--disable-hook enable-cuda-compat` (1.18.0) or the nvidia runtime in cdi/jit-cdi
#   mode has features.disable-cuda-compat-lib-hook = true (internal/modifier/gated.go).
#   The hook (cmd/nvidia-cdi-hook/cudacompat/cudacompat.go) globs
#   /usr/local/cuda/compat/libcuda.so.*.* (regular files; exactly one, else nothing) and
#     < 1.20.0   uses them when the compat library's major is greater than the host
#                driver's (extractMajorVersion);
#     >= 1.20.0  reads the library's .note.cuda.fwd_compatibility ELF note first
#                (commit f7cf48fe "Expand cudacompat hook to always inspect libcuda.so
#                ELF header if available"): with a note, uses them only when the host
#                branch is in the note's "driver" list and the compat version is newer
#                than the host's (cuda-elf-header.go UseCompat), so a newer build of the
#                SAME branch is used too; without a note, the major rule above.
#   Neither path looks at the GPU: the note's "device" list is never read, so a GeForce
#   host gets the compat libcuda, and cuInit fails with CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_
#   DEVICE (804, "forward compatibility was attempted on non supported HW").  A host
#   branch the compat package does not support fails with CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
#   (803).  Both codes: CUDA driver API cudaError/CUresult reference.
COMPAT_DIR = "/usr/local/cuda/compat"
GPU_RUNTIMES = ("nvidia", "cdi")
# Toolkit releases where the behaviour above changes (first release of each).
TOOLKIT_NO_CNTLIBS = (1, 17, 4)
TOOLKIT_CDI_COMPAT_HOOK = (1, 17, 5)
TOOLKIT_LEGACY_COMPAT_MODE = (1, 17, 7)
TOOLKIT_DISABLE_HOOK_FLAG = (1, 18, 0)
TOOLKIT_HOOK_READS_NOTE = (1, 20, 0)
# The .note.cuda.fwd_compatibility note of NVIDIA's compat libcuda ("driver": the host
# driver branches the package supports; "device": the NVML brand types it supports).
# Read from the truncated copies of NVIDIA's libraries in nvidia-container-toolkit
# testdata/compat/ (commit b784265 "testdata: truncate libcuda compat fixtures"), kept in
# tests/fixtures/cuda-compat/.  Used when an image's own library cannot be read.
COMPAT_NOTES = {
    "575.57.08": {"cuda": "12.9", "driver": (535, 550, 560, 565, 570, 575),
                  "device": (1, 2, 7, 8, 9, 10, 11, 12, 13, 14)},
    "590.44.01": {"cuda": "13.1", "driver": (535, 550, 570, 575, 580, 590),
                  "device": (1, 2, 7, 8, 9, 10, 11, 12, 13, 14)},
}
# nvmlBrandType_t (NVML nvml.h; nvidia-ml-py pynvml NVML_BRAND_*) by nvidia-smi's
# Product Brand, for the note's "device" list.
NVML_BRANDS = {
    "quadro": 1, "tesla": 2, "nvs": 3, "grid": 4, "geforce": 5, "titan": 6,
    "nvidia virtual applications": 7, "nvidia vapps": 7, "nvidia virtual pc": 8,
    "nvidia virtual compute server": 9, "nvidia rtx virtual workstation": 10,
    "nvidia cloud gaming": 11, "quadro rtx": 12, "nvidia rtx": 13, "nvidia": 14,
    "geforce rtx": 15, "titan rtx": 16,
}
_TOOLKIT_RE = re.compile(r"(?:^|[^0-9.])v?(\d{1,2})\.(\d{1,3})\.(\d{1,3})(?:[-~+][0-9A-Za-z.~+-]*)?$")
# `nvidia-ctk --version`'s first line names the version after "version", whatever follows
# it (a build note such as the lab stand-in's "(gpufleet lab stand-in)").
_TOOLKIT_CLI_RE = re.compile(r"\bversion\s+v?(\d{1,2})\.(\d{1,3})\.(\d{1,3})\b")
_COMPAT_LIB_RE = re.compile(r"^libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$")


def parse_toolkit_version(text):
    """'1.17.8', '1.17.8-1' (deb), '1.18.0~rc.1-1', or `nvidia-ctk --version` output
    ('NVIDIA Container Toolkit CLI version 1.17.8' + a commit line) -> (1, 17, 8)."""
    lines = [ln.strip() for ln in str(text if text is not None else "").splitlines()]
    for line in lines:
        m = _TOOLKIT_CLI_RE.search(line) or _TOOLKIT_RE.search(line)
        if m:
            return tuple(int(g) for g in m.groups())
    raise ValueError(
        f"toolkit_version {text!r} is not a nvidia-container-toolkit version: expected "
        "MAJOR.MINOR.PATCH such as 1.17.8 (the package version, e.g. 1.17.8-1, or the "
        "output of `nvidia-ctk --version` are read too)")


def _ver(t):
    return ".".join(str(p) for p in t)


def _elf_notes(data, want_section):
    """(name, desc) of each note in ``data`` (an ELF file, possibly truncated): the
    notes of section ``want_section`` when the section headers can be read, else of the
    PT_NOTE segments.  ValueError when it is not a 64- or 32-bit ELF file."""
    import struct
    if len(data) < 52 or data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ValueError("the compat libcuda is not an ELF file")
    is64, end = data[4] == 2, "<" if data[5] == 1 else ">"
    if is64:
        phoff, shoff = struct.unpack_from(end + "QQ", data, 32)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(end + "HHHHH", data, 54)
    else:
        phoff, shoff = struct.unpack_from(end + "II", data, 28)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from(end + "HHHHH", data, 42)

    def section(i):
        off = shoff + i * shentsize
        if is64:
            name, stype, _flags, _addr, offset, size, _link, _info, align = struct.unpack_from(end + "IIQQQQIIQ", data, off)
        else:
            name, stype, _flags, _addr, offset, size, _link, _info, align = struct.unpack_from(end + "IIIIIIIII", data, off)
        return name, stype, offset, size, max(align, 1)

    def notes(offset, size, align):
        out, pos, stop = [], offset, min(offset + size, len(data))
        while pos + 12 <= stop:
            namesz, descsz, _note_type = struct.unpack_from(end + "III", data, pos)
            name_at = pos + 12
            desc_at = name_at + ((namesz + align - 1) // align) * align
            out.append((data[name_at:name_at + namesz].rstrip(b"\0"),
                        data[desc_at:desc_at + descsz].rstrip(b"\0")))
            pos = desc_at + ((descsz + align - 1) // align) * align
            if namesz == 0 and descsz == 0:
                break
        return out

    if shoff and shnum and shoff + shnum * shentsize <= len(data) and shstrndx < shnum:
        _name, _type, stroff, strsize, _align = section(shstrndx)
        for i in range(shnum):
            name, stype, offset, size, align = section(i)
            label = data[stroff + name:data.find(b"\0", stroff + name)] if stroff + name < len(data) else b""
            if stype == 7 and label.decode("latin-1") == want_section:   # SHT_NOTE
                return notes(offset, size, align)
        return []
    out = []
    for i in range(phnum if phoff + phnum * phentsize <= len(data) else 0):
        off = phoff + i * phentsize
        ptype = struct.unpack_from(end + "I", data, off)[0]
        if ptype != 4:   # PT_NOTE
            continue
        if is64:
            offset, size, align = (struct.unpack_from(end + "Q", data, off + 8)[0],
                                   struct.unpack_from(end + "Q", data, off + 32)[0],
                                   struct.unpack_from(end + "Q", data, off + 48)[0])
        else:
            offset, size, align = (struct.unpack_from(end + "I", data, off + 4)[0],
                                   struct.unpack_from(end + "I", data, off + 16)[0],
                                   struct.unpack_from(end + "I", data, off + 28)[0])
        out.extend(notes(offset, size, max(align, 4)))
    return out


def parse_compat_note(data):
    """The .note.cuda.fwd_compatibility note of a compat libcuda, as the toolkit's hook
    reads it (owner "NVIDIA Corporation", JSON description):
    {"cuda": "12.9", "driver": (535, ...), "device": (1, 2, ...)} or None without one."""
    import json
    try:
        found = _elf_notes(bytes(data), ".note.cuda.fwd_compatibility")
    except (ValueError, IndexError, __import__("struct").error):
        return None   # GetCUDACompatElfHeaderFromReader fails: the hook warns, reads no note
    for name, desc in found:
        if name != b"NVIDIA Corporation" or not desc:
            continue
        try:
            raw = json.loads(desc.decode("utf-8"))
        except ValueError:
            return None   # the hook logs a warning and falls back, as without a note
        if not isinstance(raw, dict):
            return None
        # encoding/json matches keys case-insensitively ("CUDA version" -> CUDAVersion,
        # "driver" -> Driver, "device" -> Device)
        keys = {str(k).lower(): v for k, v in raw.items()}
        return {"cuda": keys.get("cuda version"),
                "driver": tuple(int(b) for b in keys.get("driver") or ()),
                "device": tuple(int(d) for d in keys.get("device") or ())}
    return None


def compat_lib_version(names):
    """The compat libcuda's driver version from the regular files of
    /usr/local/cuda/compat, as the hook globs them (libcuda.so.*.*, exactly one):
    ['libcuda.so.1', 'libcuda.so.575.57.08', ...] -> '575.57.08'; None otherwise."""
    found = [m.group(1) for m in (_COMPAT_LIB_RE.match(str(n)) for n in names or []) if m]
    return found[0] if len(found) == 1 else None


def assumed_compat_libs(cuda):
    """What NVIDIA's CUDA base image for ``cuda`` ships in /usr/local/cuda/compat: the
    cuda-compat-X-Y package, built from the driver branch that shipped with CUDA X.Y.  The
    version is that branch's first release (the package is installed unpinned, so the
    image may hold a newer build of the same branch)."""
    key = cuda_str(parse_cuda_version(cuda))
    driver = min_driver_for_cuda(key)
    return {"present": True, "version": driver, "branch": branch_of(driver), "note": None,
            "source": "assumed", "package": "cuda-compat-" + key.replace(".", "-")}


def _note_for(compat, for_hook=False):
    """(note, where it was read).  For the hook's own decision only a note read from the
    image's library counts (the hook reads that file); NVIDIA's known notes stand in
    when the image was not read."""
    note = compat.get("note")
    if note:
        return note, "the image's own library"
    if for_hook and compat.get("source") == "image":
        return None, None
    known = COMPAT_NOTES.get(compat.get("version") or "")
    if known:
        return known, f"NVIDIA's libcuda.so.{compat['version']}"
    return None, None


def _fc_supported_branches(compat):
    """(branches, source) the compat package supports: its ELF note, else the branches
    NVIDIA's images admit for that CUDA through brand= alternatives (FORWARD_COMPAT_BRANCHES)."""
    note, where = _note_for(compat)
    if note and note.get("driver"):
        return tuple(note["driver"]), f".note.cuda.fwd_compatibility of {where}"
    cuda = (note or {}).get("cuda") or DRIVER_BRANCHES.get(compat["branch"], {}).get("cuda")
    if cuda:
        return tuple(forward_compat_branches(cuda)) + (compat["branch"],), \
            f"the brand= alternatives of NVIDIA's CUDA {cuda} images"
    return (), None


def toolkit_loads_compat(driver_version, compat, toolkit_version=None, gpu_runtime="nvidia",
                         cuda_compat_disabled=False):
    """Whether the container toolkit puts the image's compat libraries on the loader path
    (see the comment above).  Returns (loaded, reason)."""
    if gpu_runtime not in GPU_RUNTIMES:
        raise ValueError(f"gpu_runtime {gpu_runtime!r} is not one of {', '.join(GPU_RUNTIMES)} "
                         "(nvidia: docker --gpus / device_requests driver nvidia; cdi: the CDI "
                         "spec from nvidia-ctk cdi generate)")
    host = parse_driver_version(driver_version)
    if not compat or not compat.get("present") or not compat.get("version"):
        return False, "The image has no CUDA forward-compatibility libraries in " \
                      f"{COMPAT_DIR}: the container uses the host driver's libcuda."
    version = compat["version"]
    cbranch = int(version.split(".")[0])
    tk = parse_toolkit_version(toolkit_version) if toolkit_version else None
    tk_text = f"nvidia-container-toolkit {_ver(tk)}" if tk else \
        "The container toolkit (version not given: assumed a current one, 1.17.7 or later)"
    newer_branch = cbranch > host[0]
    lib = f"{COMPAT_DIR}/libcuda.so.{version}"
    if gpu_runtime == "nvidia":
        if tk is not None and tk < TOOLKIT_NO_CNTLIBS:
            why = (f"{tk_text} (older than 1.17.4) mounts the image's compat libraries over "
                   "the host driver's when their branch differs from the host's")
            return newer_branch, (f"{why}: {lib} (branch {cbranch}) "
                                  + ("is newer than" if newer_branch else "is not newer than")
                                  + f" driver {driver_version}, so the container "
                                  + ("loads it." if newer_branch else "keeps the host's libcuda."))
        if tk is not None and tk < TOOLKIT_LEGACY_COMPAT_MODE:
            return False, (f"{tk_text} starts docker --gpus containers with --no-cntlibs "
                           "(1.17.4 to 1.17.6): the image's compat libraries are not used.")
        if cuda_compat_disabled:
            return False, (f"{tk_text} is set not to use them "
                           "(nvidia-container-runtime.modes.legacy.cuda-compat-mode = "
                           "\"disabled\"): the container uses the host driver's libcuda.")
        return newer_branch, (
            f"{tk_text} (docker --gpus, cuda-compat-mode \"ldconfig\", the default) puts an "
            "image's compat directory first on the loader path when its branch is newer than "
            f"the host driver's: {lib} is branch {cbranch}, the driver {driver_version}, so the "
            + ("container loads the compat libcuda." if newer_branch
               else "container keeps the host's libcuda."))
    # CDI
    if tk is not None and tk < TOOLKIT_CDI_COMPAT_HOOK:
        return False, (f"{tk_text} generates CDI specs without the enable-cuda-compat hook "
                       "(added in 1.17.5): the image's compat libraries are not used.")
    if cuda_compat_disabled:
        return False, (f"{tk_text}'s CDI spec has no enable-cuda-compat hook (generated with "
                       "--disable-hook enable-cuda-compat, or features.disable-cuda-compat-lib-"
                       "hook = true): the container uses the host driver's libcuda.")
    note, where = _note_for(compat, for_hook=True)
    if (tk is None or tk >= TOOLKIT_HOOK_READS_NOTE) and note and note.get("driver"):
        in_list = host[0] in note["driver"]
        newer = dsl_compare_version(version, ">", driver_version) == 1
        loaded = in_list and newer
        rule = (f"{tk_text}'s enable-cuda-compat hook (1.20.0 or later) reads the "
                f".note.cuda.fwd_compatibility of {lib} ({where}: host branches "
                f"{', '.join(str(b) for b in note['driver'])}) and uses the library when the "
                "host branch is listed and the library is newer than the driver")
        detail = (f"branch {host[0]} is {'' if in_list else 'not '}listed and {version} is "
                  f"{'' if newer else 'not '}newer than {driver_version}")
        return loaded, (f"{rule}: {detail}, so the container "
                        + ("loads the compat libcuda." if loaded else "keeps the host's libcuda."))
    return newer_branch, (
        f"{tk_text}'s enable-cuda-compat hook uses {lib} when its branch ({cbranch}) is newer "
        f"than the host driver's ({host[0]}), so the container "
        + ("loads the compat libcuda." if newer_branch else "keeps the host's libcuda."))


def _gpu_supports_forward_compat(compat, brand, datacenter_gpu):
    """(supported, why) for this GPU: the note's NVML brand list where the brand is
    known, else datacenter_gpu (NVIDIA's rule: data-center GPUs)."""
    note, where = _note_for(compat)
    b = " ".join(str(brand or "").split()).lower()
    if note and note.get("device") and b in NVML_BRANDS:
        ok = NVML_BRANDS[b] in note["device"]
        return ok, (f"its .note.cuda.fwd_compatibility ({where}) "
                    f"{'lists' if ok else 'does not list'} the {brand} brand "
                    f"(NVML brand type {NVML_BRANDS[b]})")
    return bool(datacenter_gpu), ("forward compatibility runs on data-center GPUs only"
                                  if not datacenter_gpu else "this is a data-center GPU")


def _disable_fix(gpu_runtime, toolkit_version):
    if gpu_runtime == "cdi":
        return ("generate the CDI spec with `nvidia-ctk cdi generate --disable-hook "
                "enable-cuda-compat` (toolkit 1.18.0 or later)")
    tk = parse_toolkit_version(toolkit_version) if toolkit_version else None
    pre = "upgrade nvidia-container-toolkit to 1.17.7 or later and " if tk and tk < TOOLKIT_LEGACY_COMPAT_MODE else ""
    return (pre + "set nvidia-container-runtime.modes.legacy.cuda-compat-mode = \"disabled\" in "
            "/etc/nvidia-container-runtime/config.toml (`nvidia-ctk config --in-place --set "
            "nvidia-container-runtime.modes.legacy.cuda-compat-mode=disabled`)")


def compat_verdict(result, driver_version, compat, toolkit_version, gpu_runtime,
                   cuda_compat_disabled, brand, datacenter_gpu, allow_forward_compat,
                   fc_blocked):
    """Amend check()'s result with what the container really loads."""
    reasons, suggestions = result["reasons"], result["suggestions"]
    if compat.get("source") == "assumed":
        reasons.append(
            f"No image was read: assumed what NVIDIA's CUDA {result['required_cuda']} base "
            f"images ship, the {compat['package']} package in {COMPAT_DIR} (libcuda of driver "
            f"branch {compat['branch']}, {compat['version']} or a newer build of it).")
    loaded, why = toolkit_loads_compat(driver_version, compat, toolkit_version, gpu_runtime,
                                       cuda_compat_disabled)
    info = {k: compat.get(k) for k in ("present", "version", "branch", "note", "source", "package")}
    info.update(loaded=loaded, gpu_runtime=gpu_runtime, toolkit_version=toolkit_version or None)
    result["compat_libs"] = info
    if result["require_cuda_satisfied"] is False:
        # nvidia-container-cli refuses the container before anything is loaded
        reasons.append("Were the container started: " + why[0].lower() + why[1:])
        return result
    reasons.append(why)
    if not loaded:
        return result
    host_branch = branch_of(driver_version)
    gpu_ok, gpu_why = _gpu_supports_forward_compat(compat, brand, datacenter_gpu)
    branches, table = _fc_supported_branches(compat)
    lib = f"libcuda.so.{compat['version']}"
    fixes = [f"Install driver branch {compat['branch']} or newer (the compat libraries are then "
             "not newer than the driver and stay unused).",
             f"Or use an image without {COMPAT_DIR} (or one that removes it, e.g. "
             f"`RUN rm -rf {COMPAT_DIR}` in a derived image).",
             "Or " + _disable_fix(gpu_runtime, toolkit_version) + "."]
    if not gpu_ok:
        reasons.append(
            f"The container loads {lib} but this GPU does not support forward compatibility "
            f"({gpu_why}): CUDA initialisation fails with error 804 (\"forward compatibility "
            "was attempted on non supported HW\"), although "
            + ("NVIDIA_REQUIRE_CUDA lets the container start" if result["require_cuda_satisfied"]
               else "nothing stops the container from starting")
            + (" and minor-version compatibility would run it without those "
               "libraries." if result["mode"] in ("native", "minor_version")
               else "."))
        result.update(mode="incompatible", compatible=False)
        result["suggestions"] = fixes + [s for s in suggestions if "VLLM_ENABLE_CUDA_COMPAT" not in s]
        return result
    if host_branch not in branches:
        reasons.append(
            f"The container loads {lib}, which does not support driver branch {host_branch} "
            f"(supported: {', '.join(str(b) for b in branches) or 'unknown'}, from {table}): "
            "CUDA initialisation fails with error 803 (\"system has unsupported display "
            "driver / cuda driver combination\").")
        result.update(mode="incompatible", compatible=False)
        result["suggestions"] = fixes + [s for s in suggestions if "VLLM_ENABLE_CUDA_COMPAT" not in s]
        return result
    same_branch = int(compat["version"].split(".")[0]) == host_branch
    text = (f"The container loads {lib} on driver branch {host_branch}, which it supports "
            f"({', '.join(str(b) for b in branches)}, from {table}; {gpu_why})")
    if same_branch:
        reasons.append(text + ": a newer build of the host's own branch, so the driver API "
                       "is that of the image.")
        return result
    if result["mode"] in ("native", "minor_version"):
        reasons.append(text + ": the container runs on forward compatibility.")
        result["mode"] = "forward_compat"
        return result
    if fc_blocked:
        reasons.append(text + ": forward compatibility would run the image, which "
                       "allow_forward_compat: false does not accept.")
        return result
    reasons.append(text + ".")
    return result


def compat_libs_from_image(names, libcuda=None):
    """compat_libs for check() from what the image holds in /usr/local/cuda/compat: the
    names of its regular files and, where read, the bytes of the libcuda.so.<version>
    (for its .note.cuda.fwd_compatibility).  names None: the directory is absent."""
    version = compat_lib_version(names) if names is not None else None
    if version is None:
        return {"present": False, "version": None, "branch": None, "note": None,
                "source": "image", "package": None}
    return {"present": True, "version": version, "branch": int(version.split(".")[0]),
            "note": parse_compat_note(libcuda) if libcuda else None, "source": "image",
            "package": None}
