"""The benchmark run's folder (gpufleet.bench_report and plugins/modules/vllm_bench_report.py):
raw results, CSV per instance, PNG plots, the self-contained HTML report, the knee facts.

The points are built from tests/fixtures/bench/serve-c8-1000x512.json (real key
structure, synthetic values) with a saturating curve whose knee is where the test puts
it, plus one failed point, as plugins/modules/vllm_bench returns them."""
import base64
import csv
import io
import json
import re

import pytest

import vllm_bench_report
from conftest import FIXTURES
from gpufleet import bench as b
from gpufleet import bench_analysis, bench_gpu, bench_results
from gpufleet import bench_report as r
from helpers import run_module

FIXTURE = FIXTURES / "bench" / "serve-c8-1000x512.json"
PNG = b"\x89PNG\r\n\x1a\n"
C = [1, 2, 4, 8, 16, 32]


def result(instance, c, tput, input_len, output_len=512, p99_ttft=100.0):
    data = json.loads(FIXTURE.read_text())
    req = tput / output_len
    mean = 1000.0 * c / req
    data.update(max_concurrency=c, output_throughput=tput, request_throughput=req,
                completed=10 * c, failed=0, instance=instance, input_len=str(input_len),
                output_len=str(output_len), mean_e2el_ms=mean, median_e2el_ms=mean,
                p50_e2el_ms=mean, p90_e2el_ms=1.05 * mean, p99_e2el_ms=1.1 * mean,
                p99_ttft_ms=p99_ttft, request_goodput=None)
    return data


def ok_point(instance, host, c, tput, input_len, **kw):
    data = result(instance, c, tput, input_len, **kw)
    return {"instance": instance, "host": host, "status": "ok", "result": data,
            "row": bench_results.point_from_result(data), "error": None, "log_tail": "",
            "gpu": {"sampled": True, "source": "nvml", "reason": None,
                    "devices": [{"index": 0, "samples": 5, "util_mean": 50.0, "util_max": 90.0,
                                 "mem_util_mean": 35.0, "mem_util_max": 61.0,
                                 "fb_max_mib": 70000.0, "power_mean_w": 400.0}]},
            "command": ["bench", "serve"]}


def failed(instance, host, c, input_len, error):
    return {"instance": instance, "host": host, "status": "failed", "error": error,
            "row": bench_results.failed_point(c, input_len, 512, error, instance), "log_tail": "Traceback...",
            "gpu": bench_gpu.summarise_gpu_samples([], None, None), "command": ["bench", "serve"]}


def run_points():
    """h1 (2 pairs, knee at 8, a TTFT cliff at 32 for the long pair, one failed point) and
    h2 (the lab's two concurrency levels: no knee)."""
    points = []
    for inp in (1000, 3584):
        for c in C:
            if inp == 3584 and c == 32:
                continue
            ttft = 5000.0 if (inp == 3584 and c == 16) else 100.0
            points.append(ok_point("h1:8000", "h1", c, 100.0 * min(c, 8) + 0.5 * c, inp,
                                   p99_ttft=ttft))
    points.append(failed("h1:8000", "h1", 32, 3584, "timed out after 600 s (the point's time limit)"))
    for c in (1, 2):
        p = ok_point("h2:8000", "h2", c, 40.0 * c, 32, output_len=16)
        p["gpu"] = bench_gpu.summarise_gpu_samples([], None, None)
        points.append(p)
    return points


GPU = {"present": True, "driver_version": "580.95.05", "cuda_driver_version": "13.0",
       "devices": [{"name": "NVIDIA H200"}] * 8}
INSTANCES = [
    {"instance": "h1:8000", "host": "h1", "container": "vllm-m", "model": "Org/M",
     "served_model_name": "Org/M", "image": "vllm/vllm-openai:v0.32.0",
     "settings": {"tensor_parallel_size": 1, "max_model_len": 4096, "max_num_seqs": 256,
                  "dtype": "bfloat16"}, "max_model_len": 4096,
     "notes": ["(10000, 512) clipped to (3584, 512): input 10000 + output 512 = 10512 > max_model_len 4096"],
     "gpu_facts": GPU},
    {"instance": "h2:8000", "host": "h2", "container": "vllm-m", "model": "Org/M",
     "served_model_name": "Org/M", "image": "gpufleet/vllm-cpu:lab",
     "settings": {"tensor_parallel_size": 1, "max_model_len": 2048}, "max_model_len": 2048,
     "notes": [], "gpu_facts": {"present": False}},
]
SKIPPED = [{"host": "h3", "container": "vllm-e", "instance": "h3:8100",
            "reason": "runner pooling: vllm bench serve measures text generation"}]


