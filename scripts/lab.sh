#!/usr/bin/env bash
# The built-in lab: a small simulated GPU fleet on this machine (see README, "The lab").
#
#   scripts/lab.sh run      set everything up, bring the lab up, run site.yml on it
#   scripts/lab.sh up       set up and start the lab hosts and the loopback services
#   scripts/lab.sh down     remove the lab hosts and stop the loopback services
#   scripts/lab.sh images   build (or reuse, by content hash) the lab's images and models
#                           (the hosts' image, the stand-in repositories, the models, vLLM)
#
# Both labs' hosts are reached over SSH (a key made for the lab, sudo), as real fleets are.
# The fleet lab, apart from the lab above (its own containers, gpufleet-fleet-NN, its own
# inventory, .cache/fleet/hosts.yml, written by lab/fleet.py):
#   scripts/lab.sh fleet-up --hosts N   N lightweight hosts of the lab's profiles (driver,
#                                       container runtime, the tiny model; nothing served)
#       [--hosts-only]                  only the hosts: no lab models, vLLM image or mirrors
#                                       (for a bench that brings its own mirror, e.g.
#                                       tests/bench/bench_fanout.py --fleet-lab)
#   scripts/lab.sh fleet-run [ARGS]     site.yml on them (ARGS go to ansible-playbook)
#   scripts/lab.sh fleet-down           remove them
#
# Extra arguments after `run` go to ansible-playbook (e.g. `--check`, `-v`).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. "$ROOT/scripts/lib.sh"
export PATH="$ROOT/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
# The Python helpers it runs (lab/fleet.py, tests/hfstub/lab_mirrors.py, ...) import the
# plain logic as gpufleet.<name> and the tests' helpers by name: no sys.path edits in them.
export PYTHONPATH="$ROOT/plugins/module_utils:$ROOT/tests"
INVENTORY="$ROOT/inventories/lab/hosts.yml"

# Each lab part has its own build/serve script; run those that exist.
run_if() { [[ -x "$1" || -f "$1" ]] && bash "$@" || true; }

images() {
  build_lab_host_image
  run_if lab/apt/build.sh
  run_if lab/models/build.sh
  run_if lab/vllm/build.sh
}

# Loopback services the lab hosts use, as a real fleet uses its company's servers:
#   127.0.0.1:8081  stand-in NVIDIA apt repositories (lab/apt)
#   127.0.0.1:8091  olah, a real HF mirror, offline over git-lfs repos of the lab models
#   127.0.0.1:8090  the site mirror (nginx) that hf_model filled from olah
services_up() {
  bash lab/apt/serve.sh start
  python3 tests/hfstub/lab_mirrors.py up
}

services_down() {
  python3 tests/hfstub/lab_mirrors.py down
  bash lab/apt/serve.sh stop
}

up() {
  bash scripts/setup.sh
  images
  services_up
  ansible-playbook -i "$INVENTORY" playbooks/lab.yml -e lab_image="$LAB_HOST_IMAGE"
}

# site.yml on the lab. Hosts that preflight refuses on purpose (lab_expected_refusal in
# the inventory) fail; any other failed or unreachable host fails this command.
run_site() {
  local log rc=0
  log=$(mktemp)
  ansible-playbook -i "$INVENTORY" site.yml "$@" 2>&1 | tee "$log" || rc=$?
  if ((rc != 0)); then
    if python3 - "$log" "$INVENTORY" <<'PY'; then rc=0; else rc=1; fi
import re, sys, yaml
log, inv = sys.argv[1], sys.argv[2]
hosts = yaml.safe_load(open(inv))["all"]["children"]["gpu_hosts"]["hosts"]
expected = {h for h, v in hosts.items() if (v or {}).get("lab_expected_refusal")}
bad = set()
for line in open(log):
    m = re.match(r"^(\S+)\s+:\s+ok=\d+.*unreachable=(\d+)\s+failed=(\d+)", re.sub(r"\x1b\[[0-9;]*m", "", line))
    if m and (int(m.group(2)) or int(m.group(3))):
        bad.add(m.group(1))
if not bad or bad - expected:
    print(f"[gpufleet] lab run FAILED on: {', '.join(sorted(bad - expected)) or 'the playbook itself'}")
    sys.exit(1)
print(f"[gpufleet] lab run OK; refused as expected by preflight: {', '.join(sorted(bad))}")
PY
  fi
  rm -f "$log"
  return "$rc"
}

