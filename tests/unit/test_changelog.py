"""The changelog (issue #33 item 5): antsibull-changelog fragments and releases.

Each change that a user of the collection would notice adds a fragment under
changelogs/fragments/ (docs/collection.md, "Changelog"); a release turns the fragments into
changelogs/changelog.yaml and CHANGELOG.md. These tests keep the fragments readable by
antsibull-changelog and galaxy.yml's version in step with the released ones.
"""
import pathlib
import shutil
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = pathlib.Path(sys.executable).parent / "antsibull-changelog"


def _version(text):
    return tuple(int(x) for x in text.split("."))


def _lint(root):
    return subprocess.run([str(TOOL), "lint"], cwd=root, capture_output=True, text=True,
                          timeout=120)


def test_fragments_and_changelog_pass_antsibull_changelog_lint():
    out = _lint(ROOT)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


def test_lint_refuses_a_broken_fragment(tmp_path):
    """Control: the lint above can fail (a fragment under an unknown section)."""
    shutil.copytree(ROOT / "changelogs", tmp_path / "changelogs")
    (tmp_path / "changelogs/fragments/broken.yml").write_text(
        "---\nnew_stuff:\n  - a section antsibull-changelog does not know\n")
    out = _lint(tmp_path)
    assert "broken.yml" in out.stdout + out.stderr


def test_galaxy_version_is_the_newest_release_or_newer_with_fragments():
    galaxy = _version(yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"])
    changes = ROOT / "changelogs/changelog.yaml"
    released = []
    if changes.is_file():
        released = sorted(_version(v) for v in
                          (yaml.safe_load(changes.read_text()) or {}).get("releases", {}))
    fragments = [p for p in (ROOT / "changelogs/fragments").iterdir()
                 if p.suffix in (".yml", ".yaml")]
    if released and galaxy == released[-1]:
        return
    assert fragments, ("galaxy.yml's version is not a release in changelogs/changelog.yaml "
                       "and no fragment waits for it: add a fragment or release it")
    assert not released or galaxy > released[-1], (
        f"galaxy.yml says {galaxy}, older than the newest release {released[-1]}")


def test_changelog_config_names_the_collection_and_writes_markdown():
    config = yaml.safe_load((ROOT / "changelogs/config.yaml").read_text())
    assert config["title"] == "gpufleet.fleet"
    assert config["output"] == [{"file": "CHANGELOG.md", "format": "md"}]
