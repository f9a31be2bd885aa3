"""API keys and their rotation (issue #31 item 5): plugins/module_utils/gpufleet/serve.py
(accepted_keys, probe_key, key_digest, auth_config, key_cut, the keys file in the plan),
grammar.api_key, the vllm_serve_plan refusal of a change that drops every key a running
container accepts, and the filters the roles call. What vLLM does with the file is
vLLM 0.32.0's own code (serve.AUTH_MOUNT cites it); the lab runs it (docs/security.md)."""
import socket

import pytest
import yaml

from gpufleet import grammar, serve
from test_serve import TUNE_TP1, FakeContainer, FakeDocker, _plan, _plan_params

OLD, NEW = "old-key-0123456789", "new-key-9876543210"


def test_accepted_keys_current_first_each_once_and_probe_key_by_phase():
    assert serve.accepted_keys(NEW) == [NEW]
    assert serve.accepted_keys(NEW, [OLD, NEW, OLD]) == [NEW, OLD]
    # phase 1 (new current, old retiring): our own requests carry the old key, which the
    # instances not yet replaced accept, and the replaced ones too
    assert serve.probe_key(NEW, [OLD]) == OLD
    # phase 2 (retiring emptied): the new key, which phase 1 made every instance accept
    assert serve.probe_key(NEW, []) == NEW
    assert serve.probe_key(NEW, [NEW]) == NEW


@pytest.mark.parametrize("bad, where", [
    ("short", "vllm_server_api_key"), ("has space in it", "vllm_server_api_key"),
    ("x" * 513, "vllm_server_api_key"), ("line\nbreak-key", "vllm_server_api_key"),
    (12345678, "vllm_server_api_key")])
def test_a_bad_key_is_refused_by_name_never_shown(bad, where):
    with pytest.raises(serve.PlanError) as exc:
        serve.accepted_keys(bad)
    assert where in str(exc.value) and "Nothing was changed" in str(exc.value)
    assert str(bad) not in str(exc.value)
    with pytest.raises(serve.PlanError, match=r"vllm_server_api_keys_retiring\[1\]") as exc:
        serve.accepted_keys(NEW, [OLD, bad])
    assert str(bad) not in str(exc.value)


def test_bad_api_keys_names_positions_only():
    assert grammar.bad_api_keys([NEW, "bad key", OLD, "x"]) == [1, 3]
    assert grammar.bad_api_keys([]) == []
    with pytest.raises(grammar.GrammarError, match="must be a list"):
        grammar.bad_api_keys(NEW)
    # RFC 6750's b64token: '=' only at the end
    assert grammar.bad_api_keys(["abcdefgh==", "abc=defgh"]) == [1]


def test_key_digest_is_stable_distinct_and_does_not_hold_the_key():
    assert serve.key_digest(NEW) == serve.key_digest(NEW)
    assert serve.key_digest(NEW) != serve.key_digest(OLD)
    assert len(serve.key_digest(NEW)) == 16 and NEW not in serve.key_digest(NEW)


def test_auth_config_is_the_yaml_vllm_reads():
    text = serve.auth_config([NEW, OLD])
    # vLLM's FlexibleArgumentParser.load_config_file: yaml.safe_load, a list becomes
    # `--api-key NEW OLD` (argparse_utils.py, vLLM 0.32.0)
    assert yaml.safe_load(text) == {"api-key": [NEW, OLD]}
    with pytest.raises(grammar.GrammarError):
        serve.auth_config([NEW, "evil\nport: 1"])


