"""Can this host run that CUDA image?  Driver, CUDA and GPU-architecture compatibility.

Plain data in, plain data out; no Ansible imports.  Errors are ``ValueError`` with a
message that says what was wrong and what to pass instead.

Two independent gates decide whether a CUDA container works on a host:

1. **The container toolkit's requirement check.**  Before the container starts,
   ``nvidia-container-cli configure --require=EXPR`` evaluates every ``NVIDIA_REQUIRE_*``
   variable of the image against the host driver and refuses to start the container
   when one is not met ("unsatisfied condition: cuda>=12.8, please update your driver
   ...", vLLM issues #5635 and #18813).  :func:`evaluate_require_cuda` re-implements
   that evaluation exactly (see the comments there for the C source it follows).
2. **The CUDA runtime inside the container.**  It needs a driver whose CUDA version is
   at least the runtime's (``native``), or a driver of the same CUDA major above the
   minor-version-compatibility floor (``minor_version``, limited feature set), or the
   ``cuda-compat`` forward-compatibility libraries on a data-center GPU
   (``forward_compat``).  And the image's kernels must exist for the GPU's compute
   capability, or the first launch fails with "no kernel image is available for
   execution on the device".

:func:`check` combines both and returns the verdict of the ``cuda_compat`` module.
"""
from __future__ import annotations

import re

from .arch import ARCHITECTURES, COMPUTE_CAPABILITIES
from .arch import architecture as _architecture_of
from .arch import datacenter_only as _datacenter_only
from .arch import parse_compute_capability as _parse_cc
from .gpu import is_datacenter_brand as _is_datacenter_brand

# ---------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------

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

MODES = ("native", "minor_version", "forward_compat", "incompatible")

# Bounded parts: NVIDIA drivers are MAJOR (3 digits).MINOR[.PATCH] (535.129.03, 570.26);
# CUDA versions MAJOR.MINOR[.PATCH] with at most 2, 2 and 3 digits (12.9.1).
_DRIVER_RE = re.compile(r"^(\d{3})\.(\d{1,3})(?:\.(\d{1,3}))?$")
_CUDA_RE = re.compile(r"^(\d{1,2})\.(\d{1,2})(?:\.(\d{1,3}))?$")


# ---------------------------------------------------------------------------------------
# Parsing and table look-ups
# ---------------------------------------------------------------------------------------

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


def _cuda_str(v):
    return f"{v[0]}.{v[1]}"


def parse_compute_capability(cc):
    """'8.6' -> (8, 6); 86 or '86' are not accepted (ambiguous for 10.0 and up).

    gpufleet.arch's parser; whether the table knows it is checked by _architecture."""
    return _parse_cc(cc)


def _architecture(cc):
    """Lower-case architecture name of a compute capability ("8.9" -> "ada");
    ValueError (ArchError) for one outside gpufleet.arch's table."""
    return _architecture_of(cc)


def _known_cc(cc):
    """'8.9' for a compute capability the architecture table knows; ValueError else."""
    _architecture(cc)
    return _cuda_str(parse_compute_capability(cc))


def branch_of(driver_version):
    """The driver branch (major number): '535.129.03' -> 535."""
    return parse_driver_version(driver_version)[0]


def _known_branch(branch):
    """The table row for `branch`, or the nearest lower known branch, or None."""
    lower = [b for b in DRIVER_BRANCHES if b <= branch]
    return max(lower) if lower else None


def driver_cuda_version(driver_version):
    """Newest CUDA the driver supports ('535.129.03' -> '12.2'), from DRIVER_BRANCHES.

    A branch missing from the table (a new one) is given the CUDA of the nearest older
    known branch: a lower bound, never an overstatement.
    """
    branch = branch_of(driver_version)
    known = _known_branch(branch)
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
    key = _cuda_str(parse_cuda_version(cuda))
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
    arch = _architecture(compute_capability)
    last = LAST_BRANCH_FOR_ARCHITECTURE.get(arch)
    return last is None or int(branch) <= last


def toolkit_supports_architecture(cuda, compute_capability):
    """Whether CUDA toolkit ``cuda`` can build code for ``compute_capability``."""
    first, gone = TOOLKIT_ARCH_RANGE[_known_cc(compute_capability)]
    v = parse_cuda_version(cuda)
    return v >= parse_cuda_version(first) and (gone is None or v < parse_cuda_version(gone))


# ---------------------------------------------------------------------------------------
# NVIDIA_REQUIRE_CUDA, exactly as libnvidia-container evaluates it
# ---------------------------------------------------------------------------------------
#
# Path of a requirement on the (default, "legacy") docker --gpus / runtime=nvidia path
# (sources: NVIDIA/nvidia-container-toolkit at d34b3046758cb1a5db606b2a39519c731bbf9f56,
# NVIDIA/libnvidia-container src/cli/dsl.c at 5823754b8577d16fabf25a6ef6a1d58f7ff1e5dd and
# src/cli/configure.c at e27a4a75805021ffdfa9b56403921f50eb3b83d2; their test cases are
# ported in tests/unit/test_cuda_toolkit_cases.py):
#   nvidia-container-toolkit internal/config/image/cuda_image.go CUDA.GetRequirements():
#     NVIDIA_DISABLE_REQUIRE=<true per strconv.ParseBool> drops them all (HasDisableRequire);
#     otherwise every env var starting with NVIDIA_REQUIRE_ (except NVIDIA_REQUIRE_JETPACK*)
#     is a requirement, and a "legacy" image (CUDA_VERSION set, NVIDIA_REQUIRE_CUDA unset or
#     empty) gets "cuda>=MAJOR.MINOR" of CUDA_VERSION as parseMajorMinorVersion reads it
#     (Masterminds semver NewVersion, then MAJOR and MINOR must fit 32 bits): "8" -> 8.0,
#     "v11.6" -> 11.6; a version it cannot read makes the hook panic ("failed to get
#     requirements"), so the container does not start.
#   cmd/nvidia-container-runtime-hook/main.go passes each one as --require=<value>.
#   libnvidia-container src/cli/configure.c configure_command(): every requirement is
#     evaluated once per visible GPU (dsl_data{drv, gpu}; a MIG device with its parent),
#     or once with no device when none is visible; the rules are cuda (driver's CUDA
#     "%u.%u" from nvmlSystemGetCudaDriverVersion), driver (NVML driver version string),
#     arch (compute capability "%u.%u") and brand (src/driver.c: Quadro, Tesla, NVS, GRID,
#     GeForce, TITAN, anything else "Unknown"); with no device, arch and brand hold
#     before any comparison.
#   libnvidia-container src/cli/dsl.c dsl_evaluate(): the value is split on " " into
#     alternatives (OR) and each alternative on "," into conditions (AND), read lazily:
#     the conditions of an alternative in order up to the first false one, the
#     alternatives in order up to the first that holds.  A term that is not read is never
#     checked, so "cuda>=12.4 foo=bar" holds on a CUDA 12.4 driver and is an error only on
#     an older one.  On failure the message names the FIRST space-separated term of the
#     whole value, not the failing one.  evaluate_rule(): NAME, then a run of "<>=!" that
#     must be the start of one of = != < <= > >= (so a lone "!" is "!="), then a
#     non-empty value; an unknown name, a bad operator, a comparison that returns -1, or a
#     false condition whose "NAME OP VALUE" does not fit in 128 bytes is "invalid
#     expression".  Names and brand values compare case-insensitively.
#     dsl_compare_version(): digits and dots only, each part read with strtoumax (a part
#     of 2**64-1 or more is -1), trailing ".0" groups ignored ("12" == "12.0").
# (The Go port in internal/requirements/ is used only for CSV/Tegra mode.)

