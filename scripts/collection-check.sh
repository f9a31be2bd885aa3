#!/usr/bin/env bash
# The collection as a user gets it (issue #33 item 2, docs/collection.md): build the
# tarball from this checkout, install it with ansible-galaxy into an empty folder outside
# the checkout, and there run a user's own project (tests/collection/project: its own
# ansible.cfg, inventory and playbook) that calls gpufleet.fleet.gpu_facts, cuda_compat,
# vllm_tune and the role gpufleet.fleet.vllm_server in check mode; then ansible-doc of
# every module from the installed copy; then `ansible-test sanity` in the installed copy
# (docs/collection.md, "ansible-test sanity"). About 10 s, then about 35 s of sanity tests;
# no docker; the sanity tests' virtual environments, made once under ~/.ansible/test,
# install from PyPI.
#   scripts/collection-check.sh            (scripts/test.sh runs it beside the unit tests)
#   GPUFLEET_SANITY=0 scripts/collection-check.sh  without ansible-test sanity
#   GPUFLEET_KEEP=1 scripts/collection-check.sh   keeps the folder and says where
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/scripts/lib.sh"
export PATH="$ROOT/.venv/bin:$PATH"
# Nothing of the checkout may leak into the user's run: not its ansible.cfg (which puts
# the checkout's own collection first), not its Python path.
unset ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH ANSIBLE_COLLECTIONS_PATHS PYTHONPATH
# (the ssh agent code of ansible-core warns about DSA on import: not ours, not a finding)
export PYTHONWARNINGS="ignore:DSA is deprecated" ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0

work=$(mktemp -d /tmp/gpufleet-user.XXXXXX)
if [[ "${GPUFLEET_KEEP:-}" == 1 ]]; then
  trap 'log "kept $work"' EXIT
else
  trap 'rm -rf "$work"' EXIT
fi

log "build the tarball"
ansible-galaxy collection build --force --output-path "$work/dist" "$ROOT" >/dev/null
tarball=$(ls "$work"/dist/gpufleet-fleet-*.tar.gz)
# the tarball holds no link (the checkout's collections/ link is left out) and no test rig
if tar -tzvf "$tarball" | grep -E '^l| (collections|molecule|lab|\.ci|inventories|tests/unit)/' ; then
  die "the tarball holds a link or a test rig (above): galaxy.yml build_ignore"
fi

log "install it into an empty folder with the user's project ($work)"
mkdir -p "$work/project"
cp -r "$ROOT/tests/collection/project/." "$work/project/"
cp "$ROOT/tests/fixtures/nvidia-smi/netdata-rtx-4090-driver-535.xml" "$work/project/nvidia-smi.xml"
cd "$work/project"
export ANSIBLE_CONFIG="$work/project/ansible.cfg"
# --offline --no-deps: community.* come from the pinned `ansible` package of requirements.txt
ansible-galaxy collection install --offline --no-deps -p collections "$tarball"
coll="$work/project/collections/ansible_collections/gpufleet/fleet"
[[ -f "$coll/galaxy.yml" || -f "$coll/MANIFEST.json" ]] || die "not installed at $coll"

log "the user's playbook, check mode"
python3 make_tiny_model.py models/tiny
ansible-playbook playbook.yml --check

log "ansible-doc of every module, from the installed copy"
mapfile -t modules < <(cd "$coll/plugins/modules" && ls ./*.py | sed 's#^\./##; s/\.py$//; s/^/gpufleet.fleet./')
ansible-doc -t module "${modules[@]}" > "$work/doc.txt" 2> "$work/doc.err" \
  || { cat "$work/doc.err" >&2; die "ansible-doc failed"; }
[[ ! -s "$work/doc.err" ]] || { cat "$work/doc.err" >&2; die "ansible-doc said something on stderr (above)"; }
for m in "${modules[@]}"; do
  grep -q "^> MODULE $m " "$work/doc.txt" || die "ansible-doc rendered no page for $m"
done
ansible-doc --json gpufleet.fleet.cuda_compat | grep -q "\"filename\": \"$coll/" \
  || die "ansible-doc did not read the installed copy ($coll)"
log "ok: ${#modules[@]} modules documented from $coll"

[[ "${GPUFLEET_SANITY:-1}" == 0 ]] && exit 0
log "ansible-test sanity, in the installed copy"
ansible_test_ready   # scripts/lib.sh: its pip bootstrap, SANITY_PYTHON
cd "$coll"
ansible-test sanity --python "$SANITY_PYTHON" --color no
log "ok: ansible-test sanity passed in $coll"
