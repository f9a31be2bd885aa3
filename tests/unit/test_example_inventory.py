"""The example inventory the README tells users to copy (inventories/gpu_fleet) runs the
README's commands (issue #33 item 6). Before, it had only gpu_hosts: site.yml skipped its
cuda_toolkit, gateway and monitoring plays without a word, plan.yml planned nothing, and
upgrade.yml and benchmark.yml failed their preflights.

On a copy of it, as the README makes one (`cp -r inventories/gpu_fleet inventories/mine`):
every group each of the README's playbooks targets has hosts; every variable the README
names and every variable a role's preflight asserts non-empty, with no usable default, is
set (the API key through a vault file made from the shipped example); --syntax-check and
--list-tasks pass without the vault; playbooks/plan.yml plans a model on every GPU host
from a real captured nvidia-smi (the plan helpers of tests/unit/test_plan_playbook.py)."""
import json
import os
import pathlib
import re
import secrets
import shutil
import subprocess

import pytest
import yaml

from conftest import FIXTURES, ROOT
from test_plan_playbook import _playbook, _report, _task_results

EXAMPLE = ROOT / "inventories" / "gpu_fleet"
VAULT_EXAMPLE = "group_vars/all/vault.yml.example"
# Patterns Ansible resolves without the inventory.
IMPLICIT = {"all", "localhost"}
# A group a playbook fills at run time (add_host), and the group its hosts come from.
RUNTIME_GROUPS = {"__fleet_upgrade_order": "gpu_hosts"}
# The planning host's GPUs: the real H200 capture gpufleet took (nvidia-smi/SOURCES.md).
CAPTURE = FIXTURES / "nvidia-smi" / "device-h200-driver-580.xml"
# A model the example serves -> its real config.json (tests/fixtures/models) and its
# weight bytes: Qwen2.5-7B-Instruct's hub record gives 7,615,616,512 BF16 parameters
# (models/SOURCES.md), 2 bytes each, written as a safetensors index's total_size.
MODEL_FIXTURES = {"Qwen/Qwen2.5-7B-Instruct": ("qwen2.5-7b-instruct", 7_615_616_512 * 2)}


def _readme_playbooks():
    """The playbooks of the README's `ansible-playbook X -i inventories/mine` commands."""
    found = re.findall(r"^ansible-playbook (\S+\.yml) -i inventories/mine\b",
                       (ROOT / "README.md").read_text(), re.M)
    return sorted(set(found))


PLAYBOOKS = _readme_playbooks()


def test_the_readme_names_the_playbooks_this_test_runs():
    assert PLAYBOOKS == ["playbooks/benchmark.yml", "playbooks/plan.yml",
                         "playbooks/upgrade.yml", "site.yml"], PLAYBOOKS


def _readme_variables():
    """The variables the README says the example inventory sets (its "Fleet choices"
    paragraph: every `name` in backquotes that is a variable)."""
    text = (ROOT / "README.md").read_text()
    para = re.search(r"^Fleet choices live in the inventory.*?(?:\n\n)", text, re.M | re.S)
    assert para, "README.md: the 'Fleet choices live in the inventory' paragraph is gone"
    return sorted(set(re.findall(r"`([a-z][a-z0-9]*_[a-z0-9_]+)`", para.group(0))))


def _copy(tmp_path_factory):
    """`cp -r inventories/gpu_fleet inventories/mine`: the copy the README makes."""
    path = tmp_path_factory.mktemp("inventories") / "mine"
    shutil.copytree(EXAMPLE, path)
    return path


@pytest.fixture(scope="module")
def mine(tmp_path_factory):
    """A copy as shipped: no vault (the tests using it never add one)."""
    return _copy(tmp_path_factory)


def _env():
    # no fact cache: facts of another run would show up as host variables
    return dict(os.environ, ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_FORCE_COLOR="0")