_RULES = ("cuda", "driver", "arch", "brand")
# dsl.c operators[], in its order: the first whose text starts with the run of "<>=!" wins.
_OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
_UINTMAX = 2 ** 64 - 1   # strtoumax's saturation value; dsl_compare_version rejects it
_EXPR_MAX = 128          # dsl.c EXPR_MAX: the buffer a false condition is formatted into

# Brand strings libnvidia-container can report (src/driver.c driver_get_device_brand_1_svc).
TOOLKIT_BRANDS = ("quadro", "tesla", "nvs", "grid", "geforce", "titan", "unknown")


def _invalid_expression(whole, term, problem):
    return ValueError(
        f"NVIDIA_REQUIRE_CUDA {whole!r} is malformed: term {term!r}: {problem}. "
        "nvidia-container-cli refuses the container with 'requirement error: invalid "
        "expression' when it reads this term; expected e.g. "
        "'cuda>=12.4 brand=tesla,driver>=535,driver<536'")


# A condition on a property nvidia-container-cli does not know ("foo=bar") is not
# malformed to NVIDIA's Go requirements parser: nvidia-container-toolkit
# internal/requirements/constraints/factory.go parse() first needs one of "<>=!" (else
# "invalid constraint"), then looks the property up and returns nil for an unknown one,
# which newConstraintFromRequirement skips ("Skipping unsupported constraint";
# factory_test.go TestParse 'invalid property is invalid' expects nil and no error,
# TestNewConstraintFromRequirement 'unsupported property is ignored').  That parser runs
# only in the runtime's CSV mode (internal/modifier/csv.go checkRequirements, Tegra).  On
# docker --gpus the hook passes the value to nvidia-container-cli, whose dsl.c
# evaluate_rule() finds no rule of that name and returns -1: "requirement error: invalid
# expression", the container does not start, whenever dsl_evaluate reads the term.  So
# check() answers with that verdict and the reason, not with an input error, and says so
# where the term was not read.  A term with no property name is malformed here (the Go
# parser would skip it too, as property "").
class UnknownProperty(ValueError):
    """An NVIDIA_REQUIRE_* condition on a property nvidia-container-cli does not know,
    read by it: the container does not start ('invalid expression')."""

    def __init__(self, whole, term, name):
        self.whole, self.term, self.name = whole, term, name
        super().__init__(
            f"NVIDIA_REQUIRE_CUDA {whole!r}: term {term!r} is a condition on {name!r}, a "
            f"property nvidia-container-cli does not know ({', '.join(_RULES)}). NVIDIA's Go "
            "requirements parser (CSV mode) skips such a term, but on docker --gpus "
            "nvidia-container-cli refuses the container with 'requirement error: invalid "
            "expression' when it reads it")


def _unknown_property(term):
    """The property name of a condition on a property nvidia-container-cli does not know
    ("foo=bar" -> "foo"), else None (a known property, or no name or operator at all)."""
    i = _name_end(term)
    name = term[:i]
    return name if name and i < len(term) and name.lower() not in _RULES else None


def _name_end(term):
    """Where a condition's property name ends: at the first of "<>=!" (dsl.c strcspn)."""
    i = 0
    while i < len(term) and term[i] not in "<>=!":
        i += 1
    return i


def _term_error(whole, term, problem):
    name = _unknown_property(term)
    return UnknownProperty(whole, term, name) if name else _invalid_expression(whole, term, problem)


def unknown_property_terms(requirements):
    """[(term, property)] of every condition in ``requirements`` (one NVIDIA_REQUIRE_*
    value or a list of them) on a property nvidia-container-cli does not know."""
    values = [requirements] if isinstance(requirements, str) else list(requirements or [])
    return [(t, _unknown_property(t)) for v in values for alt in str(v).split(" ")
            for t in alt.split(",") if t and _unknown_property(t)]


def _split_term(term):
    """dsl.c evaluate_rule()'s parse of one condition: (name, op, value, problem)."""
    i = _name_end(term)
    j = i
    while j < len(term) and term[j] in "<>=!":
        j += 1
    name, run, val = term[:i].lower(), term[i:j], term[j:]
    op = next((o for o in _OPERATORS if run and o.startswith(run)), None)
    problem = None
    if not name:
        problem = "it has no property name before the operator"
    elif not run:
        problem = "it has no comparison operator (one of = != < <= > >=)"
    elif name not in _RULES:   # before the operator and value, as factory.go parse() reads it
        problem = (f"{term[:i]!r} is not a property nvidia-container-cli knows "
                   "(cuda, driver, arch, brand)")
    elif op is None:
        problem = f"{run!r} is not an operator (one of = != < <= > >=)"
    elif not val:
        problem = "it has no value after the operator"
    return name, op, val, problem


