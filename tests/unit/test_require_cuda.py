"""NVIDIA's own tests as the spec for gpufleet.require_cuda's reading of an image's requirements.

Every case below is a case of NVIDIA's Go test suite, mapped onto gpufleet.require_cuda
and gpufleet.cuda, with the repository, commit, file, test and case name it comes from.  Sources read:

  TK   NVIDIA/nvidia-container-toolkit at d34b3046758cb1a5db606b2a39519c731bbf9f56
       internal/requirements/constraints/factory_test.go  (TestParse,
           TestNewConstraintFromRequirement)
       internal/requirements/constraints/logical_test.go  (TestANDConstraint, TestORConstraint)
       internal/config/image/cuda_image_test.go           (TestParseMajorMinorVersionValid,
           TestParseMajorMinorVersionInvalid, TestGetRequirements)
       cmd/nvidia-container-runtime-hook/container_config_test.go  (TestGetNvidiaConfig)
       and the code they test: internal/requirements/, internal/config/image/cuda_image.go,
       cmd/nvidia-container-runtime-hook/{main.go,container_config.go}, and the
       vendored github.com/Masterminds/semver/v3 v3.5.0 (vendor/.../version.go).
  LNC  NVIDIA/libnvidia-container src/cli/dsl.c at 5823754b8577d16fabf25a6ef6a1d58f7ff1e5dd
       (dsl_evaluate, evaluate_rule, dsl_compare_version), src/cli/configure.c at
       e27a4a75805021ffdfa9b56403921f50eb3b83d2 (the rules, configure_command).

The docker path (docker --gpus / runtime=nvidia, the toolkit's default "legacy" mode):
nvidia-container-runtime-hook reads the container's environment with cuda_image.go
(GetRequirements: every NVIDIA_REQUIRE_* but NVIDIA_REQUIRE_JETPACK*, plus
"cuda>=MAJOR.MINOR" from CUDA_VERSION for a legacy image; parseMajorMinorVersion reads
that version), passes each one as --require=..., and nvidia-container-cli evaluates them
with the C code of dsl.c.  The Go package internal/requirements is used only by
internal/modifier/csv.go (CSV mode, Tegra), so where its tests describe another result
than dsl.c gives, the case asserts what dsl.c does and says why (field ``c_differs``).

Left out, with the reason:
  * TestGetRequirements (cuda_image_test.go): its 8 cases are already ported, case for
    case, in tests/unit/test_cuda.py (test_image_requirements_follow_the_toolkit).
  * TestGetNvidiaConfig cases whose expected config is nil ("No environment,
    unprivileged/privileged", "Legacy image, devices 'empty'/'void'", "Modern image, no
    devices ... (no) image.EnvVarCudaVersion", "Modern image, devices 'empty'/'void'"):
    no device is requested, so the hook treats the container as a non-GPU container and
    checks no requirement.  cuda_compat answers for a container that gets GPUs (docker
    --gpus sets NVIDIA_VISIBLE_DEVICES), so those 8 cases do not apply.
  * TestGetNvidiaConfig "... migConfig set, unprivileged" and "... migMonitor set,
    unprivileged": the hook panics on MIG settings in an unprivileged container; that is
    about MIG access, not requirements.  The Devices, MigConfigDevices and
    DriverCapabilities fields of the other cases are not requirements either; only their
    Requirements field is ported.
  * cuda_image_test.go TestNewCUDAImageFromSpec, TestGetDevicesFromEnvvar,
    TestGetVisibleDevicesFromMounts, TestVisibleDevices, TestImexChannelsFromEnvVar,
    TestCDIDeviceRequestsFromAnnotations: device selection, mounts, IMEX and CDI
    annotations, not requirements.
  * internal/requirements/constraints/constraints_test.go: it holds no test.
"""
import pytest

from gpufleet import cuda
from gpufleet import require_cuda

TK = "NVIDIA/nvidia-container-toolkit@d34b3046758cb1a5db606b2a39519c731bbf9f56"
FACTORY_TEST = f"{TK} internal/requirements/constraints/factory_test.go"
LOGICAL_TEST = f"{TK} internal/requirements/constraints/logical_test.go"
IMAGE_TEST = f"{TK} internal/config/image/cuda_image_test.go"
HOOK_TEST = f"{TK} cmd/nvidia-container-runtime-hook/container_config_test.go"
DSL_C = "NVIDIA/libnvidia-container@5823754b8577d16fabf25a6ef6a1d58f7ff1e5dd src/cli/dsl.c"

