"""gpufleet as the collection gpufleet.fleet (issue #33 items 1-2, docs/collection.md).

The checkout is the collection: collections/ansible_collections/gpufleet/fleet is a link to
its root, so every own module, role, filter and playbook is called as gpufleet.fleet.<name>
(a short name resolves from the checkout only through settings a user does not have, and a
filter's short name does not resolve at all in a collection's role). galaxy.yml's
dependencies are requirements.yml's. scripts/collection-check.sh builds, installs and uses
the tarball outside the checkout.
"""
import os
import pathlib
import re

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINK = ROOT / "collections" / "ansible_collections" / "gpufleet" / "fleet"

# Where tasks, plays and templates live (tests write their own plays: not scanned).
_SCANNED = ("site.yml", "playbooks", "roles", "molecule")
_SUFFIXES = (".yml", ".yaml", ".j2")


def _own_names(root):
    """(modules, roles, filters) of the collection at `root`, by their short names."""
    modules = sorted(p.stem for p in (root / "plugins" / "modules").glob("*.py"))
    roles = sorted(p.name for p in (root / "roles").iterdir() if p.is_dir())
    filters = sorted(set(re.findall(r'"(gpufleet_[a-z0-9_]+)":',
                                    (root / "plugins" / "filter" / "gpufleet.py").read_text())))
    return modules, roles, filters


def short_name_calls(root):
    """'path:line: text' for every own module (a task key), role (role:, roles: [...],
    include_role/import_role name:) or filter (| name) called by its short name."""
    modules, roles, filters = _own_names(root)
    alt = lambda names: "|".join(map(re.escape, names))  # noqa: E731
    checks = [
        re.compile(rf"^\s*-?\s*({alt(modules)}):(\s|$)"),
        re.compile(rf"^\s*-?\s*(role|name):\s*['\"]?({alt(roles)})['\"]?\s*$"),
        re.compile(rf"^\s*roles:\s*\[[^\]]*(?<![\w.])({alt(roles)})\b"),
        re.compile(rf"\|\s*({alt(filters)})\b"),
    ]
    found = []
    for top in _SCANNED:
        path = root / top
        files = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for f in files:
            if not f.is_file() or f.suffix not in _SUFFIXES:
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if line.lstrip().startswith("#"):
                    continue
                if any(c.search(line) for c in checks):
                    found.append(f"{f.relative_to(root)}:{n}: {line.strip()}")
    return found


def test_no_own_module_role_or_filter_is_called_by_its_short_name():
    assert short_name_calls(ROOT) == []


def test_control_a_short_name_of_each_kind_is_found(tmp_path):
    """One short name planted of each kind is found; the same calls by FQCN are not."""
    for sub in ("plugins/modules", "plugins/filter", "roles/r/tasks", "roles/r/templates", "playbooks"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "plugins/modules/cuda_compat.py").write_text("")
    (tmp_path / "plugins/filter/gpufleet.py").write_text('{"gpufleet_batches": batches}\n')
    (tmp_path / "roles/r/tasks/main.yml").write_text(
        "- name: R | Check\n  cuda_compat:\n    driver_version: x\n"
        "- name: R | Again\n  gpufleet.fleet.cuda_compat:\n    driver_version: x\n"
        "- name: R | Include\n  ansible.builtin.include_role:\n    name: r\n"
        "- name: R | Include by FQCN\n  ansible.builtin.include_role:\n    name: gpufleet.fleet.r\n")
    (tmp_path / "roles/r/templates/t.j2").write_text(
        "{{ x | gpufleet_batches }}\n{{ x | gpufleet.fleet.gpufleet_batches }}\n")
    (tmp_path / "playbooks/p.yml").write_text(
        "- name: P\n  hosts: all\n  roles:\n    - role: r\n    - role: gpufleet.fleet.r\n"
        "- name: Q\n  hosts: all\n  roles: [r]\n- name: S\n  hosts: all\n  roles: [gpufleet.fleet.r]\n")
    assert short_name_calls(tmp_path) == [
        "playbooks/p.yml:4: - role: r",
        "playbooks/p.yml:8: roles: [r]",
        "roles/r/tasks/main.yml:2: cuda_compat:",
        "roles/r/tasks/main.yml:9: name: r",
        "roles/r/templates/t.j2:1: {{ x | gpufleet_batches }}"]


def test_the_checkout_is_the_collection_through_one_link():
    """collections/ansible_collections/gpufleet/fleet -> ../../.. (committed; no second
    copy of any file), and galaxy.yml names that collection."""
    assert LINK.is_symlink() and os.readlink(LINK) == "../../.."
    assert LINK.resolve() == ROOT
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    assert (galaxy["namespace"], galaxy["name"]) == ("gpufleet", "fleet")
    # the link is not packed into the tarball (a link to the root, a loop in a copy)
    assert "collections" in galaxy["build_ignore"]


def test_requirements_yml_are_galaxy_yml_dependencies():
    """requirements.yml (users who install from Galaxy; the execution environment) lists
    exactly the collections and ranges of galaxy.yml's dependencies."""
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())["dependencies"]
    wanted = {c["name"]: c["version"]
              for c in yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]}
    assert wanted == galaxy


