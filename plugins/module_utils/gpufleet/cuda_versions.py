"""NVIDIA's driver, CUDA and architecture tables, and the version strings they are keyed by.

Plain data in, plain data out; no Ansible imports.  Which driver each CUDA toolkit
needs, which branch supports which architecture, which branches a forward-compat package
supports, each row with its source (NVIDIA's release notes and compatibility guide);
parsers for driver, CUDA and compute-capability strings.  gpufleet.cuda's verdict,
gpufleet.require_cuda and gpufleet.compat_libs read them; gpufleet.hoststack plans
driver branches from them.
"""
from __future__ import annotations

import re

from .arch import ARCHITECTURES, COMPUTE_CAPABILITIES
from .arch import architecture as _architecture_of
from .arch import parse_compute_capability as _parse_cc


# Minimum Linux x86_64 driver per CUDA toolkit release ("Toolkit Driver Version",
# full feature set).  Source: NVIDIA CUDA Toolkit release notes, Table 3 "CUDA Toolkit
# and Corresponding Driver Versions"
# (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html), as copied into
# mesonbuild/meson mesonbuild/modules/cuda.py `_DRIVER_TABLE_VERSION` ("Copied from:
# https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html#id7").
# Key: (CUDA major.minor, update number; 0 = GA).  There is no CUDA 12.7 toolkit.
# CUDA 7.0 to 10.2 (one row per release of the table: 7.0.28, 7.5.16, 8.0.44, 8.0.61 GA2,
# 9.0.76, 9.1.85, 9.2.88, 9.2.148 Update 1, 10.0.130, 10.1.105, 10.2.89): the same table
# as copied into meson at commit 021bf59f6e8981b958d62e058b99ffa1631ef250.
TOOLKIT_MIN_DRIVER = {
    ("7.0", 0): "346.46", ("7.5", 0): "352.31",
    ("8.0", 0): "367.48", ("8.0", 1): "375.26",
    ("9.0", 0): "384.81", ("9.1", 0): "390.46",
    ("9.2", 0): "396.26", ("9.2", 1): "396.37",
    ("10.0", 0): "410.48", ("10.1", 0): "418.39", ("10.2", 0): "440.33",
    ("11.0", 0): "450.51.05", ("11.0", 1): "450.51.06",
    ("11.1", 0): "455.23", ("11.1", 1): "455.32",
    ("11.2", 0): "460.27.03", ("11.2", 1): "460.32.03", ("11.2", 2): "460.32.03",
    ("11.3", 0): "465.19.01", ("11.3", 1): "465.19.01",
    ("11.4", 0): "470.42.01", ("11.4", 1): "470.57.02", ("11.4", 2): "470.57.02",
    ("11.4", 3): "470.82.01", ("11.4", 4): "470.82.01",
    ("11.5", 0): "495.29.05", ("11.5", 1): "495.29.05", ("11.5", 2): "495.29.05",
    ("11.6", 0): "510.39.01", ("11.6", 1): "510.47.03", ("11.6", 2): "510.47.03",
    ("11.7", 0): "515.43.04", ("11.7", 1): "515.48.07",
    ("11.8", 0): "520.61.05",
    ("12.0", 0): "525.60.13", ("12.0", 1): "525.85.11",
    ("12.1", 0): "530.30.02", ("12.1", 1): "530.30.02",
    ("12.2", 0): "535.54.03", ("12.2", 1): "535.86.09", ("12.2", 2): "535.104.05",
    ("12.3", 0): "545.23.06", ("12.3", 1): "545.23.08",
    ("12.4", 0): "550.54.14", ("12.4", 1): "550.54.15",
    ("12.5", 0): "555.42.02", ("12.5", 1): "555.42.06",
    ("12.6", 0): "560.28.03", ("12.6", 1): "560.35.03", ("12.6", 2): "560.35.03",
    ("12.6", 3): "560.35.05",
    ("12.8", 0): "570.26", ("12.8", 1): "570.124.06",
    ("12.9", 0): "575.51.03", ("12.9", 1): "575.57.08",
    ("13.0", 0): "580.65.06", ("13.0", 1): "580.82.07", ("13.0", 2): "580.95.05",
    ("13.1", 0): "590.44.01", ("13.1", 1): "590.48.01",
    ("13.2", 0): "595.45.04", ("13.2", 1): "595.58.03",
    ("13.3", 0): "610.43.02", ("13.3", 1): "610.43.02",
}
# Minor-version compatibility: an application built with any CUDA X.y runs "with limited
# feature-set" on a driver of at least this version.  Source: NVIDIA CUDA Compatibility
# guide, "Minor Version Compatibility", Table 1 (CUDA 13.x >= 580, CUDA 12.x >= 525 and
# < 580, CUDA 11.x >= 450 with footnote 450.80.02)
# https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html
# 525.60.13 and 580.65.06 are the first releases of those branches (Table 3 above).
MINOR_VERSION_COMPAT_MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# Driver branches.  cuda: what nvidia-smi's "CUDA Version" shows for every driver of the
# branch (NVML nvmlSystemGetCudaDriverVersion); min_driver: the branch's first Linux
# release, which is the toolkit GA driver of Table 3 where the branch shipped with a
# toolkit (565 shipped without one: 565.57.01 reports CUDA 12.7).
# lifecycle/eol: NVIDIA Data Center Drivers, "Supported Drivers and CUDA Toolkit
# Versions", Table 2 (docs.nvidia.com/datacenter/tesla/drivers/615/ and /620/:
# R535 LTSB EOL June 2026, R580 LTSB June 2028, R595 Production March 2027, R610 New
# Feature August 2026) and its 2021 PDF edition (R450 LTSB July 2023, R460 Production
# January 2022, R455 evaluation); R470 and R570 from the project's notes
# (/work/shared/notes/gpu-cuda-facts.md); None where not checked.
DRIVER_BRANCHES = {
    # The branches of Table 3 before CUDA 11 (each toolkit's GA driver; the CUDA a branch
    # reports is its toolkit's; 418.43 reports 10.1 in tests/fixtures/nvidia-smi).
    346: {"cuda": "7.0", "min_driver": "346.46", "lifecycle": None, "eol": None},
    352: {"cuda": "7.5", "min_driver": "352.31", "lifecycle": None, "eol": None},
    367: {"cuda": "8.0", "min_driver": "367.48", "lifecycle": None, "eol": None},
    375: {"cuda": "8.0", "min_driver": "375.26", "lifecycle": None, "eol": None},
    384: {"cuda": "9.0", "min_driver": "384.81", "lifecycle": None, "eol": None},
    390: {"cuda": "9.1", "min_driver": "390.46", "lifecycle": None, "eol": None},
    396: {"cuda": "9.2", "min_driver": "396.26", "lifecycle": None, "eol": None},
    410: {"cuda": "10.0", "min_driver": "410.48", "lifecycle": None, "eol": None},
    418: {"cuda": "10.1", "min_driver": "418.39", "lifecycle": None, "eol": None},
    440: {"cuda": "10.2", "min_driver": "440.33", "lifecycle": None, "eol": None},
    450: {"cuda": "11.0", "min_driver": "450.51.05", "lifecycle": "LTSB", "eol": "2023-07"},
    455: {"cuda": "11.1", "min_driver": "455.23", "lifecycle": "evaluation", "eol": None},
    460: {"cuda": "11.2", "min_driver": "460.27.03", "lifecycle": "production", "eol": "2022-01"},
    465: {"cuda": "11.3", "min_driver": "465.19.01", "lifecycle": None, "eol": None},
    470: {"cuda": "11.4", "min_driver": "470.42.01", "lifecycle": "LTSB", "eol": "2024-07"},
    495: {"cuda": "11.5", "min_driver": "495.29.05", "lifecycle": None, "eol": None},
    510: {"cuda": "11.6", "min_driver": "510.39.01", "lifecycle": None, "eol": None},
    515: {"cuda": "11.7", "min_driver": "515.43.04", "lifecycle": None, "eol": None},
    520: {"cuda": "11.8", "min_driver": "520.61.05", "lifecycle": None, "eol": None},
    525: {"cuda": "12.0", "min_driver": "525.60.13", "lifecycle": None, "eol": None},
    530: {"cuda": "12.1", "min_driver": "530.30.02", "lifecycle": None, "eol": None},
    535: {"cuda": "12.2", "min_driver": "535.54.03", "lifecycle": "LTSB", "eol": "2026-06"},
    545: {"cuda": "12.3", "min_driver": "545.23.06", "lifecycle": None, "eol": None},
    550: {"cuda": "12.4", "min_driver": "550.54.14", "lifecycle": None, "eol": None},
    555: {"cuda": "12.5", "min_driver": "555.42.02", "lifecycle": None, "eol": None},
    560: {"cuda": "12.6", "min_driver": "560.28.03", "lifecycle": None, "eol": None},
    565: {"cuda": "12.7", "min_driver": "565.57.01", "lifecycle": None, "eol": None},
    570: {"cuda": "12.8", "min_driver": "570.26", "lifecycle": "production", "eol": "2026-02"},
    575: {"cuda": "12.9", "min_driver": "575.51.03", "lifecycle": None, "eol": None},
    580: {"cuda": "13.0", "min_driver": "580.65.06", "lifecycle": "LTSB", "eol": "2028-06"},
    590: {"cuda": "13.1", "min_driver": "590.44.01", "lifecycle": None, "eol": None},
    595: {"cuda": "13.2", "min_driver": "595.45.04", "lifecycle": "production", "eol": "2027-03"},
    610: {"cuda": "13.3", "min_driver": "610.43.02", "lifecycle": "new feature", "eol": "2026-08"},
}
# Last driver branch that supports an architecture (Kepler R470; Maxwell, Pascal and
# Volta R580): from gpufleet.arch, the one architecture table, where the sources are.
LAST_BRANCH_FOR_ARCHITECTURE = {name: row["last_driver_branch"]
                                for name, row in ARCHITECTURES.items()
                                if row["last_driver_branch"] is not None}
