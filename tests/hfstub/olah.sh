#!/usr/bin/env bash
# Install olah (a real self-hosted Hugging Face mirror, PyPI) into its own venv, apart from
# ansible's: .cache/olah-venv/bin/olah-cli. Idempotent; prints the olah-cli path.
# Used by the slow integration tests as an independent HF-API implementation to test
# hf_model against (see ../shared/notes/test-infra.md: offline mode over local git repos).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
venv="${OLAH_VENV:-$root/.cache/olah-venv}"
version="${OLAH_VERSION:-0.5.4}"
if ! "$venv/bin/olah-cli" --help >/dev/null 2>&1 \
   || ! "$venv/bin/python" -m pip show olah 2>/dev/null | grep -qx "Version: $version"; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q "olah==$version" >&2
fi
echo "$venv/bin/olah-cli"
