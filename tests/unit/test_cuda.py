"""Tests of gpufleet.cuda (driver / CUDA / architecture compatibility) and the
cuda_compat module.

Every verdict case names where its numbers come from: NVIDIA's release notes and
compatibility guide, the container toolkit's source, or a public field report.
Image environments are real captures under tests/fixtures/images (see SOURCES.md).
"""
import json
import subprocess
import uuid
import xml.etree.ElementTree as ET

import pytest

from conftest import FIXTURES
from gpufleet import cuda, gpu, hoststack
from gpufleet import cuda_versions
from gpufleet import require_cuda
from helpers import docker_answers, run_module

import cuda_compat

IMAGES = FIXTURES / "images"


def image_env(name):
    return json.loads((IMAGES / name).read_text())


def require_of(name):
    return require_cuda.image_requirements(image_env(name))["requirements"]


V085 = "vllm-openai-v0.8.5.env.json"          # CUDA 12.4.0
V016 = "vllm-openai-v0.16.0-cu129.env.json"   # CUDA 12.9.1
V023 = "vllm-openai-v0.23.0.env.json"         # CUDA 13.0.2

TOOLKIT_MSG = ", please update your driver to a newer version, or use an earlier cuda container"


# --------------------------------------------------------------------------------------
# Tables against NVIDIA's published numbers
# --------------------------------------------------------------------------------------

# NVIDIA CUDA Toolkit release notes, Table 3 "CUDA Toolkit and Corresponding Driver
# Versions" (Linux x86_64), e.g. "CUDA 13.0 GA >=580.65.06", "CUDA 12.2 Update 2
# >=535.104.05", "CUDA 12.8 GA >=570.26".
@pytest.mark.parametrize("version,update,driver", [
    ("13.0", None, "580.65.06"), ("13.0", 1, "580.82.07"), ("13.0", 2, "580.95.05"),
    ("12.9", None, "575.51.03"), ("12.9", 1, "575.57.08"),
    ("12.8", None, "570.26"), ("12.8", 1, "570.124.06"),
    ("12.6", 3, "560.35.05"), ("12.4", None, "550.54.14"), ("12.4", 1, "550.54.15"),
    ("12.2", None, "535.54.03"), ("12.2", 2, "535.104.05"),
    ("12.0", None, "525.60.13"), ("11.8", None, "520.61.05"),
    ("13.1", None, "590.44.01"), ("13.2", 1, "595.58.03"),
    ("12.9.1", None, "575.51.03"),  # a full CUDA_VERSION is reduced to major.minor
])
def test_min_driver_for_cuda_matches_release_notes(version, update, driver):
    assert cuda_versions.min_driver_for_cuda(version, update) == driver


def test_min_driver_rejects_unreleased_and_unknown_updates():
    with pytest.raises(ValueError, match="no 12.7 toolkit"):
        cuda_versions.min_driver_for_cuda("12.7")
    with pytest.raises(ValueError, match="CUDA 12.8 has no update 5"):
        cuda_versions.min_driver_for_cuda("12.8", 5)
    with pytest.raises(ValueError, match="malformed"):
        cuda_versions.min_driver_for_cuda("twelve")


@pytest.mark.parametrize("driver,expected,source", [
    # pascal-pkgs-ci issue #8: "NVIDIA-SMI 535.230.02 Driver Version: 535.230.02 CUDA Version: 12.2"
    ("535.230.02", "12.2", "sasha0552/pascal-pkgs-ci#8 nvidia-smi"),
    # llama.cpp issue #9665 comment: "Driver Version: 535.104.05 CUDA Version: 12.2"
    ("535.104.05", "12.2", "ggml-org/llama.cpp#9665"),
    # Lvllmds4 issue #46: "NVIDIA-SMI 570.195.03 Driver Version: 570.195.03 CUDA Version: 12.8"
    ("570.195.03", "12.8", "guqiong96/Lvllmds4#46 nvidia-smi"),
    # vLLM issue #5635: "cuda==12.1, nvidia driver == 530"
    ("530.30.02", "12.1", "vllm-project/vllm#5635"),
    # CUDA compatibility guide, minor-version example: 450.80.02 shipped with CUDA 11.0
    ("450.80.02", "11.0", "NVIDIA CUDA Compatibility guide"),
    # 565 shipped without a toolkit; its nvidia-smi shows CUDA 12.7
    ("565.57.01", "12.7", "565 branch"),
    ("580.119.02", "13.0", "R580 = CUDA 13.0 (release notes Table 3)"),
])
def test_driver_cuda_version_matches_nvidia_smi(driver, expected, source):
    assert cuda_versions.driver_cuda_version(driver) == expected, source


# Every branch NVIDIA published a toolkit for, from Table 3's oldest rows (CUDA 7.0,
# R346) to R610, and drivers older than the table (R304, R340: CUDA 5/6.5 era): each
# well-formed driver gets a verdict, never an error (issue 14, "every driver NVIDIA has
# published"). The real capture telegraf-gtx-1660-ti.xml (418.43, CUDA 10.1) is checked by
# test_branch_table_matches_real_nvidia_smi_captures below.
OLD_DRIVERS = [("304.137", None), ("340.108", None), ("346.46", "7.0"), ("352.31", "7.5"),
               ("367.48", "8.0"), ("375.26", "8.0"), ("384.81", "9.0"), ("390.46", "9.1"),
               ("396.37", "9.2"), ("410.48", "10.0"), ("418.39", "10.1"), ("430.64", "10.1"),
               ("440.33", "10.2"), ("450.51.05", "11.0")]


@pytest.mark.parametrize("driver,expected", OLD_DRIVERS, ids=[d for d, _ in OLD_DRIVERS])
def test_every_published_driver_gets_a_verdict(driver, expected):
    for image_cuda in ("13.0", "12.2", "10.1", "9.0"):  # 13.0: no driver here is new enough
        # a Pascal GPU (6.1: CUDA 8.0 to 12.x), which every one of these images but 13.0 builds for
        result = cuda.check(driver, ["6.1"], cuda_version=image_cuda)
        assert result["driver_cuda"] == expected
        if expected is None:  # older than the table: never compatible, and says why
            assert not result["compatible"] and result["mode"] == "incompatible"
            assert "older than the oldest branch" in result["reasons"][0]
            assert "nvidia_driver_branch: 580" in result["suggestions"][0]
        else:  # natively compatible exactly when the driver's CUDA covers the image's
            native = cuda_versions.parse_cuda_version(expected) >= cuda_versions.parse_cuda_version(image_cuda)
            assert result["compatible"] is native and result["mode"] in ("native", "incompatible")
            assert result["suggestions"] or native


