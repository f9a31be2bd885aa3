"""What an image requires of the host: NVIDIA_REQUIRE_CUDA as libnvidia-container reads it.

Plain data in, plain data out; no Ansible imports.  The image's NVIDIA_REQUIRE_*
requirements (from its environment, as nvidia-container-toolkit collects them), their
evaluation against a driver, GPU brand and architecture exactly as
`nvidia-container-cli configure --require` does it (the C source is cited below), and
the image's CUDA version and kernel architecture list from its labels.  The first of the
two gates of gpufleet.cuda's verdict.
"""
from __future__ import annotations

import re

from .cuda_versions import driver_cuda_version, parse_compute_capability, parse_driver_version


# ---------------------------------------------------------------------------------------
# NVIDIA_REQUIRE_CUDA, exactly as libnvidia-container evaluates it
# ---------------------------------------------------------------------------------------
#
# Path of a requirement on the (default, "legacy") docker --gpus / runtime=nvidia path
# (sources: NVIDIA/nvidia-container-toolkit at d34b3046758cb1a5db606b2a39519c731bbf9f56,
# NVIDIA/libnvidia-container src/cli/dsl.c at 5823754b8577d16fabf25a6ef6a1d58f7ff1e5dd and
# src/cli/configure.c at e27a4a75805021ffdfa9b56403921f50eb3b83d2; their test cases are
# ported in tests/unit/test_require_cuda.py):
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
RULES = ("cuda", "driver", "arch", "brand")
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
            f"property nvidia-container-cli does not know ({', '.join(RULES)}). NVIDIA's Go "
            "requirements parser (CSV mode) skips such a term, but on docker --gpus "
            "nvidia-container-cli refuses the container with 'requirement error: invalid "
            "expression' when it reads it")


def _unknown_property(term):
    """The property name of a condition on a property nvidia-container-cli does not know
    ("foo=bar" -> "foo"), else None (a known property, or no name or operator at all)."""
    i = _name_end(term)
    name = term[:i]
    return name if name and i < len(term) and name.lower() not in RULES else None


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


def split_term(term):
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
    elif name not in RULES:   # before the operator and value, as factory.go parse() reads it
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
    name, op, val, problem = split_term(term)
    if problem is None and (name == "brand" and op not in ("=", "!=")
                            or name != "brand" and dsl_compare_version(val, "=", val) < 0):
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


def dsl_compare_version(v1, cmp, v2):
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
        return dsl_compare_version(driver_cuda, op, val)
    if name == "driver":
        return dsl_compare_version(driver_version, op, val)
    if name == "arch":
        # configure.c check_device_arch: no visible device -> true
        return 1 if arch is None else dsl_compare_version(arch, op, val)
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
    name, op, val, problem = split_term(term)
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