@pytest.fixture(scope="module")
def report():
    return r.build_report(run_points(), INSTANCES, SKIPPED, "20261202T170000Z",
                          {"preset": "default"})


def test_files_are_all_there(report):
    files = report["files"]
    for name in ("h1_8000", "h2_8000"):
        assert f"{name}.csv" in files
        for plot in ("throughput", "latency-vs-concurrency", "latency-vs-input"):
            assert files[f"{name}-{plot}.png"].startswith(PNG)
    raw = [f for f in files if f.startswith("raw/")]
    assert len(raw) == len(run_points())
    failed_raw = json.loads(files["raw/h1_8000/c32-in3584-out512.failed.json"])
    assert "timed out" in failed_raw["error"] and failed_raw["log_tail"]
    assert json.loads(files["raw/h1_8000/c8-in1000-out512.json"])["max_concurrency"] == 8


def test_csv_rows(report):
    rows = list(csv.DictReader(io.StringIO(report["files"]["h1_8000.csv"].decode())))
    assert len(rows) == 2 * len(C)
    assert list(rows[0]) == list(bench_results.ROW_FIELDS)
    statuses = {(row["input_len"], row["concurrency"]): row["status"] for row in rows}
    assert statuses[("3584", "32")] == "failed"
    assert sum(s == "ok" for s in statuses.values()) == 2 * len(C) - 1


def test_html_is_self_contained_with_the_table_and_images(report):
    html = report["files"]["report.html"].decode()
    assert "<table id='fleet'>" in html
    for cell in ("8x H200", "580.95.05", "13.0", "vllm/vllm-openai:v0.32.0", "Org/M",
                 "tp=1 len=4096 seqs=256 bfloat16"):
        assert cell in html
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert len(images) == 6
    assert all(base64.b64decode(i).startswith(PNG) for i in images)
    assert "http://" not in html and "https://" not in html and "<script" not in html
    assert "clipped to (3584, 512)" in html
    assert "timed out after 600 s" in html
    assert "runner pooling" in html
    assert "no GPU on this host: no utilisation sampled" in html
    assert "util 50.0% mean" in html
    assert "memory bandwidth 35.0% mean / 61.0% max" in html
    assert "kneed_concave_increasing" in html and "p99_ttft_jump" in html


def test_summary_knee_cliff_and_facts(report):
    s = report["summary"]
    assert s["points"] == {"total": len(run_points()), "ok": len(run_points()) - 1, "failed": 1}
    h1 = [g for g in s["groups"] if g["instance"] == "h1:8000"]
    assert [g["knee"]["concurrency"] for g in h1] == [8, 8]
    long_pair = next(g for g in h1 if g["input_len"] == 3584)
    # what ran, level by level, with the failed point among them
    assert {"concurrency": 32, "status": "failed"} in long_pair["ran"]
    assert sum(len(g["ran"]) for g in s["groups"]) == s["points"]["total"]
    # the TTFT step at 16 is a finding; the service stops delivering at 32 (the point failed)
    assert long_pair["cliff"]["concurrency"] == 32 and long_pair["cliff"]["rule"] == "point_failed"
    assert (16, "p99_ttft_jump") in [(f["concurrency"], f["rule"]) for f in long_pair["findings"]]
    assert s["knee_facts"]["h1"]["h1:8000"]["concurrency"] == 8
    assert s["knee_facts"]["h2"]["h2:8000"]["concurrency"] is None
    from gpufleet.gateway import backend_name
    # h2 leaving: h1's knee carries the model; h1 leaving: h2 has no knee, so nothing.
    assert s["knee_rps_by_host"] == {"h1": {}, "h2": {backend_name("Org/M"): pytest.approx(
        (800 + 4) / 512, abs=1e-4)}}
    assert s["failed_points"][0]["error"].startswith("timed out")