def test_pre_cuda_11_drivers_have_no_minor_version_compatibility():
    """Minor-version compatibility starts with CUDA 11 (NVIDIA's compatibility guide):
    a CUDA 10.2 image on 418 (CUDA 10.1) is refused, while CUDA 12.2 on 535 with a 12.8
    image runs under it."""
    assert cuda.check("418.43", cuda_version="10.2")["mode"] == "incompatible"
    assert cuda.check("535.54.03", cuda_version="12.8")["mode"] == "minor_version"


def test_an_unknown_requirement_property_is_a_verdict_through_the_module(monkeypatch):
    """#34 item 6: NVIDIA_REQUIRE_REQ0=req0=true (nvidia-container-toolkit
    cmd/nvidia-container-runtime-hook/container_config_test.go TestGetNvidiaConfig 'Modern
    image, devices set, capabilities set, requirements set') is a condition on a property
    nvidia-container-cli does not know (libnvidia-container src/cli/dsl.c evaluate_rule):
    the module returns its refusal as a verdict with the reason, and honours
    fail_on_incompatible, instead of failing on the input as malformed (main did)."""
    params = {"driver_version": "535.129.03", "compute_capabilities": ["9.0"],
              "require_cuda": "req0=true"}
    result, failed = run_module(cuda_compat.main, dict(params, fail_on_incompatible=False),
                                monkeypatch)
    assert not failed and result["compatible"] is False, result
    assert result["unsatisfied_condition"] == "invalid expression"
    assert "'req0=true'" in result["reasons"][0]
    result, failed = run_module(cuda_compat.main, params, monkeypatch)
    assert failed and "requirement error: invalid expression" in result["msg"]
    assert "malformed" not in result["msg"]


def test_old_driver_verdicts_through_the_module_do_not_fail(monkeypatch):
    for driver in ("304.137", "418.43"):
        result, failed = run_module(cuda_compat.main, {
            "driver_version": driver, "compute_capabilities": ["7.5"],
            "require_cuda": "cuda>=12.2", "fail_on_incompatible": False}, monkeypatch)
        assert not failed and result["compatible"] is False, result
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "304.137", "require_cuda": "cuda>=12.2"}, monkeypatch)
    assert failed and "older than the oldest branch" in result["msg"], result


def test_the_driver_role_installs_only_cuda_11_era_branches():
    assert hoststack.INSTALLABLE_BRANCHES[0] == 450 and 580 in hoststack.INSTALLABLE_BRANCHES
    with pytest.raises(hoststack.HostStackError, match="not a known NVIDIA driver branch"):
        hoststack.parse_branch("418")


# captures that carry a driver version (one RTX PRO 6000 capture has none)
NVSMI = [p for p in sorted((FIXTURES / "nvidia-smi").glob("*.xml"))
         if "<driver_version>" in p.read_text()]


def _capture(path):
    """(gpu facts, nvidia-smi Product Brand of GPU 0) of a real nvidia-smi -q -x capture."""
    text = path.read_text()
    brand = ET.fromstring(text).findtext("gpu/product_brand")
    return gpu.parse_nvidia_smi_xml(text), brand


@pytest.mark.parametrize("path", NVSMI, ids=[p.name for p in NVSMI])
def test_branch_table_matches_real_nvidia_smi_captures(path):
    """nvidia-smi prints the driver's CUDA next to its version (tests/fixtures/nvidia-smi,
    SOURCES.md there): the branch table must give the same CUDA for every capture."""
    facts, _ = _capture(path)
    if cuda_versions.parse_driver_version(facts["driver_version"])[0] < min(cuda_versions.DRIVER_BRANCHES):
        with pytest.raises(ValueError, match="older than every branch"):
            cuda_versions.driver_cuda_version(facts["driver_version"])
    else:
        assert cuda_versions.driver_cuda_version(facts["driver_version"]) == facts["cuda_driver_version"]


@pytest.mark.parametrize("product_brand,expected", [
    ("GeForce", "geforce"), ("Tesla", "tesla"), ("Quadro", "quadro"), ("NVIDIA", "unknown"),
    ("NVIDIA RTX", "unknown"), ("unknown", "unknown"), ("TITAN", "titan"),
])
def test_toolkit_brand(product_brand, expected):
    assert cuda.toolkit_brand(product_brand) == expected


@pytest.mark.parametrize("capture,image,mode,gate", [
    # GeForce RTX 4090 on 535.86.05 (nvidia-smi capture) with the CUDA 13 vLLM image:
    # brand GeForce is in none of the image's alternatives: refused at container start.
    ("netdata-rtx-4090-driver-535.xml", V023, "incompatible", False),
    # Same host, CUDA 12.4 vLLM image (v0.8.5): brand=geforce,driver>=535,driver<536 admits
    # it, and 12.4 on a 12.2 driver is minor-version compatibility.
    ("netdata-rtx-4090-driver-535.xml", V085, "minor_version", True),
    # A100-SXM4-80GB on 535.54.03, brand "NVIDIA" -> toolkit "Unknown": the CUDA 13 image's
    # brand=unknown,driver>=535,driver<536 admits it; CUDA 13 then needs forward compat.
    ("telegraf-a100-sxm4-v12.xml", V023, "incompatible", True),
    # Dual RTX A5000 ("NVIDIA RTX") on 590.44.01 (CUDA 13.1): native for CUDA 13.0.
    ("telegraf-dual_a5000-v13.xml", V023, "native", True),
    # Quadro P2000 (Pascal 6.1) on 525.125.06 with the CUDA 12.9 image: Quadro is not in the
    # 12.9 image's list for 525 -> refused; 6.1 is not in its TORCH_CUDA_ARCH_LIST either.
    ("telegraf-quadro-p2000-v12.xml", V016, "incompatible", False),
])
def test_verdicts_from_real_captures(capture, image, mode, gate):
    facts, product_brand = _capture(FIXTURES / "nvidia-smi" / capture)
    info = require_cuda.image_requirements(image_env(image))
    result = cuda.check(facts["driver_version"],
                        [d["compute_capability"] for d in facts["devices"]],
                        cuda_version=info["cuda_version"], require_cuda=info["requirements"],
                        image_arch_list=info["arch_list"], brand=product_brand)
    assert result["mode"] == mode, result["reasons"]
    assert result["require_cuda_satisfied"] is gate
    assert result["driver_cuda"] == facts["cuda_driver_version"]


