"""tests/conftest.py's hook: under CI=true or GPUFLEET_NO_SKIP=1 a skipped slow test fails
with the skip's reason; without them it stays a skip; unit tests may skip either way.
Runs pytest in a subprocess on a tiny test file next to a copy of the conftest."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

TINY = '''
import pytest

@pytest.mark.slow
def test_slow_needs_docker():
    pytest.skip("needs docker (stand-in reason)")

@pytest.mark.slow
@pytest.mark.skipif(True, reason="no image here")
def test_slow_skipif():
    pass

def test_unit_may_skip():
    pytest.skip("optional dependency missing")

@pytest.mark.slow
def test_slow_that_runs():
    assert True
'''


def _run(tmp_path, **env):
    (tmp_path / "tests").mkdir(exist_ok=True)
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_tiny.py").write_text(TINY)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "GPUFLEET_NO_SKIP")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider",
                           "tests"], cwd=tmp_path, capture_output=True, text=True,
                          env=dict(clean, **env), timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("env", [{"CI": "true"}, {"GPUFLEET_NO_SKIP": "1"}])
def test_a_skipped_slow_test_fails_under_ci_or_no_skip(tmp_path, env):
    rc, out = _run(tmp_path, **env)
    assert rc == 1, out
    # a skip in the call is a failure; a skipif (decided at setup) an error: both exit 1
    assert "1 failed, 1 passed, 1 skipped, 1 error" in out, out
    assert "FAILED tests/" "test_tiny.py::test_slow_needs_docker - slow test skipped" in out
    assert "ERROR tests/" "test_tiny.py::test_slow_skipif - slow test skipped" in out
    assert "needs docker (stand-in reason)" in out and "no image here" in out


@pytest.mark.parametrize("env", [{}, {"CI": "false"}, {"GPUFLEET_NO_SKIP": "0"}])
def test_without_them_a_skip_stays_a_skip(tmp_path, env):
    rc, out = _run(tmp_path, **env)
    assert rc == 0, out
    assert "1 passed, 3 skipped" in out, out


def test_scripts_test_sh_sets_it_for_the_full_run_only():
    text = (ROOT / "scripts" / "test.sh").read_text()
    fast_exit = text.index('((fast)) && exit 0')
    export = text.index("export GPUFLEET_NO_SKIP=1")
    assert export > fast_exit, "GPUFLEET_NO_SKIP must be set after the --fast exit"


@pytest.mark.parametrize("summary, ok", [
    ("Molecule executed 1 scenario (1 successful)", True),
    ("Molecule executed 1 scenario (1 skipped)", False),
    ("Molecule executed 1 scenario (1 missing)", False),
    ("", False),
])
def test_molecule_test_fails_when_a_scenario_is_skipped(tmp_path, summary, ok):
    """scripts/lib.sh's molecule_test against a stand-in molecule that prints a summary
    and exits 0, as Molecule does when steps were skipped."""
    fake = tmp_path / "molecule"
    fake.write_text(f"#!/bin/sh\necho \"INFO  running $*\"\necho '{summary}'\nexit 0\n")
    fake.chmod(0o755)
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail; . scripts/lib.sh; MOLECULE={fake} molecule_test demo; echo RAN-ON"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ("RAN-ON" in proc.stdout) is ok, proc.stdout + proc.stderr
    assert "running test -s demo" in proc.stdout
    if not ok:
        assert proc.returncode == 1 and "did not run every step" in proc.stderr


def test_molecule_test_passes_a_success_followed_by_much_output(tmp_path):
    """Molecule prints its DETAILS and SCENARIO RECAP after the summary line. CI once
    failed a successful scenario here: `sed | grep -q` under pipefail, where grep -q
    left at the match and sed died of SIGPIPE on its next write. 2 MB after the match
    makes that certain, not a race."""
    fake = tmp_path / "molecule"
    fake.write_text("#!/bin/sh\necho 'INFO     Molecule executed 1 scenario (1 successful)'\n"
                    "head -c 2000000 /dev/zero | tr '\\0' x | fold -w 100\nexit 0\n")
    fake.chmod(0o755)
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail; . scripts/lib.sh; MOLECULE={fake} molecule_test demo > /dev/null; echo RAN-ON"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "RAN-ON" in proc.stdout, proc.stderr[-2000:]


def test_molecule_test_fails_when_molecule_fails(tmp_path):
    fake = tmp_path / "molecule"
    fake.write_text("#!/bin/sh\necho 'Molecule executed 1 scenario (1 successful)'\nexit 3\n")
    fake.chmod(0o755)
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail; . scripts/lib.sh; MOLECULE={fake} molecule_test demo"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "failed (exit 3)" in proc.stderr


def test_scripts_test_sh_runs_every_scenario_through_molecule_test():
    # scripts/test.sh runs its scenarios through lib.sh's molecule_tests, which runs each
    # through molecule_test (the summary check), never plain `molecule test`
    text = (ROOT / "scripts" / "test.sh").read_text()
    lib = (ROOT / "scripts" / "lib.sh").read_text()
    helper = lib[lib.index("molecule_tests() {"):]
    helper = helper[:helper.index("\n}\n")]
    assert 'molecule_test "$s"' in helper and 'molecule test -s "$s"' not in text + helper
    assert "molecule_tests $1" in text and 'molecule_tests "${BESIDE_SCENARIOS[@]}"' in text