HINT = ", please update your driver to a newer version, or use an earlier cuda container"

# Hosts the cases are evaluated on (driver -> CUDA from gpufleet.cuda_versions.DRIVER_BRANCHES).
D450 = "450.51.05"    # CUDA 11.0
D535 = "535.129.03"   # CUDA 12.2
D580 = "580.65.06"    # CUDA 13.0
ERROR = "invalid expression"   # nvidia-container-cli: "requirement error: invalid expression"


def evaluate(value, driver, **gpu):
    """dsl_evaluate's verdict: True, False, or ERROR when nvidia-container-cli fails."""
    try:
        ok, _ = require_cuda.evaluate_require_cuda(value, driver, **gpu)
    except ValueError as exc:
        assert ERROR in str(exc), exc
        return ERROR
    return ok


def case_id(case):
    return case["src"].split(" ", 1)[1]


# --------------------------------------------------------------------------------------
# factory_test.go TestParse: one condition.  "parsed" is parse_require_cuda()'s result
# (or ERROR); "on" maps a host driver to the verdict nvidia-container-cli gives there.
# --------------------------------------------------------------------------------------

PARSE_CASES = [
    dict(src=f"{FACTORY_TEST} TestParse 'empty is nil'", condition="",
         parsed=[], on={D535: True}),
    dict(src=f"{FACTORY_TEST} TestParse 'missing operator is invalid'", condition="notvalid",
         parsed=ERROR, on={D535: ERROR}),
    dict(src=f"{FACTORY_TEST} TestParse 'invalid property is invalid'", condition="foo=45",
         parsed=ERROR, on={D535: ERROR},
         c_differs="The Go factory returns nil (an unknown property is skipped), but "
                   "dsl.c evaluate_rule finds no rule named 'foo' and returns -1, so "
                   "nvidia-container-cli fails with 'invalid expression' whenever it "
                   "reaches the term (require_cuda.UnknownProperty; check() makes it a verdict)."),
    dict(src=f"{FACTORY_TEST} TestParse 'cuda must be semver'", condition="cuda=foo",
         parsed=ERROR, on={D535: ERROR}),
    dict(src=f"{FACTORY_TEST} TestParse 'cuda greater than equal'", condition="cuda>=11.6",
         parsed=[[("cuda", ">=", "11.6")]], on={D535: True, D450: False}),
    dict(src=f"{FACTORY_TEST} TestParse 'cuda greater than'", condition="cuda>11.6",
         parsed=[[("cuda", ">", "11.6")]], on={D535: True, D450: False}),
    dict(src=f"{FACTORY_TEST} TestParse 'cuda less than equal'", condition="cuda<=11.6",
         parsed=[[("cuda", "<=", "11.6")]], on={D535: False, D450: True}),
    dict(src=f"{FACTORY_TEST} TestParse 'cuda less than'", condition="cuda<11.6",
         parsed=[[("cuda", "<", "11.6")]], on={D535: False, D450: True}),
    dict(src=f"{FACTORY_TEST} TestParse 'cuda equal'", condition="cuda=11.6",
         parsed=[[("cuda", "=", "11.6")]], on={D535: False, D450: False}),
    dict(src=f"{FACTORY_TEST} TestParse 'cuda not equal'", condition="cuda!=11.6",
         parsed=[[("cuda", "!=", "11.6")]], on={D535: True, D450: True}),
]


@pytest.mark.parametrize("case", PARSE_CASES, ids=case_id)
def test_parse(case):
    if case["parsed"] == ERROR:
        with pytest.raises(ValueError, match=ERROR):
            require_cuda.parse_require_cuda(case["condition"])
    else:
        assert require_cuda.parse_require_cuda(case["condition"]) == case["parsed"]
    for driver, verdict in case["on"].items():
        assert evaluate(case["condition"], driver) == verdict, driver


# --------------------------------------------------------------------------------------
# factory_test.go TestNewConstraintFromRequirement: one requirement value.
# "on": (driver, arch or None for no visible device) -> verdict.
# --------------------------------------------------------------------------------------