def test_every_toolkit_ga_driver_reports_its_own_cuda():
    """The branch table and Table 3 agree: the GA driver of CUDA X.Y reports >= X.Y."""
    for (version, update), driver in cuda_versions.TOOLKIT_MIN_DRIVER.items():
        got = cuda_versions.parse_cuda_version(cuda_versions.driver_cuda_version(driver))
        assert got >= cuda_versions.parse_cuda_version(version), (version, update, driver)
        branch = cuda_versions.branch_of(driver)
        assert cuda_versions.parse_driver_version(cuda_versions.planned_driver_for_branch(branch)) <= \
            cuda_versions.parse_driver_version(driver)


def test_unknown_newer_branch_is_a_lower_bound():
    assert cuda_versions.driver_cuda_version("620.10.01") == cuda_versions.DRIVER_BRANCHES[610]["cuda"]
    result = cuda.check("620.10.01", cuda_version="13.0")
    assert result["mode"] == "native"
    assert "not in the branch table" in result["reasons"][-1]


def test_branch_helpers():
    assert cuda_versions.branch_of("535.129.03") == 535
    assert cuda_versions.planned_driver_for_branch(580) == "580.65.06"
    assert cuda_versions.planned_driver_for_branch("535") == "535.54.03"
    with pytest.raises(ValueError, match="driver branch 999 is not known"):
        cuda_versions.planned_driver_for_branch(999)
    # NVIDIA deprecation schedule: R580 is the last branch for Maxwell/Pascal/Volta;
    # R470 was the last for Kepler.
    assert cuda_versions.branch_supports_architecture(580, "6.1")
    assert not cuda_versions.branch_supports_architecture(590, "6.1")
    assert not cuda_versions.branch_supports_architecture(595, "7.0")
    assert not cuda_versions.branch_supports_architecture(590, "5.2")
    assert cuda_versions.branch_supports_architecture(610, "7.5")
    assert cuda_versions.branch_supports_architecture(470, "3.7")
    assert not cuda_versions.branch_supports_architecture(535, "3.7")


def test_branch_table_names_the_last_branch_per_architecture():
    assert cuda_versions.DRIVER_BRANCHES[580]["last_for_architectures"] == ["maxwell", "pascal", "volta"]
    assert cuda_versions.DRIVER_BRANCHES[470]["last_for_architectures"] == ["kepler"]
    assert cuda_versions.DRIVER_BRANCHES[535]["lifecycle"] == "LTSB"


@pytest.mark.parametrize("cc,name", [
    ("5.2", "maxwell"), ("6.1", "pascal"), ("7.0", "volta"), ("7.5", "turing"),
    ("8.0", "ampere"), ("8.6", "ampere"), ("8.9", "ada"), ("9.0", "hopper"),
    ("10.0", "blackwell"), ("12.0", "blackwell"), ("3.7", "kepler"),
])
def test_architecture_names(cc, name):
    assert cuda_versions.architecture_name(cc) == name


@pytest.mark.parametrize("version,cc,ok", [
    # CUDA 13.0 release notes: Maxwell, Pascal and Volta removed from the toolkit
    ("13.0", "7.0", False), ("13.0", "6.1", False), ("12.9", "7.0", True),
    ("12.9", "5.2", True), ("13.0", "7.5", True),
    # Blackwell: sm_100/sm_120 first in 12.8, sm_103/sm_121 first in 12.9
    ("12.6", "12.0", False), ("12.8", "12.0", True), ("12.8", "10.3", False),
    ("12.9", "10.3", True),
    # Thor: 10.1 renamed 11.0 in CUDA 13; Kepler 3.5 dropped in 12.0
    ("13.0", "10.1", False), ("13.0", "11.0", True), ("12.0", "3.5", False),
])
def test_toolkit_architecture_ranges(version, cc, ok):
    assert cuda_versions.toolkit_supports_architecture(version, cc) is ok


# --------------------------------------------------------------------------------------
# NVIDIA_REQUIRE_CUDA evaluation (libnvidia-container src/cli/dsl.c)
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("v1,op,v2,expected", [
    ("535.129.03", ">=", "535", 1), ("535.129.03", "<", "536", 1),
    ("535.129.03", "<", "535", 0), ("12.2", ">=", "12.4", 0), ("12.10", ">", "12.9", 1),
    ("12", "=", "12.0", 1), ("12.0.0", "=", "12", 1), ("12.0.1", ">", "12", 1),
    ("13.0", "!=", "13", 0), ("12.2", "<=", "12.2", 1), ("12.a", "=", "12", -1),
])
def test_dsl_compare_version(v1, op, v2, expected):
    assert require_cuda.dsl_compare_version(v1, op, v2) == expected


def test_alternatives_are_space_separated_and_conditions_comma_separated():
    value = "cuda>=12.8 brand=tesla,driver>=535,driver<536"
    # Tesla on 535: second alternative (AND of three) holds.
    assert require_cuda.evaluate_require_cuda(value, "535.129.03", brand="tesla") == (True, None)
    # GeForce on 535: no alternative holds; the message names the FIRST term.
    ok, text = require_cuda.evaluate_require_cuda(value, "535.129.03", brand="geforce")
    assert not ok and text == "unsatisfied condition: cuda>=12.8" + TOOLKIT_MSG
    # Tesla on 550: brand holds but driver<536 does not (AND).
    assert not require_cuda.evaluate_require_cuda(value, "550.54.15", brand="Tesla")[0]
    # Brand comparison is case-insensitive (str_case_equal): libnvidia-container reports "Tesla".
    assert require_cuda.evaluate_require_cuda(value, "535.54.03", brand="TESLA")[0]


def test_no_visible_device_lets_brand_and_arch_conditions_pass():
    # configure.c check_device_brand/check_device_arch: data->dev == NULL -> true.
    assert require_cuda.evaluate_require_cuda("cuda>=13.0 brand=tesla,driver>=535,driver<536",
                                      "535.129.03", brand=None)[0]
    assert require_cuda.evaluate_require_cuda("arch>=7.5", "580.65.06", arch=None)[0]
    assert not require_cuda.evaluate_require_cuda("arch>=7.5", "580.65.06", arch="7.0")[0]


def test_non_cuda_first_term_message_has_no_driver_hint():
    ok, text = require_cuda.evaluate_require_cuda("brand=tesla", "580.65.06", brand="geforce")
    assert not ok and text == "unsatisfied condition: brand=tesla"


def test_empty_requirement_always_holds():
    assert require_cuda.parse_require_cuda("") == []
    assert require_cuda.evaluate_require_cuda("  ", "535.129.03") == (True, None)


