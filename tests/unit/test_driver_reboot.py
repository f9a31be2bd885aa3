"""When nvidia_driver's reboot counts as done (roles/nvidia_driver/tasks/verify.yml).

ansible.builtin.reboot says "rebooted" once its boot-time check's output changed and its
test_command succeeded. At CI stops 40, 41 and 43 it said so while the old boot of a lab
host was still stopping (the next task found the SSH port closed): the checks ran over the
kept ControlPersist master into the old boot, and the test command then accepted a host
whose systemd was gone ("offline"). These tests run the role's real test command against a
stand-in `systemctl` (a script on PATH printing the state asked for) and read the real task.
"""
import os
import stat
import subprocess

import pytest
import yaml

from conftest import ROOT

DEFAULTS = yaml.safe_load((ROOT / "roles/nvidia_driver/defaults/main.yml").read_text())
# what the role's test command was until this file (the control below)
OLD_TEST = '[ "$(systemctl is-system-running 2>/dev/null)" != stopping ]'


def passes(command, state, rc, tmp_path):
    """Run `command` under sh with a stand-in systemctl that prints `state` and exits `rc`."""
    stub = tmp_path / "systemctl"
    stub.write_text(f"#!/bin/sh\nprintf '%s\\n' '{state}'\nexit {rc}\n")
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    return subprocess.run(["sh", "-c", command], env=env, timeout=30).returncode == 0


# systemctl is-system-running: its output and exit code in each state (systemctl(1))
STATES = {"running": 0, "degraded": 1, "starting": 1, "initializing": 1, "maintenance": 1,
          "stopping": 1, "offline": 1, "unknown": 1}


@pytest.mark.parametrize("state", sorted(STATES))
def test_the_reboot_counts_only_once_systemd_finished_booting(state, tmp_path):
    ok = passes(DEFAULTS["nvidia_driver_reboot_test_command"], state, STATES[state], tmp_path)
    assert ok == (state in ("running", "degraded")), state


def test_control_the_old_test_command_took_a_stopped_systemd_for_a_booted_host(tmp_path):
    """Once systemd-shutdown has replaced systemd, systemctl answers "offline": the old
    command passed there, so a boot-time output changed by text on the terminal was a
    reboot (the test above fails with it)."""
    assert passes(OLD_TEST, "offline", 1, tmp_path)
    assert not passes(OLD_TEST, "stopping", 1, tmp_path)


def test_each_boot_time_check_opens_a_new_connection():
    """With connect_timeout set, ansible.builtin.reboot resets its connection before every
    boot-time check: a kept ControlPersist master reaches the old boot while it stops, a
    new connection only a listening sshd."""
    tasks = yaml.safe_load((ROOT / "roles/nvidia_driver/tasks/verify.yml").read_text())
    reboot = [t for t in tasks if "ansible.builtin.reboot" in t]
    assert len(reboot) == 1, reboot
    args = reboot[0]["ansible.builtin.reboot"]
    assert int(args["connect_timeout"]) > 0
    assert args["test_command"] == "{{ nvidia_driver_reboot_test_command }}"