def test_the_plan_mounts_one_keys_file_per_set_and_hashes_the_set():
    one = _plan({"name": "m", "path": "/srv/m"}, TUNE_TP1,
                key_digests=[serve.key_digest(OLD)], auth_dir="/etc/gpufleet/vllm-auth")[0]
    assert one["command"][-2:] == ["--config", serve.AUTH_MOUNT]
    assert one["auth_file"].startswith("/etc/gpufleet/vllm-auth/") and one["auth_file"].endswith(".yaml")
    assert {"source": one["auth_file"], "target": serve.AUTH_MOUNT, "type": "bind",
            "read_only": True} in one["mounts"]
    assert one["labels"]["org.gpufleet.api-keys"] == serve.key_digest(OLD)
    assert "VLLM_API_KEY" not in one["env"]
    both = _plan({"name": "m", "path": "/srv/m"}, TUNE_TP1,
                 key_digests=[serve.key_digest(NEW), serve.key_digest(OLD)],
                 auth_dir="/etc/gpufleet/vllm-auth")[0]
    swapped = _plan({"name": "m", "path": "/srv/m"}, TUNE_TP1,
                    key_digests=[serve.key_digest(OLD), serve.key_digest(NEW)],
                    auth_dir="/etc/gpufleet/vllm-auth")[0]
    # a new set of keys: a new file and a new settings hash (the container is replaced);
    # the order of the keys does not matter
    assert both["auth_file"] != one["auth_file"]
    assert both["settings_hash"] != one["settings_hash"]
    assert swapped["settings_hash"] == both["settings_hash"]
    assert swapped["auth_file"] == both["auth_file"]
    # the argument check runs without the file (not mounted there): the same check covers
    # every set of keys
    assert serve.AUTH_MOUNT not in serve.args_check_command(both["command"])
    assert both["args_hash"] == one["args_hash"]
    with pytest.raises(serve.PlanError, match="auth_dir"):
        _plan({"name": "m", "path": "/srv/m"}, TUNE_TP1, key_digests=["ab"], auth_dir="")
    with pytest.raises(serve.PlanError, match="auth_dir"):
        _plan({"name": "m", "path": "/srv/m"}, TUNE_TP1, key_digests=["ab"],
              auth_dir="/etc/x y")


def test_key_cut_only_when_no_key_is_kept():
    label = {"org.gpufleet.api-keys": serve.key_digest(OLD)}
    assert serve.key_cut("c", label, [serve.key_digest(NEW), serve.key_digest(OLD)]) == ""
    assert serve.key_cut("c", {}, [serve.key_digest(NEW)]) == ""  # made before the label
    cut = serve.key_cut("c", label, [serve.key_digest(NEW)])
    assert "c accepts none of the keys" in cut and "vllm_server_api_keys_retiring" in cut
    assert "Nothing was changed" in cut and "vllm_server_api_key_cutover" in cut


def test_vllm_serve_plan_refuses_a_change_that_drops_every_running_key(tmp_path):
    import vllm_serve_plan
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
    old = _plan_params(tmp_path, port=port, check_ports=False,
                       key_digests=[serve.key_digest(OLD)], auth_dir=str(tmp_path / "auth"),
                       allow_key_cutover=False)
    running = vllm_serve_plan.run(old, FakeDocker([]))["instances"][0]
    ours = FakeContainer("vllmsrv-m", running["labels"])
    assert vllm_serve_plan.run(old, FakeDocker([ours]))["instances"][0]["action"] == "keep"
    # phase 1: the new key beside the old one: a replacement
    phase1 = dict(old, key_digests=[serve.key_digest(NEW), serve.key_digest(OLD)])
    planned = vllm_serve_plan.run(phase1, FakeDocker([ours]))["instances"][0]
    assert planned["action"] == "replace"
    # straight to the new key alone: refused before anything changes, naming the way
    cut = dict(old, key_digests=[serve.key_digest(NEW)])
    with pytest.raises(ValueError, match="vllmsrv-m accepts none of the keys"):
        vllm_serve_plan.run(cut, FakeDocker([ours]))
    # the control: with the cutover allowed, the same plan replaces it
    assert vllm_serve_plan.run(dict(cut, allow_key_cutover=True),
                               FakeDocker([ours]))["instances"][0]["action"] == "replace"
    # phase 2 after phase 1: the container accepts both, the new set keeps the new key
    both = FakeContainer("vllmsrv-m", planned["labels"])
    assert vllm_serve_plan.run(cut, FakeDocker([both]))["instances"][0]["action"] == "replace"
    # a stopped container serves nobody: not refused
    stopped = FakeContainer("vllmsrv-m", running["labels"], status="exited")
    assert vllm_serve_plan.run(cut, FakeDocker([stopped]))["instances"][0]["action"] == "replace"


def test_the_filters_never_show_a_key():
    import importlib.util
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("gpufleet_filters", root / "plugins/filter/gpufleet.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    filters = mod.FilterModule().filters()
    assert filters["gpufleet_probe_key"](NEW, [OLD]) == OLD
    assert filters["gpufleet_key_digests"](NEW, [OLD]) == [serve.key_digest(NEW), serve.key_digest(OLD)]
    assert yaml.safe_load(filters["gpufleet_auth_config"](NEW, [OLD])) == {"api-key": [NEW, OLD]}
    assert filters["gpufleet_bad_api_keys"]([NEW, "bad"]) == [1]
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError) as exc:
        filters["gpufleet_auth_config"](NEW, ["not a key!"])
    assert "not a key!" not in str(exc.value) and "vllm_server_api_keys_retiring[0]" in str(exc.value)