def _value_problem(name, op, val):
    """Why comparing ``name op val`` returns -1 in dsl.c (for the error message)."""
    if name == "brand":
        return f"a brand compares only with = or !=, not {op}"
    if any(c not in "0123456789." for c in val):
        return f"{val!r} is not a version (digits and dots only)"
    if any(p and int(p) >= _UINTMAX for p in val.split(".")):
        return (f"{val!r} has a part of 2**64-1 or more, which nvidia-container-cli cannot "
                "read (strtoumax)")
    return f"{val!r} is not a version (a dot without a number before it)"


def parse_require_cuda(value):
    """Parse an NVIDIA_REQUIRE_* value into alternatives of (name, op, value) conditions.

    '' -> [] (no requirement).  Every term is checked, as if a device were visible:
    ValueError names a bad term, one nvidia-container-cli fails on with "requirement
    error: invalid expression" when it reads it; UnknownProperty (a ValueError) where the
    term is a condition on a property it does not know.  (It reads lazily: see
    evaluate_require_cuda, which is what decides whether a container starts.)
    """
    if value is None:
        return []
    if not isinstance(value, str):
        raise ValueError(f"NVIDIA_REQUIRE_CUDA must be a string, got {type(value).__name__}")
    alternatives = []
    for alt in value.split(" "):
        if alt == "":
            continue
        conditions = []
        for term in alt.split(","):
            if term == "":
                continue
            conditions.append(_parse_condition(term, value))
        if conditions:
            alternatives.append(conditions)
    return alternatives


def _parse_condition(term, whole):
    name, op, val, problem = _split_term(term)
    if problem is None and (name == "brand" and op not in ("=", "!=")
                            or name != "brand" and _dsl_compare_version(val, "=", val) < 0):
        problem = _value_problem(name, op, val)
    if problem:
        raise _term_error(whole, term, problem)
    return (name, op, val)


def _strtoumax(s, pos):
    j = pos
    while j < len(s) and s[j].isdigit():
        j += 1
    return (int(s[pos:j]) if j > pos else None), j


def _skip(s, pos, chars):
    while pos < len(s) and s[pos] in chars:
        pos += 1
    return pos


def _dsl_compare_version(v1, cmp, v2):
    """Port of libnvidia-container src/cli/dsl.c dsl_compare_version():
    1 (true), 0 (false) or -1 (not comparable).  Numeric, dot-separated, trailing
    '.0' groups ignored ("12" == "12.0"); a part read as 2**64-1 or more is -1."""
    if any(c not in "0123456789." for c in v1) or any(c not in "0123456789." for c in v2):
        return -1
    p1 = p2 = 0
    while p1 < len(v1) and p2 < len(v2):
        n1, e1 = _strtoumax(v1, p1)
        n2, e2 = _strtoumax(v2, p2)
        if n1 is None or n2 is None or n1 >= _UINTMAX or n2 >= _UINTMAX:
            return -1
        if n1 != n2:
            if cmp == "=":
                return 0
            if cmp == "!=":
                return 1
            if cmp in ("<", "<="):
                return int(n1 < n2)
            return int(n1 > n2)
        p1 = _skip(v1, e1, ".")
        p2 = _skip(v2, e2, ".")
    p1 = _skip(v1, p1, ".0")
    p2 = _skip(v2, p2, ".0")
    end1, end2 = p1 >= len(v1), p2 >= len(v2)
    if cmp == "!=":
        return int(not end1 or not end2)
    if cmp in ("=", "<=", ">="):
        if end1 and end2:
            return 1
        if cmp == "=":
            return 0
    if cmp in ("<", "<="):
        return int(end1 and not end2)
    return int(not end1 and end2)


def _rule(name, op, val, driver_version, driver_cuda, brand, arch):
    if name == "cuda":
        return _dsl_compare_version(driver_cuda, op, val)
    if name == "driver":
        return _dsl_compare_version(driver_version, op, val)
    if name == "arch":
        # configure.c check_device_arch: no visible device -> true
        return 1 if arch is None else _dsl_compare_version(arch, op, val)
    # check_device_brand: no device or no brand -> true; dsl_compare_string defines only
    # = and != (str_case_equal), anything else is -1
    if brand is None:
        return 1
    if op == "=":
        return int(brand.lower() == val.lower())
    if op == "!=":
        return int(brand.lower() != val.lower())
    return -1


def _evaluate_term(term, whole, driver_version, driver_cuda, brand, arch):
    """dsl.c evaluate_rule(): 1 or 0; ValueError where it returns -1."""
    name, op, val, problem = _split_term(term)
    if problem is None:
        ret = _rule(name, op, val, driver_version, driver_cuda, brand, arch)
        if ret < 0:
            problem = _value_problem(name, op, val)
        elif ret == 0 and len(f"{name} {op} {val}".encode()) >= _EXPR_MAX:
            problem = (f"'{name} {op} {val}' is {_EXPR_MAX} bytes or longer, more than "
                       "nvidia-container-cli's buffer for an unsatisfied condition")
    if problem:
        raise _term_error(whole, term, problem)
    return ret


def evaluate_require_cuda(value, driver_version, brand=None, arch=None, driver_cuda=None):
    """Evaluate one NVIDIA_REQUIRE_* value as nvidia-container-cli does (dsl_evaluate).

    Returns (ok, unsatisfied_condition_text); the text is nvidia-container-cli's own
    message ("unsatisfied condition: cuda>=12.4, please update your driver to a newer
    version, or use an earlier cuda container") or None when ok.  ``brand`` (one of
    TOOLKIT_BRANDS) and ``arch`` ("8.0") describe the GPU; None means "no visible
    device", where the toolkit lets brand and arch conditions pass.  ``driver_cuda``
    defaults to driver_cuda_version(driver_version).  Terms are read lazily, as the C
    code reads them; a term it reads and cannot evaluate is a ValueError ("invalid
    expression"; UnknownProperty for a property it does not know), one it never reads
    is not.
    """
    parse_driver_version(driver_version)
    if value is None:
        return True, None
    if not isinstance(value, str):
        raise ValueError(f"NVIDIA_REQUIRE_CUDA must be a string, got {type(value).__name__}")
    if driver_cuda is None:
        driver_cuda = driver_cuda_version(driver_version)
    driver = str(driver_version).strip()
    ret = 1
    for alternative in value.split(" "):
        if alternative == "":
            continue
        held = True
        for term in alternative.split(","):
            if term == "":
                continue
            ret = _evaluate_term(term, value, driver, driver_cuda, brand, arch)
            if not ret:
                held = False
                break
        if held:  # dsl.c: and_expr == NULL, this alternative ran to its end
            break
    if ret:
        return True, None
    first = value.split(" ")[0]
    if first.startswith("cuda>="):
        return False, (f"unsatisfied condition: {first}, please update your driver to a "
                       "newer version, or use an earlier cuda container")
    return False, f"unsatisfied condition: {first}"


