#!/usr/bin/env bash
# Run every gpufleet test on this machine (Debian 12 / Ubuntu, as root).
# Installs and starts what the tests need first (scripts/setup.sh: apt packages, the
# Docker engine, .venv, the offline base image), then runs, failing loudly on the first
# failing stage:
#   1. yamllint and ansible-lint (production profile)
#   2. pytest unit tests (pure logic and module main()s; fast)
#   3. Molecule: every scenario under molecule/, real containers, docker driver
#   4. pytest slow tests (docker, loopback mirrors, real vLLM on the CPU)
#
#   scripts/test.sh          everything
#   scripts/test.sh --fast   stages 1 and 2 only (no docker needed after setup)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
. "$ROOT/scripts/lib.sh"

fast=0
[[ "${1:-}" == "--fast" ]] && fast=1

if ((fast)); then bash scripts/setup.sh venv; else bash scripts/setup.sh; fi
export PATH="$ROOT/.venv/bin:$PATH"
export ANSIBLE_CONFIG="$ROOT/ansible.cfg"
# tests/hfstub/lab_mirrors.py and the other helpers import gpufleet.<name> (docs/collection.md)
export PYTHONPATH="$ROOT/plugins/module_utils:$ROOT/tests"

# Each stage says when it starts and how long the run has taken so far (minutes and
# seconds since the start of this script), so a slow stage shows in any CI log.
stage() { log "== $* (at $(date -u +%H:%M:%S), $((SECONDS / 60)) min $((SECONDS % 60)) s in)"; }

# The loopback services the stages start (the apt stand-in from Molecule's prepare, the
# lab's HF mirrors from the slow tests) stop with the run, so a later run from another
# checkout finds their fixed ports free; left alone while lab hosts are up and use them.
stop_services() {
  if [[ -z "$(docker ps -q --filter name=gpufleet-lab- 2>/dev/null)" ]]; then
    bash lab/apt/serve.sh stop || true
    python3 tests/hfstub/lab_mirrors.py down || true
  fi
}

