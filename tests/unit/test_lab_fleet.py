"""Tests of the fleet lab's plain logic: lab/fleet.py (the generated inventory, sshd ports,
the link to its settings, the one connection file of both labs) and tests/bench/bench_fleet.py (the recap it reads,
the sizes it takes)."""
import importlib.util
import os

import pytest
import yaml

from conftest import ROOT

_spec = importlib.util.spec_from_file_location("fleet", ROOT / "lab" / "fleet.py")
fleet = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fleet)

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


def test_write_makes_the_inventory_and_settings_link(tmp_path):
    out = tmp_path / "fleet"
    inv = fleet.write(out, fleet.fleet_hosts(4, PROFILES))
    assert yaml.safe_load(inv.read_text()) == fleet.inventory(fleet.fleet_hosts(4, PROFILES))
    assert (out / "group_vars").is_symlink()
    assert (out / "group_vars").resolve() == fleet.GROUP_VARS.resolve()
    # rewritten for a smaller fleet
    fleet.write(out, fleet.fleet_hosts(2, PROFILES))
    assert set(yaml.safe_load(inv.read_text())["all"]["children"]["fleet_hosts"]["children"]
               ["gpu_hosts"]["hosts"]) == {"fleet-01", "fleet-02"}


def test_the_fleet_settings_are_the_main_labs_own_file():
    shared = ROOT / "inventories" / "lab_fleet" / "group_vars" / "gpu_hosts" / "main.yml"
    assert shared.is_symlink()
    assert shared.resolve() == (ROOT / "inventories" / "lab" / "group_vars" / "gpu_hosts" / "main.yml").resolve()
    own = yaml.safe_load((ROOT / "inventories" / "lab_fleet" / "group_vars" / "fleet_hosts" / "main.yml").read_text())
    assert own["vllm_server_models"] == [] and "ansible_connection" not in own
    # both labs are reached over SSH, through the main lab's one connection file
    connection = ROOT / "inventories" / "lab_fleet" / "group_vars" / "fleet_hosts" / "connection.yml"
    main = ROOT / "inventories" / "lab" / "group_vars" / "lab_hosts" / "connection.yml"
    assert connection.is_symlink() and connection.resolve() == main.resolve()
    settings = yaml.safe_load(main.read_text())
    assert settings["ansible_connection"] == "ssh" and settings["ansible_user"] == "gpufleet"
    # the key: .cache/lab/id_ed25519, from both inventories (two folders below the checkout)
    for inv_dir in (ROOT / "inventories" / "lab", ROOT / ".cache" / "fleet"):
        path = settings["ansible_ssh_private_key_file"].replace("{{ inventory_dir }}", str(inv_dir))
        assert os.path.normpath(path) == str(ROOT / ".cache" / "lab" / "id_ed25519"), path


def test_every_main_lab_host_has_its_own_sshd_port():
    inv = yaml.safe_load((ROOT / "inventories" / "lab" / "hosts.yml").read_text())
    ports = {}

    def walk(group):
        for name, hv in (group.get("hosts") or {}).items():
            if hv and "ansible_port" in hv:
                ports[name] = hv["ansible_port"]
        for child in (group.get("children") or {}).values():
            walk(child or {})
    walk(inv["all"])
    assert set(ports) == {"lab-h200", "lab-4090", "lab-a100", "lab-a10g", "lab-gw"}, ports
    assert len(set(ports.values())) == len(ports), ports
    # apart from the fleet lab's ports (2201..2299)
    assert all(not 2200 < p < 2300 for p in ports.values()), ports


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
    failed = bench.table([dict(rows[0], noop_failed="exit 2")]).splitlines()[2].split(" | ")
    assert failed[1:8] == lines[2].split(" | ")[1:8]
    assert failed[8:] == ["run failed (exit 2)", "-", "0.500", "-", "- |"]
    assert os.path.basename(bench.INVENTORY) == "hosts.yml"


def test_mitogen_table_compares_with_linear_and_gives_a_failed_run_no_ratios():
    # the 3-host figures of bench_fleet.py --mitogen, 2026-12-03 22:19 UTC: Mitogen's
    # no-op stopped at the first custom module (exit 2) after 4 s
    row = {"hosts": 3, "first": (130.1, 43.8), "noop": (51.6, 36.3), "noop_changed": 0,
           "setup": (1.74, 1.21), "noop-mitogen": (4.0, 2.6), "noop-mitogen_changed": 0,
           "setup-mitogen": (2.92, 2.11)}
    ok = bench.mitogen_table([row]).splitlines()
    assert len(ok) == 4
    assert ok[3].split(" | ")[7:] == ["0.87", "1.4x", "1.2x", "0.08x", "0.07x |"]
    failed = bench.mitogen_table([dict(row, **{"noop-mitogen_failed": "exit 2"})]).splitlines()
    assert failed[2] == ok[2]  # linear's row unchanged
    assert failed[3].split(" | ")[7:] == ["run failed (exit 2)", "-", "-", "-", "- |"]
    assert bench.mitogen_table([{k: v for k, v in row.items() if "mitogen" not in k}]).count("\n") == 1


def test_state_table_puts_the_noop_beside_the_full_run():
    row = {"hosts": 3, "first": (130.0, 44.0), "noop": (6.0, 3.0), "noop_changed": 0, "skipped": 3,
           "full": (51.6, 36.3), "full_changed": 0, "setup": (1.5, 1.2)}
    lines = bench.state_table([row]).splitlines()
    assert len(lines) == 3
    assert lines[2].split(" | ")[1:] == ["3 of 3", "6.0", "3.0", "51.6", "36.3", "1.00", "12.10", "0.400",
                                         "4.0x", "2.5x", "34.4x", "30.2x", "0.08x |"]
    failed = bench.state_table([dict(row, noop_failed="exit 2")]).splitlines()[2].split(" | ")
    assert failed[6:] == ["run failed", "-", "-", "-", "-", "-", "-", "- |"]
    assert bench.state_table([{k: v for k, v in row.items() if k != "full"}]).count("\n") == 1


def test_skipped_hosts_are_read_from_the_fleet_table():
    out = ("host     | GPUs | driver | status\n"
           "fleet-01 | 1x A10G | 580.65.06 | ready, no model to serve (unchanged: skipped)\n"
           "fleet-02 | 1x A10G | 580.65.06 | ready, no model to serve\n"
           "        fleet-04 | 1x A10G | 580.65.06 | ready, no model to serve (unchanged: skipped)\n"
           "\x1b[0;32mfleet-03 | 1x A10G | 580.65.06 | serving, answered (unchanged: skipped)\x1b[0m\n")
    assert bench.skipped_hosts(out) == ["fleet-01", "fleet-03", "fleet-04"]  # indented as debug prints it
