#!/usr/bin/env bash
# The built-in lab: a small simulated GPU fleet on this machine (see README, "The lab").
#
#   scripts/lab.sh run      set everything up, bring the lab up, run site.yml on it
#   scripts/lab.sh up       set up and start the lab hosts and the loopback services
#   scripts/lab.sh down     remove the lab hosts and stop the loopback services
#   scripts/lab.sh images   build (or reuse, by content hash) the lab's images and models
#
# Extra arguments after `run` go to ansible-playbook (e.g. `--check`, `-v`).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. "$ROOT/scripts/lib.sh"
export PATH="$ROOT/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
INVENTORY="$ROOT/inventories/lab/hosts.yml"

# Each lab part has its own build/serve script; run those that exist.
run_if() { [[ -x "$1" || -f "$1" ]] && bash "$@" || true; }

images() {
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
  ansible-playbook -i "$INVENTORY" playbooks/lab.yml
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
  *) die "usage: scripts/lab.sh run|up|down|images" ;;
esac
