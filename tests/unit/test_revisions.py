"""Model revisions side by side (plugins/module_utils/gpufleet/revisions.py, issue #31 item 6):
hf_model main() against tests/hfstub (a STAND-IN for a Hugging Face mirror on
127.0.0.1), cut half-way by tests/hfstub/faultproxy.py (a TEST DOUBLE), and the pure
decisions (pruning, mounts, hostile paths)."""
import hashlib
import os
import pathlib

import pytest

import hf_model
from gpufleet import hub, hub_client, hub_manifest, revisions
from helpers import run_module
from hfstub.faultproxy import FaultProxy  # noqa: E402
from hfstub.server import HubStub, Repo  # noqa: E402

WEIGHTS = os.urandom(2 << 20)
REV1 = {"config.json": b'{"hidden_size": 64}', "tokenizer.json": b'{"v": 1}' * 100,
        "model.safetensors": WEIGHTS}
REV2 = dict(REV1, **{"config.json": b'{"hidden_size": 64, "rev": 2}'})  # weights kept
REV3 = dict(REV1, **{"model.safetensors": os.urandom(2 << 20)})  # new weights


@pytest.fixture
def stub():
    with HubStub([Repo("org/tiny", REV1)], lfs_redirect=False) as s:
        yield s


def publish(stub, files):
    """The mirror's main moves to a new commit of org/tiny."""
    repo = Repo("org/tiny", files)
    stub.repos["org/tiny"] = repo
    return repo.commit


def fetch(monkeypatch, url, dest, check_mode=False, **kw):
    args = {"repo_id": "org/tiny", "dest": str(dest), "endpoint": url, "retries": 0,
            "max_file_attempts": 1, "timeout": 5, **kw}
    return run_module(hf_model.main, args, monkeypatch, check_mode=check_mode)


