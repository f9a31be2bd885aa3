# Shared shell helpers for scripts/*.sh. Source it; it defines functions only.
# shellcheck shell=bash

log() { printf '\033[1m[gpufleet]\033[0m %s\n' "$*" >&2; }
die() { printf '[gpufleet] ERROR: %s\n' "$*" >&2; exit 1; }

# The machine's cache of what a checkout builds from its own files and keeps by their
# content hash, as Docker keeps the lab's images: the Python virtual environment
# (scripts/setup.sh) and the lab's models (lab/models/build.sh). Every checkout of this
# machine shares it (a fresh clone, as CI makes, links or copies in seconds what the
# first one built in minutes); a machine without the cache builds everything, as before.
# A model keeps one copy (a new recipe replaces the old); a venv of new requirements is
# built beside the old ones (about 1 GB each), which a checkout of an older commit may
# still link: remove ~/.cache/gpufleet/venvs/<hash> by hand. GPUFLEET_MACHINE_CACHE
# moves it.
machine_cache() { echo "${GPUFLEET_MACHINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpufleet}"; }

# Debian mirror this machine already uses (the only one reachable here).
debian_mirror() {
  local m
  m=$(grep -hoE '^(URIs:|deb) *\[?[^ ]*\]? *https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
      | grep -oE 'https?://[^ ]+' | grep -v security | head -n1 || true)
  echo "${m:-http://deb.debian.org/debian}"
}

# Start the Docker engine when it does not answer (CI machines have no init system).
start_dockerd() {
  if docker info >/dev/null 2>&1; then return 0; fi
  command -v dockerd >/dev/null || die "dockerd not installed: run scripts/setup.sh"
  log "docker: starting dockerd (log: /var/log/gpufleet-dockerd.log)"
  setsid nohup dockerd >/var/log/gpufleet-dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return 0
    sleep 1
  done
  tail -n 20 /var/log/gpufleet-dockerd.log >&2 || true
  die "dockerd did not answer within 60 s"
}