REQUIREMENT_CASES = [
    dict(src=f"{FACTORY_TEST} TestNewConstraintFromRequirement 'empty is nil'",
         requirement="", parsed=[], on={(D535, "8.0"): True}),
    dict(src=f"{FACTORY_TEST} TestNewConstraintFromRequirement 'malformed constraint is invalid'",
         requirement="notvalid", parsed=ERROR, on={(D535, "8.0"): ERROR}),
    dict(src=f"{FACTORY_TEST} TestNewConstraintFromRequirement 'unsupported property is ignored'",
         requirement="cuda>=11.6 foo=bar", parsed=ERROR,
         on={(D535, "8.0"): True, (D450, "8.0"): ERROR},
         c_differs="The Go factory drops foo=bar and keeps cuda>=11.6.  dsl_evaluate "
                   "evaluates the space-separated alternatives in order and stops at the "
                   "first that holds: on CUDA 12.2 cuda>=11.6 holds and foo=bar is never "
                   "read (no error); on CUDA 11.0 it reads foo=bar, knows no rule 'foo' and "
                   "fails with 'invalid expression'.  parse_require_cuda checks every term, "
                   "so it names foo=bar."),
    dict(src=f"{FACTORY_TEST} TestNewConstraintFromRequirement 'space-separated is and'",
         requirement="cuda>=11.6 arch=5.3",
         parsed=[[("cuda", ">=", "11.6")], [("arch", "=", "5.3")]],
         on={(D535, "8.0"): True, (D450, "5.3"): True, (D450, "8.0"): False},
         c_differs="The case's name says AND and it expects and(...), but the Go code builds "
                   "or(...) from it (a space separates OR terms in factory.go) and "
                   "require.EqualValues converts the one slice type into the other, so the "
                   "Go test cannot tell.  dsl.c splits on ' ' into alternatives (OR): on "
                   "CUDA 11.0 with a compute capability 5.3 GPU the second alternative holds."),
    dict(src=f"{FACTORY_TEST} TestNewConstraintFromRequirement 'comma-separated is or'",
         requirement="cuda>=11.6,arch=5.3",
         parsed=[[("cuda", ">=", "11.6"), ("arch", "=", "5.3")]],
         on={(D535, "8.0"): False, (D535, "5.3"): True, (D535, None): True,
             (D450, "5.3"): False},
         c_differs="Named OR and expecting or(...), but factory.go ANDs comma-separated "
                   "factors (EqualValues hides it again), and dsl.c splits each "
                   "alternative on ',' into conditions that must all hold (AND).  With no "
                   "visible device configure.c check_device_arch holds."),
    dict(src=f"{FACTORY_TEST} TestNewConstraintFromRequirement 'and takes precedence'",
         requirement="cuda<13.6 cuda>=11.6,arch=5.3",
         parsed=[[("cuda", "<", "13.6")], [("cuda", ">=", "11.6"), ("arch", "=", "5.3")]],
         on={(D580, "8.0"): True, (D450, "5.3"): True}),
]


@pytest.mark.parametrize("case", REQUIREMENT_CASES, ids=case_id)
def test_new_constraint_from_requirement(case):
    if case["parsed"] == ERROR:
        with pytest.raises(ValueError, match=ERROR):
            require_cuda.parse_require_cuda(case["requirement"])
    else:
        assert require_cuda.parse_require_cuda(case["requirement"]) == case["parsed"]
    for (driver, arch), verdict in case["on"].items():
        assert evaluate(case["requirement"], driver, arch=arch) == verdict, (driver, arch)


def test_unsatisfied_message_names_the_first_term_of_the_value():
    # dsl.c dsl_evaluate: the message is the value up to its first space, with the driver
    # hint only when that starts with "cuda>=".
    ok, text = require_cuda.evaluate_require_cuda("cuda>=11.6,arch=5.3", D535, arch="8.0")
    assert not ok and text == "unsatisfied condition: cuda>=11.6,arch=5.3" + HINT
    ok, text = require_cuda.evaluate_require_cuda("cuda<11.6 brand=tesla", D535, brand="geforce")
    assert not ok and text == "unsatisfied condition: cuda<11.6"


