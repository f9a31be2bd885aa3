"""vLLM 0.32 serving TLS as the vllm_server role starts it (issue #32 item 2), cheaply: the
lab image (gpufleet/vllm-cpu:lab, real vLLM on the CPU) runs vLLM's own HTTP launcher
(vllm.entrypoints.launchers.launcher.serve_http, which `vllm serve` uses) with the
arguments vLLM's own parser reads from the planned command (serve.plan_instances with
tls_dir: --ssl-certfile/--ssl-keyfile), the planned read-only mount of the certificates'
folder (root 0700, key 0600) and the role's container security (no capability,
no-new-privileges, host network). No model is loaded (that costs minutes and changes
nothing in the TLS path: the same uvicorn server with the same ssl_* arguments).
Reached with `curl --cacert` and gpufleet's client (tls.client_session): the fleet CA
verifies, another CA and plain http are refused, and the key is unreadable for any other
user in the container. Pure planning: tests/unit/test_vllm_server_tls.py."""
import os
import pathlib
import socket
import subprocess
import time
import uuid

import pytest

from gpufleet import serve, tls

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGE = "gpufleet/vllm-cpu:lab"
pytestmark = pytest.mark.slow

# vLLM's parser and launcher, with a /health app in place of the engine's.
LAUNCH = """
import asyncio, sys
from fastapi import FastAPI
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.entrypoints.launchers.launcher import serve_http
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
app = FastAPI()
app.state.engine_client = None
@app.get("/health")
def health():
    return {}
async def main():
    shutdown = await serve_http(app, sock=None, host=args.host, port=args.port,
                                ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile,
                                ssl_ca_certs=args.ssl_ca_certs, ssl_cert_reqs=args.ssl_cert_reqs,
                                ssl_ciphers=args.ssl_ciphers)
    await shutdown
asyncio.run(main())
"""


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _curl(*args):
    return subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
                           *args], capture_output=True, text=True)


def test_vllm_serves_the_planned_certificate_and_only_tls(tmp_path):
    from helpers import docker_answers
    from helpers import ca_and_leaf as _ca_and_leaf

    if not docker_answers() or subprocess.run(["docker", "image", "inspect", IMAGE],
                                              capture_output=True).returncode:
        pytest.skip(f"needs Docker and {IMAGE} (scripts/lab.sh images)")
    _ca_and_leaf(tmp_path, "fleet")
    _ca_and_leaf(tmp_path, "rogue")
    folder = tmp_path / "vllm-tls"
    folder.mkdir(mode=0o700)
    (folder / "cert.pem").write_bytes((tmp_path / "fleet.crt").read_bytes())
    (folder / "key.pem").write_bytes((tmp_path / "fleet.key").read_bytes())
    os.chmod(folder / "key.pem", 0o600)
    port = _free_port()
    (inst,) = serve.plan_instances(
        {"name": "chat", "path": str(tmp_path)}, {"args": [], "settings": {"runner": "generate"}},
        image=IMAGE, image_id="sha256:aa", container_prefix="tlstest-", default_port=port,
        gpu_indexes=[], gpu_runtime="none", allow_replicas=False, tls_dir=str(folder), tls_digest="d")
    mount = [m for m in inst["mounts"] if m["target"] == serve.TLS_MOUNT][0]
    name = f"vllmtls-test-{uuid.uuid4().hex[:8]}"
    run = ["docker", "run", "-d", "--name", name, "--network", "host", "--cap-drop", "ALL",
           "--security-opt", "no-new-privileges",
           "--mount", f"type=bind,source={mount['source']},target={mount['target']},readonly",
           "--entrypoint", "python3", IMAGE, "-c", LAUNCH, *inst["command"][1:]]
    assert subprocess.run(run, capture_output=True, text=True).returncode == 0
    try:
        url = serve.local_url("127.0.0.1", port, inst["scheme"])
        deadline = time.monotonic() + 120
        while _curl("--cacert", str(tmp_path / "fleet-ca.crt"), f"{url}/health").stdout != "200":
            logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True)
            assert time.monotonic() < deadline, logs.stdout[-3000:] + logs.stderr[-3000:]
            time.sleep(1)
        assert url.startswith("https://")
        assert _curl("--cacert", str(tmp_path / "rogue-ca.crt"), f"{url}/health").returncode == 60
        assert _curl(f"http://127.0.0.1:{port}/health").stdout != "200"
        import requests
        session = tls.client_session(requests.Session(), str(tmp_path / "fleet-ca.crt"))
        assert session.get(f"{url}/health", timeout=10).status_code == 200
        with pytest.raises(requests.exceptions.SSLError):
            tls.client_session(requests.Session(), str(tmp_path / "rogue-ca.crt")).get(f"{url}/health", timeout=10)
        # read-only, and only root (vLLM's user there) reads the key
        other = subprocess.run(["docker", "exec", "--user", "65534", name, "cat",
                                f"{serve.TLS_MOUNT}/key.pem"], capture_output=True, text=True)
        assert other.returncode != 0 and "Permission denied" in other.stderr, other
        write = subprocess.run(["docker", "exec", name, "touch", f"{serve.TLS_MOUNT}/x"],
                               capture_output=True, text=True)
        assert write.returncode != 0 and "Read-only file system" in write.stderr, write
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
