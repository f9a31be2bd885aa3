"""The lab as the slow lab tests use it (tests/conftest.py's `lab` fixture,
test_upgrade_under_load.py, test_benchmark.py): commands run from the repository root."""
import os
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOGS = ROOT / ".cache/test-logs"  # .cache is not in git
INVENTORY = ROOT / "inventories/lab/hosts.yml"
IMAGE = "gpufleet/vllm-cpu:lab"
NEXT_IMAGE = "gpufleet/vllm-cpu:lab-next"  # test_upgrade_under_load.next_image()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A host row of the fleet table (roles/fleet_summary summary.j2) for a host that
# site.yml's state play skipped: "<host> | ... (unchanged: skipped)".
_SKIPPED_ROW = re.compile(r"^\s*(\S+)\s*\|.*\(unchanged: skipped\)", re.M)


def sh(*args, check=True, timeout=1800, env=None, log=None):
    """Run a command, stderr into stdout in the order they were written (a failure's tail
    is the end of the run, not the warnings a tool printed on stderr at its start). With
    `log` (a name), the output is written to .cache/test-logs/<log>.log while it runs, for
    a person following a long playbook run."""
    kw = dict(stderr=subprocess.STDOUT, text=True, cwd=ROOT, timeout=timeout,
              env=dict(os.environ, **(env or {})))
    if log:
        path = LOGS / f"{log}.log"
        LOGS.mkdir(parents=True, exist_ok=True)
        with path.open("w") as out:
            proc = subprocess.run(args, stdout=out, **kw)
        proc.stdout = path.read_text()
    else:
        proc = subprocess.run(args, stdout=subprocess.PIPE, **kw)
    if check and proc.returncode:
        raise AssertionError(f"{args} failed ({proc.returncode}):\n{proc.stdout[-8000:]}")
    return proc


def key():
    """The lab's API key (scripts/lab.sh writes it, mode 0600)."""
    return (ROOT / ".cache/lab/api-key").read_text().strip()


def skipped_hosts(text):
    """The hosts the fleet table of a site.yml output shows as skipped by the state
    check, sorted (colour codes allowed). The one reader of that row, for the lab test
    and tests/bench/bench_fleet.py."""
    return sorted(set(_SKIPPED_ROW.findall(_ANSI.sub("", text))))