# --------------------------------------------------------------------------------------
# logical_test.go TestANDConstraint / TestORConstraint.  Go builds and()/or() of mock
# constraints; in dsl.c an AND is a comma-joined alternative and an OR space-joined
# alternatives.  ALWAYS and NEVER are conditions that hold / fail on driver 535 (CUDA 12.2).
# --------------------------------------------------------------------------------------

ALWAYS, NEVER = "cuda>=7.0", "cuda>=99.0"

LOGICAL_CASES = [
    dict(src=f"{LOGICAL_TEST} TestANDConstraint 'empty is always true'",
         join=",", terms=[], expected=True),
    dict(src=f"{LOGICAL_TEST} TestANDConstraint 'single true constraint is true'",
         join=",", terms=[ALWAYS], expected=True),
    dict(src=f"{LOGICAL_TEST} TestANDConstraint 'single false constraint is false'",
         join=",", terms=[NEVER], expected=False),
    dict(src=f"{LOGICAL_TEST} TestANDConstraint 'multiple true constraints are true'",
         join=",", terms=[ALWAYS, ALWAYS], expected=True),
    dict(src=f"{LOGICAL_TEST} TestANDConstraint 'mixed constraints are false (first is true)'",
         join=",", terms=[ALWAYS, NEVER], expected=False),
    dict(src=f"{LOGICAL_TEST} TestANDConstraint 'mixed constraints are false (last is true)'",
         join=",", terms=[NEVER, ALWAYS], expected=False),
    dict(src=f"{LOGICAL_TEST} TestORConstraint 'empty is always false'",
         join=" ", terms=[], expected=True,
         c_differs="Go's or() of nothing fails, but the factory never builds it (OR() of no "
                   "terms is nil and the requirement is skipped), and dsl_evaluate starts "
                   "with ret = true: an empty NVIDIA_REQUIRE_* value always holds."),
    dict(src=f"{LOGICAL_TEST} TestORConstraint 'single true constraint is true'",
         join=" ", terms=[ALWAYS], expected=True),
    dict(src=f"{LOGICAL_TEST} TestORConstraint 'single false constraint is false'",
         join=" ", terms=[NEVER], expected=False),
    dict(src=f"{LOGICAL_TEST} TestORConstraint 'multiple true constraints are true'",
         join=" ", terms=[ALWAYS, ALWAYS], expected=True),
    dict(src=f"{LOGICAL_TEST} TestORConstraint 'mixed constraints are true (first is true)'",
         join=" ", terms=[ALWAYS, NEVER], expected=True),
    dict(src=f"{LOGICAL_TEST} TestORConstraint 'mixed constraints are true (last is true)'",
         join=" ", terms=[NEVER, ALWAYS], expected=True),
]


@pytest.mark.parametrize("case", LOGICAL_CASES, ids=case_id)
def test_logical(case):
    assert evaluate(case["join"].join(case["terms"]), D535) == case["expected"]


# --------------------------------------------------------------------------------------
# cuda_image_test.go TestParseMajorMinorVersionValid / Invalid: the CUDA_VERSION of a
# legacy image (no NVIDIA_REQUIRE_CUDA) becomes the requirement cuda>=MAJOR.MINOR; one
# the toolkit cannot read makes the hook panic ("failed to get requirements"), so the
# container does not start.
# --------------------------------------------------------------------------------------

MAJOR_MINOR_VALID = [("0", "0.0"), ("8", "8.0"), ("7.5", "7.5"), ("9.0.116", "9.0"),
                     ("4294967295.4294967295.4294967295", "4294967295.4294967295"),
                     ("v11.6", "11.6")]
MAJOR_MINOR_INVALID = ["foo", "foo.5.10", "9.0.116.50", "9.0.116foo", "7.foo", "9.0.bar",
                       "9.4294967296", "9.0.116.", "9..0", "9.", ".5.10", "-9", "+9",
                       "-9.1.116", "-9.-1.-116"]


@pytest.mark.parametrize("version,expected", MAJOR_MINOR_VALID,
                         ids=[f"TestParseMajorMinorVersionValid '{v}'"
                              for v, _ in MAJOR_MINOR_VALID])
