"""Tests of gpufleet.hub_listing: a commit's listing read from the tree API (RepoFile, the
one-tree check, the path rules it applies) and allow/ignore patterns."""
import subprocess

import pytest

from gpufleet import hub_errors, hub_listing
from hfstub.server import git_blob_sha1


def test_git_blob_sha1_equals_git_hash_object(tmp_path):
    data = b"hello\nworld\x00\xff" * 100
    (tmp_path / "f").write_bytes(data)
    out = subprocess.run(["git", "hash-object", str(tmp_path / "f")], capture_output=True,
                         text=True, check=True).stdout.strip()
    f = hub_listing.RepoFile("f", len(data), "sha1", out)
    h = f.hasher()
    h.update(data)
    assert h.hexdigest() == out == git_blob_sha1(data)


def test_parse_tree_real_hub_rows():
    # Rows as the hub returns them (shape from huggingface_hub hf_api.RepoFile: oid is the
    # git blob id, lfs.oid the sha256; the top-level size of an LFS row is not trusted).
    rows = [
        {"type": "file", "oid": "8ea6b5b5" + "0" * 32, "size": 1686, "path": "config.json"},
        {"type": "directory", "oid": "1" * 40, "size": 0, "path": "assets"},
        {"type": "file", "oid": "7e4877d7" + "0" * 32, "size": 135,
         "path": "model-00001-of-000163.safetensors",
         "lfs": {"oid": "ba38046c0ea567aa2cd032b31b26a58bdba73fb5687da60ffa25b8d11cfdb4e4",
                 "size": 5234139343, "pointerSize": 135}},
    ]
    got = hub_listing.parse_tree(rows)
    assert [(f.path, f.size, f.algorithm) for f in got] == [
        ("config.json", 1686, "sha1"),
        ("model-00001-of-000163.safetensors", 5234139343, "sha256")]
    assert got[1].digest.startswith("ba38046c")


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "a/../../b", "a//b",
                                  ".gpufleet/manifest.json", "a\\b", ""])
def test_unsafe_listing_paths_are_refused(path):
    with pytest.raises(hub_errors.HubError, match="unsafe path"):
        hub_listing.parse_tree([{"type": "file", "path": path, "size": 1, "oid": "a" * 40}])


def _file(path, oid="a" * 40):
    return {"type": "file", "path": path, "size": 1, "oid": oid}


@pytest.mark.parametrize("listing, said", [
    # one file twice (issue #32 item 5: two downloads wrote one partial file, the manifest
    # then said complete), with the same or another hash
    ([_file("model.safetensors"), _file("model.safetensors")], "'model.safetensors' twice"),
    ([_file("a/b.json"), _file("c"), _file("a/b.json", "b" * 40)], "'a/b.json' twice"),
    # a file and a folder at once
    ([_file("sub"), _file("sub/x.json")], "'sub' as a file and as a folder"),
    ([_file("sub/x.json"), _file("sub")], "'sub' as a file and as a folder"),
    ([{"type": "directory", "path": "cfg"}, _file("cfg")], "'cfg' as a file and as a folder"),
    ([_file("a/b/c"), _file("a/b")], "'a/b' as a file and as a folder"),
])
def test_a_listing_that_is_not_one_tree_is_refused(listing, said):
    with pytest.raises(hub_errors.HubError, match="nothing was downloaded") as exc:
        hub_listing.parse_tree(listing)
    assert said in str(exc.value)


def test_control_a_listing_of_one_tree_with_folders_passes():
    listing = [{"type": "directory", "path": "sub"}, _file("sub/x.json"), _file("sub/deeper/y"),
               _file("subx"), _file("a.json")]
    assert [f.path for f in hub_listing.parse_tree(listing)] == ["sub/x.json", "sub/deeper/y", "subx", "a.json"]


def test_a_refusal_quotes_at_most_200_characters_of_an_entry():
    huge = {"type": "file", "path": "x.bin", "size": -1, "oid": "a" * 40, "junk": "j" * 10_000_000}
    with pytest.raises(hub_errors.HubError) as exc:
        hub_listing.parse_tree([huge])
    assert len(str(exc.value)) < 600
    with pytest.raises(hub_errors.HubError) as exc:
        hub_listing.parse_tree([_file("p" * 5000), _file("p" * 5000)])
    assert len(str(exc.value)) < 600


def test_listing_without_hashes_is_refused():
    with pytest.raises(hub_errors.HubError, match="no usable size/hash"):
        hub_listing.parse_tree([{"type": "file", "path": "x.bin", "size": 3}])


@pytest.mark.parametrize("allow,ignore,expected", [
    (None, None, ["a.json", "sub/b.safetensors", "sub/c.txt"]),
    (["*.json"], None, ["a.json"]),
    (["sub/"], ["*.txt"], ["sub/b.safetensors"]),
    ("*.safetensors", None, ["sub/b.safetensors"]),
])
def test_filter_files(allow, ignore, expected):
    fs = [hub_listing.RepoFile(p, 1, "sha1", "a" * 40) for p in ["a.json", "sub/b.safetensors", "sub/c.txt"]]
    assert [f.path for f in hub_listing.filter_files(fs, allow, ignore)] == expected