def snapshot(top):
    """Every path under top (links not followed): kind, inode, size, mtime, sha256."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if os.path.islink(path):
                out[path] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[path] = ("dir",)
            else:
                out[path] = ("file", st.st_ino, st.st_size, st.st_mtime_ns,
                             hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest())
    return out


def served_files(dest):
    """The model files vLLM would read at dest (the state folder left out)."""
    return {p: v for p, v in snapshot(os.path.realpath(dest)).items()
            if "/.gpufleet/" not in p + "/"}


def test_new_revision_fetched_into_its_own_folder_with_hard_links(stub, tmp_path, monkeypatch):
    dest = tmp_path / "tiny"
    res, failed = fetch(monkeypatch, stub.url, dest)
    c1 = res["commit"]
    assert not failed and res["switched"] and res["previous"] is None
    assert os.readlink(dest) == f".gpufleet-revisions/tiny/{c1}"
    assert res["path"] == str(tmp_path / ".gpufleet-revisions/tiny" / c1)
    c2 = publish(stub, REV2)

    res, failed = fetch(monkeypatch, stub.url, dest)
    assert not failed, res
    assert (res["commit"], res["previous"], res["switched"]) == (c2, c1, True)
    assert os.readlink(dest) == f".gpufleet-revisions/tiny/{c2}"
    assert sorted(res["linked"]) == ["model.safetensors", "tokenizer.json"]
    assert res["bytes_downloaded"] == len(REV2["config.json"])  # only the changed bytes
    old, new = (tmp_path / ".gpufleet-revisions/tiny" / c for c in (c1, c2))
    assert (old / "model.safetensors").stat().st_ino == (new / "model.safetensors").stat().st_ino
    assert (old / "config.json").read_bytes() == REV1["config.json"]  # the old one stays
    assert (dest / "config.json").read_bytes() == REV2["config.json"]
    assert hub_manifest.read_manifest(str(new))["complete"] is True

    res, failed = fetch(monkeypatch, stub.url, dest)  # a re-run changes nothing
    assert not failed and res["changed"] is False and not res["switched"]


def test_fetch_cut_halfway_leaves_served_folder_and_link_untouched_then_resumes(
        stub, tmp_path, monkeypatch):
    dest = tmp_path / "tiny"
    res, failed = fetch(monkeypatch, stub.url, dest)
    c1 = res["commit"]
    before = served_files(dest)
    link = os.readlink(dest) if os.path.islink(dest) else None  # None: main's layout
    c3 = publish(stub, REV3)
    with FaultProxy(stub.url, queue=["drop"], only="model.safetensors") as proxy:
        res, failed = fetch(monkeypatch, proxy.url, dest)
        assert proxy.injected["drop"] == 1
    assert failed and "model.safetensors" in res["msg"]
    assert served_files(dest) == before  # what a (re)started container would read
    assert link is not None and os.readlink(dest) == link
    assert f"still points at {c1}, untouched" in res["msg"]
    partial = list((tmp_path / ".gpufleet-revisions/tiny" / c3 / ".gpufleet/incomplete").iterdir())
    assert [p.stat().st_size for p in partial] == [len(REV3["model.safetensors"]) // 2]

    res, failed = fetch(monkeypatch, stub.url, dest)  # the next run resumes, then switches
    assert not failed, res
    assert res["bytes_downloaded"] == len(REV3["model.safetensors"]) // 2
    assert os.readlink(dest) == f".gpufleet-revisions/tiny/{c3}"
    assert (dest / "model.safetensors").read_bytes() == REV3["model.safetensors"]


def test_control_in_place_fetch_cut_halfway_changes_the_served_folder(stub, tmp_path):
    """Control: main's layout (hub.sync_repo straight into the served folder) under the
    same cut leaves the served folder changed, which the test above rules out."""
    dest = tmp_path / "tiny"
    client = hub_client.HubClient(stub.url, retries=0, max_file_attempts=1, timeout=5)
    hub.sync_repo(client, "org/tiny", "main", dest)
    before = served_files(dest)
    publish(stub, REV3)
    with FaultProxy(stub.url, queue=["drop"], only="model.safetensors") as proxy:
        client = hub_client.HubClient(proxy.url, retries=0, max_file_attempts=1, timeout=5)
        with pytest.raises(hub.HubError):
            hub.sync_repo(client, "org/tiny", "main", dest)
    assert served_files(dest) != before
    assert not (dest / "model.safetensors").exists()  # the served weights are gone


def test_legacy_folder_migrated_in_check_mode_nothing_moves(stub, tmp_path, monkeypatch):
    dest = tmp_path / "tiny"
    hub.sync_repo(hub_client.HubClient(stub.url), "org/tiny", "main", dest)  # the layout before
    c1 = stub.repos["org/tiny"].commit
    ino = (dest / "model.safetensors").stat().st_ino
    tree = snapshot(tmp_path)
    res, failed = fetch(monkeypatch, stub.url, dest, check_mode=True)
    assert not failed and res["changed"] is True and res["migrated"] == c1
    assert snapshot(tmp_path) == tree

    res, failed = fetch(monkeypatch, stub.url, dest)
    assert not failed, res
    assert res["migrated"] == c1 and res["bytes_downloaded"] == 0 and res["changed"]
    assert os.readlink(dest) == f".gpufleet-revisions/tiny/{c1}"
    assert (dest / "model.safetensors").stat().st_ino == ino  # moved, not copied
    res, failed = fetch(monkeypatch, stub.url, dest)
    assert not failed and res["changed"] is False and res["migrated"] is None


def test_legacy_folder_without_manifest_is_refused(stub, tmp_path, monkeypatch):
    dest = tmp_path / "tiny"
    dest.mkdir()
    (dest / "weights.bin").write_bytes(b"x")
    res, failed = fetch(monkeypatch, stub.url, dest)
    assert failed and "without a manifest" in res["msg"] and dest.is_dir()
    assert not (tmp_path / ".gpufleet-revisions").exists()


def test_rollback_offline_with_the_mirror_stopped(tmp_path, monkeypatch):
    dest = tmp_path / "tiny"
    with HubStub([Repo("org/tiny", REV1)], lfs_redirect=False) as s:
        res, _ = fetch(monkeypatch, s.url, dest)
        c1 = res["commit"]
        publish(s, REV3)
        res, failed = fetch(monkeypatch, s.url, dest)
        c3, url = res["commit"], s.url
        assert not failed and os.readlink(dest).endswith(c3)
    # the mirror is down now: going back to c1 re-points without a request
    res, failed = fetch(monkeypatch, url, dest, revision=c1, check_mode=True)
    assert not failed and res["offline"] and not res["switched"]
    assert os.readlink(dest).endswith(c3)
    res, failed = fetch(monkeypatch, url, dest, revision=c1)
    assert not failed, res
    assert (res["offline"], res["switched"], res["previous"]) == (True, True, c3)
    assert os.readlink(dest) == f".gpufleet-revisions/tiny/{c1}"
    assert (dest / "model.safetensors").read_bytes() == WEIGHTS
    # a folder whose file changed since it was verified is not trusted offline
    weights = tmp_path / ".gpufleet-revisions/tiny" / c3 / "model.safetensors"
    os.utime(weights, ns=(1, 1))
    res, failed = fetch(monkeypatch, url, dest, revision=c3)
    assert failed and os.readlink(dest).endswith(c1)


def test_pruning_keeps_count_served_previous_and_pinned(stub, tmp_path, monkeypatch):
    dest = tmp_path / "tiny"
    commits = [fetch(monkeypatch, stub.url, dest)[0]["commit"]]
    store = tmp_path / ".gpufleet-revisions/tiny"
    for n in range(2, 5):
        commits.append(publish(stub, dict(REV1, **{"config.json": b'{"n": %d}' % n})))
        res, failed = fetch(monkeypatch, stub.url, dest, revisions_pinned=commits[:1])
        assert not failed, res
    # keep 2: the served (4th) and the previous (3rd); the pinned 1st stays; 2nd goes
    assert sorted(p.name for p in store.iterdir() if p.is_dir()) == sorted(
        [commits[0], commits[2], commits[3]])
    assert res["pruned"] == [commits[1]] and (dest / "config.json").read_bytes() == b'{"n": 4}'
    # the hard-linked weights survive the pruning of a folder that shared them
    assert (dest / "model.safetensors").read_bytes() == WEIGHTS


def test_prune_plan():
    revs = [("a" * 40, 1), ("b" * 40, 2), ("c" * 40, 3), ("d" * 40, 4), ("e" * 40, 5)]
    assert revisions.prune_plan(revs, 2, {"e" * 40, "d" * 40}) == ["a" * 40, "b" * 40,
                                                                  "c" * 40]
    assert revisions.prune_plan(revs, 3, {"e" * 40, "a" * 40}) == ["b" * 40, "c" * 40]
    assert revisions.prune_plan(revs, 2, {"a" * 40, "b" * 40, "c" * 40}) == ["d" * 40,
                                                                            "e" * 40]
    assert revisions.prune_plan(revs, 5, set()) == []
    # a partial fetch (incomplete manifest) goes before any complete folder, however new
    ranked = [("a" * 40, (True, 1)), ("b" * 40, (False, 5)), ("c" * 40, (True, 3))]
    assert revisions.prune_plan(ranked, 2, {"c" * 40}) == ["b" * 40]


def test_a_folder_a_container_mounts_is_never_pruned(tmp_path):
    layout = revisions.Layout(str(tmp_path / "models/tiny"))
    commits = [c * 40 for c in "abcd"]
    for i, c in enumerate(commits):
        os.makedirs(layout.commit_dir(c))
        os.utime(layout.commit_dir(c), (i, i))
    proc = tmp_path / "proc"
    for pid, root in (("1", "/"), ("42", f"/srv/models/.gpufleet-revisions/tiny/{'a' * 40}"),
                      ("43", "/.gpufleet-revisions/other/" + "b" * 40)):
        (proc / pid / "ns").mkdir(parents=True)
        os.symlink(f"mnt:[{pid}]", proc / pid / "ns/mnt")
        (proc / pid / "mountinfo").write_text(
            f"1 0 8:1 {root} /model ro,relatime - ext4 /dev/sda1 rw\n")
    assert revisions.mounted_commits(layout, str(proc)) == {"a" * 40}
    assert revisions.prune(layout, 3, {"d" * 40}, check_mode=True, proc=str(proc)) == ["b" * 40]
    assert os.path.isdir(layout.commit_dir("b" * 40))
    assert revisions.prune(layout, 3, {"d" * 40}, proc=str(proc)) == ["b" * 40]
    assert sorted(os.listdir(layout.store)) == ["a" * 40, "c" * 40, "d" * 40]


def test_check_mode_for_a_new_revision_changes_nothing(stub, tmp_path, monkeypatch):
    dest = tmp_path / "tiny"
    fetch(monkeypatch, stub.url, dest)
    publish(stub, REV2)
    tree = snapshot(tmp_path)
    res, failed = fetch(monkeypatch, stub.url, dest, check_mode=True)
    assert not failed and res["changed"] is True and not res["switched"]
    assert {f["path"]: f["status"] for f in res["files"]} == {
        "config.json": "would_download", "tokenizer.json": "would_link",
        "model.safetensors": "would_link"}
    assert res["bytes_to_download"] == len(REV2["config.json"])
    assert snapshot(tmp_path) == tree


@pytest.mark.parametrize("commit", ["../" + "a" * 37, "/etc", "A" * 40, "a" * 39, "a" * 40 + "/x",
                                    None])
def test_a_revision_folder_is_named_by_a_40_hex_commit_only(commit):
    with pytest.raises(hub.UnsafePathError):
        revisions.check_commit(commit)


def test_hostile_links_are_refused(stub, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "tiny"
    os.symlink(elsewhere, dest)  # a link gpufleet did not make
    res, failed = fetch(monkeypatch, stub.url, dest)
    assert failed and "not one gpufleet" in res["msg"] and not list(elsewhere.iterdir())
    os.unlink(dest)
    os.symlink(elsewhere, tmp_path / ".gpufleet-revisions")  # the store sent elsewhere
    res, failed = fetch(monkeypatch, stub.url, dest)
    assert failed and "never writes through links" in res["msg"]
    assert not list(elsewhere.iterdir())
    os.unlink(tmp_path / ".gpufleet-revisions")
    res, failed = fetch(monkeypatch, stub.url, dest, revisions_pinned=["../../etc"])
    assert failed and "40-hex" in res["msg"]
    res, failed = fetch(monkeypatch, stub.url, dest, revisions_keep=1)
    assert failed and "revisions_keep" in res["msg"]
    assert not dest.exists()


def test_a_folder_a_fetch_is_writing_is_never_pruned(tmp_path):
    layout = revisions.Layout(str(tmp_path / "models/tiny"))
    for i, c in enumerate("abc"):
        os.makedirs(os.path.join(layout.commit_dir(c * 40), ".gpufleet"))
        os.utime(layout.commit_dir(c * 40), (i, i))
    held = hub._Lock(layout.commit_dir("a" * 40))  # another fetch writes the oldest
    try:
        assert revisions.prune(layout, 2, {"c" * 40}, proc=str(tmp_path / "noproc")) == ["b" * 40]
    finally:
        held.release()
    # released: the same folder is an ordinary candidate again (keep 1: only the served)
    assert revisions.prune(layout, 1, {"c" * 40}, proc=str(tmp_path / "noproc")) == ["a" * 40]


def test_diff_names_the_commit_before_and_after(stub, tmp_path, monkeypatch):
    dest = tmp_path / "tiny"
    a = {"repo_id": "org/tiny", "dest": str(dest), "endpoint": stub.url, "_ansible_diff": True}
    res, _ = run_module(hf_model.main, a, monkeypatch)
    c1 = res["commit"]
    assert res["diff"]["before"]["commit"] is None and res["diff"]["after"]["commit"] == c1
    c2 = publish(stub, REV2)
    res, _ = run_module(hf_model.main, a, monkeypatch, check_mode=True)
    assert (res["diff"]["before"]["commit"], res["diff"]["after"]["commit"]) == (c1, c2)
    res, _ = run_module(hf_model.main, a, monkeypatch)
    assert (res["diff"]["before"]["commit"], res["diff"]["after"]["commit"]) == (c1, c2)
    res, _ = run_module(hf_model.main, a, monkeypatch)
    assert res["diff"]["before"] == res["diff"]["after"] and not res["changed"]


# --- #31 item 6 leftovers: the last-good record's commits pinned; patterns re-checked offline
def _role_pins(record, inventory_pins=None):
    """model_fetch_revisions_pinned as fleet_upgrade's gates.yml renders it from the record
    it read, and the revisions_pinned model_fetch's fetch.yml then gives hf_model."""
    import jinja2
    import yaml

    from gpufleet import upgrade
    root = pathlib.Path(__file__).resolve().parents[2]
    gates = yaml.safe_load((root / "roles/fleet_upgrade/tasks/gates.yml").read_text())
    tasks = [t for item in gates for t in item.get("block", [item])]
    named = {t.get("name"): t for t in tasks}
    include = named["Fleet upgrade | Fetch and verify the models"]
    assert include["vars"]["model_fetch_revisions_pinned"] == "{{ __fleet_upgrade_pinned }}"
    pin = named["Fleet upgrade | Pin the recorded commits beside the inventory's"]
    fetch_yml = yaml.safe_load((root / "roles/model_fetch/tasks/fetch.yml").read_text())
    env = jinja2.Environment()
    env.filters["gpufleet.fleet.gpufleet_record_commits"] = upgrade.record_commits
    expr = pin["ansible.builtin.set_fact"]["__fleet_upgrade_pinned"].strip()
    assert expr.startswith("{{") and expr.endswith("}}")
    pins = env.compile_expression(expr[2:-2])(__fleet_upgrade_pins={"record": record},
                                              model_fetch_revisions_pinned=inventory_pins or [])
    fetch = next(t for t in fetch_yml if "gpufleet.fleet.hf_model" in t)  # p2p steps first
    passed = fetch["gpufleet.fleet.hf_model"]["revisions_pinned"]
    assert passed == "{{ model_fetch_revisions_pinned }}", passed
    return pins


