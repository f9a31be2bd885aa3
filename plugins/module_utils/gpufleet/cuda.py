"""Can this host run that CUDA image?  The verdict of the ``cuda_compat`` module.

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

:func:`check` combines both and returns the verdict of the ``cuda_compat`` module.  The
facts it reads live beside it, one subject each: gpufleet.cuda_versions (NVIDIA's
driver / CUDA / architecture tables), gpufleet.require_cuda (gate 1, the image's
requirements and labels) and gpufleet.compat_libs (the image's forward-compatibility
libraries and whether the container toolkit loads them).
"""
from __future__ import annotations

from .arch import datacenter_only as _datacenter_only
from .compat_libs import (GPU_RUNTIMES, assumed_compat_libs, compat_verdict,
                          parse_toolkit_version, toolkit_loads_compat)
from .cuda_versions import (DRIVER_BRANCHES, LAST_BRANCH_FOR_ARCHITECTURE,
                            MINOR_VERSION_COMPAT_MIN_DRIVER, TOOLKIT_ARCH_RANGE,
                            architecture_name, branch_of, branch_supports_architecture,
                            cuda_str, driver_cuda_version, forward_compat_branches,
                            known_branch, known_cc, min_driver_for_cuda, parse_cuda_version,
                            parse_driver_version, toolkit_supports_architecture)
from .gpu import is_datacenter_brand as _is_datacenter_brand
from .require_cuda import (RULES, TOOLKIT_BRANDS, UnknownProperty, arch_list_covers,
                           dsl_compare_version, evaluate_require_cuda, parse_arch_list,
                           split_term, unknown_property_terms)

MODES = ("native", "minor_version", "forward_compat", "incompatible")


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
                name, op, val, problem = split_term(term)
                if (problem is None and name == "cuda" and op in (">=", "=", ">")
                        and dsl_compare_version(val, "=", val) == 1):
                    numbers = [int(p) for p in val.split(".") if p] + [0]
                    return cuda_str(parse_cuda_version(f"{numbers[0]}.{numbers[1]}"))
    return None


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
    fc_possible = branch in forward_compat_branches(required)
    if dv[0] == rv[0] and floor and dsl_compare_version(driver_version, ">=", floor) == 1:
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
        name = architecture_name(cc)
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
    ccs = [known_cc(c) for c in (compute_capabilities or [])]
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
    ccs = [known_cc(c) for c in (compute_capabilities or [])]
    requirements = [require_cuda] if isinstance(require_cuda, str) else list(require_cuda or [])
    for r in requirements:
        if not isinstance(r, str):
            raise ValueError(f"NVIDIA_REQUIRE_CUDA must be a string, got {type(r).__name__}")
    arch_list = parse_arch_list(image_arch_list) if image_arch_list else None
    toolkit_brand = _toolkit_brand(brand, datacenter_gpu)

    branch = branch_of(driver_version)
    required = cuda_str(parse_cuda_version(cuda_version)) if cuda_version else \
        _required_from_requirements(requirements)
    if known_branch(branch) is None:
        return _older_than_the_table(driver_version, branch, required, requirements)
    driver_cuda = driver_cuda_version(driver_version)

    reasons, notes = [], []  # notes: caveats about the tables, said last
    if branch not in DRIVER_BRANCHES:
        notes.append(f"Driver branch {branch} is not in the branch table; it is assumed to "
                     f"support at least CUDA {driver_cuda}, like branch {known_branch(branch)}.")
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
                f"knows only the properties {', '.join(RULES)} (libnvidia-container "
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
                f"does not know ({', '.join(RULES)}). It was not read: dsl_evaluate stops at "
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
            result = compat_verdict(result, driver_version, compat, toolkit_version,
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
                and dsl_compare_version(driver_version, ">=", floor) == 1):
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
        name = architecture_name(cc)
        last = LAST_BRANCH_FOR_ARCHITECTURE.get(name)
        if last and branch_of(driver_version) > last:
            out.append(f"Install driver branch {last} or older for compute capability {cc} ({name}).")
    return out