@pytest.mark.parametrize("value,fragment", [
    ("cuda=>12.4", "'=>' is not an operator"),
    ("cuda>=", "no value after the operator"),
    ("cuda12.4", "no comparison operator"),
    (">=12.4", "no property name"),
    ("cuda>=12.x", "'12.x' is not a version"),
    ("cuda>=12.4 brand=tesla,driver>=5a5", "'5a5' is not a version"),
])
def test_malformed_require_cuda_is_rejected_clearly(value, fragment):
    with pytest.raises(ValueError) as exc:
        require_cuda.parse_require_cuda(value)
    assert fragment in str(exc.value)
    assert "invalid expression" in str(exc.value)
    assert type(exc.value).__name__ != "UnknownProperty" and "malformed" in str(exc.value)


def test_a_condition_on_an_unknown_property_is_not_called_malformed():
    # nvidia-container-toolkit internal/requirements/constraints/factory.go parse(): an
    # unknown property gives no error (factory_test.go TestParse 'invalid property is
    # invalid' expects nil); libnvidia-container src/cli/dsl.c evaluate_rule() fails on it
    # when it reads it.  parse_require_cuda says both, and not "malformed".
    with pytest.raises(require_cuda.UnknownProperty) as exc:
        require_cuda.parse_require_cuda("foo>=1")
    assert exc.value.name == "foo" and exc.value.term == "foo>=1"
    assert "malformed" not in str(exc.value) and "invalid expression" in str(exc.value)
    assert require_cuda.unknown_property_terms(["cuda>=12.4 foo=bar,arch>=8.0", "Req0=true"]) == \
        [("foo=bar", "foo"), ("Req0=true", "Req0")]
    # Names compare case-insensitively in dsl.c (str_case_equal): CUDA is known.
    assert require_cuda.unknown_property_terms("CUDA>=12.4 >=1 cuda12") == []


# nvidia-container-toolkit internal/config/image/cuda_image_test.go TestGetRequirements
@pytest.mark.parametrize("env,expected", [
    (["NVIDIA_REQUIRE_JETPACK=csv-mounts=all"], []),
    (["NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS=base-only"], []),
    (["NVIDIA_REQUIRE_CUDA=cuda>=11.6"], ["cuda>=11.6"]),
    (["NVIDIA_REQUIRE_CUDA=cuda>=11.6", "NVIDIA_REQUIRE_BRAND=brand=tesla"],
     ["cuda>=11.6", "brand=tesla"]),
    (["CUDA_VERSION=11.6"], ["cuda>=11.6"]),
    (["CUDA_VERSION=11.6", "NVIDIA_REQUIRE_BRAND=brand=tesla"], ["cuda>=11.6", "brand=tesla"]),
    (["NVIDIA_REQUIRE_CUDA=cuda>=11.6", "NVIDIA_REQUIRE_BRAND=brand=tesla",
      "NVIDIA_DISABLE_REQUIRE=true"], []),
    (["CUDA_VERSION=11.6", "NVIDIA_REQUIRE_BRAND=brand=tesla", "NVIDIA_DISABLE_REQUIRE=true"], []),
])
def test_image_requirements_follow_the_toolkit(env, expected):
    assert sorted(require_cuda.image_requirements(env)["requirements"]) == sorted(expected)


def test_ignored_requirements_are_named_with_the_reason():
    """NVIDIA_REQUIRE_JETPACK* is left out of the check, as the hook does (toolkit 1.10.0
    changelog: "Ignore NVIDIA_REQUIRE_JETPACK* environment variables for requirement
    checks"), and said so; the others are not in that list."""
    info = require_cuda.image_requirements(["NVIDIA_REQUIRE_CUDA=cuda>=12.4",
                                    "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS=base-only"])
    assert info["requirements"] == ["cuda>=12.4"]
    assert len(info["ignored"]) == 1 and info["ignored"][0].startswith(
        "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS='base-only': nvidia-container-runtime-hook leaves")
    assert require_cuda.image_requirements(["NVIDIA_REQUIRE_CUDA=cuda>=12.4"])["ignored"] == []


def test_image_requirements_of_real_vllm_images():
    info = require_cuda.image_requirements(image_env(V023))
    assert info["cuda_version"] == "13.0" and not info["disabled"]
    assert info["arch_list"] == ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0+PTX"]
    assert info["requirements"][0].startswith("cuda>=13.0 brand=unknown,driver>=535")
    assert require_cuda.image_requirements(image_env(V085))["arch_list"] is None
    # NVIDIA_DISABLE_REQUIRE follows Go strconv.ParseBool: "1" is true, "yes" is not.
    assert require_cuda.image_requirements(["CUDA_VERSION=12.4.1", "NVIDIA_DISABLE_REQUIRE=1"])["disabled"]
    assert not require_cuda.image_requirements(["CUDA_VERSION=12.4.1", "NVIDIA_DISABLE_REQUIRE=yes"])["disabled"]


@pytest.mark.parametrize("arch_list,cc,ok", [
    ("7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX", "7.0", False),   # V100 on a vLLM CUDA 13 image
    ("7.5 8.0 8.6 8.9 9.0 10.0 12.0+PTX", "12.1", True),   # sm_120 cubin runs on 12.1
    ("7.5 8.0 9.0", "8.9", True),                          # sm_80 cubin runs on 8.9
    ("8.0 9.0", "10.0", False),                            # no PTX: no JIT to newer majors
    ("8.0+PTX", "10.0", True),                             # PTX JIT-compiles forward
    ("9.0a", "9.0", True), ("9.0a 10.0a", "10.3", False),  # 'a' cubins are exact
    ("10.0f", "10.3", True),                               # 'f' covers the family
    ("7.0;7.5;8.0", "7.2", True),
])
def test_arch_list_covers(arch_list, cc, ok):
    assert require_cuda.arch_list_covers(require_cuda.parse_arch_list(arch_list), cc) is ok


# --------------------------------------------------------------------------------------
# Verdicts: at least 20 cases, each with its source
# --------------------------------------------------------------------------------------

