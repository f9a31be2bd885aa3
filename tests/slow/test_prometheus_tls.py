"""Prometheus scrapes the fleet's https instances over TLS (issue #32 item 2), for real: the
Prometheus of Debian 12 (the package fleet_monitoring installs; its binaries taken out of
the .deb with `apt-get download`, cached in .cache/prometheus-deb, nothing installed) runs
the vllm job of the role's rendered prometheus.yml against a file_sd list written by
serve.registry_entry for two TLS stand-ins: one with the fleet CA's certificate (up) and one
with another CA's (down: x509 unknown authority). About 10 s once the package is cached.
The rendering alone: tests/unit/test_vllm_server_tls.py."""
import glob
import json
import pathlib
import shutil
import subprocess
import time
import urllib.request

import pytest
import yaml

from gpufleet import serve

ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "prometheus-deb"
pytestmark = pytest.mark.slow


def _binary(name):
    if shutil.which(name):
        return shutil.which(name)
    found = CACHE / "root" / "usr" / "bin" / name
    if not found.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", "prometheus"], cwd=CACHE, check=True,
                       capture_output=True, timeout=300)
        subprocess.run(["dpkg-deb", "-x", glob.glob(str(CACHE / "prometheus_*.deb"))[0],
                        str(CACHE / "root")], check=True)
    return str(found)


def test_prometheus_scrapes_https_instances_with_the_fleet_ca_and_refuses_another(tmp_path):
    from helpers import ca_and_leaf, free_port, tls_server
    from helpers import prometheus_config as _prometheus_config

    prometheus, promtool = _binary("prometheus"), _binary("promtool")
    servers, entries = [], []
    for name in ("fleet", "rogue"):
        ca_and_leaf(tmp_path, name)
        server = tls_server(tmp_path, name, lambda path: b"vllm:num_requests_running 0\n")
        servers.append(server)
        entries.append(serve.registry_entry(
            {"name": f"c-{name}", "model": "m", "served_model_name": "m", "runner": "generate",
             "port": server.server_address[1], "scheme": "https"}, name, "127.0.0.1"))
    (tmp_path / "vllm.json").write_text(json.dumps(entries))
    config = _prometheus_config(True)
    config["global"]["scrape_interval"] = "1s"
    config["rule_files"] = []
    config["scrape_configs"] = [j for j in config["scrape_configs"] if j["job_name"] == "vllm"]
    config["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(tmp_path / "vllm.json")]
    config["scrape_configs"][0]["tls_config"]["ca_file"] = str(tmp_path / "fleet-ca.crt")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    check = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    with open(tmp_path / "prometheus.log", "w") as log:
        proc = subprocess.Popen([prometheus, f"--config.file={tmp_path}/prometheus.yml",
                                 f"--storage.tsdb.path={tmp_path}/data",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5) as resp:
                    targets = json.load(resp)["data"]["activeTargets"]
            except OSError:
                targets = []
            if len(targets) == 2 and all(t["health"] != "unknown" for t in targets):
                break
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
        health = {t["labels"]["host"]: (t["scrapeUrl"].split(":")[0], t["health"], t["lastError"])
                  for t in targets}
        assert health["fleet"] == ("https", "up", ""), health
        assert health["rogue"][:2] == ("https", "down") and "unknown authority" in health["rogue"][2], health
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        for server in servers:
            server.shutdown()