def test_write_run_never_overwrites(tmp_path, report):
    folder = r.write_run(tmp_path, "20261202T170000Z", report["files"])
    assert (tmp_path / "20261202T170000Z" / "report.html").is_file()
    assert str(folder).endswith("20261202T170000Z")
    with pytest.raises(b.BenchError, match="exists already"):
        r.write_run(tmp_path, "20261202T170000Z", report["files"])
    with pytest.raises(b.BenchError, match="folder name"):
        r.write_run(tmp_path, "../x", report["files"])


def test_gpu_text():
    assert r.gpu_text(GPU) == "8x H200"
    assert r.gpu_text({"present": False}) == "-"


ARGS = {"run_id": "20261202T170000Z", "instances": INSTANCES, "skipped": SKIPPED,
        "matrix": {"preset": "lab"}}


def test_module_writes_the_folder(tmp_path, monkeypatch):
    args = dict(ARGS, output_dir=str(tmp_path / "benchmarks"), points=run_points())
    result, failed = run_module(vllm_bench_report.main, args, monkeypatch)
    assert not failed and result["changed"]
    folder = tmp_path / "benchmarks" / "20261202T170000Z"
    assert result["path"] == str(folder)
    for rel in result["files"]:
        assert (folder / rel).is_file()
    assert (folder / "h1_8000-throughput.png").read_bytes().startswith(PNG)
    assert result["knee_facts"]["h1"]["h1:8000"]["concurrency"] == 8
    again, failed = run_module(vllm_bench_report.main, args, monkeypatch)
    assert failed and "exists already" in again["msg"]


def test_module_check_mode_writes_nothing(tmp_path, monkeypatch):
    args = dict(ARGS, output_dir=str(tmp_path / "benchmarks"), points=run_points())
    result, failed = run_module(vllm_bench_report.main, args, monkeypatch, check_mode=True)
    assert not failed and result["path"] is None and "report.html" in result["files"]
    assert not (tmp_path / "benchmarks").exists()


def test_module_refuses_a_point_of_an_unknown_instance(tmp_path, monkeypatch):
    points = run_points()
    points[0] = dict(points[0], instance="nowhere:1")
    result, failed = run_module(vllm_bench_report.main,
                                dict(ARGS, output_dir=str(tmp_path), points=points), monkeypatch)
    assert failed and "nowhere:1" in result["msg"]


def _figures(monkeypatch, groups, instance="h1:8000"):
    """plot_files with the figures kept (name: matplotlib Figure) instead of PNG bytes."""
    kept = []
    real = r._png

    def keep(fig, plt):
        kept.append(fig)
        return real(fig, plt)
    monkeypatch.setattr(r, "_png", keep)
    names = list(r.plot_files(instance, groups))
    return dict(zip(names, kept))


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_an_axis_with_one_measured_value_says_so_instead_of_a_curve(monkeypatch):
    """#34 item 7: the lab's run (one pair, (32, 16)) has one input length: the latency-vs-
    input plot says so and draws no one-point lines; the concurrency plots, with 3 levels,
    draw their curves. Control: with two input lengths the input plot draws its lines."""
    one_pair = bench_analysis.analyse([ok_point("h1:8000", "h1", c, 100.0 * c, 32)["row"] for c in (1, 2, 4)])
    figs = _figures(monkeypatch, one_pair)
    by_input = figs["h1_8000-latency-vs-input.png"]
    assert all(not ax.lines for ax in by_input.axes)
    assert _texts(by_input) == ["one input length measured (32):\nno curve to draw; measure two or more"] * 2
    # no stray tick at the one value (a single column to read) and no empty scale
    assert all(len(ax.get_xticks()) == 0 and len(ax.get_yticks()) == 0 for ax in by_input.axes)
    assert all(ax.lines for ax in figs["h1_8000-latency-vs-concurrency.png"].axes)
    assert not _texts(figs["h1_8000-throughput.png"])
    two_pairs = bench_analysis.analyse([ok_point("h1:8000", "h1", c, 100.0 * c, n)["row"] for c in (1, 2, 4) for n in (32, 64)])
    control = _figures(monkeypatch, two_pairs)["h1_8000-latency-vs-input.png"]
    assert all(ax.lines for ax in control.axes) and not _texts(control)


