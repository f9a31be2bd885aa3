"""The model_fetch role's locks (issue #32 item 8): gpufleet.model_lock.resolve_locks (the
gpufleet_model_locks filter) finds and checks each model's lock on the control node in the
preflight, before any change, and the role hands it to hf_model.

The hubs are tests/hfstub/server.py's HubStub (STAND-INs on 127.0.0.1); the hostile one
serves a swapped weights file under the trusted commit with a listing that matches it."""
import pathlib

import pytest

from conftest import ROOT
from gpufleet import model_lock
from gpufleet.model_lock import resolve_locks
from helpers import run_playbook, run_role_preflight
from test_hf_model_lock import EVIL_WEIGHTS, LOCK, REPO, TRUSTED_REPO, hostile
from hfstub.server import HubStub  # noqa: E402


def write_lock(folder, lock=LOCK):
    path = folder / model_lock.lock_file_name(lock["repo_id"])
    path.write_text(model_lock.render_lock(model_lock.parse_lock(lock)))
    return path


def test_resolve_locks_finds_each_source_in_order(tmp_path):
    path = write_lock(tmp_path)
    assert path.name == "org--tiny.lock.yml"
    other = {**LOCK, "commit": "b" * 40}
    for entries, locks, lock_dir, commit in [
        ([{"repo_id": REPO, "lock": LOCK}], {REPO: other}, "", LOCK["commit"]),
        ([{"repo_id": REPO, "lock": str(path)}], {}, "", LOCK["commit"]),
        ([{"repo_id": REPO}], {REPO: other}, str(tmp_path), other["commit"]),
        ([{"repo_id": REPO}], {}, str(tmp_path), LOCK["commit"]),
    ]:
        items, problems = resolve_locks(entries, locks, lock_dir)
        assert problems == []
        # revision defaults to the lock's commit; the lock goes on as a plain dict
        assert items[0]["revision"] == commit and items[0]["lock"]["commit"] == commit
    items, problems = resolve_locks([{"repo_id": REPO, "revision": "main"}], {}, "")
    assert problems == [] and "lock" not in items[0] and items[0]["revision"] == "main"


@pytest.mark.parametrize("entry, locks, require, needle", [
    ({"repo_id": REPO}, {}, True, "org/tiny: no lock (model_fetch_require_lock is set)"),
    ({"repo_id": REPO, "lock": {**LOCK, "commit": "main"}}, {}, False, "is not a commit sha"),
    ({"repo_id": REPO}, {REPO: {**LOCK, "repo_id": "org/other"}}, False,
     "the lock is for org/other, not org/tiny"),
    ({"repo_id": REPO, "revision": "c" * 40, "lock": LOCK}, {}, False,
     f"revision {'c' * 40} is not the commit the lock pins ({LOCK['commit']})"),
    ({"repo_id": REPO, "lock": "locks/tiny.yml"}, {}, False, "must be an absolute path"),
    ({"repo_id": REPO, "lock": "/nonexistent/tiny.yml"}, {}, False,
     "cannot read the lock file '/nonexistent/tiny.yml'"),
])
def test_resolve_locks_refusals(entry, locks, require, needle):
    _, problems = resolve_locks([entry], locks, "", require)
    assert len(problems) == 1 and needle in problems[0], problems


def test_preflight_refuses_a_bad_lock_before_any_change(tmp_path):
    rc, failures, changed = run_role_preflight(tmp_path, "model_fetch", {
        "model_fetch_models": [{"repo_id": REPO, "lock": {**LOCK, "files": {"a.py": "x"}}}],
        "model_fetch_root": str(tmp_path / "models")})
    assert rc != 0 and changed == []
    assert len(failures) == 1 and "Model_fetch | Check the locks: " in failures[0]
    assert "a.py: 'x' is not a sha256" in failures[0] and "Nothing was changed" in failures[0]
    # the control: the same preflight with the good lock passes
    rc, failures, _ = run_role_preflight(tmp_path, "model_fetch", {
        "model_fetch_models": [{"repo_id": REPO, "lock": LOCK}],
        "model_fetch_root": str(tmp_path / "models")})
    assert rc == 0, failures


