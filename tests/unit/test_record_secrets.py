"""The host's last-good record keeps no secret (issue #31 item 8) and is the host's own
(issue #32 item 6): plugins/module_utils/gpufleet/redact.py (the rule), upgrade.build_record and
rollback_vars around it, and the module vllm_record writing and reading the file."""
import json
import os
import secrets
import stat

import pytest

from gpufleet import redact, serve, upgrade
from helpers import run_module

IMAGE_ID = "sha256:" + "ab" * 32


def _token():
    # the shape of a Hugging Face token: "hf_" and 34 random characters
    return "hf_" + secrets.token_hex(17)


def _inventory(token):
    """vllm_server_models with `token` in every place a secret can be given: each model's
    env, extra_args as `--opt value`, `--opt=value` and an option of two values, and an
    entry key named for a token. The served name and image tag are not secrets and are
    recorded as they are: they carry markers, so a test sees the whole record."""
    return [
        {"name": "org/chat", "path": "/srv/models/org/chat", "served_model_name": "chat-MARK1",
         "env": {"HF_TOKEN": token, "HTTPS_PROXY": f"http://u:{token}@proxy:3128",
                 "VLLM_API_KEY": token, "PLAIN": "1"},
         "extra_args": ["--hf-token", token, "--max-num-seqs", "8", f"--api-key={token}",
                        "--client-secret", token, token + "2", "--enable-auto-tool-choice"]},
        {"name": "org/embed", "path": "/srv/models/org/embed", "port": 8100,
         "env": {"HUGGING_FACE_HUB_TOKEN": token},
         "extra_args": [f"--hf-token={token}", "--max-num-batched-tokens", "4096"],
         "hf_token": token},
    ]


def _plan(models, token):
    """The instances serve.plan_instances makes of them (env and command hold the token,
    as on the host); the API key given as base env too, as if a path put it there."""
    out = []
    for number, model in enumerate(models):
        tune = {"args": list(model.get("extra_args", [])), "settings": {}}
        for inst in serve.plan_instances(model, tune, image="registry.example/vllm:MARK2",
                                         image_id=IMAGE_ID, container_prefix="vllm-",
                                         default_port=8000 + 100 * number, gpu_indexes=[],
                                         gpu_runtime="none", allow_replicas=False,
                                         base_env={"VLLM_API_KEY": token},
                                         revision="c0ffee"):
            assert token in json.dumps(inst)  # the plan holds it: the record must not
            out.append(inst)
    return out


def _record(token):
    models = _inventory(token)
    inputs = {"vllm_server_image": "registry.example/vllm:MARK2",
              "vllm_server_vllm_version": "0.32.0", "vllm_server_models": models,
              "vllm_server_port": 8000,
              # record.yml passes only RECORD_INPUTS; given anyway, it must not get in
              "vllm_server_api_key": token, "vllm_server_env": {"X": token}}
    return upgrade.build_record(inputs, IMAGE_ID, _plan(models, token), "580.95.05")


def _assert_no_secret(text, token):
    assert token not in text, "the record holds the secret"
    assert token[3:] not in text and token[3:15] not in text  # nor a part of it


def test_no_input_brings_a_secret_into_the_record():
    token = _token()
    record = _record(token)
    text = json.dumps(record)
    _assert_no_secret(text, token)
    # the record is the whole record: what is not secret is there as given
    assert "chat-MARK1" in text and "registry.example/vllm:MARK2" in text
    chat, embed = record["inputs"]["vllm_server_models"]
    assert chat["env"]["HF_TOKEN"] == redact.digest(token)
    assert chat["env"]["PLAIN"] == redact.digest("1")  # every env value: keys only
    assert chat["extra_args"] == [
        "--hf-token", redact.digest(token), "--max-num-seqs", "8",
        f"--api-key={redact.digest(token)}", "--client-secret", redact.digest(token),
        redact.digest(token + "2"), "--enable-auto-tool-choice"]
    assert embed["extra_args"] == [f"--hf-token={redact.digest(token)}",
                                   "--max-num-batched-tokens", "4096"]
    assert embed["hf_token"] == redact.digest(token)
    assert record["version"] == upgrade.RECORD_VERSION == 2
    assert "vllm_server_api_key" not in record["inputs"]
    # what vllm_server's preflight and the rollback read is still there
    assert [i["args_hash"] for i in record["instances"]] == [
        i["args_hash"] for i in _plan(_inventory(token), token)]


def test_control_a_record_built_the_old_way_fails_the_same_check():
    """The check above catches a record that keeps the values verbatim, as build_record
    did before (its inputs' vllm_server_models as given)."""
    token = _token()
    record = _record(token)
    record["inputs"]["vllm_server_models"] = _inventory(token)
    record["version"] = 1
    with pytest.raises(AssertionError, match="holds the secret"):
        _assert_no_secret(json.dumps(record), token)


