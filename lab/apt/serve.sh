#!/usr/bin/env bash
# Serve the lab's stand-in NVIDIA apt repositories (built by lab/apt/build.sh) with
# nginx on http://127.0.0.1:8081/ (loopback only). Idempotent: builds when the sources
# changed, starts nginx only when nothing answers, with its own config and pid file
# under .cache/lab/apt-nginx/.
#
#   lab/apt/serve.sh          build if needed, then start (or keep) the server
#   lab/apt/serve.sh stop     stop the server this script started
#
# Mirror URLs a role uses in the lab (same variables an air-gapped user sets):
#   nvidia_driver_repo_url / cuda_toolkit_repo_url: http://127.0.0.1:8081/cuda/debian12/x86_64/
#   container_toolkit_repo_url: http://127.0.0.1:8081/libnvidia-container/stable/deb/amd64/
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=scripts/lib.sh
. "$ROOT/scripts/lib.sh"

PORT=${GPUFLEET_APT_PORT:-8081}
RUN="$ROOT/.cache/lab/apt-nginx"
PID="$RUN/nginx.pid"

running() { [[ -f "$PID" ]] && kill -0 "$(cat "$PID")" 2>/dev/null; }

if [[ "${1:-start}" == stop ]]; then
  if running; then kill "$(cat "$PID")"; log "apt: stopped nginx on 127.0.0.1:$PORT"; fi
  exit 0
fi

bash "$ROOT/lab/apt/build.sh"
if running && curl -fsS -o /dev/null "http://127.0.0.1:$PORT/cuda/debian12/x86_64/Release"; then
  exit 0
fi
command -v nginx >/dev/null || die "nginx missing: run scripts/setup.sh (nginx-light)"
mkdir -p "$RUN/tmp"
cat > "$RUN/nginx.conf" <<CONF
daemon on;
worker_processes 1;
pid $PID;
error_log $RUN/error.log warn;
events { worker_connections 64; }
http {
  access_log $RUN/access.log;
  client_body_temp_path $RUN/tmp;
  proxy_temp_path $RUN/tmp;
  fastcgi_temp_path $RUN/tmp;
  uwsgi_temp_path $RUN/tmp;
  scgi_temp_path $RUN/tmp;
  types { application/vnd.debian.binary-package deb; text/plain Release Packages; }
  default_type application/octet-stream;
  sendfile on;
  server {
    listen 127.0.0.1:$PORT;
    root $ROOT/.cache/lab/apt;
    autoindex on;
  }
}
CONF
nginx -c "$RUN/nginx.conf" -e "$RUN/error.log"
for _ in $(seq 1 50); do
  curl -fsS -o /dev/null "http://127.0.0.1:$PORT/cuda/debian12/x86_64/Release" && {
    log "apt: serving the lab's stand-in NVIDIA repositories on http://127.0.0.1:$PORT/"
    exit 0
  }
  sleep 0.1
done
die "nginx did not answer on 127.0.0.1:$PORT (log: $RUN/error.log)"
