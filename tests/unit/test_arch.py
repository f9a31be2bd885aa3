"""gpufleet.arch: the one compute-capability table and parser, and its users.

Before this table, architecture facts lived in gpu.py, cuda.py, hoststack.py and
tune.py with three parsers, and an unknown compute capability passed cuda.py silently.
"""
import pathlib

import pytest

from gpufleet import arch, cuda, gpu, hoststack, tune
from gpufleet.hoststack import HostStackError
from helpers import run_module

MODULE_UTILS = pathlib.Path(arch.__file__).parent


def test_every_table_keyed_by_architecture_covers_the_same_set():
    names = set(arch.ARCHITECTURES)
    assert {row[0] for row in arch.COMPUTE_CAPABILITIES.values()} == names
    assert set(gpu._ARCHITECTURE_NAMES.values()) == names  # nvidia-smi's spellings
    fields = {frozenset(row) for row in arch.ARCHITECTURES.values()}
    assert fields == {frozenset({"open_kernel_modules", "last_driver_branch", "bf16", "fp8"})}
    assert set(cuda.LAST_BRANCH_FOR_ARCHITECTURE) <= names
    assert set(cuda.TOOLKIT_ARCH_RANGE) == set(arch.COMPUTE_CAPABILITIES)


def test_every_compute_capability_the_product_tables_name_is_in_the_table():
    named = {cc for _, cc in gpu._CC_BY_NAME} | {cc for _, cc in gpu._PCI_DEVICES.values()}
    assert named <= set(arch.COMPUTE_CAPABILITIES)


def test_one_parser_and_one_table():
    """No other module_utils file keeps a compute-capability regex or table of its own."""
    for name in ("gpu.py", "cuda.py", "hoststack.py", "tune.py"):
        text = (MODULE_UTILS / name).read_text()
        assert "from .arch import" in text, name
        for own in ("_ARCHITECTURE_BY_CC =", "_CC_RE", "FP8_NATIVE_CAPABILITY =",
                    "_TURING =", "_BLACKWELL =", '"10.3": (', "< (8, 0)", ">= (8, 0)"):
            assert own not in text, (name, own)


@pytest.mark.parametrize("cc,expected", [
    ("8.9", "ada"), (" 9.0 ", "hopper"), ((12, 0), "blackwell"), ("7.5", "turing"),
    ("6.1", "pascal"), ("11.0", "blackwell"),
])
def test_architecture(cc, expected):
    assert arch.architecture(cc) == expected


@pytest.mark.parametrize("cc,fragment", [
    ("86", "malformed"), ("eight", "malformed"), ("8.9.1", "malformed"), (True, "malformed"),
    (8.9, None), (None, "malformed"), ("", "malformed"), ((8, True), "malformed"),
    ("9.9", "not in gpufleet's architecture table"), ("13.0", "not in gpufleet's"),
    ("4.0", "not in gpufleet's"),
])
def test_unknown_or_malformed_capability_is_a_clear_error(cc, fragment):
    if fragment is None:  # a float from YAML is read as its text, "8.9"
        assert arch.architecture(cc) == "ada"
        return
    with pytest.raises(arch.ArchError, match=fragment):
        arch.architecture(cc)


def test_facts_gathering_still_reports_an_unknown_gpu():
    assert gpu.architecture_for("13.0") is None
    facts = {"devices": [{"compute_capability": "13.0"}]}
    assert gpu.open_kernel_modules_supported(facts) is None


# --- the users: an unknown capability is an error there, not a silent pass ---------------

@pytest.mark.parametrize("cc", ["9.9", "4.0", "13.0"])
def test_cuda_check_refuses_an_unknown_capability(cc):
    with pytest.raises(ValueError, match=f"compute capability {cc} is not in gpufleet's"):
        cuda.check("580.65.06", compute_capabilities=[cc], cuda_version="13.0")
    with pytest.raises(ValueError, match="not in gpufleet's architecture table"):
        cuda.toolkit_supports_architecture("13.0", cc)


@pytest.mark.parametrize("cc,fragment", [
    ("9.9", "not in gpufleet's architecture table"), ("eight", "malformed"),
    ("90", "malformed"), (9, "malformed"),
])
def test_kernel_module_flavor_refuses_unknown_or_malformed_capability(cc, fragment):
    with pytest.raises(HostStackError, match=fragment):
        hoststack.kernel_module_flavor("580", [{"compute_capability": cc}])


@pytest.mark.parametrize("cc", ["eight", "9.x", "90"])
def test_nvidia_driver_plan_fails_clearly_on_a_malformed_capability(cc, monkeypatch):
    import nvidia_driver_plan
    args = {"branch": "580", "distribution": "Debian", "distribution_version": "12",
            "architecture": "x86_64", "repo_url": "http://127.0.0.1:9/cuda/",
            "devices": [{"compute_capability": cc}], "timeout": 1}
    result, failed = run_module(nvidia_driver_plan.main, args, monkeypatch)
    assert failed and "compute capability" in result["msg"] and "MAJOR.MINOR" in result["msg"]


@pytest.mark.parametrize("cc,fragment", [("9.9", "not in gpufleet's"), ("8.9.1", "malformed")])
def test_tune_refuses_an_unknown_capability(cc, fragment):
    from gpufleet import model
    desc = model.describe_config({"model_type": "llama", "num_hidden_layers": 2,
                                  "num_attention_heads": 4, "hidden_size": 64,
                                  "max_position_embeddings": 128}, weights_bytes=1000)
    with pytest.raises(tune.TuneError, match=fragment):
        tune.plan(desc, [{"memory_total_mib": 1000, "compute_capability": cc}])