@pytest.mark.parametrize("name, secret", [
    ("--api-key", True), ("--hf-token", True), ("--client-secret", True),
    ("--db-password", True), ("--aws_credentials", True), ("HF_TOKEN", True),
    ("hf_token", True), ("apiKey", True), ("--max-num-batched-tokens", False),
    ("--tokenizer", False), ("--tokenizer-mode", False), ("--ssl-keyfile", False),
    ("--kv-cache-dtype", False), ("served_model_name", False), ("--max-model-len", False),
])
def test_secret_names_are_whole_words(name, secret):
    assert redact.secret_name(name) is secret


def test_a_secret_named_flag_without_a_value_is_kept():
    args = ["--return-tokens-as-token-ids", "--max-num-seqs", "8", "--hf-token"]
    assert redact.redact_args(args) == args


# ----------------------------------------------------------------- rollback
def test_rollback_restores_each_secret_whose_digest_matches():
    token = _token()
    record = json.loads(json.dumps(_record(token)))  # as read from the host
    out = upgrade.rollback_vars(record, current_models=_inventory(token))
    assert out["vllm_server_models"] == _inventory(token)  # the very values: same hashes
    assert out["record_notes"] == []


def test_rollback_takes_a_changed_or_removed_secret_from_the_inventory_and_says_so():
    token, new = _token(), _token()
    record = json.loads(json.dumps(_record(token)))
    current = _inventory(token)
    current[0]["env"]["HF_TOKEN"] = new
    del current[0]["env"]["VLLM_API_KEY"]
    current[0]["extra_args"][1] = new  # --hf-token's value
    current[1]["extra_args"][0] = "--hf-token=" + new
    out = upgrade.rollback_vars(record, current_models=current)
    chat, embed = out["vllm_server_models"]
    assert chat["env"] == {"HF_TOKEN": new, "HTTPS_PROXY": f"http://u:{token}@proxy:3128",
                           "PLAIN": "1"}
    assert chat["extra_args"] == ["--hf-token", new, "--max-num-seqs", "8",
                                  f"--api-key={token}", "--client-secret", token,
                                  token + "2", "--enable-auto-tool-choice"]
    assert embed["extra_args"] == [f"--hf-token={new}", "--max-num-batched-tokens", "4096"]
    notes = out["record_notes"]
    assert notes == [
        "model org/chat: env HF_TOKEN differs from the recorded one, so the inventory's "
        "current value is used",
        "model org/chat: env VLLM_API_KEY is no longer in the inventory, so the rollback "
        "runs without it",
        "model org/chat: extra_args --hf-token differs from the recorded one, so the "
        "inventory's current value is used",
        "model org/embed: extra_args --hf-token differs from the recorded one, so the "
        "inventory's current value is used"]
    _assert_no_secret(" ".join(notes), token)
    _assert_no_secret(" ".join(notes), new)


def test_rollback_refuses_a_removed_model_with_secrets_naming_what_is_missing():
    token = _token()
    record = json.loads(json.dumps(_record(token)))
    with pytest.raises(upgrade.UpgradeError) as exc:
        upgrade.rollback_vars(record, current_models=_inventory(token)[:1])
    msg = str(exc.value)
    assert ("no longer has model org/embed (env HUGGING_FACE_HUB_TOKEN, extra_args "
            "--hf-token, hf_token): put the entry back") in msg
    assert "org/chat" not in msg and "sha256:" not in msg
    _assert_no_secret(msg, token)
    # a model without secrets needs no inventory entry
    plain = upgrade.build_record(
        {"vllm_server_image": "i", "vllm_server_vllm_version": "0.32.0", "vllm_server_port": 1,
         "vllm_server_models": [{"name": "m", "path": "/p"}]}, IMAGE_ID, [])
    assert upgrade.rollback_vars(plain)["vllm_server_models"] == [{"name": "m", "path": "/p"}]


def test_a_record_written_before_redaction_is_still_rolled_back_to():
    token = _token()
    old = json.loads(json.dumps(_record(token)))
    old["version"], old["inputs"]["vllm_server_models"] = 1, _inventory(token)
    out = upgrade.rollback_vars(old, current_models=[])
    assert out["vllm_server_models"] == _inventory(token) and out["record_notes"] == []


# ----------------------------------------------------------------- the module
def _files_under(root):
    return [p for p in root.rglob("*") if p.is_file()]