def test_record_commits_names_only_the_recorded_40_hex_commits():
    from gpufleet import upgrade
    c = "c" * 40
    record = {"models": [["/srv/models/a", c], ["/srv/models/b", c], ["/srv/models/x", "local-1f"],
                         ["/srv/models/y"], "junk", ["/srv/models/z", "a" * 40]]}
    assert upgrade.record_commits(record) == ["a" * 40, c]
    assert upgrade.record_commits({}) == upgrade.record_commits(None) == []
    assert upgrade.record_commits({"models": "x"}) == []


def test_the_last_good_records_commit_survives_the_pruning_of_an_upgrade(stub, tmp_path,
                                                                        monkeypatch):
    """c1 is recorded good; c2 was fetched and served since (a site.yml run that never
    passed its gates, say), and the upgrade now fetches c3: the pruning keeps c3 and c2
    (served and previous) and, fed from the record through the roles, c1 too."""
    dest = tmp_path / "tiny"
    c1 = fetch(monkeypatch, stub.url, dest)[0]["commit"]
    publish(stub, REV2)
    assert not fetch(monkeypatch, stub.url, dest)[1]
    publish(stub, REV3)
    assert _role_pins({"version": 2, "models": [[str(dest), c1]]}, ["e" * 40]) == ["e" * 40, c1]
    pins = _role_pins({"version": 2, "models": [[str(dest), c1]]})
    assert pins == [c1]
    res, failed = fetch(monkeypatch, stub.url, dest, revisions_pinned=pins)
    assert not failed, res
    assert res["pruned"] == [] and (tmp_path / ".gpufleet-revisions/tiny" / c1).is_dir()
    # what the same fetch does without the pin: the rollback target goes
    publish(stub, REV1 | {"config.json": b'{"n": 5}'})
    res, failed = fetch(monkeypatch, stub.url, dest)
    assert not failed and c1 in res["pruned"]