for _branch, _row in DRIVER_BRANCHES.items():
    _row["last_for_architectures"] = sorted(
        a for a, last in LAST_BRANCH_FOR_ARCHITECTURE.items() if last == _branch)
del _branch, _row
# Which compute capabilities a CUDA toolkit can build for: (first CUDA, first CUDA
# without it), from gpufleet.arch (sources there).
TOOLKIT_ARCH_RANGE = {cc: (first, gone) for cc, (_arch_name, first, gone) in COMPUTE_CAPABILITIES.items()}
# Driver branches whose hosts NVIDIA's own CUDA images admit through a
# `brand=<datacenter brand>,driver>=B,driver<B+1` alternative of NVIDIA_REQUIRE_CUDA,
# i.e. the branches on which the image's cuda-compat (forward compatibility) libraries
# are meant to be used.  Sources (real image configs):
#   12.4: vllm/vllm-openai:v0.8.5 Config.Env (470, 525, 535)
#   12.9: vllm/vllm-openai v0.16.0 image, `vllm collect-env` (535, 550, 560, 565, 570)
#   13.0: vllm/vllm-openai:v0.23.0 Config.Env (535, 550, 565, 570, 575)
# Other versions use the nearest lower listed version of the same major.
FORWARD_COMPAT_BRANCHES = {
    "12.4": (470, 525, 535),
    "12.9": (535, 550, 560, 565, 570),
    "13.0": (535, 550, 565, 570, 575),
}
# Bounded parts: NVIDIA drivers are MAJOR (3 digits).MINOR[.PATCH] (535.129.03, 570.26);
# CUDA versions MAJOR.MINOR[.PATCH] with at most 2, 2 and 3 digits (12.9.1).
_DRIVER_RE = re.compile(r"^(\d{3})\.(\d{1,3})(?:\.(\d{1,3}))?$")
_CUDA_RE = re.compile(r"^(\d{1,2})\.(\d{1,2})(?:\.(\d{1,3}))?$")