# The lab's images and models (minutes on a fresh machine: the vLLM CPU image) build in
# the background while the lint and unit stages run, which need neither; their log is
# shown when the build is waited for (stage "lab images and models").
images_pid=""
images_log="$ROOT/.cache/test-logs/lab-images.log"
molecule_pid=""
on_exit() {
  # A signal to this script leaves its foreground stage (a pytest) running, and the lab
  # would go down under it (its tests then fail after the fact): stop this script's
  # children first (read from /proc: no procps needed).
  local children
  children=$(cat /proc/$$/task/*/children 2>/dev/null || true)
  if [[ -n "${children// /}" ]]; then kill $children 2>/dev/null || true; fi
  if [[ -n "$images_pid" ]]; then kill -- "-$images_pid" 2>/dev/null || true; fi
  if [[ -n "$molecule_pid" ]]; then kill -- "-$molecule_pid" 2>/dev/null || true; fi
  # a lab the Molecule lane brought up that no lab test took down (a stage failed first)
  if [[ -n "$(docker ps -q --filter name=gpufleet-lab- 2>/dev/null)" && -z "${GPUFLEET_KEEP_LAB:-}" ]]; then
    bash scripts/lab.sh down > /dev/null 2>&1 || true
  fi
  stop_services
}
# The stand-in apt repository is built first, in the foreground: unit tests read it.
if ! ((fast)); then
  bash lab/apt/build.sh
  trap on_exit EXIT
  mkdir -p "$(dirname "$images_log")"
  # its own process group (setsid), so a failing stage stops the whole build with it
  setsid bash scripts/lab.sh images > "$images_log" 2>&1 &
  images_pid=$!
fi

stage "yamllint"
yamllint --strict .
# ansible-lint (about one core for a minute) runs beside the unit tests (about one core
# for two and a half minutes); its output is shown, and its verdict counted, when both end.
stage "ansible-lint (production profile) and the collection check with ansible-test sanity, beside the unit tests"
lint_log="$ROOT/.cache/test-logs/ansible-lint.log"
mkdir -p "$(dirname "$lint_log")"
ansible-lint --offline --profile production -q > "$lint_log" 2>&1 &
lint_pid=$!
# The collection as a user gets it (docs/collection.md): build, install outside the
# checkout, a user's playbook in check mode, ansible-doc of every module (about 7 s of one
# core), then ansible-test sanity in the installed copy (about 38 s of one core, measured
# 2026-12-07; its virtual environments were made by scripts/setup.sh, beside the base
# image). Both cores are not busy all through the unit tests (155 s of CPU in 158 s with
# four workers) and ansible-lint's minute: it runs here, not on a lane after them.
coll_log="$ROOT/.cache/test-logs/collection.log"
bash scripts/collection-check.sh > "$coll_log" 2>&1 &
coll_pid=$!
stage "pytest: unit tests (four workers)"
# Four pytest-xdist workers on the two cores: many unit tests wait (role runs, a real
# HAProxy's checks, deadlines against dripping peers), and two workers left the cores
# idle for a quarter of the stage (2,595 tests: 208 s with two workers, 155 s of CPU;
# 158 s with four, 2026-12-07, beside other work). ansible-lint holds one core for about a
# minute beside them.
unit_rc=0
pytest -q -n 4 -m "not slow" tests || unit_rc=$?
lint_rc=0; wait "$lint_pid" || lint_rc=$?
coll_rc=0; wait "$coll_pid" || coll_rc=$?
stage "ansible-lint's output (exit $lint_rc)"
cat "$lint_log"
stage "the collection, built, installed and used outside the checkout, and its sanity tests (exit $coll_rc)"
cat "$coll_log"
((lint_rc == 0)) || die "ansible-lint failed (exit $lint_rc); its output is above"
((coll_rc == 0)) || die "scripts/collection-check.sh failed (exit $coll_rc); its output is above"
((unit_rc == 0)) || die "unit tests failed (exit $unit_rc); their output is above ansible-lint's"
((fast)) && exit 0

# From here on a skip is a failure: a slow test that skips (no Docker, image or models)
# fails with its reason (tests/conftest.py), and so does a Molecule scenario whose steps
# were skipped (molecule_test, scripts/lib.sh).
export GPUFLEET_NO_SKIP=1

stage "lab images and models (cached by content hash; built beside the stages above)"
rc=0; wait "$images_pid" || rc=$?
images_pid=""
cat "$images_log"
((rc == 0)) || die "scripts/lab.sh images failed (exit $rc); its output is above"

# Molecule and the slow tests that need no lab run side by side: a Molecule scenario keeps
# about one of this 2-core machine's cores busy (measured: `molecule test -s nvidia_driver`,
# 151 s wall, the machine 1.02 cores busy on average), and no test of either uses what
# the other does (own container names, free or own ports; the apt stand-in is read
# through file:// by Molecule). Molecule's output goes to a log, shown when it ends.
# The lab tests then run alone: their probe and soak gates measure latency.
# To even the two lanes, Molecule's lane then runs the slow test files below (Ansible
# against a systemd container, as a scenario is): at CI stop 18 the slow tests without
# the lab took about 1,440 s and the Molecule scenarios about 950 s, the driver
# lifecycle file about 260 s of the 1,440.
# The fetch wait's 500-poll playbook tests (about 4 minutes of one core) go there too, so the
# rollout orchestration tests (tests/unit/test_upgrade_orchestration.py, about 4 minutes)
# and they add to both lanes alike.
# Both lanes keep both cores busy: moving a file between them moves its CPU time with it
# (at CI stop 39 moving the container toolkit's lifecycle file here made the run 1 min 43 s
# longer, 3,484 s against 3,381 s); only less work shortens them.
AFTER_MOLECULE=(tests/slow/test_hoststack_driver_lifecycle.py tests/unit/test_fetch_wait.py)
stage "molecule: every scenario, then ${AFTER_MOLECULE[*]} (beside the slow tests without the lab)"
# vllm_server's scenario is run by tests/slow/test_vllm_server_molecule.py (with a random
# API key it then looks for in the whole output), so it is not run twice.
# Some scenarios run in the other lane, before its slow tests, to even the two: at CI stop
# 23 the Molecule lane took about 16 min and the other about 13 (preflight, about 70 s,
# already beside); fleet_upgrade (about 5 min) and fleet_benchmark (about 4 1/2) came
# after: fleet_upgrade and vllm_gateway (about 1 min) go beside, fleet_benchmark stays.
# preflight (49 s) went back to Molecule's lane after the clean-clone run of 2026-12-07,
# where this lane ended 158 s after the other (whose end, the lab up, is the lab stage's
# start): 34 min 52 s against 32 min 14 s.
BESIDE_SCENARIOS=(vllm_gateway fleet_upgrade)
scenarios=$(find molecule -mindepth 2 -maxdepth 2 -name molecule.yml -printf '%h\n' | xargs -r -n1 basename | sort \
            | grep -vx -e vllm_server "${BESIDE_SCENARIOS[@]/#/-e}")
[[ -n "$scenarios" ]] || die "no Molecule scenario found under molecule/"
for s in "${BESIDE_SCENARIOS[@]}"; do [[ -f "molecule/$s/molecule.yml" ]] || die "no Molecule scenario $s"; done
[[ -f tests/slow/test_vllm_server_molecule.py ]] || die "nothing runs the vllm_server scenario"
# The apt stand-in (127.0.0.1:8081) that the host-stack tests of both lanes install from is
# started here, once: two lanes starting it in the same second would race for its port.
bash lab/apt/serve.sh
molecule_log="$ROOT/.cache/test-logs/molecule.log"
# its own process group (setsid), stopped with the run when a stage fails (on_exit)
# When both are done, this lane brings the lab up (`scripts/lab.sh run`, about 5 1/2 min at
# CI stop 36, then the first minutes of the lab stage) beside the other lane's last slow
# tests: none of those uses the lab's names or ports (the mirrors' and vLLM's included).
# Its exit code and log are left in $lab_done for the lab tests' fixture (tests/conftest.py),
# which asserts on them as it does on its own run.
lab_done="$ROOT/.cache/test-logs/lab-run.done"
lab_log="$ROOT/.cache/test-logs/lab-run.log"
rm -f "$lab_done"
setsid bash -c 'set -euo pipefail; . scripts/lib.sh; molecule_tests $1
    lab_done=$2 lab_log=$3; shift 3; log "== pytest $* (at $(date -u +%H:%M:%S))"
    pytest -q -s --durations=10 -m "slow and not lab" "$@"
    log "== the lab: scripts/lab.sh run, for the lab stage (at $(date -u +%H:%M:%S)); log $lab_log"
    rc=0; bash scripts/lab.sh run > "$lab_log" 2>&1 || rc=$?
    echo "$rc $lab_log" > "$lab_done"
    log "== the lab is up (exit $rc, at $(date -u +%H:%M:%S))"' \
  molecule "$scenarios" "$lab_done" "$lab_log" "${AFTER_MOLECULE[@]}" > "$molecule_log" 2>&1 &
molecule_pid=$!

stage "pytest: slow tests without the lab (docker, mirrors, vLLM), beside Molecule"
# -s: the tuner's comparisons with real vLLM are printed.
# a failing scenario ends the run here (molecule_test dies; on_exit stops Molecule's lane)
molecule_tests "${BESIDE_SCENARIOS[@]}"
slow_log="$ROOT/.cache/test-logs/slow.log"
slow_rc=0
pytest -q -s --durations=30 -rfE -m "slow and not lab" "${AFTER_MOLECULE[@]/#/--ignore=}" tests \
  2>&1 | tee "$slow_log" || slow_rc=$?
stage "waiting for Molecule"
molecule_rc=0; wait "$molecule_pid" || molecule_rc=$?
molecule_pid=""
cat "$molecule_log"
((molecule_rc == 0)) || die "Molecule or ${AFTER_MOLECULE[*]} failed (exit $molecule_rc); its output is above"
if ((slow_rc != 0)); then
  # Molecule's output came after theirs: repeat pytest's summary of what failed and why,
  # so that the end of the log (all a CI page may show) names it
  log "slow tests without the lab: pytest's summary again ($slow_log)"
  sed -n '/= short test summary info =/,$p' "$slow_log" >&2
  die "slow tests without the lab failed (exit $slow_rc); their output is above Molecule's"
fi

[[ -f "$lab_done" ]] || die "the Molecule lane ended without bringing the lab up ($lab_done)"
export GPUFLEET_LAB_RUN_DONE="$lab_done"
stage "pytest: slow tests on the lab (the whole lab, alone)"
# The lab run (brought up by the Molecule lane), the front door's route table, its second
# run, check mode, the site.yml refusal, the control case, every rolling upgrade under load
# ((a)+(f) a settings change and a key rotation in two runs over the whole lab, the same
# upgrade again, (d) bad canary, (b)+(e) image and driver branch with reboots in the key
# rotation's second run, (c) model revision), then playbooks/benchmark.yml, on one lab.
# The orchestration cases (the controller killed after a drain with HAProxy reloaded, two
# runs at once, a gate failure in a two-host batch, a lost host) run against the real
# HAProxy with stand-in vLLM instances in tests/unit/test_upgrade_orchestration.py, beside Molecule (issue #31 item
# 11: until CI stop 39 they ran here, and (f) could not). (At CI stop 38 the lab tests with
# no latency gate ran in the Molecule lane as soon as the lab was up: the lanes, CPU-bound,
# took 8 minutes more and the lab stage 5 less, so they are back here.) Each stage above
# prints its start; pytest's --durations gives each case's time.
# -s: the load totals (requests sent and failed) are printed.
pytest -q -s --durations=30 -m "slow and lab" tests
stage "done"