def test_parse_major_minor_version_valid(version, expected):
    # Source: IMAGE_TEST TestParseMajorMinorVersionValid, case named by the version.
    assert require_cuda.toolkit_major_minor(version) == expected
    info = require_cuda.image_requirements([f"CUDA_VERSION={version}"])
    assert info["requirements"] == [f"cuda>={expected}"]
    assert info["cuda_version"] == expected
    # And nvidia-container-cli's verdict on that requirement (dsl.c): 4294967295 is far
    # below its own bound (UINTMAX_MAX), so that one is unsatisfied, not an error.
    ok, text = require_cuda.evaluate_require_cuda(f"cuda>={expected}", D535)
    if expected.startswith("4294967295"):
        assert not ok and text == f"unsatisfied condition: cuda>={expected}" + HINT
    else:
        assert ok


@pytest.mark.parametrize("version", MAJOR_MINOR_INVALID,
                         ids=[f"TestParseMajorMinorVersionInvalid '{v}'"
                              for v in MAJOR_MINOR_INVALID])
def test_parse_major_minor_version_invalid(version):
    # Source: IMAGE_TEST TestParseMajorMinorVersionInvalid, case named by the version.
    with pytest.raises(ValueError):
        require_cuda.toolkit_major_minor(version)
    with pytest.raises(ValueError, match="failed to get requirements"):
        require_cuda.image_requirements([f"CUDA_VERSION={version}"])
    # GetRequirements reads CUDA_VERSION only for a legacy image whose requirements are
    # not disabled: otherwise the same value is no error.
    for extra in (["NVIDIA_REQUIRE_CUDA=cuda>=11.6"], ["NVIDIA_DISABLE_REQUIRE=true"]):
        info = require_cuda.image_requirements([f"CUDA_VERSION={version}"] + extra)
        assert info["cuda_version"] is None
        assert info["requirements"] == (["cuda>=11.6"] if "NVIDIA_REQUIRE_CUDA" in extra[0] else [])


def test_sources_of_the_major_minor_cases():
    # The two lists above are the complete tables of IMAGE_TEST at TK's commit.
    assert len(MAJOR_MINOR_VALID) == 6 and len(MAJOR_MINOR_INVALID) == 15


# --------------------------------------------------------------------------------------
# container_config_test.go TestGetNvidiaConfig: the Requirements the hook passes to
# nvidia-container-cli (require.ElementsMatch: order does not matter), for every case that
# yields a config.  Device, capability and MIG variables do not change them.
# --------------------------------------------------------------------------------------

_REQ = {"NVIDIA_REQUIRE_REQ0": "req0=true", "NVIDIA_REQUIRE_REQ1": "req1=false"}
_DISABLE = {"NVIDIA_DISABLE_REQUIRE": "true"}
_VIS = "NVIDIA_VISIBLE_DEVICES"
_CAPS = "NVIDIA_DRIVER_CAPABILITIES"
_LEGACY = {"CUDA_VERSION": "9.0"}
_MODERN = {"NVIDIA_REQUIRE_CUDA": "cuda>=9.0"}
_THREE = ["cuda>=9.0", "req0=true", "req1=false"]

