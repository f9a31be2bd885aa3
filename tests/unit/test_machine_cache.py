"""The machine's cache (scripts/lib.sh machine_cache): what a checkout builds from its own
files and keeps by content hash, shared by every checkout of the machine, as Docker keeps
the lab's images. Two users: lab/models/build_models.py (the lab's models, by recipe
hash) and scripts/setup.sh (the virtual environment, by the requirements' hash).

The models' tests run build_models.py's own functions on a stand-in recipe (a folder
with a config.json and a weights file, written by the test) in temporary folders; the
venv's run setup.sh's setup_venv in a copy of the checkout's scripts with a stand-in
`python3` that makes a fake venv (pip is not run)."""
import importlib.util
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def bm(tmp_path, monkeypatch):
    """lab/models/build_models.py with its folders under tmp_path and one stand-in recipe."""
    spec = importlib.util.spec_from_file_location("build_models_under_test",
                                                  ROOT / "lab/models/build_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "MODELS", tmp_path / "checkout" / "models")
    monkeypatch.setattr(mod, "STAMPS", tmp_path / "checkout" / "models" / ".stamps")
    monkeypatch.setenv("GPUFLEET_MACHINE_CACHE", str(tmp_path / "machine"))
    built = []

    def recipe(out):
        built.append(out)
        (out / "config.json").write_text('{"model_type": "llama"}\n')
        (out / "model.safetensors").write_bytes(b"weights" * 100)
    monkeypatch.setattr(mod, "RECIPES", {"org/tiny": recipe})
    mod.built = built
    return mod


def test_a_built_model_is_kept_and_a_fresh_checkout_copies_it_without_building(bm, tmp_path, monkeypatch):
    assert bm.build("org/tiny") is True and len(bm.built) == 1
    kept = bm.machine_copy("org/tiny")
    assert kept == tmp_path / "machine" / "lab-models" / bm.recipe_hash("org/tiny")[:16] / "org__tiny"
    assert (kept / "model.safetensors").read_bytes() == b"weights" * 100

    # a fresh clone: no models, no stamps
    monkeypatch.setattr(bm, "MODELS", tmp_path / "clone" / "models")
    monkeypatch.setattr(bm, "STAMPS", tmp_path / "clone" / "models" / ".stamps")
    assert bm.main(["--from-cache-only"]) == 0
    assert len(bm.built) == 1, "copied, not built"
    copy = tmp_path / "clone" / "models" / "org" / "tiny"
    assert (copy / "model.safetensors").read_bytes() == b"weights" * 100
    assert bm.is_current("org/tiny")
    # a full copy, no hard links: a test that damages the checkout's file leaves the cache's
    assert (copy / "model.safetensors").stat().st_ino != (kept / "model.safetensors").stat().st_ino
    (copy / "model.safetensors").write_bytes(b"damaged")
    assert (kept / "model.safetensors").read_bytes() == b"weights" * 100
    # no temporary folder left beside either
    assert sorted(p.name for p in copy.parent.iterdir()) == ["tiny"]
    assert sorted(p.name for p in kept.parent.iterdir()) == ["org__tiny"]


def test_from_cache_only_says_what_is_still_to_build_and_builds_nothing(bm, capsys):
    assert bm.main(["--from-cache-only"]) == 3
    assert "[models] to build: org/tiny" in capsys.readouterr().out
    assert bm.built == [] and not (bm.MODELS / "org" / "tiny").exists()
    with pytest.raises(SystemExit):
        bm.main(["--from-cache-only", "--force"])


def test_another_recipe_replaces_the_kept_copy_and_is_never_taken_for_it(bm, tmp_path, monkeypatch):
    bm.build("org/tiny")
    old = bm.machine_copy("org/tiny")
    # the recipe changes (build_models.py, requirements.txt or sources.txt): a new hash
    monkeypatch.setattr(bm, "recipe_hash", lambda name: "f" * 64)
    assert bm.machine_copy("org/tiny") != old
    assert bm.build("org/tiny") is True and len(bm.built) == 2, "the old recipe's copy is not used"
    assert not old.exists() and not old.parent.exists(), "one copy per model"
    assert (bm.machine_copy("org/tiny") / "config.json").is_file()


def test_without_a_machine_cache_it_builds_as_before(bm, monkeypatch):
    monkeypatch.delenv("GPUFLEET_MACHINE_CACHE")
    assert bm.machine_copy("org/tiny") is None
    assert bm.build("org/tiny") is True and bm.is_current("org/tiny")
    assert bm.main(["--from-cache-only"]) == 0  # up to date in the checkout


STANDIN_PYTHON3 = """#!/bin/sh
# stand-in python3 for setup_venv: `python3 -m venv DIR` makes a fake venv whose pip
# writes nothing; counts the venvs it made
[ "$1" = -m ] && [ "$2" = venv ] || { echo "stand-in python3: not $*" >&2; exit 1; }
mkdir -p "$3/bin"
printf '#!/bin/sh\\nexit 0\\n' > "$3/bin/pip"
printf '#!/bin/sh\\necho ansible-playbook\\n' > "$3/bin/ansible-playbook"
chmod +x "$3/bin/pip" "$3/bin/ansible-playbook"
echo "$3" >> "$VENVS_MADE"
"""


def _setup_venv(checkout, machine, made):
    env = dict(os.environ, GPUFLEET_MACHINE_CACHE=str(machine), VENVS_MADE=str(made),
               PATH=f"{checkout / 'bin'}:{os.environ['PATH']}")
    return subprocess.run(["bash", "scripts/setup.sh", "venv"], cwd=checkout, env=env,
                          capture_output=True, text=True, check=False)


@pytest.fixture
def checkouts(tmp_path):
    """Two checkouts with the real scripts and requirements files, and a stand-in python3."""
    out = []
    for name in ("one", "two"):
        co = tmp_path / name
        (co / "scripts").mkdir(parents=True)
        (co / "bin").mkdir()
        for f in ("scripts/setup.sh", "scripts/lib.sh", "requirements.txt", "requirements-runtime.txt"):
            (co / f).write_bytes((ROOT / f).read_bytes())
        (co / "bin" / "python3").write_text(STANDIN_PYTHON3)
        (co / "bin" / "python3").chmod(0o755)
        out.append(co)
    return out


def test_the_venv_is_built_once_per_machine_and_linked_by_every_checkout(checkouts, tmp_path):
    one, two = checkouts
    machine, made = tmp_path / "machine", tmp_path / "made"
    first = _setup_venv(one, machine, made)
    assert first.returncode == 0, first.stderr
    second = _setup_venv(two, machine, made)
    assert second.returncode == 0, second.stderr
    want = subprocess.run("cat requirements.txt requirements-runtime.txt | sha256sum | cut -c1-16",
                          shell=True, cwd=one, capture_output=True, text=True).stdout.strip()
    entry = machine / "venvs" / want
    assert made.read_text().split() == [str(entry)], "one venv made, in the machine's cache"
    for co in (one, two):
        assert (co / ".venv").is_symlink() and os.readlink(co / ".venv") == str(entry)
        assert (co / ".venv" / ".requirements-hash").read_text().strip() == want
    assert "has requirements.txt" in second.stderr
    # a third run in a checkout changes nothing and makes nothing
    assert _setup_venv(one, machine, made).returncode == 0
    assert made.read_text().split() == [str(entry)]


def test_a_venv_build_cut_short_is_made_again(checkouts, tmp_path):
    one, _ = checkouts
    machine, made = tmp_path / "machine", tmp_path / "made"
    assert _setup_venv(one, machine, made).returncode == 0
    entry = pathlib.Path(os.readlink(one / ".venv"))
    (entry / ".requirements-hash").unlink()  # as a pip install killed halfway leaves it
    (one / ".venv").unlink()
    assert _setup_venv(one, machine, made).returncode == 0
    assert made.read_text().split() == [str(entry), str(entry)]
    assert (entry / ".requirements-hash").is_file()


def test_a_checkout_with_its_own_current_venv_keeps_it(checkouts, tmp_path):
    one, _ = checkouts
    machine, made = tmp_path / "machine", tmp_path / "made"
    assert _setup_venv(one, machine, made).returncode == 0
    entry = pathlib.Path(os.readlink(one / ".venv"))
    (one / ".venv").unlink()
    (one / ".venv").mkdir()
    (one / ".venv" / "bin").mkdir()
    (one / ".venv" / "bin" / "ansible-playbook").write_text("#!/bin/sh\n")
    (one / ".venv" / "bin" / "ansible-playbook").chmod(0o755)
    (one / ".venv" / ".requirements-hash").write_text((entry / ".requirements-hash").read_text())
    assert _setup_venv(one, machine, made).returncode == 0
    assert not (one / ".venv").is_symlink(), "a checkout's own up-to-date venv is left alone"