def _groups(path):
    """`ansible-inventory --list` of `path`: {group: set of its hosts, children's included}."""
    proc = subprocess.run([str(ROOT / ".venv/bin/ansible-inventory"), "-i", str(path), "--list"],
                          capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)

    def members(group):
        entry = data.get(group, {})
        out = set(entry.get("hosts", []))
        for child in entry.get("children", []):
            out |= members(child)
        return out

    return {name: members(name) for name in data if name != "_meta"}


def _plays(path):
    """(playbook, play name, hosts pattern, roles) of each play of `path`, through
    import_playbook."""
    for play in yaml.safe_load(path.read_text()):
        if "ansible.builtin.import_playbook" in play or "import_playbook" in play:
            target = play.get("ansible.builtin.import_playbook") or play["import_playbook"]
            # gpufleet.fleet.<name>: the collection's playbooks/<name>.yml (this checkout)
            if target.startswith("gpufleet.fleet."):
                target = ROOT / "playbooks" / (target.removeprefix("gpufleet.fleet.") + ".yml")
            yield from _plays(path.parent / target)
            continue
        roles = [(r["role"] if isinstance(r, dict) else r).removeprefix("gpufleet.fleet.")
                 for r in play.get("roles", [])]
        yield str(path.relative_to(ROOT)), play.get("name", "?"), str(play["hosts"]), roles


def _runtime_groups():
    """Groups the roles fill with add_host (a play on them has no hosts in any inventory)."""
    found = set()
    for path in ROOT.glob("roles/*/tasks/*.yml"):
        for task in yaml.safe_load(path.read_text()) or []:
            args = task.get("ansible.builtin.add_host") or task.get("add_host")
            if isinstance(args, dict) and isinstance(args.get("groups"), list):
                found |= set(args["groups"])
    return found


def test_the_groups_filled_at_run_time_are_known():
    assert _runtime_groups() == set(RUNTIME_GROUPS)


def _pattern_hosts(pattern, groups):
    """Hosts of a play's `hosts:` pattern (a:b union, a:&b intersection, a:!b exclusion),
    and the problems: groups the inventory lacks or leaves empty."""
    hosts, problems = set(), []
    terms = [t.strip() for t in re.split(r"[:,]", pattern) if t.strip()]
    for i, term in enumerate(terms):
        op, name = (term[0], term[1:]) if term[0] in "&!" else ("|", term)
        if name in IMPLICIT:
            members = {"localhost"} if name == "localhost" else set().union(*groups.values())
        else:
            name = RUNTIME_GROUPS.get(name, name)
            if name not in groups:
                problems.append(f"group {name!r} is not in the inventory")
            elif not groups[name]:
                problems.append(f"group {name!r} has no hosts")
            members = groups.get(name, set())
        if i == 0 or op == "|":
            hosts |= members
        elif op == "&":
            hosts &= members
        else:
            hosts -= members
    return hosts, problems


def test_every_group_a_playbook_targets_has_hosts(mine):
    """A play whose group is missing or empty is skipped with only a warning: on main's
    inventory, site.yml skipped its cuda_toolkit, gateway and monitoring plays."""
    groups = _groups(mine)
    missing = []
    for top in PLAYBOOKS:
        for playbook, name, pattern, _ in _plays(ROOT / top):
            hosts, problems = _pattern_hosts(pattern, groups)
            if problems or not hosts:
                missing.append(f"{playbook}: play {name!r} (hosts: {pattern}): "
                               + ("; ".join(problems) or "no host matches"))
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("playbook", PLAYBOOKS)
@pytest.mark.parametrize("mode", ["--syntax-check", "--list-tasks"])
def test_syntax_check_and_list_tasks_pass_without_the_vault(mine, playbook, mode):
    assert not (mine / "group_vars" / "all" / "vault.yml").exists()
    proc = _playbook(mine, ROOT / playbook, mode)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    unmatched = set(re.findall(r"Could not match supplied host pattern, ignoring: (\S+)",
                               proc.stdout + proc.stderr)) - set(RUNTIME_GROUPS)
    assert not unmatched, f"{playbook} {mode}: no hosts for {sorted(unmatched)}"