HOOK_CASES = [
    ("Legacy image, no devices, no capabilities, no requirements", _LEGACY, ["cuda>=9.0"]),
    ("Legacy image, devices 'all', no capabilities, no requirements",
     {**_LEGACY, _VIS: "all"}, ["cuda>=9.0"]),
    ("Legacy image, devices 'none', no capabilities, no requirements",
     {**_LEGACY, _VIS: "none"}, ["cuda>=9.0"]),
    ("Legacy image, devices set, no capabilities, no requirements",
     {**_LEGACY, _VIS: "gpu0,gpu1"}, ["cuda>=9.0"]),
    ("Legacy image, devices set, capabilities 'empty', no requirements",
     {**_LEGACY, _VIS: "gpu0,gpu1", _CAPS: ""}, ["cuda>=9.0"]),
    ("Legacy image, devices set, capabilities 'all', no requirements",
     {**_LEGACY, _VIS: "gpu0,gpu1", _CAPS: "all"}, ["cuda>=9.0"]),
    ("Legacy image, devices set, capabilities set, no requirements",
     {**_LEGACY, _VIS: "gpu0,gpu1", _CAPS: "video,display"}, ["cuda>=9.0"]),
    ("Legacy image, devices set, capabilities set, requirements set",
     {**_LEGACY, _VIS: "gpu0,gpu1", _CAPS: "video,display", **_REQ}, _THREE),
    ("Legacy image, devices set, capabilities set, requirements set, disable requirements",
     {**_LEGACY, _VIS: "gpu0,gpu1", _CAPS: "video,display", **_REQ, **_DISABLE}, []),
    ("Modern image, devices 'all', no capabilities, no requirements",
     {**_MODERN, _VIS: "all"}, ["cuda>=9.0"]),
    ("Modern image, devices 'none', no capabilities, no requirements",
     {**_MODERN, _VIS: "none"}, ["cuda>=9.0"]),
    ("Modern image, devices set, no capabilities, no requirements",
     {**_MODERN, _VIS: "gpu0,gpu1"}, ["cuda>=9.0"]),
    ("Modern image, devices set, capabilities 'empty', no requirements",
     {**_MODERN, _VIS: "gpu0,gpu1", _CAPS: ""}, ["cuda>=9.0"]),
    ("Modern image, devices set, capabilities 'all', no requirements",
     {**_MODERN, _VIS: "gpu0,gpu1", _CAPS: "all"}, ["cuda>=9.0"]),
    ("Modern image, devices set, capabilities set, no requirements",
     {**_MODERN, _VIS: "gpu0,gpu1", _CAPS: "video,display"}, ["cuda>=9.0"]),
    ("Modern image, devices set, capabilities set, requirements set",
     {**_MODERN, _VIS: "gpu0,gpu1", _CAPS: "video,display", **_REQ}, _THREE),
    ("Modern image, devices set, capabilities set, requirements set, disable requirements",
     {**_MODERN, _VIS: "gpu0,gpu1", _CAPS: "video,display", **_REQ, **_DISABLE}, []),
    ("No cuda envs, devices 'all'", {_VIS: "all"}, []),
    ("Modern image, devices 'all', migConfig set, privileged",
     {**_MODERN, _VIS: "all", "NVIDIA_MIG_CONFIG_DEVICES": "mig0,mig1"}, ["cuda>=9.0"]),
    ("Modern image, devices 'all', migMonitor set, privileged",
     {**_MODERN, _VIS: "all", "NVIDIA_MIG_MONITOR_DEVICES": "mig0,mig1"}, ["cuda>=9.0"]),
    ("Hook config set as driver-capabilities-all", {_VIS: "all", _CAPS: "all"}, []),
    ("Hook config set, envvar sets driver-capabilities",
     {_VIS: "all", _CAPS: "video,display"}, []),
    ("Hook config set, envvar unset sets default driver-capabilities", {_VIS: "all"}, []),
    ("Hook config set, swarmResource overrides device selection",
     {_VIS: "all", "DOCKER_SWARM_RESOURCE": "GPU1,GPU2"}, []),
    ("Hook config set, comma separated swarmResource is split and overrides device selection",
     {_VIS: "all", "DOCKER_SWARM_RESOURCE": "GPU1,GPU2"}, []),
]


@pytest.mark.parametrize("description,env,expected", HOOK_CASES,
                         ids=[f"TestGetNvidiaConfig '{d}'" for d, _, _ in HOOK_CASES])
def test_get_nvidia_config_requirements(description, env, expected):
    # Source: HOOK_TEST TestGetNvidiaConfig, case named by its description.
    info = require_cuda.image_requirements([f"{k}={v}" for k, v in env.items()])
    assert sorted(info["requirements"]) == sorted(expected)
    assert info["disabled"] is ("NVIDIA_DISABLE_REQUIRE" in env)
    if "req0=true" in expected:
        # The Go test only checks what the hook passes on.  nvidia-container-cli then
        # evaluates "req0=true": dsl.c has no rule named req0, so it fails with
        # "requirement error: invalid expression" and the container does not start.
        # check() gives that verdict, with the term, not an input error.
        result = cuda.check(D535, compute_capabilities=["8.0"], require_cuda=info["requirements"])
        assert result["compatible"] is False and result["require_cuda_satisfied"] is False
        assert result["unsatisfied_condition"] == ERROR
        assert "'req0=true'" in result["reasons"][0]
    elif expected:
        # "devices 'none'": the requirements are still passed; with no visible GPU
        # configure.c evaluates them once with no device.
        assert cuda.check(D535, compute_capabilities=["8.0"],
                          require_cuda=info["requirements"])["require_cuda_satisfied"]
        assert require_cuda.evaluate_require_cuda("cuda>=9.0", D535, brand=None, arch=None)[0]


