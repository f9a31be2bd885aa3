#!/usr/bin/env python3
"""Benchmark (not part of the test run): one model to N hosts through a site mirror whose
uplink is capped at a fixed aggregate rate, peer-to-peer (gpufleet.p2p, the web-seed
policy) beside plain http (gpufleet.hub, what transport http runs), at each N.

Real software throughout, on this machine's loopback:
- the site mirror is nginx with the hf_site_mirror role's server config (sendfile, Range)
  serving a synthetic model folder verified as hf_model leaves it (bench_fetch.make_model);
  its egress is the body bytes of its own access log;
- the uplink cap is the kernel's: an `htb` qdisc on `lo` with one class (a token
  bucket, --rate-mib, shared by every connection) and a u32 filter that sends only the
  packets leaving the mirror's port into it; every other loopback packet is unclassified,
  and htb sends those directly, unshaped (`default 0`). Removed at the end (and on
  Ctrl-C);
- each host is its own process bound to its own 127.0.0.x address: p2p runs
  gpufleet.p2p.run_peer (tests/hfstub/p2ppeer.py, Debian's python3-libtorrent, the code
  hf_model runs for transport p2p), with the web-seed policy of model_fetch's defaults
  (the first host uses the web seed from the start; the others add it only after
  model_fetch_p2p_web_seed_fallback seconds without a peer's block) and every host
  seeding until all are done; http runs gpufleet.hub.sync_repo from the mirror (the same
  listing, each file hashed). Every host must end with every file verified (run_peer's
  hf_model rule before a file's final name, then the manifest; sync_repo's own).

With --fleet-lab the hosts are the fleet lab's containers instead (scripts/lab.sh fleet-up
--hosts N, at least the largest N; the first N of its inventory for each row), and each
row is the real role: `ansible-playbook` running gpufleet.fleet.model_fetch (hf_model,
transport p2p or http) over SSH on those N hosts, each fetching into its own filesystem
(model_fetch_root /srv/gpufleet-fanout in its container, the same path on every host, as
in a real fleet) as root. The
lab's hosts share this machine's network (playbooks/lab.yml: network_mode host), so each
p2p host listens on its own loopback address (model_fetch_p2p_address 127.0.0.(20 + i))
and the same htb class on `lo` caps the mirror. The torrent is made on a `mirror` host
(connection local) by hf_mirror_index, as hf_site_mirror does; nginx serves that site.
Each row prints two walls: the hosts' (the mirror's first request of the row, seen in its
access log, to the latest manifest.json a host wrote: every file verified) and the
playbook's (ansible-playbook's whole run: SSH, facts, the role's checks, the async
polling). Before the rows, python3-libtorrent and python3-requests are installed on the
hosts (what the role would do on its first p2p run), and after each p2p row the role's
p2p_stop entry point ends the seeders (not timed).

    sudo true && flock /tmp/gpufleet-lab.lock env PYTHONPATH=plugins/module_utils:tests:tests/bench \\
        .venv/bin/python tests/bench/bench_fanout.py [--hosts 1,3,10,25] [--mib 64] [--rate-mib 4]
    flock /tmp/gpufleet-lab.lock bash -c 'scripts/lab.sh fleet-up --hosts 25 --hosts-only &&
        env PYTHONPATH=plugins/module_utils:tests:tests/bench .venv/bin/python
        tests/bench/bench_fanout.py --fleet-lab; rc=$?; scripts/lab.sh fleet-down; exit $rc'

Needs root (tc), nginx and /usr/bin/python3 with python3-libtorrent (scripts/setup.sh).
Prints one table: N, mode, mirror egress bytes, egress / model size, wall seconds until
every host has the verified model, wall / the same mode's N=1; and whether the goals hold
(p2p: egress <= 1.5x the model at every N, wall at the largest N <= 1.5x N=1). Exit
status 1 when a host fails or a goal is missed.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]

from bench_fetch import COMMIT, REPO, make_model, publish  # noqa: E402  (one model maker)
from gpufleet import hub_mirror, p2p_swarm  # noqa: E402
from hfstub.nginxlab import Nginx, free_port  # noqa: E402
from hfstub.p2pplays import p2p_plays  # noqa: E402

PEER = ROOT / "tests/hfstub/p2ppeer.py"
SYS_PYTHON = "/usr/bin/python3"
MIRROR = "127.0.0.1"
FIRST_HOST = 20  # host i listens on 127.0.0.(20 + i)
TIMEOUT = 900  # seconds one run may take at most (a hang fails the bench)


class Uplink:
    """The mirror's aggregate uplink cap: tc htb on lo, one class for the packets whose
    source port is the mirror's (the rest go through unshaped)."""

    def __init__(self, port, rate):
        self.port, self.rate = port, int(rate)

    def _tc(self, *args, check=True):
        return subprocess.run(["tc", *args], capture_output=True, text=True, check=check)

    def __enter__(self):
        root = self._tc("qdisc", "show", "dev", "lo").stdout
        if "noqueue" not in root:
            raise SystemExit(f"lo already has a qdisc ({root.strip()}); not touching it.")
        self._tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "0")
        try:
            # bursts above lo's 64 KiB segments
            rate = f"{self.rate * 8}bit"
            self._tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:20", "htb",
                     "rate", rate, "ceil", rate, "burst", "256kb", "cburst", "256kb",
                     "quantum", "65536")
            self._tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio",
                     "1", "u32", "match", "ip", "sport", str(self.port), "0xffff",
                     "flowid", "1:20")
        except subprocess.CalledProcessError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        self._tc("qdisc", "del", "dev", "lo", "root", check=False)