def _role_defaults():
    """{variable: the role whose defaults/main.yml sets it}."""
    return {var: path.parts[-3] for path in ROOT.glob("roles/*/defaults/main.yml")
            for var in yaml.safe_load(path.read_text()) or {}}


def _preflight_requirements():
    """{role: {variable: minimum length}} of every `VAR | length > N` / `>= N` that a
    role's assert checks where no role's default gives a value (empty, or a template
    that may render empty): the inventory must set them. A condition with an
    alternative counts only when the alternative is an opt-out variable whose default is
    false (fleet_upgrade_allow_downtime); `... or <a fact>` does not."""
    defaults = {}
    for path in ROOT.glob("roles/*/defaults/main.yml"):
        defaults.update(yaml.safe_load(path.read_text()) or {})
    rule = re.compile(r"^\(?\s*([a-z][a-z0-9_]*) \| (?:default\([^)]*\) \| )?length (>=|>) (\d+)\)?"
                      r"(?: or ([a-z][a-z0-9_]*))?$")
    out = {}
    for path in ROOT.glob("roles/*/tasks/*.yml"):
        role = path.parts[-3]
        for task in yaml.safe_load(path.read_text()) or []:
            args = task.get("ansible.builtin.assert") or task.get("assert")
            if not isinstance(args, dict):
                continue
            that = args["that"] if isinstance(args["that"], list) else [args["that"]]
            for cond in that:
                m = rule.match(str(cond).strip())
                if not m or (m.group(4) and defaults.get(m.group(4)) is not False):
                    continue
                name, op, n = m.group(1), m.group(2), int(m.group(3))
                default = defaults.get(name, "")
                if isinstance(default, (str, list, dict)) and (not default or "{{" in str(default)):
                    out.setdefault(role, {})[name] = n + 1 if op == ">" else n
    return out


def _patterns_of_roles():
    """{role: host patterns of the plays that run it} from the `roles:` of the README's
    playbooks (a group filled at run time replaced by the group its hosts come from)."""
    out = {}
    for top in PLAYBOOKS:
        for _, _, pattern, roles in _plays(ROOT / top):
            for name, group in RUNTIME_GROUPS.items():
                pattern = re.sub(rf"\b{name}\b", group, pattern)
            for role in roles:
                out.setdefault(role, set()).add(pattern)
    return out


def test_the_preflight_requirements_are_found():
    """The scan finds what it must (a control for the two helpers above)."""
    required = _preflight_requirements()
    assert required["vllm_server"]["vllm_server_api_key"] == 8
    assert required["vllm_gateway"].keys() >= {"vllm_gateway_instances_file", "vllm_gateway_frontends",
                                               "vllm_gateway_api_keys"}
    assert "vllm_server_file_sd_path" in required["fleet_upgrade"]
    assert "fleet_benchmark_instances_file" in required["fleet_benchmark"]
    assert "fleet_monitoring_instances_file" in required["fleet_monitoring"]
    roles = _patterns_of_roles()
    assert roles["vllm_gateway"] == {"gateways"} and roles["fleet_upgrade"] == {"gpu_hosts"}
    assert roles["cuda_toolkit"] == {"gpu_hosts:&cuda_toolkit"}


def _vault_from_example(mine):
    """What the example's instructions make: vault.yml from vault.yml.example, each empty
    value replaced by a new secret. Returns the values ({} without an example:
    test_secrets_come_from_the_vault_example says so, the other tests go on)."""
    example = mine / VAULT_EXAMPLE
    if not example.is_file():
        return {}
    text = example.read_text()
    assert "ansible-vault encrypt" in text
    values = yaml.safe_load(text)
    assert values and all(name.startswith("vault_") for name in values), values
    # an example, not a secret: every value is empty in git
    assert not [name for name, value in values.items() if value], "a value in the example"
    filled = {name: secrets.token_hex(16) for name in values}
    (mine / "group_vars" / "all" / "vault.yml").write_text(yaml.safe_dump(filled))
    return filled