def test_every_case_is_counted():
    # 10 + 6 + 12 + 6 + 15 + 25 ported cases (the TestGetRequirements 8 live in test_cuda.py).
    assert (len(PARSE_CASES), len(REQUIREMENT_CASES), len(LOGICAL_CASES),
            len(MAJOR_MINOR_VALID), len(MAJOR_MINOR_INVALID), len(HOOK_CASES)) == \
        (10, 6, 12, 6, 15, 25)
    for case in PARSE_CASES + REQUIREMENT_CASES + LOGICAL_CASES:
        assert case["src"].startswith(TK) and " Test" in case["src"]


# --------------------------------------------------------------------------------------
# What dsl.c does that no Go test covers, and that the cases above rely on.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("value,gpu,verdict", [
    # evaluate_rule: strncmp(ptr, operator, n) with n the length of the run of "<>=!",
    # so a lone "!" is the first operator it prefixes: "!=".
    ("cuda!12.2", {}, False), ("cuda!11.6", {}, True),
    # The conditions of an alternative are read in order and reading stops at the first
    # false one: a bad term after it is never read.
    ("cuda>=99.0,foo=1 cuda>=12.0", {}, True), ("cuda>=12.0,foo=1", {}, ERROR),
    # check_device_brand / check_device_arch: no visible device holds before any
    # comparison; with one, a brand compares only with = and !=.
    ("brand>=tesla", {"brand": None}, True), ("brand>=tesla", {"brand": "tesla"}, ERROR),
    ("arch>=foo", {"arch": None}, True), ("arch>=foo", {"arch": "8.0"}, ERROR),
    # dsl_compare_version: strtoumax() == UINTMAX_MAX is an error (also on overflow) ...
    ("cuda>=18446744073709551615", {}, ERROR), ("cuda>=99999999999999999999999", {}, ERROR),
    ("cuda>=18446744073709551614", {}, False),
    # ... but only for the parts it reads: the loop stops at the shorter version.
    ("cuda>=12.2.99999999999999999999999", {}, False),
    # A false condition is formatted into char buf[EXPR_MAX = 128]; when "name op value"
    # does not fit, evaluate_rule returns -1.
    ("brand=" + "x" * 119, {"brand": "geforce"}, False),
    ("brand=" + "x" * 120, {"brand": "geforce"}, ERROR),
    ("brand=" + "x" * 120, {"brand": "x" * 120}, True),
    # Empty alternatives are skipped; one of empty conditions ends the loop with the
    # result so far.
    (",", {}, True), ("cuda>=99.0 ,", {}, False), ("cuda>=99.0  cuda>=12.0", {}, True),
])
def test_dsl_c_details(value, gpu, verdict):
    # Source: DSL_C (evaluate_rule, dsl_evaluate, dsl_compare_version) and configure.c.
    assert evaluate(value, D535, **gpu) == verdict


def test_check_follows_the_lazy_evaluation():
    # An unknown property in a later alternative is no error when an earlier one holds:
    # check() gives the verdict nvidia-container-cli gives, and reads the CUDA floor from
    # the first alternative.  Where it is read, the verdict is nvidia-container-cli's
    # "invalid expression" (see the unknown-property tests below).
    result = cuda.check(D535, compute_capabilities=["8.0"], require_cuda="cuda>=12.2 foo=bar")
    assert result["require_cuda_satisfied"] and result["required_cuda"] == "12.2"
    result = cuda.check(D535, compute_capabilities=["8.0"], require_cuda="cuda>=12.4 foo=bar")
    assert result["require_cuda_satisfied"] is False and result["unsatisfied_condition"] == ERROR
    # "cuda>=12" is "cuda>=12.0" to dsl_compare_version.
    assert cuda.check(D535, require_cuda="cuda>=12")["required_cuda"] == "12.0"