def test_offline_rollback_rechecks_the_patterns(tmp_path, monkeypatch):
    """c1 and c3 were fetched without tokenizer.json (ignore_patterns); the inventory now
    wants it. A rollback does not re-point to a folder that lacks it: it fetches the commit
    again (the mirror up), or fails with the reason (the mirror down), the link unmoved."""
    dest = tmp_path / "tiny"
    store = tmp_path / ".gpufleet-revisions/tiny"
    narrow = {"ignore_patterns": ["tokenizer.json"]}
    with HubStub([Repo("org/tiny", REV1)], lfs_redirect=False) as s:
        c1 = fetch(monkeypatch, s.url, dest, **narrow)[0]["commit"]
        publish(s, REV3)
        c3 = fetch(monkeypatch, s.url, dest, **narrow)[0]["commit"]
        assert publish(s, REV1) == c1  # the stub serves one commit: c1's again
        res, failed = fetch(monkeypatch, s.url, dest, revision=c1)
        assert not failed, res
        assert (res["offline"], res["switched"]) == (False, True)
        assert res["offline_refused"] == (
            f"{c1}'s folder was not used offline: allow_patterns/ignore_patterns changed "
            "since it was fetched: they select 1 file(s) it lacks (tokenizer.json); fetching "
            "it from the mirror.")
        assert os.readlink(dest).endswith(c1) and (dest / "tokenizer.json").is_file()
        url = s.url
    # the mirror is down from here
    res, failed = fetch(monkeypatch, url, dest, revision=c3)
    assert failed and os.readlink(dest).endswith(c1)
    assert f"{c3}'s folder was not used offline" in res["msg"]
    assert "1 file(s) it lacks (tokenizer.json)" in res["msg"]
    # the patterns it was fetched with: offline
    res, failed = fetch(monkeypatch, url, dest, revision=c3, **narrow)
    assert not failed and res["offline"] and os.readlink(dest).endswith(c3)
    # a folder holding more than the patterns select: offline (as a fetch would leave it)
    res, failed = fetch(monkeypatch, url, dest, revision=c1, **narrow)
    assert not failed and res["offline"] and os.readlink(dest).endswith(c1)
    # a folder that keeps no file list (fetched before gpufleet kept one) is not trusted
    (store / c3 / ".gpufleet" / revisions.SELECTION).unlink()
    res, failed = fetch(monkeypatch, url, dest, revision=c3, **narrow)
    assert failed and "keep the commit's file list" in res["msg"]
    assert os.readlink(dest).endswith(c1)