CASES = [
    # 1. vLLM #5635: "ubuntu-22.04, cuda==12.1, nvidia driver == 530, gpu==V100" running
    # vllm 0.5.0 (CUDA 12.4 base, same NVIDIA_REQUIRE_CUDA as v0.8.5): "nvidia-container-cli:
    # requirement error: unsatisfied condition: cuda>=12.4, please update your driver...".
    dict(id="vllm-5635-v100-530", driver="530.30.02", ccs=["7.0"], image=V085,
         datacenter=True, mode="incompatible", gate=False,
         unsatisfied="unsatisfied condition: cuda>=12.4" + TOOLKIT_MSG),
    # 2. vLLM #18813: v0.9.0 image (CUDA 12.8) on a pre-570 driver: "unsatisfied condition:
    # cuda>=12.8". NVIDIA's CUDA 12.8 images list brand=...,driver>=560,driver<561 etc.
    # only for data-center brands; a GeForce on 560 is refused.
    dict(id="vllm-18813-cu128-geforce-560", driver="560.35.03", ccs=["8.9"],
         require="cuda>=12.8 brand=unknown,driver>=535,driver<536 brand=tesla,driver>=535,driver<536 "
                 "brand=tesla,driver>=560,driver<561",
         mode="incompatible", gate=False,
         unsatisfied="unsatisfied condition: cuda>=12.8" + TOOLKIT_MSG),
    # 3. janhq/server #262 and microsoft/VibeVoice #352 (vllm/vllm-openai:v0.14.1, CUDA 12.9):
    # "unsatisfied condition: cuda>=12.9" on consumer hosts; 12.9 images admit only
    # data-center brands on 535/550/560/565/570 (real v0.16.0 image env).
    dict(id="vllm-cu129-geforce-550", driver="550.54.15", ccs=["8.6"], image=V016,
         mode="incompatible", gate=False,
         unsatisfied="unsatisfied condition: cuda>=12.9" + TOOLKIT_MSG),
    # 4. Same image, data-center GPU on R550: admitted by brand=tesla,driver>=550,driver<551,
    # and CUDA 12.9 runs on a 12.4 driver via minor-version compatibility (driver >= 525.60.13,
    # NVIDIA compatibility guide Table 1).
    dict(id="vllm-cu129-tesla-550-minor", driver="550.54.15", ccs=["8.0"], image=V016,
         datacenter=True, mode="minor_version", gate=True),
    # 5. The v0.16.0 collect-env report itself: 2x L40S (8.9), driver 580.119.02, container
    # running: native, 8.9 in TORCH_CUDA_ARCH_LIST.
    dict(id="vllm-0.16-l40s-580-report", driver="580.119.02", ccs=["8.9", "8.9"], image=V016,
         datacenter=True, brand="unknown", mode="native", gate=True),
    # 6. Brief/vLLM docs: CUDA 13 image (v0.23.0) on H100 with 535.129.03: the toolkit admits
    # it (brand=tesla/unknown,driver>=535,driver<536) but CUDA 13 needs R580 or forward compat.
    dict(id="vllm-cu130-h100-535-no-fc", driver="535.129.03", ccs=["9.0"], image=V023,
         datacenter=True, mode="incompatible", gate=True,
         suggest=["CUDA 12.2 or older", "install driver branch 580 (>= 580.65.06)",
                  "VLLM_ENABLE_CUDA_COMPATIBILITY=1"]),
    # 7. Same with forward compatibility allowed (vLLM documents CUDA 13 images in compat
    # mode on R535 and R570 data-center hosts; VLLM_ENABLE_CUDA_COMPATIBILITY=1).
    dict(id="vllm-cu130-h100-535-fc", driver="535.129.03", ccs=["9.0"], image=V023,
         datacenter=True, allow_fc=True, mode="forward_compat", gate=True),
    # 8. CUDA 13 image on a GeForce RTX 4090 with 535: refused by the toolkit, and forward
    # compatibility is data-center only (NVIDIA compatibility guide); shader-slang CI report
    # "unsatisfied condition: cuda>=13.0, please update your driver".
    dict(id="vllm-cu130-4090-535", driver="535.129.03", ccs=["8.9"], image=V023,
         mode="incompatible", gate=False,
         unsatisfied="unsatisfied condition: cuda>=13.0" + TOOLKIT_MSG,
         suggest=["CUDA 12.2 or older", "NVIDIA_DISABLE_REQUIRE=1", "580.65.06"],
         no_suggest=["VLLM_ENABLE_CUDA_COMPATIBILITY"]),
    # 9. CUDA 13 image on R580 (13.0 GA driver 580.65.06, release notes Table 3): native.
    dict(id="vllm-cu130-h100-580", driver="580.65.06", ccs=["9.0"], image=V023,
         datacenter=True, mode="native", gate=True),
    # 10. V100 (7.0) on R580 with the CUDA 13 image: CUDA 13 dropped Volta and the image's
    # TORCH_CUDA_ARCH_LIST starts at 7.5 ("no kernel image is available").
    dict(id="vllm-cu130-v100-580", driver="580.95.05", ccs=["7.0"], image=V023,
         datacenter=True, mode="incompatible", gate=True,
         reason="CUDA 13.0 dropped it", suggest=["CUDA 12.x or older", "7.0"]),
    # 11. GTX 1080 (6.1) on R590: the branch dropped Pascal (deprecation schedule), and CUDA 13.
    dict(id="pascal-590", driver="590.44.01", ccs=["6.1"], cuda_version="13.1",
         mode="incompatible", reason="last branch for pascal is R580",
         suggest=["branch 580 or older"]),
    # 12. RTX 5090 (12.0) on R580 with the CUDA 13 image: native, 12.0 in the arch list.
    dict(id="vllm-cu130-5090-580", driver="580.82.07", ccs=["12.0"], image=V023,
         mode="native", gate=True),
    # 13. A100 (brand reported "Unknown" by libnvidia-container) on R570 with the CUDA 13
    # image, forward compatibility allowed: admitted by brand=unknown,driver>=570,driver<571.
    dict(id="vllm-cu130-a100-570-fc", driver="570.133.20", ccs=["8.0"], image=V023,
         datacenter=True, brand="unknown", allow_fc=True, mode="forward_compat", gate=True),
    # 14. Data-center GPU on R560 with the CUDA 13 image: 560 is NOT among the image's
    # driver alternatives (535, 550, 565, 570, 575), so even a Tesla is refused.
    dict(id="vllm-cu130-tesla-560", driver="560.35.03", ccs=["9.0"], image=V023,
         datacenter=True, allow_fc=True, mode="incompatible", gate=False,
         unsatisfied="unsatisfied condition: cuda>=13.0" + TOOLKIT_MSG),
    # 15. CUDA 12.4 image (v0.8.5) on a GeForce with 535: its requirement still listed
    # brand=geforce,driver>=535,driver<536, so it starts; 12.4 on a 12.2 driver is
    # minor-version compatibility.
    dict(id="vllm-0.8.5-geforce-535", driver="535.183.01", ccs=["8.9"], image=V085,
         mode="minor_version", gate=True),
    # 16. Lvllmds4 #46: image built on CUDA 12.8.1 (NVIDIA_REQUIRE_CUDA=cuda>=12.8) on
    # 570.195.03 (nvidia-smi: CUDA 12.8): the container starts (the error came later from
    # PyTorch inside): native for CUDA 12.8.
    dict(id="lvllmds4-46-570-cu128", driver="570.195.03", ccs=["8.9"], require="cuda>=12.8",
         mode="native", gate=True),
    # 17. NVIDIA compatibility guide, minor-version example: an 11.1 application on
    # 450.80.02 (shipped with 11.0).
    dict(id="nvidia-doc-11.1-on-450.80.02", driver="450.80.02", cuda_version="11.1",
         mode="minor_version"),
    # 18. Guide Table 1: CUDA 12.x needs >= 525: a 12.0 app on 520 (CUDA 11.8) is incompatible.
    dict(id="nvidia-doc-12.0-on-520", driver="520.61.05", cuda_version="12.0",
         mode="incompatible", suggest=["525.60.13"]),
    # 19. Guide Table 1: CUDA 13.x needs >= 580: 13.0 on 575 (12.9) on a workstation GPU.
    dict(id="nvidia-doc-13.0-on-575-geforce", driver="575.57.08", cuda_version="13.0",
         ccs=["8.6"], mode="incompatible", suggest=["580.65.06"]),
    # 20. Guide Table 1: 12.8 app on 525.60.13 -> minor-version compatibility.
    dict(id="nvidia-doc-12.8-on-525.60.13", driver="525.60.13", cuda_version="12.8",
         mode="minor_version"),
    # 21. 535 LTSB with a CUDA 12.2 image (12.2 GA driver 535.54.03): native.
    dict(id="cuda-12.2-on-535", driver="535.129.03", cuda_version="12.2", ccs=["8.0"],
         mode="native"),
    # 22. Legacy image (CUDA_VERSION only, no NVIDIA_REQUIRE_CUDA): the toolkit requires
    # cuda>=12.4 (cuda_image.go IsLegacy); a 12.2 driver is refused.
    dict(id="legacy-cuda-version-only", driver="535.129.03", ccs=["8.0"],
         env=["CUDA_VERSION=12.4.1"], mode="incompatible", gate=False,
         unsatisfied="unsatisfied condition: cuda>=12.4" + TOOLKIT_MSG),
    # 23. NVIDIA_DISABLE_REQUIRE=1 skips the toolkit check (cuda_image.go HasDisableRequire):
    # the same legacy image now runs under minor-version compatibility.
    dict(id="disable-require", driver="535.129.03", ccs=["8.0"],
         env=["CUDA_VERSION=12.4.1", "NVIDIA_DISABLE_REQUIRE=1"], mode="minor_version"),
    # 24. Every visible GPU is checked (configure.c loops over devices): one V100 among
    # H100s fails the arch condition.
    dict(id="arch-condition-per-gpu", driver="580.65.06", ccs=["9.0", "7.0"],
         require="cuda>=12.0,arch>=7.5", datacenter=True, mode="incompatible", gate=False,
         unsatisfied="unsatisfied condition: cuda>=12.0,arch>=7.5" + TOOLKIT_MSG),
]


