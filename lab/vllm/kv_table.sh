#!/usr/bin/env bash
# Measure vLLM's own "CPU KV cache size: N tokens" for given --kv-cache-memory-bytes.
#
#   lab/vllm/kv_table.sh MODEL_DIR MAX_MODEL_LEN BYTES...
#   e.g. lab/vllm/kv_table.sh gpufleet/tiny-llama 256 1048576 16777216
#
# MODEL_DIR is relative to .cache/lab/models. For each BYTES it starts the image
# (VLLM_IMAGE, default gpufleet/vllm-cpu:lab) on 127.0.0.1 with the model mounted
# read-only, waits (bounded) for the KV cache line in the log, prints one markdown table
# row "| BYTES | max_model_len | N | concurrency |" and removes the container (named
# vllmimg-kv-*). The server is not queried; the line is logged before it is healthy.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

(( $# >= 3 )) || die "usage: lab/vllm/kv_table.sh MODEL_DIR MAX_MODEL_LEN BYTES..."
dir=$1 len=$2; shift 2
IMAGE=${VLLM_IMAGE:-gpufleet/vllm-cpu:lab}
MODEL=$ROOT/.cache/lab/models/$dir
[[ -f "$MODEL/config.json" ]] || die "model $dir missing: run lab/models/build.sh"
image_exists "$IMAGE" || die "image $IMAGE missing: run lab/vllm/build.sh"
cname=""
trap '[[ -n "$cname" ]] && docker rm -f "$cname" >/dev/null 2>&1 || true' EXIT

for bytes in "$@"; do
  [[ "$bytes" =~ ^[0-9]+$ ]] || die "BYTES must be an integer, got '$bytes'"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cname="vllmimg-kv-$$-$bytes"
  docker run -d --name "$cname" --network host --shm-size 1g -v "$MODEL:/models/m:ro" "$IMAGE" \
    --model /models/m --host 127.0.0.1 --port "$port" --max-model-len "$len" \
    --enforce-eager --dtype bfloat16 --kv-cache-memory-bytes "$bytes" >/dev/null
  line=""
  for _ in $(seq 1 240); do
    line=$(docker logs "$cname" 2>&1 | grep -oE 'KV cache size: [0-9,]+ tokens, Maximum concurrency for [0-9,]+ tokens per request: [0-9.]+x' | head -n1 || true)
    [[ -n "$line" ]] && break
    [[ "$(docker inspect -f '{{.State.Running}}' "$cname")" == true ]] \
      || { docker logs --tail 15 "$cname" 2>&1 | sed 's/^/    /' >&2; line="FAILED"; break; }
    sleep 1
  done
  if [[ "$line" == FAILED || -z "$line" ]]; then
    echo "| $bytes | $len | failed to start (see above) | |"
  else
    tokens=$(sed -E 's/KV cache size: ([0-9,]+) tokens.*/\1/' <<<"$line")
    conc=$(sed -E 's/.*request: ([0-9.]+)x/\1/' <<<"$line")
    echo "| $bytes | $len | $tokens | ${conc}x |"
  fi
  docker rm -f "$cname" >/dev/null
  cname=""
done
