"""Tests of the fleet lab's plain logic: lab/fleet.py (the generated inventory, sshd ports,
the lab key, the link to its settings) and tests/bench/bench_fleet.py (the recap it reads,
the sizes it takes)."""
import importlib.util
import os
import stat
import sys

import pytest
import yaml

from conftest import ROOT

sys.path.insert(0, str(ROOT / "lab"))
import fleet  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_fleet", ROOT / "tests" / "bench" / "bench_fleet.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

PROFILES = list(yaml.safe_load((ROOT / "lab" / "profiles.yml").read_text()))


def test_hosts_take_the_lab_profiles_in_turn_and_one_port_each():
    hosts = fleet.fleet_hosts(10, PROFILES, port_base=2200)
    assert [h["name"] for h in hosts][:3] == ["fleet-01", "fleet-02", "fleet-03"]
    assert hosts[-1]["name"] == "fleet-10"
    assert [h["profile"] for h in hosts[:len(PROFILES)]] == PROFILES
    assert hosts[len(PROFILES)]["profile"] == PROFILES[0]
    assert [h["port"] for h in hosts] == list(range(2201, 2211))
    # every profile of lab/profiles.yml is used, none other: the one list
    assert {h["profile"] for h in hosts} == set(PROFILES)


@pytest.mark.parametrize("n, base", [(0, 2200), (100, 2200), (5, 65533), (3, 100)])
def test_sizes_and_ports_out_of_range_are_refused(n, base):
    with pytest.raises(ValueError):
        fleet.fleet_hosts(n, PROFILES, port_base=base)


def test_inventory_puts_every_host_in_gpu_hosts_under_fleet_hosts():
    hosts = fleet.fleet_hosts(3, PROFILES)
    inv = fleet.inventory(hosts)
    gpu = inv["all"]["children"]["fleet_hosts"]["children"]["gpu_hosts"]["hosts"]
    assert gpu == {"fleet-01": {"lab_profile": PROFILES[0], "ansible_port": 2201},
                   "fleet-02": {"lab_profile": PROFILES[1], "ansible_port": 2202},
                   "fleet-03": {"lab_profile": PROFILES[2], "ansible_port": 2203}}
    # no group of the main lab that site.yml would act on beyond gpu_hosts
    assert set(inv["all"]["children"]) == {"fleet_hosts"}


def test_sshd_listens_on_its_port_on_loopback_only():
    assert fleet.sshd_conf(2207).splitlines()[1:] == ["Port 2207", "ListenAddress 127.0.0.1"]


def test_write_makes_the_inventory_key_and_settings_link(tmp_path):
    out = tmp_path / "fleet"
    inv = fleet.write(out, fleet.fleet_hosts(4, PROFILES))
    assert yaml.safe_load(inv.read_text()) == fleet.inventory(fleet.fleet_hosts(4, PROFILES))
    key = out / "id_ed25519"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert (out / "id_ed25519.pub").read_text().startswith("ssh-ed25519 ")
    assert (out / "group_vars").is_symlink()
    assert (out / "group_vars").resolve() == fleet.GROUP_VARS.resolve()
    assert (out / "hosts" / "fleet-04" / "sshd.conf").read_text() == fleet.sshd_conf(2204)
    # a smaller fleet: the key is kept, the hosts it no longer has are gone
    before = key.read_bytes()
    fleet.write(out, fleet.fleet_hosts(2, PROFILES))
    assert key.read_bytes() == before
    assert sorted(p.name for p in (out / "hosts").iterdir()) == ["fleet-01", "fleet-02"]


def test_the_fleet_settings_are_the_main_labs_own_file():
    shared = ROOT / "inventories" / "lab_fleet" / "group_vars" / "gpu_hosts" / "main.yml"
    assert shared.is_symlink()
    assert shared.resolve() == (ROOT / "inventories" / "lab" / "group_vars" / "gpu_hosts" / "main.yml").resolve()
    own = yaml.safe_load((ROOT / "inventories" / "lab_fleet" / "group_vars" / "fleet_hosts" / "main.yml").read_text())
    assert own["ansible_connection"] == "ssh" and own["vllm_server_models"] == []
    # the main lab keeps the Docker connection
    main = yaml.safe_load((ROOT / "inventories" / "lab" / "group_vars" / "lab_hosts" / "connection.yml").read_text())
    assert main["ansible_connection"] == "community.docker.docker"


RECAP = """\
TASK [Summary | Print the fleet table] *****************************************
ok: [localhost] =>
    msg: |-
        host     | status

PLAY RECAP *********************************************************************
\x1b[0;32mfleet-01\x1b[0m                   : \x1b[0;32mok=86  \x1b[0m changed=0    unreachable=0    failed=0    \
skipped=52   rescued=0    ignored=0
fleet-02                   : ok=86   changed=2    unreachable=0    failed=0    skipped=52   rescued=0    ignored=0
fleet-03                   : ok=12   changed=0    unreachable=1    failed=0    skipped=2    rescued=0    ignored=0
localhost                  : ok=2    changed=0    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0


TASKS RECAP ********************************************************************
Thursday 03 December 2026  07:14:10 +0000 (0:00:00.180)       0:03:00.084 *****
"""


def test_recap_is_read_per_host_colours_and_all():
    recap = bench.parse_recap("PLAY RECAP ****\nold : ok=1 changed=9\n\n" + RECAP)
    assert set(recap) == {"fleet-01", "fleet-02", "fleet-03", "localhost"}  # the last recap only
    assert recap["fleet-01"] == {"ok": 86, "changed": 0, "unreachable": 0, "failed": 0,
                                 "skipped": 52, "rescued": 0, "ignored": 0}
    assert recap["fleet-02"]["changed"] == 2
    assert recap["fleet-03"]["unreachable"] == 1


def test_a_noop_run_that_changed_or_lost_a_host_is_reported():
    recap = bench.parse_recap(RECAP)
    hosts = ["fleet-01", "fleet-02", "fleet-03", "fleet-04"]
    assert bench.check_recap(recap, hosts, expect_no_change=True) == [
        "fleet-04: not in the recap", "fleet-02: changed=2", "fleet-03: failed=0 unreachable=1"]
    # a first run may change things
    assert bench.check_recap(recap, hosts[:2]) == ["fleet-03: failed=0 unreachable=1"]


def test_output_without_a_recap_is_an_error():
    with pytest.raises(ValueError):
        bench.parse_recap("ERROR! the playbook: site.yml could not be found\n")


def test_sizes_option():
    assert bench.parse_sizes("3,10,25") == [3, 10, 25]
    assert bench.parse_sizes("3") == [3]
    for bad in ("", "0", "3,-1"):
        with pytest.raises(ValueError):
            bench.parse_sizes(bad)


def test_table_has_one_row_per_size_with_per_host_figures_and_ratios():
    rows = [{"hosts": 3, "first": (180.0, 46.0), "noop": (87.0, 47.0), "setup": (2.0, 1.5), "noop_changed": 0},
            {"hosts": 10, "first": (400.0, 150.0), "noop": (200.0, 150.0), "setup": (4.0, 5.0), "noop_changed": 1}]
    lines = bench.table(rows).splitlines()
    assert len(lines) == 4
    assert lines[2].split(" | ")[1:] == ["180.0", "46.0", "87.0", "47.0", "0", "2.00", "1.50", "29.00",
                                         "15.67", "0.500", "43.5x", "31.3x |"]
    assert lines[3].split(" | ")[5] == "1"
    assert os.path.basename(bench.INVENTORY) == "hosts.yml"