def _run_case(case):
    require, version, arch_list = case.get("require"), case.get("cuda_version"), None
    if "image" in case or "env" in case:
        info = require_cuda.image_requirements(case.get("env") or image_env(case["image"]))
        require, version, arch_list = info["requirements"], info["cuda_version"], info["arch_list"]
    return cuda.check(case["driver"], compute_capabilities=case.get("ccs", []),
                      cuda_version=version, require_cuda=require, image_arch_list=arch_list,
                      datacenter_gpu=case.get("datacenter", False),
                      allow_forward_compat=case.get("allow_fc", False), brand=case.get("brand"))


def test_at_least_twenty_cited_cases():
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_verdict(case):
    result = _run_case(case)
    assert result["mode"] == case["mode"], result["reasons"]
    assert result["compatible"] is (case["mode"] != "incompatible")
    assert result["driver_cuda"] == cuda_versions.driver_cuda_version(case["driver"])
    if "gate" in case:
        assert result["require_cuda_satisfied"] is case["gate"]
    if "unsatisfied" in case:
        assert result["unsatisfied_condition"] == case["unsatisfied"]
    if "reason" in case:
        assert any(case["reason"] in r for r in result["reasons"]), result["reasons"]
    text = " ".join(result["suggestions"])
    for fragment in case.get("suggest", []):
        assert fragment in text, result["suggestions"]
    for fragment in case.get("no_suggest", []):
        assert fragment not in text
    assert result["reasons"] and all(r.endswith(".") for r in result["reasons"])
    if result["compatible"] and result["mode"] == "native":
        assert result["suggestions"] == []
    else:
        assert result["suggestions"], "a non-native verdict must say what to do"


def test_minor_version_reason_says_feature_set_is_limited():
    result = cuda.check("550.54.15", cuda_version="12.9")
    assert result["mode"] == "minor_version"
    assert "limited feature set" in result["reasons"][0]
    assert result["min_driver"] == "575.51.03"
    assert "install driver branch 575 (>= 575.51.03)" in result["suggestions"][0]


def test_ptx_only_coverage_fails_under_minor_version_compatibility():
    """CUDA compatibility guide: minor-version compatibility does not JIT newer PTX."""
    native = cuda.check("580.65.06", ["8.9"], cuda_version="13.0", image_arch_list="8.0+PTX")
    assert native["mode"] == "native"  # 8.0 cubin already runs on 8.9 (same major)
    ptx_only = cuda.check("575.57.08", ["10.0"], cuda_version="12.9", image_arch_list="9.0+PTX")
    assert ptx_only["driver_cuda"] == "12.9" and ptx_only["mode"] == "native"
    minor = cuda.check("570.124.06", ["10.0"], cuda_version="12.9", image_arch_list="9.0+PTX")
    assert minor["mode"] == "incompatible"
    assert "covered only by PTX" in minor["reasons"][-1]


def test_toolkit_refusal_dominates_minor_version_compatibility():
    """cuda>=12.8 blocks a 12.x host even though 12.8 would run by minor-version compat."""
    result = cuda.check("550.54.15", ["8.9"], require_cuda="cuda>=12.8")
    assert result["mode"] == "incompatible"
    assert result["reasons"][0].startswith("nvidia-container-cli refuses to start")
    assert result["reasons"][1].startswith("Were the container started")
    assert any("NVIDIA_DISABLE_REQUIRE=1" in s for s in result["suggestions"])


def test_forward_compat_is_never_offered_to_consumer_gpus():
    for said in (dict(brand="GeForce"), dict(brand="NVIDIA RTX"), dict(datacenter_gpu=False)):
        result = cuda.check("535.129.03", ["8.9"], cuda_version="13.0", allow_forward_compat=True,
                            **said)
        assert result["mode"] == "incompatible" and result["datacenter_gpu"] is False, said
        assert "forward compatibility needs a data-center GPU" in result["reasons"][0]