def _role_check_run(tmp_path, stub, **extra):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(f"all:\n  hosts:\n    h:\n      ansible_connection: local\n"
                         f"      ansible_python_interpreter: {ROOT / '.venv/bin/python'}\n")
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: h\n  gather_facts: false\n  roles: [gpufleet.fleet.model_fetch]\n")
    return run_playbook(inventory, playbook, "h", {
        "model_fetch_models": [{"repo_id": REPO}], "model_fetch_root": str(tmp_path / "models"),
        "model_fetch_endpoint": stub.url, "model_fetch_create_group": False,
        "model_fetch_group": "root", "model_fetch_retries": 0, **extra}, check=True)


def test_the_role_hands_the_lock_to_hf_model(tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir()
    write_lock(locks)
    with HubStub([hostile({"model.safetensors": EVIL_WEIGHTS})]) as stub:
        # the control: without a lock, the hostile mirror's listing is accepted
        rc, _, failures, _ = _role_check_run(tmp_path, stub)
        assert rc == 0, failures
        rc, _, failures, _ = _role_check_run(tmp_path, stub,
                                             model_fetch_lock_dir=str(locks))
    assert rc != 0
    assert len(failures) == 1 and "Report what would be fetched" in failures[0]
    assert f"the lock pins sha256 {LOCK['files']['model.safetensors']}" in failures[0]
    with HubStub([TRUSTED_REPO]) as stub:
        rc, _, failures, _ = _role_check_run(tmp_path, stub, model_fetch_lock_dir=str(locks),
                                             model_fetch_require_lock=True)
    assert rc == 0, failures


def test_the_lock_playbook_writes_beside_the_inventory_what_the_role_reads(tmp_path):
    inv_dir = tmp_path / "inv"
    inv_dir.mkdir()
    inventory = inv_dir / "hosts.yml"
    inventory.write_text(f"all:\n  children:\n    gpu_hosts:\n      hosts:\n        h:\n"
                         f"          ansible_connection: local\n"
                         f"          ansible_python_interpreter: {ROOT / '.venv/bin/python'}\n"
                         f"          model_fetch_models: [{{repo_id: {REPO}}}]\n"
                         f"  hosts:\n    localhost:\n      ansible_connection: local\n"
                         f"      ansible_python_interpreter: {ROOT / '.venv/bin/python'}\n")
    playbook = ROOT / "playbooks/model_lock.yml"
    with HubStub([TRUSTED_REPO]) as stub:
        rc, changed, failures, _ = run_playbook(inventory, playbook, "localhost",
                                                {"model_lock_endpoint": stub.url})
        assert rc == 0, failures
        path = inv_dir / "locks" / model_lock.lock_file_name(REPO)
        written = model_lock.load_lock_file(str(path))
        assert written.as_dict()["files"] == LOCK["files"] and written.commit == LOCK["commit"]
        rc, changed, failures, _ = run_playbook(inventory, playbook, "localhost",
                                                {"model_lock_endpoint": stub.url})
        assert rc == 0 and changed == 0, failures
    # the role finds it by model_fetch_lock_dir and refuses the hostile mirror with it
    with HubStub([hostile({"model.safetensors": EVIL_WEIGHTS})]) as stub:
        rc, _, failures, _ = _role_check_run(tmp_path, stub,
                                             model_fetch_lock_dir=str(inv_dir / "locks"))
    assert rc != 0 and LOCK["files"]["model.safetensors"] in failures[0], failures


def test_the_lock_playbook_without_an_inventory_folder_asks_for_model_lock_dir(tmp_path):
    """#33 item 1: with no host of gpu_hosts and no localhost in an inventory file, the
    locks went to playbook_dir/locks, inside the collection when run as
    gpufleet.fleet.model_lock; now the run stops and names model_lock_dir, writing
    nothing."""
    inv_dir = tmp_path / "inv"
    inv_dir.mkdir()
    inventory = inv_dir / "hosts"
    inventory.write_text("other ansible_connection=local\n")
    locks = ROOT / "playbooks" / "locks"
    assert not locks.exists()
    rc, _, failures, _ = run_playbook(inventory, ROOT / "playbooks/model_lock.yml", "localhost",
                                      {"model_lock_models": [{"repo_id": REPO}],
                                       "model_lock_endpoint": "http://127.0.0.1:9"})
    assert rc != 0 and len(failures) == 1, failures
    assert "No folder for the locks" in failures[0] and "set model_lock_dir" in failures[0]
    assert "Nothing was written" in failures[0]
    assert not locks.exists() and not (inv_dir / "locks").exists()