def test_secrets_come_from_the_vault_example():
    """Every vault_ variable the inventory reads is in the example, and no secret is set
    in clear."""
    text = "\n".join(p.read_text() for p in EXAMPLE.rglob("*.yml"))
    used = set(re.findall(r"\b(vault_[a-z0-9_]+)", text))
    example = yaml.safe_load((EXAMPLE / VAULT_EXAMPLE).read_text())
    assert used and used <= set(example), used - set(example or {})
    for name in ("vllm_server_api_key", "model_fetch_token"):
        assert re.search(rf"^{name}: \"{{{{ vault_{name}\b", text, re.M), name


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Per host, the value of every variable the README names and every preflight
    requirement of the roles its groups run (the role's default when the inventory sets
    none), rendered by Ansible on a copy with the vault made from the example; plus the
    vault's values and the model root the values were rendered with."""
    mine = _copy(tmp_path_factory)
    vault = _vault_from_example(mine)
    models_root = tmp_path_factory.mktemp("models")
    required, by_role = _preflight_requirements(), _patterns_of_roles()
    plays = []
    groups = _groups(mine)
    owner = _role_defaults()
    wanted = {}  # hosts pattern -> {variable: (minimum length, role whose preflight needs it or None)}
    for var in _readme_variables():
        wanted.setdefault("gpu_hosts", {})[var] = (0, None)
    for role, names in required.items():
        for pattern in by_role.get(role, ()):
            for var, n in names.items():
                wanted.setdefault(pattern, {})[var] = (n, role)
    wanted.setdefault("gpu_hosts", {})["vllm_server_models"] = (1, None)  # serves something
    for pattern, names in sorted(wanted.items()):
        # the inventory's value, else the default of the role that sets one (rendered for
        # this host); a README variable must be in the inventory itself
        roles = sorted({owner[var] for var, (_, role) in names.items() if role and var in owner})
        tasks = [{"name": f"Load {role}'s defaults", "ansible.builtin.include_vars": {
            "file": str(ROOT / "roles" / role / "defaults" / "main.yml"), "name": f"__d_{role}"}}
            for role in roles]
        exprs = [f"'{var}': lookup('ansible.builtin.vars', '{var}', default="
                 + (f"__d_{owner[var]}['{var}']" if role and var in owner else "'__UNSET__'") + ")"
                 for var, (_, role) in sorted(names.items())]
        tasks.append({"name": "Show", "ansible.builtin.debug": {
            "msg": "{{ {" + ", ".join(exprs) + "} }}"}})
        plays.append({"name": pattern, "hosts": pattern, "gather_facts": False, "tasks": tasks})
    pb = tmp_path_factory.mktemp("pb") / "render.yml"
    pb.write_text(yaml.safe_dump(plays, sort_keys=False))
    proc = _playbook(mine, pb, "-e", json.dumps({"model_fetch_root": str(models_root)}))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    values = {}
    for play in _report(proc)["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == "Show":
                for host, res in task["hosts"].items():
                    values.setdefault(play["play"]["name"], {})[host] = res["msg"]
    return {"values": values, "wanted": wanted, "groups": groups, "vault": vault,
            "models_root": models_root}


def test_the_readme_names_the_example_s_variables():
    names = _readme_variables()
    assert {"vllm_server_api_key", "vllm_server_models", "model_fetch_endpoint"} <= set(names), names


def test_every_required_variable_is_set_for_every_host(rendered):
    problems = []
    for pattern, names in sorted(rendered["wanted"].items()):
        hosts, missing = _pattern_hosts(pattern, rendered["groups"])
        problems += [f"{pattern}: {why}" for why in missing]
        for host in sorted(hosts):
            got = rendered["values"].get(pattern, {}).get(host, {})
            for var, (n, role) in sorted(names.items()):
                value = got.get(var, "__UNSET__")
                why = f" (roles/{role}'s preflight: length >= {n})" if role else " (README)"
                if value == "__UNSET__":
                    problems.append(f"{host} ({pattern}): {var} is not set{why}")
                elif value is None or len(value) < n:
                    problems.append(f"{host} ({pattern}): {var} is {value!r}{why}")
    assert not problems, "\n".join(problems)


def test_the_key_and_the_gateway_come_from_the_vault_and_the_served_models(rendered):
    values = {**rendered["values"]["gateways"], **rendered["values"]["gpu_hosts"]}
    groups = rendered["groups"]
    key = rendered["vault"].get("vault_vllm_server_api_key")
    assert key, f"no vault_vllm_server_api_key in {VAULT_EXAMPLE}"
    served = set()
    for host in groups["gpu_hosts"]:
        assert values[host]["vllm_server_api_key"] == key, host
        served |= {m["name"] for m in values[host]["vllm_server_models"]}
    for host in groups["gateways"]:
        assert values[host]["vllm_gateway_api_keys"] == [key], host
        frontends = {f["served_model_name"] for f in values[host]["vllm_gateway_frontends"]}
        # the gateway's preflight refuses a frontend for a model no instance serves
        assert frontends and frontends <= served, (host, frontends - served)


def test_plan_yml_plans_a_model_on_every_gpu_host(rendered, mine):
    """playbooks/plan.yml on the copy, each host planned from the captured H200 and the
    model folders the inventory names (a real config.json, weights as an index); without
    the vault: planning needs no key."""
    assert not (mine / "group_vars" / "all" / "vault.yml").exists()
    values, groups = rendered["values"]["gpu_hosts"], rendered["groups"]
    for host in groups["gpu_hosts"]:
        models = values.get(host, {}).get("vllm_server_models")
        for model in models if isinstance(models, list) else []:  # none: planned nothing, below
            assert model["name"] in MODEL_FIXTURES, f"no fixture for {model['name']}: add one"
            folder, weights = MODEL_FIXTURES[model["name"]]
            path = pathlib.Path(model["path"])
            assert str(path).startswith(str(rendered["models_root"])), path
            path.mkdir(parents=True, exist_ok=True)
            shutil.copy(FIXTURES / "models" / folder / "config.json", path / "config.json")
            (path / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": weights}, "weight_map": {}}))
    extra = {"ansible_connection": "local",
             "ansible_python_interpreter": str(ROOT / ".venv/bin/python"),
             "plan_nvidia_smi_xml": str(CAPTURE), "model_fetch_root": str(rendered["models_root"])}
    proc = _playbook(mine, ROOT / "playbooks" / "plan.yml", "-e", json.dumps(extra))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = _report(proc)
    planned = {}
    for task in (t for p in report["plays"] for t in p["tasks"]):
        if task["task"]["name"] == "Plan | Print settings, prediction and reasons":
            for host, res in task["hosts"].items():
                planned[host] = [item["msg"] for item in res.get("results", [])
                                 if not item.get("skipped")]
    for host in sorted(groups["gpu_hosts"]):
        assert planned.get(host), f"{host}: plan.yml planned nothing"
        assert all(msg["fits"] is True and msg["command"].startswith("vllm serve ")
                   for msg in planned[host]), planned[host]
    for host, stats in report["stats"].items():
        assert stats["failures"] == 0 and stats["changed"] == 0, (host, stats)
        # a host with no models (the gateway) is not planned and reads no image
        assert stats.get("rescued", 0) == 0, (host, stats)
    nothing = _task_results(report, "Plan | Say when a host has no models to plan")
    assert len([r for r in nothing if not r.get("skipped")]) == len(
        set(report["stats"]) - groups["gpu_hosts"])