def parse_driver_version(s):
    """'535.129.03' -> (535, 129, 3).  ValueError on anything else."""
    text = str(s).strip() if s is not None else ""
    m = _DRIVER_RE.match(text)
    if not m or int(m.group(1)) < 100:
        raise ValueError(
            f"driver_version {s!r} is malformed: expected MAJOR.MINOR[.PATCH] as printed "
            "by nvidia-smi (a 3-digit branch, then at most 3 digits per part), e.g. "
            "535.129.03 or 570.26")
    return tuple(int(g) for g in m.groups() if g is not None)


def parse_cuda_version(s):
    """'12.9', '12.9.1' or 12.9 -> (12, 9).  ValueError on anything else."""
    text = str(s).strip() if s is not None else ""
    m = _CUDA_RE.match(text)
    if not m:
        raise ValueError(
            f"CUDA version {s!r} is malformed: expected MAJOR.MINOR such as 12.2 or 13.0 "
            "(at most 2 digits each, then an optional .PATCH)")
    return int(m.group(1)), int(m.group(2))


def cuda_str(v):
    return f"{v[0]}.{v[1]}"


def parse_compute_capability(cc):
    """'8.6' -> (8, 6); 86 or '86' are not accepted (ambiguous for 10.0 and up).

    gpufleet.arch's parser; whether the table knows it is checked by architecture_name."""
    return _parse_cc(cc)


def architecture_name(cc):
    """Lower-case architecture name of a compute capability ("8.9" -> "ada");
    ValueError (ArchError) for one outside gpufleet.arch's table."""
    return _architecture_of(cc)


def known_cc(cc):
    """'8.9' for a compute capability the architecture table knows; ValueError else."""
    architecture_name(cc)
    return cuda_str(parse_compute_capability(cc))


