#!/usr/bin/env bash
# Prepare this machine (Debian 12 / Ubuntu, as root) for gpufleet's lab and tests.
# Idempotent: every step checks before it acts, so a second run takes seconds.
#
#   scripts/setup.sh            apt packages, Docker engine, .venv, offline base image,
#                               ansible-test sanity's virtual environments
#   scripts/setup.sh venv       only the Python virtualenv
#
# Nothing here reaches anything but Debian's mirror and PyPI.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

# haproxy: Debian's HAProxy, run by tests/unit/test_upgrade_orchestration.py as the real
# gateway in front of stand-in vLLM instances (the lab's gateway runs in its own container).
# python3-libtorrent + python3-requests: the p2p engine (gpufleet.p2p) under Debian's
# /usr/bin/python3, as the GPU hosts run it (tests/slow/test_p2p_loopback.py).
APT_PACKAGES=(docker.io debootstrap apt-utils dpkg-dev git git-lfs nginx-light haproxy python3-venv curl
  python3-libtorrent python3-requests)

setup_apt() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == *"install ok installed"* ]] || missing+=("$p")
  done
  if ((${#missing[@]})); then
    log "apt: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

setup_venv() {
  # Built once per machine for each content of requirements.txt and the file it includes
  # (their hash, stamped in the venv when its install ends): in the machine's cache
  # (machine_cache, scripts/lib.sh), to which .venv links. A venv cannot move (its
  # scripts name its path), so it is built where it stays; an entry without its stamp is
  # a build that was cut short, made again. A checkout whose own .venv folder has the
  # stamp keeps it.
  local want have="" dir
  want=$(cat requirements.txt requirements-runtime.txt | sha256sum | cut -c1-16)
  [[ -f .venv/.requirements-hash ]] && have=$(cat .venv/.requirements-hash)
  [[ "$want" == "$have" && -x .venv/bin/ansible-playbook ]] && return 0
  dir="$(machine_cache)/venvs/$want"
  mkdir -p "$(dirname "$dir")"
  (
    flock 9  # one build of an entry at a time (two checkouts set up at once)
    if [[ "$(cat "$dir/.requirements-hash" 2>/dev/null)" != "$want" || ! -x "$dir/bin/ansible-playbook" ]]; then
      log "venv: installing requirements.txt into $dir (this machine's cache; .venv links to it)"
      rm -rf "$dir"
      python3 -m venv "$dir"
      "$dir/bin/pip" install -q --disable-pip-version-check -r requirements.txt
      echo "$want" > "$dir/.requirements-hash"
    else
      log "venv: $dir (this machine's cache) has requirements.txt $want; .venv links to it"
    fi
  ) 9> "$dir.lock"
  rm -rf .venv
  ln -s "$dir" .venv
}

case "${1:-all}" in
  venv) setup_venv ;;
  all)
    setup_apt
    start_dockerd
    setup_venv
    # ansible-test sanity's virtual environments (scripts/collection-check.sh runs the
    # tests; about 90 s of one core, from PyPI), made beside the base image's debootstrap,
    # which waits on Debian's mirror: kept under ~/.ansible/test, so a second run finds them.
    sanity_log=$(mktemp /tmp/gpufleet-sanity-venvs.XXXXXX)
    (export PATH="$ROOT/.venv/bin:$PATH"; prime_sanity_venvs) > "$sanity_log" 2>&1 &
    sanity_pid=$!
    build_base_image
    wait "$sanity_pid" || { cat "$sanity_log" >&2; die "ansible-test sanity's virtual environments (above)"; }
    rm -f "$sanity_log"
    ;;
  *) die "usage: scripts/setup.sh [all|venv]" ;;
esac