def test_vllm_record_writes_0600_and_nothing_it_writes_holds_a_secret(tmp_path, monkeypatch):
    import vllm_record
    token = _token()
    path = tmp_path / "gpufleet" / "vllm-last-good.json"
    result, failed = run_module(vllm_record.main, {"path": str(path), "record": _record(token)},
                                monkeypatch)
    assert not failed and result["changed"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.geteuid()
    files = _files_under(tmp_path)
    assert files == [path]  # no temporary file left beside it
    for written in files:
        _assert_no_secret(written.read_text(), token)
    _assert_no_secret(json.dumps(result), token)
    read, failed = run_module(vllm_record.main, {"path": str(path), "state": "read"},
                              monkeypatch)
    assert not failed and read["record"]["version"] == 2
    _assert_no_secret(json.dumps(read), token)


def test_vllm_record_refuses_a_record_of_the_old_format(tmp_path, monkeypatch):
    import vllm_record
    token = _token()
    old = _record(token)
    old["version"], old["inputs"]["vllm_server_models"] = 1, _inventory(token)
    path = tmp_path / "rec.json"
    result, failed = run_module(vllm_record.main, {"path": str(path), "record": old},
                                monkeypatch)
    assert failed and "gpufleet_build_record" in result["msg"] and not path.exists()


def test_an_old_0644_record_is_read_then_replaced_and_tightened(tmp_path, monkeypatch):
    import vllm_record
    token = _token()
    old = _record(token)
    old["version"], old["inputs"]["vllm_server_models"] = 1, _inventory(token)
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(old))
    path.chmod(0o644)
    read, failed = run_module(vllm_record.main, {"path": str(path), "state": "read"},
                              monkeypatch)
    assert not failed and read["record"]["version"] == 1  # still accepted
    new = _record(token)
    result, _ = run_module(vllm_record.main, {"path": str(path), "record": new}, monkeypatch,
                           check_mode=True)
    assert result["changed"] and token in path.read_text()  # check mode writes nothing
    result, _ = run_module(vllm_record.main, {"path": str(path), "record": new,
                                              "_ansible_diff": True}, monkeypatch)
    assert result["changed"] and stat.S_IMODE(path.stat().st_mode) == 0o600
    _assert_no_secret(path.read_text(), token)
    # --diff shows the old record's models as the new one keeps them, and the mode
    assert result["diff"]["before_header"] == f"{path} (mode 0644, uid {os.geteuid()})"
    assert '"version": 1' in result["diff"]["before"]
    _assert_no_secret(json.dumps(result), token)
    # the same content at 0644: only the mode is wrong, still a change
    path.chmod(0o644)
    result, _ = run_module(vllm_record.main, {"path": str(path), "record": new}, monkeypatch)
    assert result["changed"] and stat.S_IMODE(path.stat().st_mode) == 0o600
    again, _ = run_module(vllm_record.main, {"path": str(path), "record": new}, monkeypatch)
    assert not again["changed"]


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_read_refuses_a_record_others_may_write(tmp_path, monkeypatch, mode):
    import vllm_record
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(_record(_token())))
    path.chmod(mode)
    result, failed = run_module(vllm_record.main, {"path": str(path), "state": "read"},
                                monkeypatch)
    assert failed and "record" not in result
    assert f"{path} is owned by" in result["msg"] and f"with mode {mode:04o}" in result["msg"]
    assert f"chmod 0600 {path}" in result["msg"] and "run site.yml" in result["msg"]


def test_read_refuses_a_record_of_another_owner(tmp_path, monkeypatch):
    """The owner required is the user the module runs as: root under become. A test run
    by anyone shows it by running the module as another uid than the file's."""
    import vllm_record
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(_record(_token())))
    path.chmod(0o600)
    me = os.geteuid()
    monkeypatch.setattr(vllm_record.os, "geteuid", lambda: me + 4242)
    result, failed = run_module(vllm_record.main, {"path": str(path), "state": "read"},
                                monkeypatch)
    assert failed and f"uid {me}" in result["msg"] and "mode 0600" in result["msg"]
    assert f"uid {me + 4242}" in result["msg"] and f"chown {me + 4242} {path}" in result["msg"]
    if me == 0:  # as root, a file really owned by someone else (nobody)
        monkeypatch.setattr(vllm_record.os, "geteuid", lambda: 0)
        os.chown(path, 65534, 65534)
        result, failed = run_module(vllm_record.main, {"path": str(path), "state": "read"},
                                    monkeypatch)
        assert failed and "uid 65534" in result["msg"] and "root (uid 0)" in result["msg"]


def test_vllm_record_read_says_whether_a_rollback_could_run(tmp_path):
    """check_image (issue #31 item 7): the record's image by id must still be on the host."""
    import vllm_record
    path = tmp_path / "last-good.json"
    params = {"path": str(path), "state": "read", "check_image": True}
    asked = []

    def present(image_id):
        asked.append(image_id)
        return image_id == "sha256:here"
    none = vllm_record.run(params, False, image_present=present)
    assert none["image_present"] is False and "has no last-good record" in none["problem"]
    assert asked == []  # no record, nothing to ask
    for image_id, ok in (("sha256:here", True), ("sha256:gone", False)):
        path.write_text(json.dumps({"version": 2, "image_ref": "vllm:x", "image_id": image_id}))
        path.chmod(0o600)
        result = vllm_record.run(params, False, image_present=present)
        assert result["image_present"] is ok
        assert (result["problem"] == "") is ok, result["problem"]
    assert asked == ["sha256:here", "sha256:gone"]
