"""playbooks/benchmark.yml on the real lab: `vllm bench serve` from each chat instance's own
image (gpufleet/vllm-cpu:lab, vLLM 0.32 CPU) against lab-h200 and lab-a10g, a two-point by
two-pair matrix (concurrency 1 and 2 by the pairs (32, 16) and (64, 16): the smallest that
has two lines on every plot; the lab preset's four levels, which show the knee, took 6 min
51 s for the two instances, see docs/benchmark.md), and the run folder it writes.

Real software only: the lab (scripts/lab.sh run) with vLLM serving SmolLM2-135M-Instruct
on CPU. Stand-ins, as the README says: the GPUs (a captured nvidia-smi XML behind a
stand-in nvidia-smi that emulates only `-q -x`), so no utilisation can be sampled and the
report must say so. Runs on the session's lab (tests/conftest.py): in CI after the
upgrade cases of test_upgrade_under_load.py (the knee facts it caches would otherwise feed
their capacity gate); run alone, it brings a lab up and removes it afterwards:
  .venv/bin/pytest -s -m slow tests/slow/test_benchmark.py
"""
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

from labrun import INVENTORY, key, sh  # noqa: E402

pytestmark = pytest.mark.slow

CHAT = {"lab-h200:18000", "lab-a10g:18200"}
PNG = b"\x89PNG\r\n\x1a\n"
LAB = {"fleet_benchmark_concurrency": [1, 2], "fleet_benchmark_pairs": [[32, 16], [64, 16]],
       "fleet_benchmark_min_prompts": 10, "fleet_benchmark_point_timeout": 600}


@pytest.fixture(scope="module")
def run(lab, tmp_path_factory):
    assert lab["rc"] == 0, lab["output"][-3000:]
    out = tmp_path_factory.mktemp("benchmarks")
    proc = sh(str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(INVENTORY),
              "playbooks/benchmark.yml", "-e", json.dumps(dict(LAB, fleet_benchmark_output_dir=str(out))),
              check=False, timeout=3600, env={"ANSIBLE_FORCE_COLOR": "0"})
    print(proc.stdout[-6000:])
    folders = [p for p in out.iterdir() if p.is_dir()]
    return {"proc": proc, "out": out, "folders": folders}


def test_playbook_succeeds_with_a_progress_line_per_point(run):
    proc = run["proc"]
    assert proc.returncode == 0, proc.stdout[-8000:]
    for instance in CHAT:
        for c in (1, 2):
            for inp in (32, 64):
                assert f"{instance} c={c} in={inp} out=16" in proc.stdout
    assert key() not in proc.stdout


def test_one_run_folder_with_csv_png_html(run):
    assert len(run["folders"]) == 1, run["folders"]
    folder = run["folders"][0]
    for instance in CHAT:
        name = instance.replace(":", "_")
        assert (folder / f"{name}.csv").is_file()
        for plot in ("throughput", "latency-vs-concurrency", "latency-vs-input"):
            assert (folder / f"{name}-{plot}.png").read_bytes().startswith(PNG)
    html = (folder / "report.html").read_text()
    assert "<table id='fleet'>" in html and html.count("data:image/png;base64,") == 6
    assert "no GPU on this host: no utilisation sampled" in html
    assert "gpufleet/vllm-cpu:lab" in html and "HuggingFaceTB/SmolLM2-135M-Instruct" in html
    for path in folder.rglob("*"):
        if path.is_file():
            assert key() not in path.read_text(errors="replace"), path


def test_every_point_is_accounted_for(run):
    folder = run["folders"][0]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["points"]["total"] == 2 * 2 * 2, summary["points"]
    seen = set()
    for group in summary["groups"]:
        assert group["instance"] in CHAT
        seen.add((group["instance"], group["input_len"]))
    assert seen == {(i, n) for i in CHAT for n in (32, 64)}
    for instance in CHAT:
        name = instance.replace(":", "_")
        rows = (folder / f"{name}.csv").read_text().splitlines()
        assert len(rows) == 1 + 4
        raws = sorted(p.name for p in (folder / "raw" / name).iterdir())
        assert len(raws) == 4, raws
    for failed in summary["failed_points"]:
        assert failed["error"], failed
    raw = [json.loads(p.read_text()) for p in folder.glob("raw/*/*.json")
           if not p.name.endswith(".failed.json")]
    assert all(r["completed"] + r["failed"] == r["num_prompts"] for r in raw)
    assert any(s["instance"] == "lab-a100:18100" and "pooling" in s["reason"]
               for s in summary["skipped"]), summary["skipped"]
    print(json.dumps({k: summary[k] for k in ("points", "knees", "failed_points")}, indent=1))


def cached_facts(host):
    """A host's facts in ansible.cfg's jsonfile cache (.cache/facts). ansible-core 2.19
    names the file with a serialization prefix (s1_<host>) and keeps the facts as a JSON
    string under "__payload__", each tagged value as {"value", "tags", "__ansible_type"}."""
    files = [p for p in (ROOT / ".cache/facts").iterdir() if p.name.split("_", 1)[-1] == host]
    assert len(files) == 1, files
    data = json.loads(files[0].read_text())
    payload = data.get("__payload__", data)
    facts = json.loads(payload) if isinstance(payload, str) else payload
    return {k: untag(v) for k, v in facts.items()}


def untag(value):
    if isinstance(value, dict):
        if "__ansible_type" in value and "value" in value:
            return untag(value["value"])
        return {k: untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [untag(v) for v in value]
    return value


def test_knee_facts_are_cached(run):
    facts = cached_facts("lab-h200")
    assert "lab-h200:18000" in facts["fleet_benchmark_knee"]
    assert isinstance(facts["benchmark_knee_rps"], dict)