def _parse_bool_go(s):
    """Go strconv.ParseBool; invalid -> False (HasDisableRequire ignores the error)."""
    return s in ("1", "t", "T", "TRUE", "true", "True")


# Masterminds/semver v3 looseSemVerRegex, as NewVersion uses it (CoerceNewVersion).
_SEMVER_LOOSE_RE = re.compile(
    r"v?([0-9]+)(\.[0-9]+)?(\.[0-9]+)?"
    r"(-([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?"
    r"(\+([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?")


def toolkit_major_minor(version):
    """'12.4.1' -> '12.4', '8' -> '8.0', 'v11.6' -> '11.6': the MAJOR.MINOR the container
    toolkit reads from a legacy image's CUDA_VERSION (cuda_image.go
    parseMajorMinorVersion).  ValueError where the toolkit fails."""
    text = str(version)
    m = _SEMVER_LOOSE_RE.fullmatch(text) if len(text) <= 256 else None
    parts = [int(g.lstrip(".")) if g else 0 for g in m.group(1, 2, 3)] if m else []
    pre = m.group(5) if m else None
    if (not m or any(p > _UINTMAX for p in parts)
            or any(p.isdigit() and len(p) > 1 and p[0] == "0" for p in (pre or "").split("."))
            or parts[0] > 2 ** 32 - 1 or parts[1] > 2 ** 32 - 1):
        raise ValueError(
            f"CUDA_VERSION {version!r} is not a version the container toolkit can read: "
            "expected [v]MAJOR[.MINOR[.PATCH]] such as 12.4.1, MAJOR and MINOR at most "
            "4294967295")
    return f"{parts[0]}.{parts[1]}"


def image_requirements(env, labels=None):
    """What an image's Config.Env (list of "K=V") tells this check.

    Returns dict(requirements=[...], disabled=bool, cuda_version="12.9"|None,
    arch_list=[...]|None, ignored=[...]), following cuda_image.go GetRequirements() for the
    first two; ``ignored`` names the NVIDIA_REQUIRE_* variables the toolkit leaves out of
    its check (NVIDIA_REQUIRE_JETPACK*, since toolkit 1.10.0), each with the reason.
    cuda_version is CUDA_VERSION's MAJOR.MINOR as the toolkit reads it (None when it
    cannot and does not need to).  ValueError where the hook fails: a legacy image
    (no NVIDIA_REQUIRE_CUDA) whose CUDA_VERSION the toolkit cannot read.
    """
    values = {}
    for item in env or []:
        key, sep, val = str(item).partition("=")
        if sep:
            values[key] = val
    disabled = _parse_bool_go(values.get("NVIDIA_DISABLE_REQUIRE", ""))
    requirements = [v for k, v in sorted(values.items())
                    if k.startswith("NVIDIA_REQUIRE_") and not k.startswith("NVIDIA_REQUIRE_JETPACK")]
    ignored = [f"{k}={v!r:.80}: nvidia-container-runtime-hook leaves NVIDIA_REQUIRE_JETPACK* out of "
               "its requirement check (toolkit 1.10.0 and later; Jetson's CSV mode reads it)"
               for k, v in sorted(values.items()) if k.startswith("NVIDIA_REQUIRE_JETPACK")]
    # IsLegacy(): CUDA_VERSION set, NVIDIA_REQUIRE_CUDA unset or empty
    legacy = bool(values.get("CUDA_VERSION")) and not values.get("NVIDIA_REQUIRE_CUDA")
    cuda_version = None
    if values.get("CUDA_VERSION"):
        try:
            cuda_version = toolkit_major_minor(values["CUDA_VERSION"])
        except ValueError as exc:
            if legacy and not disabled:
                raise ValueError(
                    f"{exc}. The image sets no NVIDIA_REQUIRE_CUDA, so "
                    "nvidia-container-runtime-hook derives cuda>=MAJOR.MINOR from CUDA_VERSION "
                    "and fails with 'failed to get requirements': the container does not "
                    "start. Fix the image's CUDA_VERSION or set NVIDIA_REQUIRE_CUDA") from None
        if legacy and not disabled:
            requirements.append(f"cuda>={cuda_version}")
    arch_text = values.get("TORCH_CUDA_ARCH_LIST") or (labels or {}).get("TORCH_CUDA_ARCH_LIST")
    arch_list = parse_arch_list(arch_text) if arch_text else None
    return {"requirements": [] if disabled else requirements, "disabled": disabled,
            "cuda_version": cuda_version, "arch_list": arch_list, "ignored": ignored}