REPORTED = FIXTURES / "bench" / "reported-34-7" / "curve"


def test_summary_and_matrix_line_list_what_ran_with_the_roles_empty_axes():
    """#34 item 7: the role passes matrix {preset: lab, concurrency: [], pairs: []} (its
    fleet_benchmark_concurrency / _pairs, empty for "the preset's"), and summary.json and
    the report's Matrix line printed `concurrency: []` though four levels ran. Now both
    list the levels and pairs that ran (from the points), per instance too, and the asked
    axes resolved to the preset's; the lab's one input length is said in the report."""
    points = []
    for path in sorted(REPORTED.glob("*.json")):
        data = json.loads(path.read_text())
        points.append({"instance": data["instance"], "status": "ok", "result": data,
                       "row": bench_results.point_from_result(data), "error": None,
                       "gpu": bench_gpu.summarise_gpu_samples([], None, None)})
    points[0]["preemptions"] = {"count": None, "reason": "http://x/metrics could not be read"}
    points[1]["row"] = dict(points[1]["row"], preemptions=0.0)
    instance = dict(INSTANCES[1], instance="reported-34-7:18000", host="lab-h200")
    as_the_role_passes = {"preset": "lab", "concurrency": [], "pairs": [], "min_prompts": 50,
                          "percentiles": [50, 90, 99], "goodput": {}, "point_timeout": 900}
    report = r.build_report(points, [instance], (), "20261205T000000Z", as_the_role_passes,
                            with_plots=False)
    matrix = report["summary"]["matrix"]
    assert matrix["concurrency"] == [1, 4, 16, 32] == list(b.LAB_CONCURRENCY)
    assert matrix["pairs"] == [[32, 16]]
    assert matrix["instances"] == {"reported-34-7:18000": {"concurrency": [1, 4, 16, 32],
                                                           "pairs": [[32, 16]]}}
    assert matrix["asked"] == {"concurrency": [1, 4, 16, 32], "pairs": [[32, 16]]}
    assert matrix["preset"] == "lab" and matrix["min_prompts"] == 50
    saved = json.loads(report["files"]["summary.json"])
    assert saved["matrix"]["concurrency"] == [1, 4, 16, 32]
    html = report["files"]["report.html"].decode()
    assert ("Matrix (what ran): concurrency <code>1, 4, 16, 32</code> x (input, output) "
            "<code>(32, 16)</code> on 1 instance(s)") in html
    assert "&quot;concurrency&quot;: []" not in html and '"concurrency": []' not in html
    assert "Ran: concurrency 1, 4, 16, 32 x (input, output) (32, 16)" in html
    assert ("Plot: latency vs input length: one input length measured (32), no curve drawn"
            in html)
    assert "p99_ttft_jump, note]" in html  # the 3.6x step at 4 is a note, not the cliff
    assert "<th>preempted</th>" in html and "<td>0</td>" in html
    assert "<td>- (http://x/metrics could not be read)</td>" in html
    group = report["summary"]["groups"][0]
    assert group["knee"]["concurrency"] == 16 and group["cliff"] is None
    # the run's own matrix, with explicit axes and a clipped pair, lists what ran
    s = r.build_report(run_points(), INSTANCES, SKIPPED, "x",
                       {"preset": "default", "concurrency": C, "pairs": [[1000, 512], [10000, 512]]},
                       with_plots=False)["summary"]["matrix"]
    assert s["concurrency"] == C and s["pairs"] == [[32, 16], [1000, 512], [3584, 512]]
    assert s["instances"]["h2:8000"] == {"concurrency": [1, 2], "pairs": [[32, 16]]}
    assert s["asked"]["pairs"] == [[1000, 512], [10000, 512]]


def test_axis_notes():
    two_pairs = bench_analysis.analyse([ok_point("h1:8000", "h1", c, 100.0 * c, n)["row"]
                           for c in (1, 2, 4) for n in (32, 64)])
    assert r.axis_notes(two_pairs) == []
    one_level = bench_analysis.analyse([ok_point("h1:8000", "h1", 4, 400.0, n)["row"] for n in (32, 64)])
    assert r.axis_notes(one_level) == [
        "throughput and latency vs concurrency: one concurrency level measured (4), no curve "
        "drawn; measure two or more"]