def addr(i):
    return f"127.0.0.{FIRST_HOST + i}"


def run_p2p(work, n, torrent, model, web_seed, fallback):
    """n hosts at once; the wall time until the last has placed every file."""
    hosts = [f"host-{i + 1:02d}" for i in range(n)]
    ports = {h: free_port() for h in hosts}
    stop = work / "stop"
    listing = [{"path": f.path, "size": f.size, "algorithm": f.algorithm, "digest": f.digest}
               for f in model["files"]]
    allow = [MIRROR] + [addr(i) for i in range(n)]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "plugins/module_utils"))
    procs = {}
    t0 = time.monotonic()
    for i, h in enumerate(hosts):
        job = {"torrent": str(torrent), "dest": str(work / h), "listing": listing,
               "commit": model["commit"], "repo_id": REPO, "listen": addr(i),
               "port": ports[h], "allow": allow, "web_seed": web_seed,
               # the policy as model_fetch applies it (inventory order)
               "web_seed_delay": p2p_swarm.web_seed_delay(h, hosts, p2p_swarm.WEB_SEED_HOSTS, fallback),
               "peers": [f"{addr(j)}:{ports[o]}" for j, o in enumerate(hosts) if o != h],
               "stop_file": str(stop), "timeout": TIMEOUT}
        (work / f"{h}.job.json").write_text(json.dumps(job))
        log = (work / f"{h}.log").open("w")
        procs[h] = subprocess.Popen([SYS_PYTHON, str(PEER), "peer", str(work / f"{h}.job.json"),
                                     str(work / f"{h}.result.json")],
                                    stdout=log, stderr=subprocess.STDOUT, env=env)
    done = {}
    try:
        while len(done) < n and time.monotonic() - t0 < TIMEOUT:
            for h in hosts:
                if h not in done and '"event": "complete"' in (work / f"{h}.log").read_text():
                    done[h] = time.monotonic() - t0
                elif h not in done and procs[h].poll() is not None:
                    raise SystemExit(f"{h} ended before completing:\n"
                                     + (work / f"{h}.log").read_text()[-2000:])
            time.sleep(0.05)
        wall = max(done.values()) if len(done) == n else None
    finally:
        stop.touch()
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if wall is None:
        raise SystemExit(f"p2p N={n}: not every host completed within {TIMEOUT} s")
    results = {h: json.loads((work / f"{h}.result.json").read_text()) for h in hosts}
    for h, r in results.items():
        if not r["complete"] or r["files_rejected"] or r["banned_peers"]:
            raise SystemExit(f"p2p N={n}: {h} did not verify: {r['files_rejected']}")
        if not (work / h / ".gpufleet" / "manifest.json").exists():
            raise SystemExit(f"p2p N={n}: {h} has no manifest")
    seeded = {h: r["bytes_by_source"]["web_seed"] for h, r in results.items()
              if r["bytes_by_source"]["web_seed"]}
    return wall, seeded


