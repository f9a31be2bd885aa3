"""pytest setup shared by every test.

Imports come from pytest.ini's `pythonpath` (no sys.path edits): pure logic as
`gpufleet.<name>` (plugins/module_utils; no Ansible needed), the modules of
plugins/modules by name, the helpers of tests/ by name, and the collection as
`ansible_collections.gpufleet.fleet.*` (collections/, a link to this checkout), which is
how a module imports its module_utils at run time.
"""
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

try:
    # Ansible's collection loader, as on the controller, before any test imports a module:
    # `ansible_collections.gpufleet.fleet` is then the collection (with its metadata, which
    # ansible-doc's fragment loader reads), not a bare namespace package.
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader([str(ROOT / "collections")])
except ImportError:  # pure-logic tests still run without Ansible
    pass



# A skipped slow test proves nothing, yet pytest exits 0: under CI=true or
# GPUFLEET_NO_SKIP=1 (scripts/test.sh sets it for the full run) a skip of a test marked
# slow is a failure that gives the skip's reason. Unit tests may still skip.
def _no_skip():
    import os

    return (os.environ.get("CI", "").lower() == "true"
            or os.environ.get("GPUFLEET_NO_SKIP", "") not in ("", "0"))


import pytest  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and item.get_closest_marker("slow") is not None and _no_skip():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"slow test skipped under CI=true / GPUFLEET_NO_SKIP=1, which "
                           f"counts as a failure: {reason}")


# One lab for the lab tests (tests/slow/test_upgrade_under_load.py, then
# tests/slow/test_benchmark.py): `scripts/lab.sh run` once per pytest session (fixture
# `lab`; or once before the session, by scripts/test.sh: GPUFLEET_LAB_RUN_DONE), the lab removed after the last test that uses it (GPUFLEET_KEEP_LAB=1 leaves it
# up for a person, not in CI). Those tests run last, the upgrade file's first and in its
# order (each case starts from the state the one before left), then the benchmark's: no
# other test runs beside the lab on this small machine, and never two labs at once.
LAB_FILES = ("test_upgrade_under_load.py", "test_benchmark.py")


def pytest_collection_modifyitems(items):
    # marker `lab` on every test of those files: scripts/test.sh runs the other slow tests
    # beside Molecule (-m "slow and not lab"), then these alone (-m "slow and lab")
    for item in items:
        if item.path.name in LAB_FILES:
            item.add_marker(pytest.mark.lab)
    rank = {name: i for i, name in enumerate(LAB_FILES)}
    order = sorted(range(len(items)), key=lambda i: (rank.get(items[i].path.name, -1), i))
    items[:] = [items[i] for i in order]


@pytest.fixture(scope="session")
def lab():
    import os

    from labrun import IMAGE, NEXT_IMAGE, sh

    if sh("docker", "image", "inspect", IMAGE, check=False).returncode:
        pytest.fail(f"needs {IMAGE} (scripts/lab.sh images builds it)")
    done = os.environ.get("GPUFLEET_LAB_RUN_DONE")
    if done:
        # scripts/test.sh ran `scripts/lab.sh run` already (in the lane that finished first,
        # beside the other's last tests): its exit code is in that file, its output in the
        # log it names. The lab tests still start from exactly that run.
        rc, log = pathlib.Path(done).read_text().split(maxsplit=1)
        run = {"rc": int(rc), "output": pathlib.Path(log.strip()).read_text()}
    else:
        proc = sh("bash", "scripts/lab.sh", "run", check=False, timeout=2400, log="lab-run")
        run = {"rc": proc.returncode, "output": proc.stdout}
    try:
        yield run
    finally:
        if not os.environ.get("GPUFLEET_KEEP_LAB"):
            sh("docker", "rmi", NEXT_IMAGE, check=False)
            sh("bash", "scripts/lab.sh", "down", check=False, timeout=900)