# --- without a brand: what the compute capability proves (#34 item 6) ------------------------
# developer.nvidia.com/cuda-gpus: 8.0 (A100, A30), 9.0 (H100, H200, GH200), 10.0 (B200,
# GB200), 10.3 (B300, GB300) and 3.7 (K80) are data-center parts only; NVIDIA's CUDA
# Compatibility guide: forward compatibility runs on data-center GPUs.
@pytest.mark.parametrize("brand,datacenter_gpu,ccs,kind", [
    (None, True, ["8.6"], True), (None, False, ["9.0"], False),     # the flag wins
    ("Tesla", None, ["7.0"], True), ("NVIDIA", None, ["8.6"], True),
    ("GeForce", None, ["8.9"], False), ("NVIDIA RTX", None, ["8.6"], False),
    ("TITAN", None, ["7.0"], False), ("Quadro", None, ["6.0"], False),
    ("unknown", None, ["9.0"], True),                               # the toolkit's brand: CC decides
    (None, None, ["9.0"], True), (None, None, ["8.0", "8.0"], True), (None, None, ["10.3"], True),
    (None, None, ["3.7"], True),
    (None, None, ["8.6"], None), (None, None, ["8.9"], None), (None, None, ["12.0"], None),
    (None, None, ["9.0", "8.9"], None), (None, None, [], None), ("unknown", None, ["7.5"], None),
])
def test_gpu_kind_from_what_proves_it(brand, datacenter_gpu, ccs, kind):
    assert cuda.gpu_kind(brand, datacenter_gpu, ccs)[0] is kind


def test_a_data_center_only_capability_needs_no_brand_for_forward_compat():
    """An H100 (9.0) on R535 with a CUDA 13.0 image: without brand or datacenter_gpu the
    module used to assume a GeForce and answer incompatible, where the container runs with
    the image's compat libraries. Control: the same call, said to be no data-center GPU."""
    result = cuda.check("535.129.03", ["9.0"], cuda_version="13.0", allow_forward_compat=True)
    assert result["compatible"] and result["mode"] == "forward_compat", result["reasons"]
    assert result["datacenter_gpu"] is True and not result["depends_on_brand"]
    assert "compute capability 9.0 is data-center only" in result["datacenter_gpu_from"]
    control = cuda.check("535.129.03", ["9.0"], cuda_version="13.0", allow_forward_compat=True,
                         datacenter_gpu=False)
    assert control["mode"] == "incompatible"


def test_a_shared_capability_says_the_verdict_depends_on_the_brand():
    """8.9 is an RTX 4090 or an L4/L40: the verdict depends on it, both outcomes are given,
    the refusing one is the verdict, and the first suggestion names the input."""
    result = cuda.check("535.129.03", ["8.9"], cuda_version="13.0", allow_forward_compat=True)
    assert result["depends_on_brand"] is True and result["compatible"] is False
    assert result["outcomes"] == {"datacenter": {"compatible": True, "mode": "forward_compat"},
                                  "other": {"compatible": False, "mode": "incompatible"}}
    assert result["reasons"][0].startswith("This depends on the GPU, which nothing here decides")
    assert "the image runs (forward_compat)" in result["reasons"][0]
    assert "it does not run (incompatible)" in result["reasons"][0]
    assert result["suggestions"][0].startswith("Say which GPU this is: brand")
    assert result["datacenter_gpu"] is None


def test_a_shared_capability_with_the_same_verdict_either_way_is_plain():
    result = cuda.check("580.95.05", ["8.9"], cuda_version="12.4")
    assert result["compatible"] and result["mode"] == "native"
    assert result["depends_on_brand"] is False and "outcomes" not in result
    assert not any("depends on the GPU" in r for r in result["reasons"])


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(driver_version="535"), "driver_version '535' is malformed"),
    (dict(driver_version="535.129.03-1"), "MAJOR.MINOR[.PATCH]"),
    (dict(driver_version=""), "malformed"),
    (dict(driver_version="535.129.03", cuda_version="13"), "CUDA version '13' is malformed"),
    (dict(driver_version="535.129.03", compute_capabilities=["86"]), "compute capability '86'"),
    (dict(driver_version="535.129.03", require_cuda="cuda>>12"), "'>>' is not an operator"),
    (dict(driver_version="535.129.03", cuda_version="12.2", image_arch_list="sm_80"),
     "architecture list entry 'sm_80'"),
    (dict(driver_version="535.129.03", cuda_version="12.2", brand="rtx"), "brand 'rtx'"),
])
def test_bad_input_fails_clearly(kwargs, fragment):
    with pytest.raises(ValueError) as exc:
        cuda.check(**kwargs)
    assert fragment in str(exc.value)


# --------------------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------------------

class FakeImage:
    def __init__(self, env, labels=None):
        self.attrs = {"Config": {"Env": env, "Labels": labels}}


class FakeDocker:
    """Stand-in for docker.DockerClient: only images.get(), as the module uses it."""

    def __init__(self, images):
        self._images = images
        self.images = self

    def get(self, name):
        if name not in self._images:
            raise cuda_compat.docker_errors.ImageNotFound(f"No such image: {name}")
        return self._images[name]


@pytest.fixture
def fake_docker(monkeypatch):
    client = FakeDocker({
        "vllm/vllm-openai:v0.23.0": FakeImage(image_env(V023), {"maintainer": "vLLM"}),
        "vllm/vllm-openai:v0.16.0": FakeImage(image_env(V016)),
    })
    monkeypatch.setattr(cuda_compat.docker, "from_env", lambda: client)
    return client


def test_main_fails_on_incompatible_with_full_message(monkeypatch, fake_docker):
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "535.129.03", "compute_capabilities": ["8.9"],
        "image": "vllm/vllm-openai:v0.23.0"}, monkeypatch)
    assert failed and result["changed"] is False
    msg = result["msg"]
    for fragment in ("535.129.03", "CUDA 12.2", "CUDA 13.0", "580.65.06", "cuda>=13.0"):
        assert fragment in msg
    assert result["mode"] == "incompatible" and result["require_cuda_satisfied"] is False
    assert result["image_requirements"]["cuda_version"] == "13.0"
    assert result["suggestions"]