# --------------------------------------------------------------------------------------
# A condition on a property nvidia-container-cli does not know (#34 item 6).
#   TK internal/requirements/constraints/factory.go parse(): no "<>=!" -> error "invalid
#     constraint"; an unknown property -> nil, skipped ("Skipping unsupported
#     constraint"); used only by internal/modifier/csv.go (CSV mode, Tegra).
#   TK factory_test.go TestParse 'invalid property is invalid' (foo=45 -> nil, no error),
#     TestNewConstraintFromRequirement 'unsupported property is ignored'
#     (cuda>=11.6 foo=bar -> cuda>=11.6).
#   LNC src/cli/dsl.c evaluate_rule(): the rules are cuda, driver, arch and brand
#     (configure.c rules[]); no rule of that name returns -1 and dsl_evaluate() sets
#     "invalid expression"; configure.c prints "requirement error: invalid expression" and
#     the container does not start (docker --gpus, the toolkit's legacy mode:
#     cmd/nvidia-container-runtime-hook/main.go passes every requirement as --require=).
#   A real report of that message on docker --gpus: mudler/LocalAI issue #4789.
# --------------------------------------------------------------------------------------

def test_an_unknown_property_that_is_read_is_the_toolkits_refusal_not_an_input_error():
    # TK factory_test.go TestNewConstraintFromRequirement 'unsupported property is ignored'
    # on a CUDA 11.0 host: the Go parser keeps cuda>=11.6 (false there); dsl.c reads
    # foo=bar after it and fails.  Control: main's check() raised ValueError ("malformed").
    result = cuda.check(D450, compute_capabilities=["8.0"], require_cuda="cuda>=11.6 foo=bar",
                        datacenter_gpu=True)
    assert result["compatible"] is False and result["mode"] == "incompatible"
    assert result["require_cuda_satisfied"] is False
    assert result["unsatisfied_condition"] == ERROR
    first = result["reasons"][0]
    assert '"requirement error: invalid expression"' in first and "'foo=bar'" in first
    assert "'foo'" in first and "cuda, driver, arch, brand" in first
    assert "unsupported property is ignored" in first
    assert result["suggestions"][0].startswith("Use an image whose NVIDIA_REQUIRE_* has no 'foo=bar'")
    assert "NVIDIA_DISABLE_REQUIRE=true" in result["suggestions"][0]


def test_an_unknown_property_that_is_not_read_is_ignored_with_a_reason():
    # LNC dsl.c dsl_evaluate(): the alternatives are read in order up to the first that
    # holds, so on CUDA 12.2 foo=bar is never read and the container starts, as the Go
    # test's 'unsupported property is ignored' expects.  The verdict says it was ignored,
    # and what happens where it is read.  Control: main returned no such reason.
    result = cuda.check(D535, compute_capabilities=["8.0"], require_cuda="cuda>=11.6 foo=bar",
                        datacenter_gpu=True)
    assert result["compatible"] and result["require_cuda_satisfied"] is True
    said = [r for r in result["reasons"] if r.startswith("Ignored on this host: 'foo=bar'")]
    assert len(said) == 1 and ERROR in said[0] and "CSV mode" in said[0]


@pytest.mark.parametrize("value,fragment", [
    # TK factory.go parse(): no operator character is "invalid constraint" there too.
    ("notvalid", "no comparison operator"),
    # A known property with a bad value: factory.go p.Validate(value) fails (TestParse
    # 'cuda must be semver'); dsl.c dsl_compare_version returns -1.
    ("cuda=foo", "'foo' is not a version"),
])
def test_a_truly_malformed_term_is_still_an_input_error(value, fragment):
    with pytest.raises(ValueError, match=fragment) as exc:
        cuda.check(D535, compute_capabilities=["8.0"], require_cuda=value)
    assert type(exc.value).__name__ != "UnknownProperty" and "malformed" in str(exc.value)


def test_legacy_image_version_feeds_the_runtime_check():
    # A legacy image's CUDA_VERSION "v11.6" is CUDA 11.6 to the toolkit, and to check().
    info = require_cuda.image_requirements(["CUDA_VERSION=v11.6"])
    result = cuda.check(D535, compute_capabilities=["8.0"], cuda_version=info["cuda_version"],
                        require_cuda=info["requirements"])
    assert result["compatible"] and result["required_cuda"] == "11.6"
