"""hf_site_mirror serves no one it was not told to: it listens on loopback unless an
address is set, takes an allow-list (nginx allow/deny), and its preflight refuses a bad
address or network before anything changes. The template is rendered with the role's
real defaults; the preflight runs in a real ansible-playbook (connection local)."""
import jinja2
import pytest
import yaml

from conftest import ROOT
from gpufleet import hub_mirror
from helpers import run_playbook

ROLE = ROOT / "roles" / "hf_site_mirror"


def _render(**overrides):
    values = dict(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text()), **overrides)
    # Ansible's template module renders with trim_blocks
    template = jinja2.Environment(trim_blocks=True).from_string(
        (ROLE / "templates" / "hf-site-mirror.conf.j2").read_text())
    return template.render(ansible_managed="test", **values)


def test_by_default_the_mirror_listens_on_loopback_only_with_no_allow_list():
    conf = _render()
    assert "    listen 127.0.0.1:8090;\n" in conf
    assert "geo " not in conf and "return 403" not in conf


def test_an_allow_list_lets_only_its_entries_in():
    conf = _render(hf_site_mirror_bind_address="10.0.0.5", hf_site_mirror_port=8091,
                   hf_site_mirror_allow=["10.0.0.0/24", "fd00::/8", "192.0.2.7"])
    assert "    listen 10.0.0.5:8091;\n" in conf
    assert ("geo $hf_site_mirror_allowed {\n    default 0;\n    10.0.0.0/24 1;\n"
            "    fd00::/8 1;\n    192.0.2.7 1;\n}\n") in conf
    # at server level, so it also covers the locations that answer with `return`
    server = conf[conf.index("server {"):conf.index("    location ")]
    assert "    if ($hf_site_mirror_allowed = 0) {\n        return 403;\n    }\n" in server
    assert "    listen [::1]:8090;\n" in _render(hf_site_mirror_bind_address="::1")


def test_bad_addresses():
    good = ["127.0.0.1", "10.0.0.5", "::1", "0.0.0.0", "fd00::1"]
    assert hub_mirror.bad_addresses(good) == []
    assert hub_mirror.bad_addresses(["10.0.0.300", "10.0.0.0/24", "host", "", " 10.0.0.1", 7]) == [
        "10.0.0.300", "10.0.0.0/24", "host", "", " 10.0.0.1", 7]
    assert hub_mirror.bad_addresses(["10.0.0.0/24", "fd00::/8", "192.0.2.7"], networks=True) == []
    assert hub_mirror.bad_addresses(["10.0.0.1/24", "10.0.0.0/33", "all"], networks=True) == [
        "10.0.0.1/24", "10.0.0.0/33", "all"]


@pytest.mark.parametrize("overrides, named", [
    ({"hf_site_mirror_bind_address": "10.0.0.300"}, "10.0.0.300"),
    ({"hf_site_mirror_bind_address": "mirror.example"}, "mirror.example"),
    ({"hf_site_mirror_allow": ["10.0.0.0/24", "10.0.0.1/24"]}, "10.0.0.1/24"),
    ({"hf_site_mirror_allow": ["10.0.0.0/33"]}, "10.0.0.0/33"),
])
def test_preflight_refuses_a_bad_address_or_network_before_anything(tmp_path, overrides, named):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(f"all:\n  hosts:\n    h:\n      ansible_connection: local\n"
                         f"      ansible_python_interpreter: {ROOT / '.venv/bin/python'}\n")
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: h\n  gather_facts: false\n  roles: [gpufleet.fleet.hf_site_mirror]\n")
    rc, _, failures, changed = run_playbook(inventory, playbook, "h", {
        "hf_site_mirror_models": [{"path": str(tmp_path / "no-such-folder")}],
        "hf_site_mirror_root": str(tmp_path / "site"),
        "hf_site_mirror_nginx_conf_dir": str(tmp_path / "conf.d"),
        "hf_site_mirror_install": False, "hf_site_mirror_manage_service": False,
        **overrides})
    assert rc != 0 and changed == []
    assert len(failures) == 1 and "Hf_site_mirror | Check the address and the allow-list" in failures[0]
    assert named in failures[0] and "Nothing was changed" in failures[0]
    assert not (tmp_path / "site").exists()