def test_main_reports_without_failing_when_asked(monkeypatch, fake_docker):
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "535.129.03", "compute_capabilities": ["9.0"],
        "image": "vllm/vllm-openai:v0.23.0", "datacenter_gpu": True,
        "fail_on_incompatible": False}, monkeypatch)
    assert not failed and result["changed"] is False and result["compatible"] is False
    assert any("VLLM_ENABLE_CUDA_COMPATIBILITY=1" in s for s in result["suggestions"])


def test_main_image_native_in_check_mode(monkeypatch, fake_docker):
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "580.119.02", "compute_capabilities": ["8.9"],
        "image": "vllm/vllm-openai:v0.16.0", "datacenter_gpu": True}, monkeypatch,
        check_mode=True)
    assert not failed and result["changed"] is False
    assert result["mode"] == "native" and result["required_cuda"] == "12.9"


def test_main_unknown_image(monkeypatch, fake_docker):
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "580.65.06", "image": "vllm/vllm-openai:nope"}, monkeypatch)
    assert failed
    assert result["msg"] == ("image vllm/vllm-openai:nope is not present on this host; pull it "
                             "first or pass require_cuda")


def test_main_docker_unreachable(monkeypatch):
    def broken():
        raise cuda_compat.docker_errors.DockerException("Error while fetching server API version")
    monkeypatch.setattr(cuda_compat.docker, "from_env", broken)
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "580.65.06", "image": "x:1"}, monkeypatch)
    assert failed and result["msg"].startswith("cannot read image x:1 through docker")


@pytest.mark.parametrize("args,fragment", [
    ({"driver_version": "535.1x", "cuda_version": "12.2"}, "driver_version '535.1x' is malformed"),
    ({"driver_version": "535.129.03", "require_cuda": "cuda>=12.4 brand"},
     "no comparison operator"),
    ({"driver_version": "535.129.03"}, "one of the following is required"),
    ({"driver_version": "535.129.03", "cuda_version": "12.2", "require_cuda": "cuda>=12.2"},
     "mutually exclusive"),
])
def test_main_bad_input(monkeypatch, args, fragment):
    result, failed = run_module(cuda_compat.main, args, monkeypatch)
    assert failed and fragment in result["msg"]
    assert "compatible" not in result


def test_main_require_cuda_native(monkeypatch):
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "570.195.03", "require_cuda": "cuda>=12.8",
        "compute_capabilities": ["8.9"]}, monkeypatch)
    assert not failed and result["mode"] == "native" and result["changed"] is False


# --------------------------------------------------------------------------------------
# Real docker engine (slow): a tiny local image carrying NVIDIA_REQUIRE_CUDA
# --------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not docker_answers(), reason="no docker engine answers")
def test_module_reads_a_real_local_image(tmp_path, monkeypatch):
    base = "gpufleet/debian:12"
    if subprocess.run(["docker", "image", "inspect", base], capture_output=True).returncode:
        pytest.skip(f"{base} is not built on this host (scripts build it)")
    tag = f"cudacompat-test:{uuid.uuid4().hex[:8]}"
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base}\n"
        "ENV CUDA_VERSION=12.9.1\n"
        "ENV NVIDIA_REQUIRE_CUDA=\"cuda>=12.9 brand=tesla,driver>=550,driver<551\"\n"
        "ENV TORCH_CUDA_ARCH_LIST=\"7.0 7.5 8.0 8.9 9.0 10.0 12.0\"\n"
        "ENV NVIDIA_REQUIRE_JETPACK=csv-mounts=all\n")
    subprocess.run(["docker", "build", "-q", "-t", tag, str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    try:
        result, failed = run_module(cuda_compat.main, {
            "driver_version": "550.54.15", "compute_capabilities": ["8.0"], "image": tag,
            "datacenter_gpu": True}, monkeypatch)
        assert not failed and result["mode"] == "minor_version"
        assert result["image_requirements"]["arch_list"][0] == "7.0"
        assert any(r.startswith("Ignored, as the container toolkit does: NVIDIA_REQUIRE_JETPACK=")
                   for r in result["reasons"]), result["reasons"]
        result, failed = run_module(cuda_compat.main, {
            "driver_version": "550.54.15", "compute_capabilities": ["8.6"], "image": tag,
            "brand": "GeForce"}, monkeypatch)
        assert failed and "unsatisfied condition: cuda>=12.9" in result["msg"]
        # 8.6 without a brand is an A10 (brand=tesla admits driver 550) or an RTX 3090
        result, failed = run_module(cuda_compat.main, {
            "driver_version": "550.54.15", "compute_capabilities": ["8.6"], "image": tag},
            monkeypatch)
        assert failed and result["depends_on_brand"] and "This depends on the GPU" in result["msg"]
        assert result["outcomes"]["datacenter"]["compatible"], result["outcomes"]
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


# --- planned driver (driver_branch): what preflight checks before the driver role runs ---

@pytest.mark.parametrize("installed,branch,expected", [
    ("580.95.05", "580", "580.95.05"),   # same branch: kept, never upgraded as a side effect
    ("550.127.05", "580", "580.65.06"),  # another branch: the role installs 580; plan its first release
    (None, "580", "580.65.06"),          # no driver yet (PCI facts only)
    ("535.129.03", "535", "535.129.03"),
])
def test_planned_driver(installed, branch, expected):
    assert cuda_versions.planned_driver(installed, branch) == expected


def test_planned_driver_rejects_unknown_branch():
    with pytest.raises(ValueError, match="branch 123 is not known"):
        cuda_versions.planned_driver(None, "123")


def test_main_driver_branch_plans_the_upgrade(monkeypatch, fake_docker):
    # lab-a100: 550.127.05 installed, branch 580 planned -> checked against 580.65.06
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "550.127.05", "driver_branch": "580", "compute_capabilities": ["8.0"],
        "image": "vllm/vllm-openai:v0.23.0", "datacenter_gpu": True}, monkeypatch)
    assert not failed and result["compatible"] and result["mode"] == "native"
    assert result["driver_version"] == "580.65.06" and result["driver_planned"] is True
    assert "550.127.05" in result["reasons"][0]


def test_main_driver_branch_keeps_pinned_branch(monkeypatch, fake_docker):
    # lab-4090: pinned to 535, so the installed 535.129.03 is what runs the image
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "535.129.03", "driver_branch": "535", "compute_capabilities": ["8.9"],
        "image": "vllm/vllm-openai:v0.23.0"}, monkeypatch)
    assert failed and result["driver_planned"] is False
    for fragment in ("535.129.03", "CUDA 12.2", "CUDA 13.0"):
        assert fragment in result["msg"]


def test_main_needs_a_driver_or_a_branch(monkeypatch, fake_docker):
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "", "cuda_version": "12.4"}, monkeypatch)
    assert failed and "driver_branch" in result["msg"]
