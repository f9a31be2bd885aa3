"""--trust-remote-code is refused unless the model's lock pins every *.py file of the model
(issue #32 item 8): the folder's, with the sha256 they have there, and every module
config.json's auto_map names; code of another repository is refused outright."""
import hashlib
import json
import shutil

import pytest

import vllm_tune
from conftest import FIXTURES
from gpufleet import model as m
from gpufleet import tune as t
from helpers import run_module

GiB = 1 << 30
TRC = ["--trust-remote-code"]
CONFIG_PY = b"class InternLM2Config:\n    pass\n"
MODELING_PY = b"class InternLM2ForCausalLM:\n    pass\n"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def model_dir(tmp_path, extra=None):
    """internlm2_5-7b's config.json (auto_map: configuration_internlm2, modeling_internlm2)
    with its two Python files and `extra` ({path: bytes})."""
    folder = tmp_path / "internlm2"
    folder.mkdir()
    shutil.copy(FIXTURES / "models" / "internlm2_5-7b" / "config.json", folder / "config.json")
    files = {"configuration_internlm2.py": CONFIG_PY, "modeling_internlm2.py": MODELING_PY,
             **(extra or {})}
    for path, data in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(data)
    return folder, files


def lock_of(files):
    return {"repo_id": "internlm/internlm2_5-7b", "commit": "1" * 40,
            "files": {"config.json": "2" * 64, **{p: sha256(d) for p, d in files.items()}}}


def plan(folder, lock, extra_args=TRC):
    desc = m.describe_model_dir(str(folder), weights_bytes=GiB)
    return t.plan(desc, [], kv_cache_memory_bytes=GiB, max_model_len=512,
                  extra_args=extra_args, lock=lock)


def test_the_folder_s_python_and_auto_map_s_modules_are_described(tmp_path):
    folder, files = model_dir(tmp_path, {"sub/helper.py": b"x = 1\n"})
    (folder / ".gpufleet").mkdir()
    (folder / ".gpufleet" / "state.py").write_bytes(b"ignored")
    desc = m.describe_model_dir(str(folder), weights_bytes=GiB)
    assert desc["python_files"] == {p: sha256(d) for p, d in files.items()}
    assert desc["remote_code_repos"] == []
    assert m.auto_map_modules({"auto_map": {
        "AutoConfig": "configuration_x.XConfig",
        "AutoTokenizer": ["tokenization_x.XTokenizer", None],
        "AutoModel": "org/other--modeling_x.XModel"}}) == (
        ["configuration_x.py", "tokenization_x.py"], ["org/other"])


def test_a_lock_pinning_every_python_file_lets_the_plan_through(tmp_path):
    folder, files = model_dir(tmp_path)
    result = plan(folder, lock_of(files))
    assert "--trust-remote-code" in result["args"]
    assert any(r.startswith("--trust-remote-code: the lock of internlm/internlm2_5-7b@")
               and "configuration_internlm2.py, modeling_internlm2.py" in r
               for r in result["reasons"])


def test_without_a_lock_it_is_refused(tmp_path):
    folder, _ = model_dir(tmp_path)
    with pytest.raises(t.TuneError, match="--trust-remote-code, which runs the repository's "
                                          "Python.*give the model's lock"):
        plan(folder, None)


def test_a_python_file_the_lock_does_not_pin_is_named(tmp_path):
    folder, files = model_dir(tmp_path, {"sub/helper.py": b"x = 1\n"})
    lock = lock_of(files)
    del lock["files"]["sub/helper.py"]
    with pytest.raises(t.TuneError, match=r"does not pin sub/helper\.py \("):
        plan(folder, lock)


def test_an_auto_map_module_the_lock_does_not_pin_is_named(tmp_path):
    """Not in the folder (a fetch with patterns left it out) and not in the lock."""
    folder, files = model_dir(tmp_path)
    (folder / "modeling_internlm2.py").unlink()
    lock = lock_of(files)
    del lock["files"]["modeling_internlm2.py"]
    with pytest.raises(t.TuneError, match=r"does not pin modeling_internlm2\.py"):
        plan(folder, lock)


def test_a_python_file_other_than_the_lock_s_is_refused_with_both_values(tmp_path):
    folder, files = model_dir(tmp_path)
    lock = lock_of(files)
    swapped = b"import os\nos.system('x')\n"
    (folder / "modeling_internlm2.py").write_bytes(swapped)
    with pytest.raises(t.TuneError) as exc:
        plan(folder, lock)
    assert (f"modeling_internlm2.py: the lock pins sha256 {sha256(MODELING_PY)}, the model "
            f"folder holds sha256 {sha256(swapped)}") in str(exc.value)


def test_code_of_another_repository_is_refused(tmp_path):
    folder, files = model_dir(tmp_path)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"]["AutoModel"] = "evil/code--modeling_x.Model"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(t.TuneError, match=r"names code of another repository \(evil/code\)"):
        plan(folder, lock_of(files))


def test_a_bad_lock_is_refused():
    desc = m.describe_config(json.loads(
        (FIXTURES / "models" / "internlm2_5-7b" / "config.json").read_text()), weights_bytes=GiB)
    with pytest.raises(t.TuneError, match="lock: .*is not a commit sha"):
        t.plan(desc, [], kv_cache_memory_bytes=GiB, max_model_len=512, extra_args=TRC,
               lock={"repo_id": "a/b", "commit": "main", "files": {"x.py": "0" * 64}})


def test_no_lock_is_needed_without_the_flag(tmp_path):
    """The control: a model needing no remote code plans without a lock."""
    folder = tmp_path / "llama"
    folder.mkdir()
    shutil.copy(FIXTURES / "models" / "llama-3.1-8b" / "config.json", folder / "config.json")
    (folder / "stray.py").write_bytes(b"pass\n")
    assert plan(folder, None, extra_args=[])["args"]


def test_vllm_tune_takes_the_lock(tmp_path, monkeypatch):
    folder, files = model_dir(tmp_path)
    base = {"model_path": str(folder), "weights_bytes": GiB, "gpus": [],
            "kv_cache_memory_bytes": GiB, "max_model_len": 512, "extra_args": TRC}
    res, failed = run_module(vllm_tune.main, base, monkeypatch)
    assert failed and "give the model's lock" in res["msg"]
    res, failed = run_module(vllm_tune.main, {**base, "lock": lock_of(files)}, monkeypatch)
    assert not failed and "--trust-remote-code" in res["args"], res.get("msg")
    path = tmp_path / "internlm2.lock.json"
    path.write_text(json.dumps(lock_of(files)))
    res, failed = run_module(vllm_tune.main, {**base, "lock": str(path)}, monkeypatch)
    assert not failed, res.get("msg")
    res, failed = run_module(vllm_tune.main, {**base, "lock": str(tmp_path / "none.yml")},
                             monkeypatch)
    assert failed and "cannot read the lock file" in res["msg"]