def test_every_collection_a_role_or_playbook_calls_is_a_dependency():
    """A community.* (or other) collection called in a role or playbook is in galaxy.yml's
    dependencies (community.crypto was used but not listed before)."""
    deps = set(yaml.safe_load((ROOT / "galaxy.yml").read_text())["dependencies"])
    used = set()
    for top in ("roles", "playbooks"):
        for f in (ROOT / top).rglob("*.yml"):
            used |= set(re.findall(r"^\s*-?\s*([a-z_]+\.[a-z_]+)\.[a-z_]+:", f.read_text(), re.M))
    used -= {"ansible.builtin", "gpufleet.fleet"}
    used = {u for u in used if not u.startswith("org.")}  # container label keys, org.gpufleet.*
    assert used and used <= deps, used - deps


def test_playbooks_are_importable_by_their_collection_name():
    """site.yml at the root only imports gpufleet.fleet.site (playbooks/site.yml), which
    imports its siblings by collection name: `ansible-playbook gpufleet.fleet.site` works
    from an installed copy."""
    root_site = yaml.safe_load((ROOT / "site.yml").read_text())
    assert [p.get("ansible.builtin.import_playbook") for p in root_site] == ["gpufleet.fleet.site"]
    site = yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
    imported = [p["ansible.builtin.import_playbook"] for p in site if "ansible.builtin.import_playbook" in p]
    assert imported and all(name.startswith("gpufleet.fleet.") for name in imported)
    for name in imported:
        assert (ROOT / "playbooks" / (name.removeprefix("gpufleet.fleet.") + ".yml")).is_file()


# --- what ansible-test sanity found in the installed copy (docs/collection.md) ---------------
_RETURN_KEYS = {"description", "returned", "type", "sample", "contains", "elements", "version_added"}


def stray_return_keys(returns, where=""):
    """'path: key' for every key of a RETURN entry that is not one of _RETURN_KEYS."""
    found = []
    for name, entry in (returns or {}).items():
        path = f"{where}.{name}" if where else name
        if not isinstance(entry, dict):
            found.append(f"{path}: not a mapping")
            continue
        found += [f"{path}: {key!r}" for key in sorted(set(entry) - _RETURN_KEYS, key=str)]
        found += stray_return_keys(entry.get("contains"), path)
    return found


def test_every_return_entry_has_only_known_keys():
    """validate-modules' return-syntax-error: nvidia_driver_plan's RETURN had a flow
    mapping whose description held ', null when absent.': YAML read a stray key."""
    found = []
    for module in sorted((ROOT / "plugins" / "modules").glob("*.py")):
        text = module.read_text()
        block = re.search(r'^RETURN = r?"""(.*?)"""', text, re.S | re.M)
        found += [f"{module.stem}: {s}" for s in stray_return_keys(yaml.safe_load(block.group(1)))]
    assert found == []


def test_control_the_old_installed_version_line_has_a_stray_key():
    old = ("plan:\n  description: x\n  type: dict\n  contains:\n"
           "    installed_version: {description: The meta's installed version, null when absent., type: str}\n")
    assert stray_return_keys(yaml.safe_load(old)) == ["plan.installed_version: 'null when absent.'"]


def test_hub_imports_without_requests_and_says_what_is_missing():
    """The plain logic of hub.py imports on a host without requests (ansible-test's import
    test; hub_mirror, p2p and revisions import hub); a client says what to install."""
    import subprocess
    import sys

    code = ("import sys\nsys.modules['requests'] = sys.modules['urllib3'] = None\n"
            "from gpufleet import hub, hub_client\nassert not hub_client.HAS_REQUESTS\n"
            "try:\n    hub_client.HubClient('https://huggingface.co')\n"
            "except hub.HubError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "plugins" / "module_utils")))
    assert proc.returncode == 0, proc.stderr
    assert "needs the Python library requests" in proc.stdout


def test_the_state_check_reads_the_collections_roles_wherever_the_playbook_is(tmp_path):
    """site.yml's state check lists the roles and digests the code of the collection the
    filter belongs to, not playbook_dir's: a collection or imported playbook has
    playbook_dir = <collection>/playbooks, which has no roles/ (the filter took
    playbook_dir before, and listed playbook_dir/roles). A play in a folder with no roles
    gets every role of gpufleet.fleet in the pattern."""
    import subprocess

    (tmp_path / "play.yml").write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n"
        "        msg: \"PATTERN={{ 'gpufleet' | gpufleet.fleet.gpufleet_state_var_pattern }}\"\n"
        "    - ansible.builtin.debug:\n"
        "        msg: \"DIGEST={{ [1] | gpufleet.fleet.gpufleet_state_digest(['x'], ['h']) }}\"\n")
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-c", "local",
                           str(tmp_path / "play.yml")], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, ANSIBLE_FORCE_COLOR="0"), timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
    pattern = re.search(r"PATTERN=([^\s\"]+)", proc.stdout).group(1)
    assert pattern == "^(?!gpufleet_state_)(%s)_" % "|".join(roles + ["gpufleet"])
    assert re.search(r"DIGEST=[0-9a-f]{64}\b", proc.stdout)
    assert not (tmp_path / "roles").exists() and not (ROOT / "playbooks" / "roles").exists()
