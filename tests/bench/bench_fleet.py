#!/usr/bin/env python3
"""Benchmark (not part of the test run): what a site.yml run costs per host as the fleet
grows, against Ansible's own fact gathering on the same hosts.

For each fleet size, on a fresh fleet lab (scripts/lab.sh fleet-up --hosts N: lab hosts
of lab/profiles.yml reached over SSH, driver, container runtime and the tiny model, no
model served: vllm_server_models is empty, so the serving play plans and starts nothing):

  first    site.yml on the fresh hosts (every host must end with failed=0, unreachable=0)
  no-op    site.yml again: nothing to do (changed=0 on every host, else it is reported);
           the state play finds every host as its first run left it and skips it
  full     the no-op once more with the state check off (-e gpufleet_state_check=false):
           every role runs on every host, as every no-op run did before the state check
  setup    `ansible all -m setup` on the same hosts (bare fact gathering)

each timed (wall) with the control node's CPU: user + system time of the ansible process
and of every process it waited for (os.wait4's rusage: its forks, the ssh clients; not
the ControlPersist masters ssh leaves in the background), in all and per host; and the
ratios no-op / setup. A second table puts the no-op run beside the full one: what the
state check saves, and how many hosts it skipped (the fleet table's "unchanged: skipped").

    env PYTHONPATH=plugins/module_utils:tests .venv/bin/python tests/bench/bench_fleet.py [--hosts 3,10,25] [--keep] [--no-full] [--mitogen]

--mitogen also runs the no-op and setup with Mitogen's strategy (mitogen_linear), on the
same hosts right after the plain ones, and prints its rows beside them: the alternative
issue #12 asks to measure. Mitogen is not a dependency of gpufleet; install it into the
venv first (`.venv/bin/pip install mitogen`).

Prints one table with every size side by side. Run it on an idle machine: the numbers are
this machine's CPU. Logs of every run are kept in .cache/fleet/bench/. Exit status 1 when
a run fails or the no-op run changed something. The fleet is removed at the end (--keep
keeps the last one).
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
from labrun import skipped_hosts  # noqa: E402  (the one reader of the fleet table's skipped rows)

FLEET = ROOT / ".cache" / "fleet"
INVENTORY = FLEET / "hosts.yml"
LOGS = FLEET / "bench"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RECAP_LINE = re.compile(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$")


def parse_recap(text):
    """{host: {ok, changed, unreachable, failed, skipped, rescued, ignored}} from the
    last PLAY RECAP of an ansible-playbook output (colour codes allowed)."""
    lines = _ANSI.sub("", text).splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("PLAY RECAP")]
    if not starts:
        raise ValueError("no PLAY RECAP in the output")
    recap = {}
    for line in lines[starts[-1] + 1:]:
        m = _RECAP_LINE.match(line.strip())
        if not m:
            if recap:
                break
            continue
        recap[m.group(1)] = {k: int(v) for k, v in (kv.split("=") for kv in m.group(2).split())}
    if not recap:
        raise ValueError("an empty PLAY RECAP")
    return recap


def check_recap(recap, hosts, expect_no_change=False):
    """Problems with a run's recap: a fleet host missing, failed or unreachable, or (no-op
    run) changed. localhost (the summary play) counts too."""
    problems = [f"{h}: not in the recap" for h in hosts if h not in recap]
    for host, c in sorted(recap.items()):
        if c.get("failed", 0) or c.get("unreachable", 0):
            problems.append(f"{host}: failed={c.get('failed', 0)} unreachable={c.get('unreachable', 0)}")
        if expect_no_change and c.get("changed", 0):
            problems.append(f"{host}: changed={c['changed']}")
    return problems


def parse_sizes(text):
    """'3,10,25' -> [3, 10, 25]."""
    sizes = [int(s) for s in text.split(",") if s.strip()]
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"--hosts wants sizes such as 3,10,25, got {text!r}")
    return sizes


def measured(cmd, log, env):
    """(wall seconds, control-node CPU seconds, exit status) of cmd, its output in log."""
    with open(log, "w") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, proc.returncode


def ratio(a, b):
    return a / b if b else float("nan")


def table(rows):
    """Markdown table, one row per fleet size (rows: dicts from main)."""
    head = ["hosts", "first: wall s", "first: CPU s", "no-op: wall s", "no-op: CPU s", "no-op changed",
            "setup: wall s", "setup: CPU s", "no-op / host: wall s", "no-op / host: CPU s",
            "setup / host: CPU s", "no-op / setup: wall", "no-op / setup: CPU"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        n = r["hosts"]
        cells = [str(n), f"{r['first'][0]:.1f}", f"{r['first'][1]:.1f}", f"{r['noop'][0]:.1f}",
                 f"{r['noop'][1]:.1f}", str(r["noop_changed"]), f"{r['setup'][0]:.2f}", f"{r['setup'][1]:.2f}"]
        if r.get("noop_failed"):  # as in mitogen_table: a run that stopped early is no figure
            cells += [f"run failed ({r['noop_failed']})", "-", f"{r['setup'][1] / n:.3f}", "-", "-"]
        else:
            cells += [f"{r['noop'][0] / n:.2f}", f"{r['noop'][1] / n:.2f}", f"{r['setup'][1] / n:.3f}",
                      f"{ratio(r['noop'][0], r['setup'][0]):.1f}x", f"{ratio(r['noop'][1], r['setup'][1]):.1f}x"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def state_table(rows):
    """Markdown table: the no-op run (the state check skips unchanged hosts) beside the
    same no-op with the state check off (every role on every host), each against setup."""
    head = ["hosts", "skipped", "no-op: wall s", "no-op: CPU s", "full: wall s", "full: CPU s",
            "no-op / host: CPU s", "full / host: CPU s", "setup / host: CPU s",
            "no-op / setup: wall", "no-op / setup: CPU", "full / setup: wall", "full / setup: CPU",
            "no-op / full: CPU"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "full" not in r:
            continue
        n, noop, full, setup = r["hosts"], r["noop"], r["full"], r["setup"]
        cells = [str(n), f"{r.get('skipped', 0)} of {n}", f"{noop[0]:.1f}", f"{noop[1]:.1f}",
                 f"{full[0]:.1f}", f"{full[1]:.1f}"]
        if r.get("noop_failed") or r.get("full_failed"):
            cells += ["run failed"] + ["-"] * 7
        else:
            cells += [f"{noop[1] / n:.2f}", f"{full[1] / n:.2f}", f"{setup[1] / n:.3f}",
                      f"{ratio(noop[0], setup[0]):.1f}x", f"{ratio(noop[1], setup[1]):.1f}x",
                      f"{ratio(full[0], setup[0]):.1f}x", f"{ratio(full[1], setup[1]):.1f}x",
                      f"{ratio(noop[1], full[1]):.2f}x"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def mitogen_table(rows):
    """Markdown table: the no-op run and setup with the default strategy (linear) and with
    Mitogen's, on the same hosts, and Mitogen's against linear (rows with --mitogen)."""
    head = ["hosts", "strategy", "no-op: wall s", "no-op: CPU s", "no-op changed", "setup: wall s",
            "setup: CPU s", "no-op / host: CPU s", "no-op / setup: wall", "no-op / setup: CPU",
            "no-op vs linear: wall", "no-op vs linear: CPU"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "noop-mitogen" not in r:
            continue
        n = r["hosts"]
        for name, key in (("linear", "noop"), ("mitogen_linear", "noop-mitogen")):
            noop, setup = r[key], r[key.replace("noop", "setup")]
            cells = [str(n), name, f"{noop[0]:.1f}", f"{noop[1]:.1f}", str(r[f"{key}_changed"]),
                     f"{setup[0]:.2f}", f"{setup[1]:.2f}"]
            if r.get(f"{key}_failed"):
                # a run that stopped early is fast: its figures are no ratio of anything
                cells += [f"run failed ({r[f'{key}_failed']})"] + ["-"] * 4
            else:
                cells += [f"{noop[1] / n:.2f}", f"{ratio(noop[0], setup[0]):.1f}x",
                          f"{ratio(noop[1], setup[1]):.1f}x", f"{ratio(noop[0], r['noop'][0]):.2f}x",
                          f"{ratio(noop[1], r['noop'][1]):.2f}x"]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def mitogen_env(env):
    """env with Mitogen's strategy plugin (ansible_mitogen, installed in this Python)."""
    try:
        import ansible_mitogen  # noqa: PLC0415 - optional, only for --mitogen
    except ImportError as exc:
        raise SystemExit("--mitogen needs Mitogen in this venv: .venv/bin/pip install mitogen") from exc
    plugins = pathlib.Path(ansible_mitogen.__file__).parent / "plugins" / "strategy"
    return dict(env, ANSIBLE_STRATEGY_PLUGINS=str(plugins), ANSIBLE_STRATEGY="mitogen_linear")