# Content hash of files/dirs (paths relative to the repo root), 16 hex chars.
content_hash() {
  ( cd "$ROOT" && find "$@" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum ) | sha256sum | cut -c1-16
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# Base image for the lab hosts and Molecule: Debian 12 with systemd and python3, built
# offline with debootstrap (no registry is reachable). Tagged by the hash of its recipe,
# so it is rebuilt only when the recipe changes.
BASE_IMAGE_PACKAGES="python3,python3-apt,ca-certificates,systemd,systemd-sysv,dbus,iproute2,procps,kmod,gnupg,curl,sudo,less"
BASE_IMAGE=gpufleet/debian:12
build_base_image() {
  local hash tag rootfs mirror
  hash=$( { echo "$BASE_IMAGE_PACKAGES"; cat "$ROOT/lab/base/setup-rootfs.sh"; } | sha256sum | cut -c1-12)
  tag="$BASE_IMAGE-$hash"
  if image_exists "$tag"; then
    docker tag "$tag" "$BASE_IMAGE"
    return 0
  fi
  mirror=$(debian_mirror)
  rootfs=$(mktemp -d /var/tmp/gpufleet-rootfs.XXXXXX)
  log "image: debootstrap Debian 12 into $rootfs from $mirror (about a minute)"
  debootstrap --variant=minbase --include="$BASE_IMAGE_PACKAGES" bookworm "$rootfs" "$mirror" >/var/log/gpufleet-debootstrap.log 2>&1 \
    || { tail -n 20 /var/log/gpufleet-debootstrap.log >&2; die "debootstrap failed"; }
  bash "$ROOT/lab/base/setup-rootfs.sh" "$rootfs" "$mirror"
  tar -C "$rootfs" -c . | docker import \
    -c 'CMD ["/lib/systemd/systemd"]' -c 'ENV container=docker' \
    -c "LABEL org.gpufleet.recipe=$hash" - "$tag" >/dev/null
  rm -rf "$rootfs"
  docker tag "$tag" "$BASE_IMAGE"
  log "image: built $tag"
}

# The lab hosts' image (scripts/lab.sh up and fleet-up): the base image above plus sshd
# and a login user (lab/base/host-ssh.Dockerfile), so the lab is reached over SSH as real
# fleets are. Tagged by the hash of the base image's recipe and that file, so it is
# rebuilt only when one of them changes.
LAB_HOST_IMAGE=gpufleet/debian-ssh:12
build_lab_host_image() {
  local hash tag
  build_base_image
  hash=$( { echo "$BASE_IMAGE_PACKAGES"; cat "$ROOT/lab/base/setup-rootfs.sh" "$ROOT/lab/base/host-ssh.Dockerfile"; } \
          | sha256sum | cut -c1-12)
  tag="$LAB_HOST_IMAGE-$hash"
  if ! image_exists "$tag"; then
    log "image: building $tag (openssh-server from Debian's mirror)"
    docker build -q --network host -t "$tag" --label "org.gpufleet.recipe=$hash" -f "$ROOT/lab/base/host-ssh.Dockerfile" \
      "$ROOT/lab/base" >/dev/null
  fi
  docker tag "$tag" "$LAB_HOST_IMAGE"
}

# `molecule test -s SCENARIO`, failing unless Molecule's own summary says the scenario ran
# and succeeded ("Molecule executed 1 scenario (1 successful)"): a scenario whose steps
# were skipped or whose playbooks are missing ends "(1 skipped)" / "(1 missing)" and
# still exits 0. MOLECULE names another molecule command (the tests use a stand-in).
molecule_test() {
  local scenario=$1 out rc
  out=$(mktemp)
  # the exit status goes through a file: right under set -e and pipefail, and without them
  { rc=0; "${MOLECULE:-molecule}" test -s "$scenario" 2>&1 || rc=$?; echo "$rc" > "$out.rc"; } | tee "$out"
  rc=$(cat "$out.rc"); rm -f "$out.rc"
  if ((rc != 0)); then rm -f "$out"; die "molecule test -s $scenario failed (exit $rc)"; fi
  # the colour codes are stripped into a file first: `sed | grep -q` under pipefail fails
  # at random (grep -q exits at the match, sed's last write then dies of SIGPIPE)
  sed 's/\x1b\[[0-9;]*m//g' "$out" > "$out.plain"
  if ! grep -q "Molecule executed 1 scenario (1 successful)" "$out.plain"; then
    local summary
    summary=$(grep "Molecule executed" "$out.plain" | tail -n1 || true)
    rm -f "$out" "$out.plain"
    die "molecule test -s $scenario did not run every step: ${summary:-no Molecule summary printed}"
  fi
  rm -f "$out" "$out.plain"
}

# molecule_test for each scenario named, in turn, each announced with the time it starts;
# the first failure ends the shell (die), as molecule_test does.
molecule_tests() {
  local s
  for s in "$@"; do
    log "== molecule test -s $s (at $(date -u +%H:%M:%S))"
    molecule_test "$s"
  done
}

# ansible-test sanity (docs/collection.md, "ansible-test sanity") makes one virtual
# environment per test under ~/.ansible/test/venv, kept and reused, and bootstraps pip in
# each with get-pip, which it downloads from ci-files.testing.ansible.com (not reachable
# from these machines) unless its cached copy is there: that copy is provided
# (scripts/ansible-test-get-pip.py) when none is. Needs .venv/bin first on PATH.
ansible_test_ready() {
  local at_dir pip_version get_pip
  at_dir=$(python3 -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')
  pip_version=$(sed -n "s/^ *pip='\([0-9.]*\)',\$/\1/p" "$at_dir/_internal/python_requirements.py")
  [[ -n "$pip_version" ]] || die "no pip version found in $at_dir/_internal/python_requirements.py"
  get_pip="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
  if [[ ! -s "$get_pip" ]]; then
    mkdir -p "$(dirname "$get_pip")"
    cp "$ROOT/scripts/ansible-test-get-pip.py" "$get_pip"
  fi
  SANITY_PYTHON=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
}

# Make the sanity tests' virtual environments ahead (from PyPI; scripts/setup.sh does it
# beside the base image's debootstrap). They depend only on the tests and the Python
# version, so a collection tree holding only galaxy.yml serves (with no file at all,
# ansible-test stops before it makes any).
prime_sanity_venvs() {
  local tree rc=0
  ansible_test_ready
  tree=$(mktemp -d /tmp/gpufleet-sanity-prime.XXXXXX)
  mkdir -p "$tree/ansible_collections/gpufleet/fleet"
  cp "$ROOT/galaxy.yml" "$tree/ansible_collections/gpufleet/fleet/"
  (cd "$tree/ansible_collections/gpufleet/fleet" \
     && ansible-test sanity --prime-venvs --python "$SANITY_PYTHON" --color no) || rc=$?
  rm -rf "$tree"
  return "$rc"
}
