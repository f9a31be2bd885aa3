"""cuda_compat, vllm_serve_plan and nvidia_driver_plan: bad versions, ports, addresses
and branches are clear errors that say what to do. Each case was a
traceback or a wrong answer at f11dbb6.
"""
import pytest

from gpufleet import cuda, hoststack, serve
from helpers import run_module


# --------------------------------------------------------------------------------------
# cuda_compat, vllm_serve_plan, nvidia_driver_plan
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,fragment", [
    (dict(driver_version="99999999999999999999.1", cuda_version="12.2"), "malformed"),
    (dict(driver_version="535.99999999.03", cuda_version="12.2"), "malformed"),
    (dict(driver_version="5350.129.03", cuda_version="12.2"), "malformed"),
    (dict(driver_version="580.65.06", cuda_version="12.7"), "no 12.7 toolkit"),
    (dict(driver_version="580.65.06", cuda_version="12.99"), "not a CUDA toolkit release"),
    (dict(driver_version="580.65.06", cuda_version="999999999.0"), "malformed"),
    (dict(driver_version="580.65.06", require_cuda="cuda>=12.7"), "no 12.7 toolkit"),
])
def test_cuda_compat_refuses_impossible_versions(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        cuda.check(**kwargs)


@pytest.mark.parametrize("branch", ["abc", "5x0", "-1", "58.0", " "])
def test_cuda_compat_non_numeric_branch_says_what_to_do(branch, monkeypatch):
    import cuda_compat
    result, failed = run_module(cuda_compat.main, {
        "driver_branch": branch, "cuda_version": "12.4"}, monkeypatch)
    assert failed and "invalid literal" not in result["msg"]
    assert "driver_branch" in result["msg"] and "580" in result["msg"]


@pytest.mark.parametrize("version", ["-1", "abc", "580", "580.x.1", "99999999999.1"])
def test_driver_version_that_is_not_a_version_is_refused(version):
    with pytest.raises(hoststack.HostStackError) as exc:
        hoststack.resolve_driver_version("580", version, None, ["580.65.06-1"])
    msg = str(exc.value)
    assert "is not a driver version" in msg and "set nvidia_driver_branch" not in msg


def _plan(port=None, default_port=8000, bind_address="127.0.0.1", replicas=False):
    entry = {"name": "m", "path": "/p"}
    if port is not None:
        entry["port"] = port
    tune_result = {"args": ["--tensor-parallel-size", "1"],
                   "settings": {"tensor_parallel_size": 1}}
    return serve.plan_instances(
        entry, tune_result, image="i", image_id="sha256:aa", container_prefix="vllm-",
        default_port=default_port, gpu_indexes=[0, 1], gpu_runtime="nvidia",
        allow_replicas=replicas, bind_address=bind_address)


@pytest.mark.parametrize("kwargs", [
    dict(port="abc"), dict(port=99999), dict(port=-1), dict(port=65536), dict(port="80.5"),
    dict(port=True), dict(default_port=99999), dict(port=65535, replicas=True),
])
def test_serve_plan_refuses_a_port_outside_1_65535(kwargs):
    with pytest.raises(serve.PlanError, match="65535"):
        _plan(**kwargs)


@pytest.mark.parametrize("address", ["not an address", "999.1.1.1", "no-such-host.invalid",
                                     "bad\x00name"])
def test_serve_plan_refuses_an_address_that_is_not_one(address):
    with pytest.raises(serve.PlanError, match="not an IP address or a name this host resolves"):
        _plan(bind_address=address)
    with pytest.raises(serve.PlanError, match="not an IP address"):
        serve.port_is_free(address, 8000)


def test_serve_plan_good_ports_and_addresses_still_plan():
    assert _plan(port="9000")[0]["port"] == 9000
    assert [i["port"] for i in _plan(port=65534, replicas=True)] == [65534, 65535]
    assert _plan(bind_address="0.0.0.0")[0]["port"] == 8000
    assert _plan(bind_address="localhost")[0]["port"] == 8000
    assert _plan(bind_address="::1")[0]["port"] == 8000


@pytest.mark.parametrize("models,fragment", [
    ([{"name": "m", "port": "abc"}], "not a TCP port"),
    ([{"name": "m", "port": 99999}], "not a TCP port"),
])
def test_vllm_serve_plan_module_fails_clearly_on_bad_ports(tmp_path, monkeypatch, models,
                                                           fragment):
    import vllm_serve_plan

    class NoContainers:
        containers = None

        def list(self, all=False, filters=None):
            return []
    client = NoContainers()
    client.containers = client
    monkeypatch.setattr(vllm_serve_plan.docker, "from_env", lambda: client)
    (tmp_path / "m").mkdir()
    for entry in models:
        entry["path"] = str(tmp_path / "m")
    result, failed = run_module(vllm_serve_plan.main, {
        "models": models, "tunes": [{"args": ["--x"], "settings": {"tensor_parallel_size": 1}}],
        "image": "i", "image_id": "sha256:aa", "gpu_runtime": "none"}, monkeypatch)
    assert failed and fragment in result["msg"]


def test_vllm_serve_plan_bad_bind_address_is_not_port_in_use(tmp_path, monkeypatch):
    import vllm_serve_plan

    class NoContainers:
        def list(self, all=False, filters=None):
            return []
    client = NoContainers()
    client.containers = client
    monkeypatch.setattr(vllm_serve_plan.docker, "from_env", lambda: client)
    (tmp_path / "m").mkdir()
    result, failed = run_module(vllm_serve_plan.main, {
        "models": [{"name": "m", "path": str(tmp_path / "m")}],
        "tunes": [{"args": ["--x"], "settings": {"tensor_parallel_size": 1}}], "image": "i", "image_id": "sha256:aa",
        "gpu_runtime": "none", "bind_address": "no-such-host.invalid", "port": 8123},
        monkeypatch)
    assert failed and "already in use" not in result["msg"]
    assert "not an IP address or a name this host resolves" in result["msg"]