def run_http(work, n, url):
    """n hosts at once, each gpufleet.hub.sync_repo from the mirror."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "plugins/module_utils"))
    code = ("import sys; from gpufleet import hub, hub_client; "
            "r = hub.sync_repo(hub_client.HubClient(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4],"
            " max_workers=4); assert r['commit'] == sys.argv[3]")
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", code, url, REPO, COMMIT,
                               str(work / f"host-{i + 1:02d}")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i in range(n)]
    for proc in procs:
        out, _ = proc.communicate(timeout=TIMEOUT)
        if proc.returncode:
            raise SystemExit(f"http N={n}: a host failed:\n{out.decode()[-2000:]}")
    return time.monotonic() - t0, {}


# --- --fleet-lab: the fleet lab's containers, the role through ansible-playbook ----------
FLEET_INVENTORY = ROOT / ".cache/fleet/hosts.yml"  # scripts/lab.sh fleet-up writes it
FLEET_GROUP_VARS = ROOT / "inventories/lab_fleet/group_vars"
LAB_KEY = ROOT / ".cache/lab/id_ed25519"
# model_fetch_root for the bench: one path in every host's own filesystem (the lab's
# default, /var/lib/gpufleet-lab/<host>/models, differs per host, and model_fetch runs
# hosts whose model items differ one after the other: docs/model-fetch.md)
FLEET_MODEL_ROOT = "/srv/gpufleet-fanout"
FLEET_PLAYS = p2p_plays(become=True)


class FirstRequest:
    """When the mirror answered its first request after start(): its access log grows
    (nginx writes a line when a request ends; the first of a row is a listing, a few KB)."""

    def __init__(self, log):
        self.log, self.at, self._stop = pathlib.Path(log), None, threading.Event()

    def _size(self):
        return self.log.stat().st_size if self.log.exists() else 0

    def __enter__(self):
        size = self._size()

        def watch():
            while not self._stop.is_set() and self.at is None:
                if self._size() > size:
                    self.at = time.time()
                time.sleep(0.02)
        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class FleetLab:
    """The fleet lab's first hosts as the bench's inventory: the lab's own group_vars (SSH,
    become, model_fetch_root), a loopback address of its own per host for the swarm, a
    group fan_N per fleet size, and the `mirror` host (local) where the torrent is made."""

    def __init__(self, work, sizes):
        if not FLEET_INVENTORY.exists():
            raise SystemExit("no fleet lab: scripts/lab.sh fleet-up --hosts N first")
        lab = yaml.safe_load(FLEET_INVENTORY.read_text())
        hosts = lab["all"]["children"]["fleet_hosts"]["children"]["gpu_hosts"]["hosts"]
        self.hosts = list(hosts)
        if len(self.hosts) < max(sizes):
            raise SystemExit(f"the fleet lab has {len(self.hosts)} hosts, the bench needs "
                             f"{max(sizes)}: scripts/lab.sh fleet-up --hosts {max(sizes)}")
        self.work = work
        inv_dir = work / "inventory"
        inv_dir.mkdir()
        (inv_dir / "group_vars").symlink_to(FLEET_GROUP_VARS)
        gpu = {h: {**hosts[h], "model_fetch_p2p_address": addr(i),
                   "ansible_ssh_private_key_file": str(LAB_KEY)}
               for i, h in enumerate(self.hosts[:max(sizes)])}
        self.inventory = inv_dir / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {
            "hosts": {"mirror": {"ansible_connection": "local",
                                 "ansible_python_interpreter": SYS_PYTHON}},
            "children": {
                "fleet_hosts": {"children": {"gpu_hosts": {"hosts": gpu}}},
                **{f"fan_{n}": {"hosts": {h: {} for h in self.hosts[:n]}} for n in sizes}}}},
            sort_keys=False))
        for name, text in FLEET_PLAYS.items():
            (work / name).write_text(text)
        self.env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
                        ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_FORCE_COLOR="0",
                        PATH=f"{ROOT / '.venv/bin'}:{os.environ['PATH']}")

    def ansible(self, args, log, extra=None, json_out=False):
        env = dict(self.env, ANSIBLE_STDOUT_CALLBACK="json") if json_out else self.env
        cmd = [*args, "-i", str(self.inventory)] + (["-e", json.dumps(extra)] if extra else [])
        t0 = time.monotonic()
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=TIMEOUT)
        seconds = time.monotonic() - t0
        (self.work / log).write_text(out.stdout + out.stderr)
        if out.returncode:
            raise SystemExit(f"{' '.join(args[:2])} failed (rc {out.returncode}), "
                             f"{self.work / log}:\n{(out.stdout + out.stderr)[-3000:]}")
        return seconds, out.stdout

    def prepare(self, n, site, folder, torrents):
        """The torrent on the mirror host; the engine's packages on the first n hosts."""
        self.ansible(["ansible-playbook", str(self.work / "mirror.yml")], "mirror.log",
                     {"site": str(site), "folder": str(folder), "torrents": str(torrents)})
        seconds, _ = self.ansible(
            ["ansible", f"fan_{n}", "-b", "-m", "ansible.builtin.apt", "-a",
             "name=python3-libtorrent,python3-requests update_cache=true cache_valid_time=3600"],
            "packages.log")
        return seconds

    def _root(self, host):
        """The host's own filesystem, seen from this machine: /proc/<its PID 1>/root."""
        pid = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", f"gpufleet-{host}"],
                             capture_output=True, text=True, check=True).stdout.strip()
        return pathlib.Path(f"/proc/{pid}/root")

    def dest(self, host):
        """The host's model folder (dest, a link to its commit folder), resolved in the
        host's own filesystem (an absolute link names a path of the host, not of this
        machine)."""
        root = self._root(host)
        link = root / FLEET_MODEL_ROOT.lstrip("/") / REPO
        if not link.is_symlink():
            return link
        target = os.readlink(link)
        return (root / target.lstrip("/")) if target.startswith("/") else link.parent / target

    def clear(self, hosts):
        for h in hosts:
            shutil.rmtree(self._root(h) / FLEET_MODEL_ROOT.lstrip("/"), ignore_errors=True)

    def run(self, n, mode, url, access, torrents, fallback, model):
        """One row: model_fetch on the first n hosts; (hosts' wall, playbook's wall, web
        seed bytes by host)."""
        hosts = self.hosts[:n]
        self.clear(self.hosts)
        extra = {"fetchers": f"fan_{n}", "model_fetch_transport": mode,
                 "model_fetch_models": [{"repo_id": REPO, "transport": mode}],
                 "model_fetch_endpoint": url, "model_fetch_p2p_group": f"fan_{n}",
                 "model_fetch_root": FLEET_MODEL_ROOT,
                 "model_fetch_p2p_mirror_host": "mirror",
                 "model_fetch_p2p_torrent_dir": str(torrents),
                 "model_fetch_p2p_port": free_port(),
                 "model_fetch_p2p_web_seed_fallback": fallback}
        with FirstRequest(access) as first:
            playbook, out = self.ansible(["ansible-playbook", str(self.work / "fetch.yml")],
                                         f"fetch-{mode}-{n}.log", extra, json_out=True)
        seeded = {}
        if mode == "p2p":
            report, _ = json.JSONDecoder().raw_decode(out[out.index("{"):])
            for play in report["plays"]:
                for task in play["tasks"]:
                    for h, res in task["hosts"].items():
                        got = (res.get("p2p") or {}).get("bytes_from_web_seed")
                        if isinstance(got, int) and got:
                            seeded[h] = got
            self.ansible(["ansible-playbook", str(self.work / "stop.yml")],
                         f"stop-{n}.log", extra)
        ends = []
        for h in hosts:  # every host's folder: hf_model's rule on every file, again
            folder = self.dest(h)
            manifest = folder / ".gpufleet" / "manifest.json"
            if not manifest.exists():
                raise SystemExit(f"{mode} N={n}: {h} has no manifest")
            ends.append(manifest.stat().st_mtime)
            again = hub_mirror.read_model_folder(str(folder), REPO)
            if again["commit"] != model["commit"]:
                raise SystemExit(f"{mode} N={n}: {h}'s folder does not verify")
        if first.at is None:
            raise SystemExit(f"{mode} N={n}: the mirror saw no request")
        return max(ends) - first.at, playbook, seeded


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="1,3,10,25", help="fleet sizes, comma-separated")
    ap.add_argument("--mib", type=float, default=64, help="model size in MiB")
    ap.add_argument("--files", type=int, default=2, help="number of large files")
    ap.add_argument("--rate-mib", type=float, default=4, help="mirror uplink, MiB/s in all")
    ap.add_argument("--fallback", type=float, default=p2p_swarm.WEB_SEED_FALLBACK,
                    help="model_fetch_p2p_web_seed_fallback (seconds)")
    ap.add_argument("--modes", default="p2p,http")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--fleet-lab", action="store_true",
                    help="hosts: the fleet lab's containers, through the model_fetch role")
    args = ap.parse_args()
    sizes = [int(x) for x in args.hosts.split(",")]
    modes = args.modes.split(",")

    work = pathlib.Path(tempfile.mkdtemp(prefix="gpufleet-fanout-"))
    rows = []
    try:
        folder = work / "source"
        make_model(folder, args.mib / 1024, args.files)
        model = hub_mirror.read_model_folder(str(folder), REPO)
        total = sum(f.size for f in model["files"])
        torrent = work / "model.torrent"
        subprocess.run([SYS_PYTHON, str(PEER), "make", str(folder), str(torrent)], check=True,
                       capture_output=True, env=dict(os.environ,
                                                     PYTHONPATH=str(ROOT / "plugins/module_utils")))
        port = free_port()
        url = f"http://{MIRROR}:{port}"
        conf = publish(work, folder, port)
        access = work / "access.log"
        rate = int(args.rate_mib * (1 << 20))
        lab = FleetLab(work, sizes) if args.fleet_lab else None
        if lab:
            seconds = lab.prepare(max(sizes), work / "site", folder, work / "torrents")
            print(f"fleet lab: {', '.join(lab.hosts[:max(sizes)])}; python3-libtorrent and "
                  f"python3-requests on them in {seconds:.0f} s (not timed below)", flush=True)
        print(f"model {total} bytes ({len(model['files'])} files), mirror uplink {rate} B/s "
              f"(tc htb class on lo, sport {port}), sizes {sizes}, modes {modes}", flush=True)
        with Nginx(work / "nginx", conf, access_log=access) as nginx, Uplink(port, rate):
            nginx.wait(f"{url}/")
            for n in sizes:
                for mode in modes:
                    run_dir = work / f"{mode}-{n}"
                    run_dir.mkdir()
                    before = nginx.egress()
                    playbook = None
                    if lab:
                        wall, playbook, seeded = lab.run(n, mode, url, access, work / "torrents",
                                                         args.fallback, model)
                    elif mode == "p2p":
                        wall, seeded = run_p2p(run_dir, n, torrent, model,
                                               p2p_swarm.web_seed_url(url, REPO), args.fallback)
                    else:
                        wall, seeded = run_http(run_dir, n, url)
                    time.sleep(0.5)  # nginx logs a request when it ends
                    egress = nginx.egress() - before
                    rows.append({"n": n, "mode": mode, "egress": egress, "wall": wall,
                                 "playbook": playbook, "seeded": seeded})
                    print(f"  N={n:3d} {mode:4s} egress {egress:>12d} B "
                          f"({egress / total:5.2f}x)  wall {wall:7.1f} s  "
                          + (f"playbook {playbook:7.1f} s  " if lab else "") + "web seed used by "
                          + (", ".join(f"{h} ({b} B)" for h, b in seeded.items())
                             or ("-" if mode == "p2p" else "every host (http)")), flush=True)
                    if not args.keep:
                        shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        if lab and not args.keep:
            try:
                lab.clear(lab.hosts)
            except subprocess.CalledProcessError:
                pass  # the hosts are gone already
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    base = {r["mode"]: r["wall"] for r in rows if r["n"] == min(sizes)}
    print(f"\nmodel {total} bytes; mirror uplink {rate} B/s ({args.rate_mib:g} MiB/s) in all; "
          f"web-seed policy: {p2p_swarm.WEB_SEED_HOSTS} host from the start, the others after "
          f"{args.fallback:g} s without a peer's block\n")
    lab_cols = args.fleet_lab  # the playbook's own wall beside the hosts'
    print(f"| N | mode | mirror egress (bytes) | egress / model | wall s | wall / N={min(sizes)} |"
          + (f" playbook s | playbook / N={min(sizes)} |" if lab_cols else ""))
    print("|---|---|---|---|---|---|" + ("---|---|" if lab_cols else ""))
    pbase = {r["mode"]: r["playbook"] for r in rows if r["n"] == min(sizes)}
    for r in rows:
        print(f"| {r['n']} | {r['mode']} | {r['egress']} | {r['egress'] / total:.2f}x | "
              f"{r['wall']:.1f} | {r['wall'] / base[r['mode']]:.2f}x |"
              + (f" {r['playbook']:.1f} | {r['playbook'] / pbase[r['mode']]:.2f}x |"
                 if lab_cols else ""))
    p2p_rows = [r for r in rows if r["mode"] == "p2p"]
    ok = all(r["egress"] <= 1.5 * total for r in p2p_rows)
    if p2p_rows:
        last = max(p2p_rows, key=lambda r: r["n"])
        ok = ok and last["wall"] <= 1.5 * base["p2p"]
    print("\ngoals met (p2p: egress <= 1.5x model at every N, wall at the largest N <= 1.5x "
          "N=1)" if ok else "\nGOALS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