# --- The fleet lab -----------------------------------------------------------------------
FLEET_DIR="$ROOT/.cache/fleet"
FLEET_INVENTORY="$FLEET_DIR/hosts.yml"
FLEET_PREFIX=gpufleet-
# Its own fact cache: the main lab's (.cache/facts) never answers for a fleet host.
fleet_env() { export ANSIBLE_CACHE_PLUGIN_CONNECTION="$FLEET_DIR/facts"; }

fleet_containers() { docker ps -aq --filter "name=^${FLEET_PREFIX}fleet-[0-9]+\$"; }

fleet_down() {
  local ids
  ids=$(fleet_containers)
  [[ -z "$ids" ]] || docker rm -f $ids >/dev/null
  # each host's folder on this machine (playbooks/lab.yml; the models are fetched there)
  rm -rf /var/lib/gpufleet-lab/fleet-[0-9][0-9] "$FLEET_DIR/facts"
  # the mirrors are the main lab's too: stopped only when no lab host uses them
  [[ -n "$(docker ps -q --filter name=gpufleet-lab- 2>/dev/null)" ]] || services_down
}

fleet_up() {
  local n="" hosts_only=""
  while (($#)); do
    case "$1" in
      --hosts) n=${2:-}; shift 2 || die "--hosts needs a number" ;;
      --hosts=*) n=${1#--hosts=}; shift ;;
      --hosts-only) hosts_only=1; shift ;;
      *) die "fleet-up: unknown argument $1 (usage: scripts/lab.sh fleet-up --hosts N [--hosts-only])" ;;
    esac
  done
  [[ "$n" =~ ^[0-9]+$ ]] || die "usage: scripts/lab.sh fleet-up --hosts N [--hosts-only]"
  bash scripts/setup.sh
  if [[ -n "$hosts_only" ]]; then
    build_lab_host_image
  else
    images
    services_up
  fi
  python3 lab/fleet.py --hosts "$n" --dir "$FLEET_DIR" >/dev/null
  # hosts of an earlier, larger fleet
  local keep c
  keep=$(python3 -c 'import sys, yaml; print(" ".join(yaml.safe_load(open(sys.argv[1]))["all"]["children"]["fleet_hosts"]["children"]["gpu_hosts"]["hosts"]))' "$FLEET_INVENTORY")
  for c in $(docker ps -a --format '{{.Names}}' --filter "name=^${FLEET_PREFIX}fleet-[0-9]+\$"); do
    [[ " $keep " == *" ${c#"$FLEET_PREFIX"} "* ]] || { docker rm -f "$c" >/dev/null; rm -rf "/var/lib/gpufleet-lab/${c#"$FLEET_PREFIX"}"; }
  done
  ansible-playbook -i "$FLEET_INVENTORY" playbooks/lab.yml -e lab_container_prefix="$FLEET_PREFIX" -e lab_image="$LAB_HOST_IMAGE"
  # every host answers over SSH (sshd starts with the host's systemd)
  ansible all -i "$FLEET_INVENTORY" -m ansible.builtin.wait_for_connection -a timeout=120 >/dev/null
  log "fleet lab: $n hosts up, inventory $FLEET_INVENTORY (scripts/lab.sh fleet-run, fleet-down)"
}

case "${1:-}" in
  images) bash scripts/setup.sh; images ;;
  up) up ;;
  run) shift; up; run_site "$@" ;;
  down)
    # The vLLM containers the lab hosts started on this machine's engine (their names
    # start with vllm_server_container_prefix, "vllm-<host>-" in the lab), then the hosts.
    ids=$(docker ps -aq --filter 'name=^vllm-lab-') && [[ -z "$ids" ]] || docker rm -f $ids >/dev/null
    ansible-playbook -i "$INVENTORY" playbooks/lab.yml -e lab_state=absent
    services_down
    ;;
  fleet-up) shift; fleet_env; fleet_up "$@" ;;
  fleet-run)
    shift; fleet_env
    [[ -f "$FLEET_INVENTORY" ]] || die "no fleet lab: scripts/lab.sh fleet-up --hosts N first"
    ansible-playbook -i "$FLEET_INVENTORY" site.yml "$@"
    ;;
  fleet-down) fleet_down ;;
  *) die "usage: scripts/lab.sh run|up|down|images|fleet-up --hosts N [--hosts-only]|fleet-run|fleet-down" ;;
esac