def branch_of(driver_version):
    """The driver branch (major number): '535.129.03' -> 535."""
    return parse_driver_version(driver_version)[0]


def known_branch(branch):
    """The table row for `branch`, or the nearest lower known branch, or None."""
    lower = [b for b in DRIVER_BRANCHES if b <= branch]
    return max(lower) if lower else None


def driver_cuda_version(driver_version):
    """Newest CUDA the driver supports ('535.129.03' -> '12.2'), from DRIVER_BRANCHES.

    A branch missing from the table (a new one) is given the CUDA of the nearest older
    known branch: a lower bound, never an overstatement.
    """
    branch = branch_of(driver_version)
    known = known_branch(branch)
    if known is None:
        raise ValueError(
            f"driver {driver_version} (branch {branch}) is older than every branch this "
            f"module knows (oldest {min(DRIVER_BRANCHES)}, CUDA "
            f"{DRIVER_BRANCHES[min(DRIVER_BRANCHES)]['cuda']}); install a current driver branch")
    return DRIVER_BRANCHES[known]["cuda"]


def min_driver_for_cuda(cuda, update=None):
    """Minimum Linux driver for the full feature set of a CUDA toolkit release.

    ``update`` is the update number (1 for "12.2 Update 1"); None or 0 is GA.
    """
    key = cuda_str(parse_cuda_version(cuda))
    upd = 0 if update is None else int(update)
    if (key, upd) in TOOLKIT_MIN_DRIVER:
        return TOOLKIT_MIN_DRIVER[(key, upd)]
    known = sorted({k for k, _update in TOOLKIT_MIN_DRIVER}, key=parse_cuda_version)
    if key in known:
        updates = sorted(u for k, u in TOOLKIT_MIN_DRIVER if k == key)
        raise ValueError(f"CUDA {key} has no update {upd} in NVIDIA's table; known updates: "
                         f"{', '.join(str(u) for u in updates)} (0 = GA)")
    raise ValueError(
        f"CUDA {key} is not a CUDA toolkit release in NVIDIA's toolkit/driver table as "
        f"known here ({known[0]} to {known[-1]}; there is no 12.7 toolkit): use the image's "
        "real CUDA version (its CUDA_VERSION), or add a new release from the CUDA release "
        "notes Table 3 to TOOLKIT_MIN_DRIVER")


def planned_driver_for_branch(branch):
    """The driver version a plan can assume for ``branch`` before installing it: the
    branch's first release (what NVIDIA's tables promise for the whole branch)."""
    text = str(branch).strip()
    if isinstance(branch, bool) or not text.isdigit():
        raise ValueError(f"driver branch {branch!r} is not a branch number such as 580: set "
                         "driver_branch to one of "
                         f"{', '.join(str(k) for k in sorted(DRIVER_BRANCHES))}")
    b = int(text)
    if b not in DRIVER_BRANCHES:
        raise ValueError(f"driver branch {branch} is not known; known branches: "
                         f"{', '.join(str(k) for k in sorted(DRIVER_BRANCHES))}")
    return DRIVER_BRANCHES[b]["min_driver"]


def planned_driver(installed, branch):
    """The driver a host runs once the driver role has applied ``branch``.

    The installed driver when it is already on that branch (the role never upgrades
    within a branch as a side effect), else the branch's first release, the oldest
    driver the role can install (a conservative plan)."""
    if installed:
        parse_driver_version(installed)
        if str(branch_of(installed)) == str(branch).strip():
            return str(installed).strip()
    return planned_driver_for_branch(branch)


def branch_supports_architecture(branch, compute_capability):
    """False when driver ``branch`` no longer supports a GPU of ``compute_capability``
    (Kepler after R470; Maxwell, Pascal and Volta after R580)."""
    arch = architecture_name(compute_capability)
    last = LAST_BRANCH_FOR_ARCHITECTURE.get(arch)
    return last is None or int(branch) <= last


def toolkit_supports_architecture(cuda, compute_capability):
    """Whether CUDA toolkit ``cuda`` can build code for ``compute_capability``."""
    first, gone = TOOLKIT_ARCH_RANGE[known_cc(compute_capability)]
    v = parse_cuda_version(cuda)
    return v >= parse_cuda_version(first) and (gone is None or v < parse_cuda_version(gone))


def forward_compat_branches(required):
    major, minor = parse_cuda_version(required)
    same = [parse_cuda_version(k) for k in FORWARD_COMPAT_BRANCHES if parse_cuda_version(k)[0] == major]
    if not same:
        return ()
    lower = [v for v in same if v <= (major, minor)]
    pick = max(lower) if lower else min(same)
    return FORWARD_COMPAT_BRANCHES[cuda_str(pick)]