def parse_arch_list(value):
    """TORCH_CUDA_ARCH_LIST-style text or list -> ['7.5', '8.0', ..., '12.0+PTX']."""
    items = value if isinstance(value, (list, tuple)) else re.split(r"[\s;,]+", str(value))
    out = []
    for item in items:
        item = str(item).strip()
        if not item:
            continue
        m = re.match(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$", item, re.IGNORECASE)
        if not m:
            raise ValueError(
                f"architecture list entry {item!r} is malformed: expected entries like 8.0, "
                "9.0a or 12.0+PTX (TORCH_CUDA_ARCH_LIST format)")
        out.append(f"{m.group(1)}.{m.group(2)}{m.group(3).lower()}{'+PTX' if m.group(4) else ''}")
    return out


def arch_list_covers(arch_list, compute_capability, allow_ptx=True):
    """Whether kernels built for ``arch_list`` load on a GPU of ``compute_capability``.

    CUDA binary compatibility (CUDA C++ Programming Guide, "Binary Compatibility"):
    a cubin for X.y runs on X.z with z >= y; 'a' (arch-specific) cubins run only on
    exactly X.y; 'f' (family) cubins on the same major with z >= y; PTX for X.y is JIT-
    compiled for any compute capability >= X.y.
    """
    cc = parse_compute_capability(compute_capability)
    for entry in arch_list:
        m = re.match(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$", entry)
        built = (int(m.group(1)), int(m.group(2)))
        suffix, ptx = m.group(3), bool(m.group(4))
        if suffix == "a":
            if cc == built:
                return True
        elif cc[0] == built[0] and cc[1] >= built[1]:
            return True
        if allow_ptx and ptx and cc >= built:
            return True
    return False


# ---------------------------------------------------------------------------------------
# The verdict
# ---------------------------------------------------------------------------------------

def _required_from_requirements(requirements):
    """The CUDA floor of the first requirement that names one: the cuda>= (or =, >)
    condition of its first alternative (NVIDIA's images start with 'cuda>=X.Y'), read as
    dsl_compare_version reads it ('cuda>=12' is 12.0).  A term nvidia-container-cli could
    not evaluate is passed over here; evaluating the requirement reports it if it is read."""
    for value in requirements:
        alternatives = [[t for t in alt.split(",") if t] for alt in value.split(" ")]
        for conditions in [a for a in alternatives if a][:1]:
            for term in conditions:
                name, op, val, problem = _split_term(term)
                if (problem is None and name == "cuda" and op in (">=", "=", ">")
                        and _dsl_compare_version(val, "=", val) == 1):
                    numbers = [int(p) for p in val.split(".") if p] + [0]
                    return _cuda_str(parse_cuda_version(f"{numbers[0]}.{numbers[1]}"))
    return None


def _forward_compat_branches(required):
    major, minor = parse_cuda_version(required)
    same = [parse_cuda_version(k) for k in FORWARD_COMPAT_BRANCHES if parse_cuda_version(k)[0] == major]
    if not same:
        return ()
    lower = [v for v in same if v <= (major, minor)]
    pick = max(lower) if lower else min(same)
    return FORWARD_COMPAT_BRANCHES[_cuda_str(pick)]


# nvidia-smi's "Product Brand" (NVML nvmlBrandType_t names) for brands that
# libnvidia-container reports as "Unknown" (src/driver.c maps only Quadro, Tesla, NVS,
# GRID, GeForce and TITAN).  Seen in the captures under tests/fixtures/nvidia-smi:
# "NVIDIA" (A100, T4 on recent drivers), "NVIDIA RTX" (RTX A5000).
_UNKNOWN_TO_TOOLKIT = ("nvidia", "nvidia rtx", "quadro rtx", "geforce rtx", "titan rtx",
                       "nvidia vapps", "nvidia virtual pc", "nvidia virtual compute server",
                       "nvidia rtx virtual workstation", "nvidia cloud gaming")


def toolkit_brand(product_brand):
    """The brand nvidia-container-cli compares against ``brand=`` conditions, from
    nvidia-smi's Product Brand ("GeForce" -> "geforce", "NVIDIA" -> "unknown")."""
    b = " ".join(str(product_brand or "").split()).lower()
    if b in TOOLKIT_BRANDS:
        return b
    if b in _UNKNOWN_TO_TOOLKIT:
        return "unknown"
    raise ValueError(
        f"brand {product_brand!r} is not a GPU brand nvidia-smi or nvidia-container-cli "
        f"reports; use nvidia-smi's Product Brand (GeForce, Tesla, NVIDIA, NVIDIA RTX, ...) or "
        f"one of {', '.join(TOOLKIT_BRANDS)}")


def _toolkit_brand(brand, datacenter_gpu):
    if brand:
        return toolkit_brand(brand)
    # Data-center GPUs report Tesla (V100, T4) or a brand libnvidia-container maps to
    # "Unknown" (A100, H100: NVML_BRAND_NVIDIA); NVIDIA's images list both alike.
    return "tesla" if datacenter_gpu else "geforce"


def _runtime_mode(driver_version, driver_cuda, required, min_driver, branch,
                  datacenter_gpu, allow_forward_compat):
    """Mode from the CUDA versions alone: (mode, forward_compat_possible, reason)."""
    dv = parse_cuda_version(driver_cuda)
    if required is None:
        return "native", False, (f"No CUDA version is required; driver {driver_version} "
                                 f"supports CUDA {driver_cuda}.")
    rv = parse_cuda_version(required)
    if dv >= rv:
        return "native", False, (f"Driver {driver_version} supports CUDA {driver_cuda}, which "
                                 f"covers the required CUDA {required} natively.")
    floor = MINOR_VERSION_COMPAT_MIN_DRIVER.get(rv[0])
    fc_possible = branch in _forward_compat_branches(required)
    if dv[0] == rv[0] and floor and _dsl_compare_version(driver_version, ">=", floor) == 1:
        return "minor_version", fc_possible, (
            f"Driver {driver_version} supports CUDA {driver_cuda}, older than the required CUDA "
            f"{required}; CUDA {rv[0]}.x minor-version compatibility (driver >= {floor}) runs it "
            f"with a limited feature set: no JIT of PTX newer than CUDA {driver_cuda}, and APIs "
            "that need a newer driver fail.")
    if datacenter_gpu and fc_possible and allow_forward_compat:
        return "forward_compat", True, (
            f"Driver {driver_version} supports CUDA {driver_cuda}, older than the required CUDA "
            f"{required}; on this data-center GPU the image's CUDA forward-compatibility "
            f"libraries (cuda-compat) run CUDA {required} on branch {branch}.")
    why = (f"Driver {driver_version} supports CUDA {driver_cuda}, but the image needs CUDA "
           f"{required} (driver >= {min_driver or 'unknown'})")
    if dv[0] != rv[0]:
        why += f"; minor-version compatibility does not cross CUDA majors ({dv[0]} -> {rv[0]})"
    if fc_possible and datacenter_gpu:
        why += ("; forward compatibility could run it on this data-center GPU but "
                "allow_forward_compat is false")
    elif fc_possible:
        why += "; forward compatibility needs a data-center GPU"
    return "incompatible", fc_possible, why + "."


def _toolkit_gate(requirements, ccs, driver_version, driver_cuda, toolkit_brand):
    """nvidia-container-cli's verdict: every requirement, once per visible GPU
    (configure.c configure_command), or once with no device, up to the first failure.
    (ok, first failure text, UnknownProperty or None): a condition on a property it does
    not know, once read, is its "invalid expression" and stops the container like an
    unsatisfied one."""
    for value in requirements:
        for cc in (ccs or [None]):
            try:
                ok, text = evaluate_require_cuda(value, driver_version, brand=toolkit_brand,
                                                 arch=cc, driver_cuda=driver_cuda)
            except UnknownProperty as exc:
                return False, "invalid expression", exc
            if not ok:
                return False, text, None
    return True, None, None


def _architecture_problems(ccs, required, branch, arch_list, mode):
    """Sentences for each GPU the toolkit, the driver branch or the image's kernels miss."""
    problems = []
    for cc in ccs:
        name = _architecture(cc)
        if required and not toolkit_supports_architecture(required, cc):
            first, gone = TOOLKIT_ARCH_RANGE[cc]
            dropped = gone and parse_cuda_version(required) >= parse_cuda_version(gone)
            problems.append(f"CUDA {required} cannot run on compute capability {cc} ({name}): "
                            + (f"CUDA {gone} dropped it." if dropped
                               else f"support starts with CUDA {first}."))
        if not branch_supports_architecture(branch, cc):
            problems.append(f"Driver branch {branch} does not support compute capability {cc} "
                            f"({name}); the last branch for {name} is "
                            f"R{LAST_BRANCH_FOR_ARCHITECTURE[name]}.")
        if arch_list is not None and not arch_list_covers(arch_list, cc):
            problems.append(f"The image's kernels are built for {' '.join(arch_list)}, which does "
                            f"not cover compute capability {cc} ({name}): the first kernel launch "
                            "fails with 'no kernel image is available for execution on the device'.")
        elif (arch_list is not None and mode == "minor_version"
              and not arch_list_covers(arch_list, cc, allow_ptx=False)):
            problems.append(f"Compute capability {cc} ({name}) is covered only by PTX in "
                            f"{' '.join(arch_list)}, and under minor-version compatibility the "
                            f"driver cannot JIT-compile PTX from the newer CUDA {required}.")
    return problems


def gpu_kind(brand=None, datacenter_gpu=None, compute_capabilities=()):
    """(datacenter, why): whether the GPUs are data-center parts (forward compatibility
    needs them), from what proves it, in this order: ``datacenter_gpu`` as given; the
    brand (nvidia-smi's Tesla or NVIDIA: data-center; GeForce, TITAN, Quadro, NVIDIA RTX,
    ...: not; the toolkit's "unknown": undecided); compute capabilities that only
    data-center parts have (arch.DATACENTER_ONLY: 8.0, 9.0, 10.0, 10.3, 3.7). None when
    nothing decides (8.6 is an A10 or an RTX 3090)."""
    if datacenter_gpu is not None:
        return bool(datacenter_gpu), "datacenter_gpu was given"
    if brand:
        kind = _is_datacenter_brand(str(brand))
        if kind is not None:
            return kind, f"the brand {brand} is {'a data-center' if kind else 'not a data-center'} brand"
    ccs = [_known_cc(c) for c in (compute_capabilities or [])]
    if ccs and all(_datacenter_only(c) for c in ccs):
        return True, (f"compute capability {', '.join(sorted(set(ccs)))} is data-center only "
                      "(developer.nvidia.com/cuda-gpus)")
    return None, ("neither datacenter_gpu nor a brand that decides was given, and compute "
                  f"capability {', '.join(sorted(set(ccs))) or '(none given)'} is shared by "
                  "data-center and other GPUs")


def check(driver_version, compute_capabilities=(), cuda_version=None, require_cuda=None,
          image_arch_list=None, datacenter_gpu=None, allow_forward_compat=False, brand=None,
          compat_libs=None, toolkit_version=None, gpu_runtime="nvidia",
          cuda_compat_disabled=False):
    """Decide whether a host can run a CUDA image; returns the cuda_compat result dict.

    Whether the GPUs are data-center parts (``datacenter_gpu``; None: not said) is taken
    from what proves it (gpu_kind): the flag, the brand, or a data-center-only compute
    capability. Where nothing does, both are evaluated: the same verdict either way is
    returned as it is; different ones give ``depends_on_brand`` true, both ``outcomes``
    and the verdict that refuses, with the input that decides it as the first suggestion.
    The result says which (``datacenter_gpu``, ``datacenter_gpu_from``).
    """
    args = dict(compute_capabilities=compute_capabilities, cuda_version=cuda_version,
                require_cuda=require_cuda, image_arch_list=image_arch_list,
                allow_forward_compat=allow_forward_compat, brand=brand,
                compat_libs=compat_libs, toolkit_version=toolkit_version,
                gpu_runtime=gpu_runtime, cuda_compat_disabled=cuda_compat_disabled)
    kind, why = gpu_kind(brand, datacenter_gpu, compute_capabilities)
    if kind is not None:
        result = _check(driver_version, datacenter_gpu=kind, **args)
        return dict(result, datacenter_gpu=kind, datacenter_gpu_from=why, depends_on_brand=False)
    outcomes = {"datacenter": _check(driver_version, datacenter_gpu=True, **args),
                "other": _check(driver_version, datacenter_gpu=False, **args)}
    short = {k: {"compatible": v["compatible"], "mode": v["mode"]} for k, v in outcomes.items()}
    if short["datacenter"] == short["other"]:
        result = outcomes["other"]
        return dict(result, datacenter_gpu=None, datacenter_gpu_from=why, depends_on_brand=False)
    refused = "other" if not short["other"]["compatible"] else "datacenter"
    result = outcomes[refused]
    said = {k: ("runs" if v["compatible"] else "does not run") + f" ({v['mode']})" for k, v in short.items()}
    result["reasons"].insert(0, (
        f"This depends on the GPU, which nothing here decides ({why}): on a data-center GPU "
        f"(Tesla, or nvidia-smi's brand NVIDIA: A10, A40, L4, L40S) the image {said['datacenter']}; "
        f"on a GeForce, TITAN, Quadro or NVIDIA RTX it {said['other']}. The verdict below is "
        "the refusing one."))
    result["suggestions"].insert(0, (
        "Say which GPU this is: brand (nvidia-smi's Product Brand, as the preflight role "
        "passes it) or datacenter_gpu."))
    return dict(result, compatible=False, mode="incompatible", datacenter_gpu=None,
                datacenter_gpu_from=why, depends_on_brand=True, outcomes=short)


def _check(driver_version, compute_capabilities=(), cuda_version=None, require_cuda=None,
           image_arch_list=None, datacenter_gpu=False, allow_forward_compat=False, brand=None,
           compat_libs=None, toolkit_version=None, gpu_runtime="nvidia",
           cuda_compat_disabled=False):
    """check() for a GPU whose kind is known (``datacenter_gpu`` a bool).

    ``require_cuda`` is one NVIDIA_REQUIRE_CUDA value or a list of NVIDIA_REQUIRE_*
    values (all must hold, as the toolkit ANDs them).  ``cuda_version`` is the image's
    CUDA runtime ("13.0"); when absent it is read from the requirement's cuda>= term.
    ``brand`` is nvidia-smi's Product Brand or the toolkit's brand (see toolkit_brand());
    by default "tesla" for data-center GPUs and "geforce" otherwise.

    ``compat_libs`` says what the image has in /usr/local/cuda/compat: a dict
    (present, version "575.57.08", note from parse_compat_note, source "image"), or
    "assume" for what NVIDIA's CUDA base image of the required CUDA ships
    (assumed_compat_libs).  With it, the verdict follows what the container toolkit
    (``toolkit_version``, ``gpu_runtime`` "nvidia" or "cdi", ``cuda_compat_disabled``)
    really loads: see toolkit_loads_compat().  None (default): not evaluated.
    """
    parse_driver_version(driver_version)
    if toolkit_version:
        parse_toolkit_version(toolkit_version)
    if gpu_runtime not in GPU_RUNTIMES:
        toolkit_loads_compat(driver_version, None, None, gpu_runtime)   # raises
    driver_version = str(driver_version).strip()
    ccs = [_known_cc(c) for c in (compute_capabilities or [])]
    requirements = [require_cuda] if isinstance(require_cuda, str) else list(require_cuda or [])
    for r in requirements:
        if not isinstance(r, str):
            raise ValueError(f"NVIDIA_REQUIRE_CUDA must be a string, got {type(r).__name__}")
    arch_list = parse_arch_list(image_arch_list) if image_arch_list else None
    toolkit_brand = _toolkit_brand(brand, datacenter_gpu)

    branch = branch_of(driver_version)
    required = _cuda_str(parse_cuda_version(cuda_version)) if cuda_version else \
        _required_from_requirements(requirements)
    if _known_branch(branch) is None:
        return _older_than_the_table(driver_version, branch, required, requirements)
    driver_cuda = driver_cuda_version(driver_version)

    reasons, notes = [], []  # notes: caveats about the tables, said last
    if branch not in DRIVER_BRANCHES:
        notes.append(f"Driver branch {branch} is not in the branch table; it is assumed to "
                     f"support at least CUDA {driver_cuda}, like branch {_known_branch(branch)}.")
    # A CUDA NVIDIA never shipped (12.7) or one newer than the table is an error, not a
    # verdict: min_driver_for_cuda names the known releases and what to do.
    min_driver = min_driver_for_cuda(required) if required else None

    # 1. What the CUDA runtime in the container can do on this driver.
    mode, fc_possible, runtime_reason = _runtime_mode(
        driver_version, driver_cuda, required, min_driver, branch, datacenter_gpu,
        allow_forward_compat)

    # 2. The container toolkit's requirement check: it runs first and blocks the start,
    #    so when it refuses, no compatibility mode matters.
    gate_ok, unsatisfied, unknown = _toolkit_gate(requirements, ccs, driver_version,
                                                  driver_cuda, toolkit_brand)
    if unknown is not None or not gate_ok:
        refused = (f"nvidia-container-cli refuses to start the container on driver "
                   f"{driver_version} with a {toolkit_brand} GPU: \"requirement error: ")
        if unknown is not None:
            reasons.append(
                refused + f"invalid expression\". It reads the term {unknown.term!r} of "
                f"NVIDIA_REQUIRE_* {unknown.whole!r}, a condition on {unknown.name!r}, and "
                f"knows only the properties {', '.join(_RULES)} (libnvidia-container "
                "src/cli/dsl.c evaluate_rule). NVIDIA's Go requirements parser would skip the "
                "term (nvidia-container-toolkit factory_test.go 'unsupported property is "
                "ignored'), but docker --gpus does not use it (only the runtime's CSV mode on "
                "Tegra does).")
        else:
            reasons.append(
                refused + f"{unsatisfied}\". This check runs before any CUDA code, so "
                "minor-version or forward compatibility cannot help unless the image's "
                "requirement admits this driver.")
        if mode in ("minor_version", "forward_compat"):
            runtime_reason = "Were the container started, this would apply: " + runtime_reason
        reasons.append(runtime_reason)
        mode = "incompatible"
    else:
        reasons.append(runtime_reason)
        if requirements:
            reasons.append(f"NVIDIA_REQUIRE_CUDA is satisfied for a {toolkit_brand} GPU on "
                           f"driver {driver_version}: nvidia-container-cli will start the "
                           "container.")
        skipped = unknown_property_terms(requirements)
        if skipped:
            terms = ", ".join(repr(t) for t, _detail in skipped)
            reasons.append(
                f"Ignored on this host: {terms}, a condition on a property nvidia-container-cli "
                f"does not know ({', '.join(_RULES)}). It was not read: dsl_evaluate stops at "
                "the first alternative that holds and at the first false condition of an "
                "alternative. Where it is read (another driver or GPU), nvidia-container-cli "
                "refuses the container with 'requirement error: invalid expression'; NVIDIA's "
                "Go requirements parser (CSV mode only) would skip it.")
        elif mode != "native":
            reasons.append("No NVIDIA_REQUIRE_CUDA was given, so the container toolkit's own "
                           "check was not evaluated.")

    # 3. GPU architecture against the toolkit, the driver branch and the image's kernels.
    problems = _architecture_problems(ccs, required, branch, arch_list, mode)
    reasons.extend(problems + notes)
    if problems:
        mode = "incompatible"

    fc_blocked = (mode == "incompatible" and gate_ok and not problems and fc_possible
                  and datacenter_gpu and not allow_forward_compat
                  and parse_cuda_version(driver_cuda) < parse_cuda_version(required))
    compatible = mode != "incompatible"
    suggestions = []
    if not compatible:
        suggestions = _suggestions(driver_version, driver_cuda, required, ccs, datacenter_gpu,
                                   fc_possible, gate_ok or unknown is not None, arch_list,
                                   min_driver)
        if unknown is not None:
            suggestions[:0] = [
                f"Use an image whose NVIDIA_REQUIRE_* has no {unknown.term!r} (a derived image "
                "can set the variable again with ENV), or give the container "
                "NVIDIA_DISABLE_REQUIRE=true, which skips nvidia-container-cli's whole "
                "requirement check (the CUDA driver then decides at run time)."]
    elif mode == "forward_compat":
        suggestions.append("Start vLLM images with VLLM_ENABLE_CUDA_COMPATIBILITY=1 so they load "
                           "the bundled cuda-compat libraries.")
    elif mode == "minor_version":
        suggestions.append(f"For the full CUDA {required} feature set install driver branch "
                           f"{branch_of(min_driver)} (>= {min_driver})." if min_driver else
                           f"For the full feature set install a driver for CUDA {required}.")
    result = {
        "compatible": compatible,
        "mode": mode,
        "required_cuda": required,
        "driver_cuda": driver_cuda,
        "driver_branch": branch,
        "min_driver": min_driver,
        "require_cuda_satisfied": gate_ok if requirements else None,
        "unsatisfied_condition": unsatisfied,
        "reasons": reasons,
        "suggestions": suggestions,
    }
    # 4. What the container really loads: the image's forward-compatibility libraries.
    if compat_libs is not None:
        compat = compat_libs
        if compat == "assume":
            compat = assumed_compat_libs(required) if required else None
        if compat is not None:
            result = _compat_verdict(result, driver_version, compat, toolkit_version,
                                     gpu_runtime, cuda_compat_disabled, brand, datacenter_gpu,
                                     allow_forward_compat, fc_blocked)
    return result


def _older_than_the_table(driver_version, branch, required, requirements):
    """The verdict for a driver older than every branch of DRIVER_BRANCHES (a well-formed
    version, so a verdict, not an error): it predates CUDA 7.0, the oldest toolkit the
    table knows, so it runs no image gpufleet can name, and the toolkit's cuda>= check
    cannot be evaluated without the CUDA it supports."""
    oldest = min(DRIVER_BRANCHES)
    row = DRIVER_BRANCHES[oldest]
    min_driver = min_driver_for_cuda(required) if required else None
    need = (f"the image needs CUDA {required} (driver >= {min_driver})"
            if required else "no CUDA version was given")
    return {
        "compatible": False,
        "mode": "incompatible",
        "required_cuda": required,
        "driver_cuda": None,
        "driver_branch": branch,
        "min_driver": min_driver,
        "require_cuda_satisfied": None if not requirements else False,
        "unsatisfied_condition": None,
        "reasons": [
            f"Driver {driver_version} (branch {branch}) is older than the oldest branch in "
            f"NVIDIA's toolkit/driver table as kept here (R{oldest}, {row['min_driver']}, "
            f"CUDA {row['cuda']}): the CUDA it supports is older than {row['cuda']}, and "
            f"{need}. The container toolkit's NVIDIA_REQUIRE_CUDA check was not evaluated."],
        "suggestions": [
            "Install a current driver branch (nvidia_driver_branch: 580, the long-term "
            "branch) for this host's GPUs; check that the branch still supports them "
            "(Kepler's last branch is R470)."],
    }


def _suggestions(driver_version, driver_cuda, required, ccs, datacenter_gpu,
                 fc_possible, gate_ok, arch_list, min_driver):
    """Concrete fixes for an incompatible verdict, most direct first."""
    out = []
    dv = parse_cuda_version(driver_cuda)
    rv = parse_cuda_version(required) if required else None
    dropped = [cc for cc in ccs if required and not toolkit_supports_architecture(required, cc)]
    if rv is not None and (dv < rv or not gate_ok):
        out.append(f"Use an image built for CUDA {driver_cuda} or older (read its CUDA_VERSION / "
                   "NVIDIA_REQUIRE_CUDA, not its tag).")
        floor = MINOR_VERSION_COMPAT_MIN_DRIVER.get(dv[0])
        if (dv[0] < rv[0] and floor and dv[0] == 12
                and _dsl_compare_version(driver_version, ">=", floor) == 1):
            note = "" if datacenter_gpu else (
                "; on a non-data-center GPU the container toolkit admits it only with "
                "NVIDIA_DISABLE_REQUIRE=1")
            out.append("Or use a CUDA 12.x image such as vllm/vllm-openai:<tag>-cu129, which runs "
                       f"on this driver under minor-version compatibility (limited feature set){note}.")
        if min_driver and not dropped:
            target = branch_of(min_driver)
            blocked = [cc for cc in ccs if not branch_supports_architecture(target, cc)]
            if not blocked:
                out.append(f"Or install driver branch {target} (>= {min_driver}).")
        if datacenter_gpu and fc_possible and dv < rv:
            out.append("Or, on this data-center GPU, allow forward compatibility "
                       "(allow_forward_compat: true) and start vLLM images with "
                       "VLLM_ENABLE_CUDA_COMPATIBILITY=1.")
        elif not gate_ok and dv[0] == rv[0]:
            out.append("Or set NVIDIA_DISABLE_REQUIRE=1 on the container to skip the toolkit's "
                       "check; CUDA minor-version compatibility then applies, with its limits.")
    for cc in dropped:
        out.append(f"Compute capability {cc} needs an image built for CUDA 12.x or older "
                   "(CUDA 13 dropped Maxwell, Pascal and Volta), on driver branch 580 or older.")
    if arch_list is not None:
        missing = [cc for cc in ccs if not arch_list_covers(arch_list, cc)]
        if missing:
            out.append(f"Use an image whose TORCH_CUDA_ARCH_LIST includes {' '.join(missing)} "
                       "(or build one with it).")
    for cc in ccs:
        name = _architecture(cc)
        last = LAST_BRANCH_FOR_ARCHITECTURE.get(name)
        if last and branch_of(driver_version) > last:
            out.append(f"Install driver branch {last} or older for compute capability {cc} ({name}).")
    return out


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
    key = _cuda_str(parse_cuda_version(cuda))
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
        return tuple(_forward_compat_branches(cuda)) + (compat["branch"],), \
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
        newer = _dsl_compare_version(version, ">", driver_version) == 1
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


def _compat_verdict(result, driver_version, compat, toolkit_version, gpu_runtime,
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
