"""Per-family task and vars selection of the host stack roles, for the families that
cannot run on these machines (only Debian 12 containers can be built here).

Each role's tasks/main.yml picks vars with first_found over
<distribution>-<major>.yml, <distribution>.yml, <os_family>.yml, then a fallback, and
includes tasks/setup-<os_family>.yml. This checks, with Ansible's own first_found lookup
run on the real role directories, which files each supported distribution gets, and
that those files define what the tasks use.
"""
import json
import re
import subprocess

import pytest
import yaml

from conftest import ROOT

ROLES = ["nvidia_driver", "cuda_toolkit", "container_toolkit"]
# ansible_facts of the supported releases: distribution, major version, os_family
HOSTS = [("Ubuntu", "22", "Debian"), ("Ubuntu", "24", "Debian"), ("Debian", "12", "Debian"),
         ("RedHat", "9", "RedHat"), ("Rocky", "9", "RedHat"), ("AlmaLinux", "9", "RedHat")]


def first_found(role, dist, major, family):
    """Resolve the role's vars file with Ansible's first_found, as tasks/main.yml does."""
    tasks = yaml.safe_load((ROOT / "roles" / role / "tasks/main.yml").read_text())
    spec = tasks[0]["vars"]
    files = next(iter(spec.values()))["files"]
    files = [f.replace("{{ ansible_facts.distribution }}", dist)
              .replace("{{ ansible_facts.distribution_major_version }}", major)
              .replace("{{ ansible_facts.os_family }}", family) for f in files]
    term = json.dumps({"files": files, "paths": [str(ROOT / "roles" / role / "vars")]})
    out = subprocess.run(
        [str(ROOT / ".venv/bin/ansible"), "localhost", "-i", "localhost,", "-c", "local", "-m", "debug",
         "-a", "msg={{ lookup('ansible.builtin.first_found', %s) }}" % term, "-o"],
        capture_output=True, text=True, cwd=ROOT, check=True).stdout
    return re.search(r'"msg": "([^"]+)"', out).group(1)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("dist, major, family", HOSTS)
def test_family_files_selected(role, dist, major, family):
    chosen = first_found(role, dist, major, family)
    assert chosen.endswith(f"/roles/{role}/vars/{family}.yml")
    assert (ROOT / "roles" / role / "tasks" / f"setup-{family}.yml").is_file()


@pytest.mark.parametrize("role", ROLES)
def test_family_vars_define_what_setup_uses(role):
    """Every _<role>_ variable a setup-<family>.yml uses is defined for that family."""
    base = ROOT / "roles" / role
    common = set(yaml.safe_load((base / "vars/main.yml").read_text()) or {})
    for family in ("Debian", "RedHat"):
        defined = common | set(yaml.safe_load((base / f"vars/{family}.yml").read_text()) or {})
        used = set(re.findall(rf"\b(_{role}_[a-z_]+)", (base / f"tasks/setup-{family}.yml").read_text()))
        assert used <= defined, f"{role} {family}: undefined {sorted(used - defined)}"


def test_unsupported_distribution_falls_back_and_is_refused_by_preflight():
    # Debian 11 gets the Debian vars (first_found), but the planner refuses it before
    # anything changes (tests/unit/test_hoststack_logic.py covers the message).
    assert first_found("nvidia_driver", "Debian", "11", "Debian").endswith("vars/Debian.yml")
    assert first_found("nvidia_driver", "Archlinux", "0", "Archlinux").endswith("vars/main.yml")