def lab(*args):
    subprocess.run(["bash", "scripts/lab.sh", *args], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL if args[0] == "fleet-down" else None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="3,10,25", help="fleet sizes, comma-separated")
    ap.add_argument("--keep", action="store_true", help="leave the last fleet up")
    ap.add_argument("--no-full", action="store_true",
                    help="leave out the no-op with the state check off (a quicker re-run)")
    ap.add_argument("--mitogen", action="store_true",
                    help="also time the no-op run and setup with Mitogen's mitogen_linear strategy")
    args = ap.parse_args(argv)
    try:
        sizes = parse_sizes(args.hosts)
    except ValueError as e:
        ap.error(str(e))

    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(FLEET / "facts"),
               PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}")
    playbook = ["ansible-playbook", "-i", str(INVENTORY), "site.yml"]
    setup = ["ansible", "all", "-i", str(INVENTORY), "-m", "ansible.builtin.setup"]
    full = playbook + ["-e", "gpufleet_state_check=false"]
    runs = [("first", playbook, False, env), ("noop", playbook, True, env),
            ("full", full, True, env), ("setup", setup, False, env)]
    if args.no_full:
        runs = [r for r in runs if r[0] != "full"]
    if args.mitogen:
        menv = mitogen_env(env)
        runs += [("noop-mitogen", playbook, True, menv), ("setup-mitogen", setup, False, menv)]
    started = datetime.datetime.now(datetime.timezone.utc)
    rows, failures = [], []
    try:
        for n in sizes:
            lab("fleet-down")
            t0 = time.perf_counter()
            lab("fleet-up", "--hosts", str(n))
            up = time.perf_counter() - t0
            LOGS.mkdir(parents=True, exist_ok=True)
            hosts = [f"fleet-{i:02d}" for i in range(1, n + 1)]
            row = {"hosts": n, "up": up}
            for key, cmd, no_change, run_env in runs:
                log = LOGS / f"{n:02d}-{key}.log"
                print(f"[bench] {n} hosts: {key} ...", flush=True)
                wall, cpu, rc = measured(cmd, log, run_env)
                row[key] = (wall, cpu)
                print(f"[bench] {n} hosts: {key}: {wall:.1f} s wall, {cpu:.1f} s CPU, exit {rc} ({log})", flush=True)
                if key.startswith("setup"):
                    if rc:
                        failures.append(f"{n} hosts, setup: exit {rc} ({log})")
                    continue
                recap = parse_recap(log.read_text())
                problems = check_recap(recap, hosts, expect_no_change=no_change)
                if key.startswith(("noop", "full")):
                    row[f"{key}_changed"] = sum(c.get("changed", 0) for c in recap.values())
                if key == "noop":
                    row["skipped"] = len(skipped_hosts(log.read_text()))
                if rc or problems:
                    failures.append(f"{n} hosts, {key}: exit {rc}; " + "; ".join(problems))
                    row[f"{key}_failed"] = f"exit {rc}"
            rows.append(row)
            print(f"[bench] {n} hosts: fleet-up {up:.0f} s", flush=True)
            # the table so far: a run stopped at a larger size keeps the smaller ones
            print(table(rows), flush=True)
            print(state_table(rows), flush=True)
    finally:
        if not args.keep:
            lab("fleet-down")

    print(f"\nbench_fleet.py --hosts {args.hosts}, {started:%Y-%m-%d %H:%M} UTC, "
          f"{os.cpu_count()} CPUs, forks from ansible.cfg\n")
    print(table(rows))
    print("\nThe no-op run (the state check skips unchanged hosts) beside the same run with "
          "the state check off (every role runs):\n")
    print(state_table(rows))
    if args.mitogen:
        print("\nThe same no-op run and setup with Mitogen's strategy:\n")
        print(mitogen_table(rows))
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
