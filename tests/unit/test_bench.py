"""Load-test analysis (gpufleet.bench): the matrix, reading saved `vllm bench serve`
results, the knee and the cliff.

The one result file, tests/fixtures/bench/serve-c8-1000x512.json, has the exact key
structure vLLM writes but synthetic values (tests/fixtures/bench/SOURCES.md). The
curves are synthetic with a knee and a cliff put where the test says; every expected
number is derived in the test from the curve, not read back from the code under test.
"""
import csv
import re
import io
import json
import shutil

import pytest

from conftest import FIXTURES
from gpufleet import bench as b
from gpufleet import bench_analysis, bench_results

FIXTURE = FIXTURES / "bench" / "serve-c8-1000x512.json"
C = [1, 2, 4, 8, 16, 32, 64]
NOISE = dict(zip(C, [1.01, 0.98, 1.01, 1.02, 0.99, 1.01, 0.98]))


def result(c, out_tput, output_len=512, input_len=1000, p99_ttft=100.0, p99_e2el=None,
           failed=0, completed=None, goodput=None, request_rate="inf", instance="i0"):
    """A saved result with every key vLLM writes (as in the fixture), consistent with a
    closed loop: request throughput = output throughput / output_len, mean E2E by Little's
    law (concurrency / request throughput), p99 E2E 10% above the mean unless given."""
    data = json.loads(FIXTURE.read_text())
    req_tput = out_tput / output_len
    mean_e2el = 1000.0 * c / req_tput if req_tput else 0.0
    completed = 10 * c if completed is None else completed
    data.update(max_concurrency=c, request_rate=request_rate, completed=completed,
                failed=failed, request_throughput=req_tput, output_throughput=out_tput,
                request_goodput=goodput, instance=instance, input_len=str(input_len),
                output_len=str(output_len))
    data.update(mean_e2el_ms=mean_e2el, median_e2el_ms=mean_e2el, p50_e2el_ms=mean_e2el,
                p90_e2el_ms=1.05 * mean_e2el,
                p99_e2el_ms=1.1 * mean_e2el if p99_e2el is None else p99_e2el,
                p99_ttft_ms=p99_ttft)
    return data


def rows(curve, **kw):
    """Rows for C, output throughput from curve(c)."""
    return [bench_results.point_from_result(result(c, curve(c), **kw)) for c in C]


def one(points, **kw):
    groups = bench_analysis.analyse(points, **kw)
    assert len(groups) == 1
    return groups[0]


def saturating(at):
    """Throughput k * min(c, at) plus a tiny slope: the knee is at `at`."""
    return lambda c: 100.0 * min(c, at) + 0.5 * c


# ---------------------------------------------------------------------------
# The result file: vLLM's keys
# ---------------------------------------------------------------------------

def test_the_fixture_has_every_key_the_parser_requires_and_vllms_own_top_level_keys():
    data = json.loads(FIXTURE.read_text())
    assert set(bench_results.REQUIRED_KEYS) <= set(data)
    # main_async()'s setup keys and the lists --save-detailed would keep are as vLLM leaves them
    for key in ("date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id",
                "num_prompts", "burstiness", "latencies", "queue_times", "rtfx"):
        assert key in data
    for key in ("ttfts", "itls", "generated_texts", "errors", "input_lens", "start_times"):
        assert key not in data


def test_point_from_the_fixture_file():
    row = bench_results.point_from_result(FIXTURE)
    assert set(row) == set(bench_results.ROW_FIELDS)
    assert (row["instance"], row["input_len"], row["output_len"], row["concurrency"]) == \
        ("gpu01-vllm0", 1000, 512, 8)
    assert row["status"] == "ok" and row["error"] is None and row["source"] == str(FIXTURE)
    assert (row["completed"], row["failed"], row["success_rate"]) == (80, 0, 1.0)
    assert row["request_throughput"] == pytest.approx(80 / 58.9)
    assert row["output_throughput"] == pytest.approx(80 * 512 / 58.9)
    assert (row["p50_ttft_ms"], row["p90_ttft_ms"], row["p99_ttft_ms"]) == (91.2, 121.5, 160.3)
    assert (row["p99_tpot_ms"], row["p99_itl_ms"], row["p99_e2el_ms"]) == (11.71, 17.8, 5932.4)
    assert row["request_goodput"] is None and row["request_rate"] == "inf"
    # closed loop: offered = 8 slots / 5.8186 s mean E2E
    assert row["offered_request_rate"] == pytest.approx(8 / 5.8186)


def test_the_fixture_alone_has_no_knee_and_no_cliff():
    group = one([bench_results.point_from_result(FIXTURE)])
    assert group["knee"] is None and "only 1 measured point" in group["why_no_knee"]
    assert group["cliff"] is None and group["why_no_cliff"].startswith("no cliff")


@pytest.mark.parametrize("key", bench_results.REQUIRED_KEYS)
def test_a_missing_required_key_is_named_with_the_file(tmp_path, key):
    data = json.loads(FIXTURE.read_text())
    del data[key]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as err:
        bench_results.point_from_result(path)
    assert str(path) in str(err.value) and repr(key) in str(err.value)


def test_default_percentiles_are_refused_with_the_flags_to_add(tmp_path):
    """vLLM's defaults (ttft,tpot,itl; p99 only) lack e2el and p50/p90."""
    data = json.loads(FIXTURE.read_text())
    for key in [k for k in data if k.startswith(("p50_", "p90_")) or "_e2el_" in k]:
        del data[key]
    with pytest.raises(ValueError, match="--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99"):
        bench_results.point_from_result(data)


def test_unknown_top_level_keys_are_metadata_and_ignored():
    data = json.loads(FIXTURE.read_text())
    data["tp"] = "2"  # --metadata tp=2
    assert bench_results.point_from_result(data)["concurrency"] == 8


@pytest.mark.parametrize("change, message", [
    ({"max_concurrency": None}, "without --max-concurrency|no --max-concurrency"),
    ({"completed": 1.5}, "'completed' is 1.5, not a count"),
    ({"output_throughput": "fast"}, "'output_throughput' is 'fast', not a number"),
    ({"request_rate": None}, "'request_rate' is None"),
    ({"input_len": "1k"}, "input_len is '1k'"),
])
def test_bad_values_are_refused(change, message):
    data = json.loads(FIXTURE.read_text())
    data.update(change)
    with pytest.raises(ValueError, match=message):
        bench_results.point_from_result(data, source="run-7.json")


def test_lengths_come_from_the_caller_or_metadata_and_must_agree():
    data = json.loads(FIXTURE.read_text())
    for key in ("input_len", "output_len", "instance"):
        del data[key]
    with pytest.raises(ValueError, match="input_len is None"):
        bench_results.point_from_result(data)
    row = bench_results.point_from_result(data, instance="h1", input_len=1000, output_len=512)
    assert (row["instance"], row["input_len"], row["output_len"]) == ("h1", 1000, 512)
    with pytest.raises(ValueError, match="'input_len' is '1000' but 2000 was passed"):
        bench_results.point_from_result(json.loads(FIXTURE.read_text()), input_len=2000)


def test_files_that_are_not_one_result_are_refused(tmp_path):
    appended = tmp_path / "appended.json"
    appended.write_text(FIXTURE.read_text() + "\n" + FIXTURE.read_text())
    with pytest.raises(ValueError, match="--append-result") as err:
        bench_results.load_result(appended)
    assert str(appended) in str(err.value)
    array = tmp_path / "array.json"
    array.write_text("[]")
    with pytest.raises(ValueError, match="holds a JSON list"):
        bench_results.load_result(array)
    with pytest.raises(ValueError, match="cannot be read"):
        bench_results.load_result(tmp_path / "absent.json")
    copy = tmp_path / "copy.json"
    shutil.copy(FIXTURE, copy)
    assert bench_results.load_result(copy) == json.loads(FIXTURE.read_text())


# ---------------------------------------------------------------------------
# The knee
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("at", [2, 8, 16, 32])
def test_knee_where_throughput_saturates(at):
    group = one(rows(saturating(at)))
    assert group["knee"]["concurrency"] == at
    assert group["knee"]["rule"] == "kneed_concave_increasing"
    assert f"concurrency {at}" in group["knee"]["detail"] and group["why_no_knee"] is None


def test_knee_on_a_smooth_diminishing_returns_curve():
    """Throughput c / (1 + c / 8): concave everywhere; the bend is well inside the range."""
    group = one(rows(lambda c: 800.0 * c / (1 + c / 8)))
    assert group["knee"]["concurrency"] in (8, 16)


@pytest.mark.parametrize("curve, reason", [
    (lambda c: 100.0 * c, "keeps growing without a bend"),          # linear scaling
    (lambda c: 100.0 * c * NOISE[c], "keeps growing"),               # linear, +-2% noise
    (lambda c: 500.0 + 0.1 * c, "flat"),                              # saturated from 1
    (lambda c: float(c * c), "first point"),                          # convex
    # falling: more concurrency costs throughput from 8 on (a cliff), flat below it
    (lambda c: 1000.0 - 10 * c, "(below the cliff at concurrency 8)"),
])
def test_curves_without_a_knee_say_why(curve, reason):
    group = one(rows(curve))
    assert group["knee"] is None and reason in group["why_no_knee"]


def test_no_knee_below_three_measured_points():
    assert "only 2 measured point" in one(rows(saturating(8))[:2])["why_no_knee"]
    # failed points do not count: 2 measured + 5 failed
    points = rows(saturating(8))[:2] + [
        {"concurrency": c, "input_len": 1000, "output_len": 512, "instance": "i0",
         "error": "timed out"} for c in C[2:]]
    assert "only 2 measured point" in one(points)["why_no_knee"]


def test_three_points_with_a_sharp_bend_have_a_knee_a_mild_one_none():
    sharp = [bench_results.point_from_result(result(c, t)) for c, t in ((1, 100.0), (2, 200.0), (4, 200.0))]
    mild = [bench_results.point_from_result(result(c, t)) for c, t in ((1, 100.0), (2, 180.0), (4, 200.0))]
    assert one(sharp)["knee"]["concurrency"] == 2
    assert one(mild)["knee"] is None


# ---------------------------------------------------------------------------
# The cliff
# ---------------------------------------------------------------------------

def test_saturation_alone_is_not_a_cliff():
    """Past the knee E2E grows with concurrency as Little's law says: no jump rule fires."""
    group = one(rows(saturating(8)))
    assert group["cliff"] is None and group["findings"] == []
    assert "the service delivered at every one of the 7 point(s), concurrency 1 to 64" in group["why_no_cliff"]
    # p99 E2E doubles per doubling past the knee: explained 2x, so even p99_jump 1.5 holds
    assert one(rows(saturating(8)), p99_jump=1.5)["cliff"] is None
    # steps of 4x concurrency past the knee: p99 E2E grows 4x, explained 4x
    sparse = [bench_results.point_from_result(result(c, saturating(4)(c))) for c in (1, 4, 16, 64)]
    assert one(sparse)["cliff"] is None


def test_failed_requests_at_32():
    points = [bench_results.point_from_result(result(c, saturating(8)(c), failed=3 if c >= 32 else 0))
              for c in C]
    group = one(points)
    assert group["cliff"]["concurrency"] == 32 and group["cliff"]["rule"] == "failed_requests"
    assert "3 of 323 requests failed" in group["cliff"]["detail"]
    assert [f["concurrency"] for f in group["findings"]] == [32, 64]
    assert group["knee"]["concurrency"] == 8


def test_a_p99_jump_at_16_is_a_finding_and_the_errors_at_32_the_cliff():
    """#34 item 7: a latency step is never the cliff; the service stops delivering where
    requests fail. Control: the same curve without the failures has no cliff at all."""
    def point(c, failing=True):
        tput = saturating(8)(c)
        little = 1000.0 * c / (tput / 512)  # ms
        return bench_results.point_from_result(result(c, tput, failed=3 if failing and c >= 32 else 0,
                                          p99_e2el=little * (1.1 if c < 16 else 5.0)))
    group = one([point(c) for c in C])
    assert (group["cliff"]["concurrency"], group["cliff"]["rule"]) == (32, "failed_requests")
    assert [(f["concurrency"], f["rule"]) for f in group["findings"]][:2] == [
        (16, "p99_e2el_jump"), (32, "failed_requests")]
    assert group["knee"]["concurrency"] == 8  # below the cliff
    control = one([point(c, failing=False) for c in C])
    assert control["cliff"] is None and "latency steps are findings, not a cliff: 16" in control["why_no_cliff"]


def test_p99_jump_rule_bound_is_exact():
    """Linear scaling: explained growth 1, so p99 TTFT may double (p99_jump 2.0) but not more."""
    def group(factor):
        points = [bench_results.point_from_result(result(c, 100.0 * c, p99_ttft=100.0 * (factor if c == 16 else 1.0)))
                  for c in C]
        return one(points)
    assert group(2.0)["findings"] == []
    step = group(2.01)["findings"][0]
    assert (step["concurrency"], step["rule"]) == (16, "p99_ttft_jump")
    assert "more than 2 x the 1.00x" in step["detail"]
    assert group(2.01)["cliff"] is None  # throughput still scales: a finding, not a cliff
    assert one([bench_results.point_from_result(result(c, 100.0 * c, p99_ttft=100.0 * (2.01 if c == 16 else 1.0)))
                for c in C], p99_jump=3.0)["findings"] == []


def test_throughput_falling_is_a_cliff_and_the_knee_is_below_it():
    """Output throughput rises to concurrency 16 then falls 20%: the cliff is at 32
    (throughput_falls), the knee is found on the points below it. Control: a dip within 5%
    is no cliff."""
    def curve(c):
        return {1: 100.0, 2: 190.0, 4: 340.0, 8: 520.0, 16: 600.0, 32: 480.0, 64: 300.0}[c]
    group = one(rows(curve))
    assert (group["cliff"]["concurrency"], group["cliff"]["rule"]) == (32, "throughput_falls")
    assert "20% below the 600 tok/s of concurrency 16" in group["cliff"]["detail"]
    assert group["knee"] and group["knee"]["concurrency"] < 32
    flat = one(rows(lambda c: {1: 100.0, 2: 190.0, 4: 340.0, 8: 520.0, 16: 600.0,
                                32: 580.0, 64: 590.0}[c]))
    assert flat["cliff"] is None


def preempting(counts):
    """Rows of the saturating(8) curve with vllm_bench's preemption counts per level."""
    return [dict(bench_results.point_from_result(result(c, saturating(8)(c))), preemptions=n)
            for c, n in zip(C, counts)]


def test_preemptions_starting_are_the_cliff():
    """vLLM preempts requests (KV cache full) from concurrency 32 on: the cliff
    (preemptions_start) though throughput still rises; the knee is below it. Controls: zero
    preemptions counted is no cliff and says "no preemption"; unread counts (None, the
    recorded results) are no rule and say nothing about preemption."""
    group = one(preempting([0, 0, 0, 0, 0, 6, 40]))
    assert (group["cliff"]["concurrency"], group["cliff"]["rule"]) == (32, "preemptions_start")
    assert "preempted 6 request(s) during the point at concurrency 32" in group["cliff"]["detail"]
    assert "vllm:num_preemptions_total" in group["cliff"]["detail"]
    assert group["knee"]["concurrency"] == 8
    none = one(preempting([0] * 7))
    assert none["cliff"] is None and "no preemption" in none["why_no_cliff"]
    unread = one(preempting([None] * 7))
    assert unread["cliff"] is None and "preemption" not in unread["why_no_cliff"]


def test_a_failed_point_is_a_cliff():
    points = rows(lambda c: 100.0 * c)[:4] + [
        {"instance": "i0", "input_len": 1000, "output_len": 512, "concurrency": 16,
         "error": "timed out after 900 s"}]
    group = one(points)
    assert group["cliff"] == {"concurrency": 16, "rule": "point_failed",
                              "detail": "the run at concurrency 16 produced no result: timed out after 900 s"}
    assert group["rows"][-1]["status"] == "failed"


def test_all_points_failed():
    points = [bench_results.failed_point(c, 32, 16, "connection refused", instance="lab") for c in (1, 2)]
    group = one(points)
    assert group["knee"] is None and "only 0 measured point" in group["why_no_knee"]
    assert (group["cliff"]["concurrency"], group["cliff"]["rule"]) == (1, "point_failed")


def test_achieved_rate_below_offered_is_a_note_not_the_cliff():
    """Closed loop: offered = c / mean E2E. A run whose throughput is 60% of that measured
    less load than its concurrency: a note naming the figures; the cliff stays where the
    service stops delivering (none here: throughput rises and nothing fails)."""
    data = result(8, 800.0)
    data["request_throughput"] *= 0.6
    row = bench_results.point_from_result(data)
    group = one(rows(lambda c: 100.0 * c)[:3] + [row])
    note = next(f for f in group["findings"] if f["rule"] == "rate_below_offered")
    assert note["concurrency"] == 8 and "60% of the" in note["detail"]
    assert "a note, not a cliff" in note["detail"]
    assert group["cliff"] is None and "rate_below_offered at 8" in group["why_no_cliff"]
    # open loop: offered is the configured rate (capped by the closed-loop one)
    slow = bench_results.point_from_result(result(8, 800.0, request_rate=1.0))
    assert slow["offered_request_rate"] == 1.0
    assert one([slow])["findings"] == []  # 800/512 = 1.56 req/s >= 1.0 offered


def test_goodput_below_offered_is_a_note():
    tput = 800.0
    group = one([bench_results.point_from_result(result(8, tput, goodput=0.5 * tput / 512))])
    assert [f["rule"] for f in group["findings"]] == ["goodput_below_offered"]
    assert group["cliff"] is None


def test_a_synthetic_single_point_has_neither():
    group = one([bench_results.point_from_result(result(4, 400.0))])
    assert group["knee"] is None and group["cliff"] is None


# ---------------------------------------------------------------------------
# Grouping, errors, CSV
# ---------------------------------------------------------------------------

def test_groups_by_instance_and_pair():
    points = rows(saturating(8), instance="b") + rows(lambda c: 100.0 * c, instance="a") + \
        rows(saturating(4), instance="a", input_len=50, output_len=20)
    groups = bench_analysis.analyse(points)
    assert [(g["instance"], g["input_len"], g["output_len"]) for g in groups] == \
        [("a", 50, 20), ("a", 1000, 512), ("b", 1000, 512)]
    assert [g["knee"] and g["knee"]["concurrency"] for g in groups] == [4, None, 8]
    assert [r["concurrency"] for r in groups[0]["rows"]] == C


def test_analyse_refuses_bad_points():
    with pytest.raises(ValueError, match="two results for instance i0, pair \\(1000, 512\\) at concurrency 4"):
        bench_analysis.analyse(rows(saturating(8)) + [bench_results.point_from_result(result(4, 400.0))])
    with pytest.raises(ValueError, match="has an error and metrics"):
        bench_analysis.analyse([dict(bench_results.point_from_result(result(4, 400.0)), error="timed out")])
    with pytest.raises(ValueError, match="neither a row"):
        bench_analysis.analyse([{"concurrency": 4}])
    with pytest.raises(ValueError, match="p99_jump"):
        bench_analysis.analyse([], p99_jump=0.5)
    with pytest.raises(ValueError, match="a failed point needs an error"):
        bench_results.failed_point(4, 32, 16, "")


def test_rows_to_csv_round_trip():
    group = one(rows(saturating(8))[:3] + [bench_results.failed_point(8, 1000, 512, "timed out", instance="i0")])
    text = bench_analysis.rows_to_csv(group["rows"])
    read = list(csv.DictReader(io.StringIO(text)))
    assert list(read[0]) == list(bench_results.ROW_FIELDS) and len(read) == 4
    assert [r["concurrency"] for r in read] == ["1", "2", "4", "8"]
    assert float(read[2]["output_throughput"]) == pytest.approx(saturating(8)(4))
    assert read[3]["status"] == "failed" and read[3]["error"] == "timed out"
    assert read[3]["p99_ttft_ms"] == "" and read[0]["request_goodput"] == ""
    with pytest.raises(ValueError, match="not ROW_FIELDS"):
        bench_analysis.rows_to_csv([{"concurrency": 1, "colour": "red"}])


# ---------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------

def test_default_matrix_without_a_limit():
    m = b.matrix_points()
    assert m["notes"] == [] and len(m["points"]) == 5 * 7
    assert m["points"][:2] == [{"input_len": 1000, "output_len": 512, "concurrency": 1},
                               {"input_len": 1000, "output_len": 512, "concurrency": 2}]


def test_default_matrix_clipped_to_32k():
    m = b.matrix_points(max_model_len=32768)
    pairs = sorted({(p["input_len"], p["output_len"]) for p in m["points"]})
    assert pairs == [(50, 20), (1000, 128), (1000, 512), (10000, 512), (32256, 512)]
    assert m["notes"] == ["(100000, 512) clipped to (32256, 512): input 100000 + output 512 = "
                          "100512 > max_model_len 32768"]


def test_default_matrix_on_a_2k_model_clips_and_drops_the_repeat():
    m = b.matrix_points(max_model_len=2048)
    pairs = [(p["input_len"], p["output_len"]) for p in m["points"] if p["concurrency"] == 1]
    assert pairs == [(1000, 512), (1536, 512), (1000, 128), (50, 20)]
    assert len(m["notes"]) == 2 and "repeats a pair" in m["notes"][1]


def test_drop_instead_of_clip_and_outputs_that_cannot_fit():
    m = b.matrix_points(max_model_len=2048, overflow="drop")
    assert len({(p["input_len"], p["output_len"]) for p in m["points"]}) == 3
    assert all("dropped" in n for n in m["notes"])
    m = b.matrix_points(pairs=[(32, 16), (10, 600)], concurrency=[2, 1], max_model_len=512)
    assert m["points"] == [{"input_len": 32, "output_len": 16, "concurrency": 1},
                           {"input_len": 32, "output_len": 16, "concurrency": 2}]
    assert "output alone" in m["notes"][0]


def test_lab_preset_fits_a_1k_model():
    m = b.matrix_points(b.LAB_CONCURRENCY, b.LAB_PAIRS, max_model_len=1024)
    assert m["notes"] == [] and len(m["points"]) == 4


def test_lab_preset_shows_the_recorded_knee():
    """The lab preset's levels, taken from the recorded 7-level lab curve, keep its knee:
    enough levels for kneed, and the bend at the same concurrency (16)."""
    rows = [bench_results.point_from_result(p) for p in LAB_KNEE.glob("*.json")]
    subset = [r for r in rows if r["concurrency"] in b.LAB_CONCURRENCY]
    assert len(subset) == len(b.LAB_CONCURRENCY) >= 3
    assert one(subset)["knee"]["concurrency"] == one(rows)["knee"]["concurrency"] == 16


@pytest.mark.parametrize("kwargs, message", [
    ({"concurrency": [0]}, "concurrency level"),
    ({"concurrency": []}, "no concurrency levels"),
    ({"pairs": [(1000,)]}, "a pair is"),
    ({"pairs": [(1000, -1)]}, "output_len"),
    ({"max_model_len": 0}, "max_model_len"),
    ({"overflow": "shrink"}, "overflow"),
])
def test_matrix_refuses_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        b.matrix_points(**kwargs)


# ---------------------------------------------------------------------------
# Recorded lab runs (tests/fixtures/bench/SOURCES.md): real `vllm bench serve` results
# ---------------------------------------------------------------------------

LAB = FIXTURES / "bench" / "lab-2026-12-02"
LAB_KNEE = FIXTURES / "bench" / "lab-2026-12-03" / "curve"
# the same 7-point curve on an idle machine, after a clean-clone CI run (issue #34 item 7)
LAB_IDLE = FIXTURES / "bench" / "lab-2026-12-07" / "curve"


def lab_files(part):
    return sorted((LAB / part).rglob("*.json"))


def _raw_curve(paths):
    """vLLM's saved results of one curve, by concurrency: (the results, the concurrency
    levels, output throughput worked out from each result's own totals)."""
    raws = sorted((json.loads(p.read_text()) for p in paths), key=lambda r: r["max_concurrency"])
    return (raws, [r["max_concurrency"] for r in raws],
            [r["total_output_tokens"] / r["duration"] for r in raws])


def _little_cliffs(raws, p99_jump=2.0):
    """The p99 jump rule worked out here from the raw files, concurrency ascending: the
    first (concurrency, metric) whose p99 grew more than p99_jump x what the growth of
    concurrency over request throughput explains (completed / duration)."""
    raws = sorted(raws, key=lambda r: r["max_concurrency"])
    found = []
    for prev, now in zip(raws, raws[1:]):
        rps_prev = prev["completed"] / prev["duration"]
        rps_now = now["completed"] / now["duration"]
        explained = max(1.0, now["max_concurrency"] / prev["max_concurrency"] * rps_prev / rps_now)
        for metric in ("ttft", "e2el"):
            if now[f"p99_{metric}_ms"] / prev[f"p99_{metric}_ms"] > p99_jump * explained:
                found.append((now["max_concurrency"], f"p99_{metric}_jump"))
    return found


@pytest.mark.parametrize("path", lab_files("preset") + lab_files("curve")
                         + sorted(LAB_KNEE.glob("*.json")) + sorted(LAB_IDLE.glob("*.json")),
                         ids=lambda p: f"{p.parents[1].name}/{p.parent.name}/{p.name}")
def test_recorded_lab_point_reads_as_vllm_wrote_it(path):
    raw = json.loads(path.read_text())
    row = bench_results.point_from_result(path)
    c, inp, out = (int(x[1:]) for x in path.stem.replace("in", "i").replace("out", "o").split("-"))
    assert (row["concurrency"], row["input_len"], row["output_len"]) == (c, inp, out)
    assert row["instance"] == raw["instance"] and row["instance"].startswith("lab-")
    assert row["status"] == "ok" and row["completed"] == raw["num_prompts"] and row["failed"] == 0
    assert row["request_throughput"] == pytest.approx(raw["completed"] / raw["duration"])
    assert row["output_throughput"] == pytest.approx(raw["total_output_tokens"] / raw["duration"])
    assert row["p99_ttft_ms"] == raw["p99_ttft_ms"] > raw["p50_ttft_ms"] > 0


def test_recorded_lab_preset_two_points_per_pair_have_no_knee():
    """The lab preset (c = 1, 2 by (32, 16) and (64, 16), both chat instances) as the CI
    test runs it: 4 groups of 2 points, too few for kneed; the latency steps are the p99 rule's."""
    rows = [bench_results.point_from_result(p) for p in lab_files("preset")]
    groups = bench_analysis.analyse(rows)
    assert sorted((g["instance"], g["input_len"]) for g in groups) == [
        (i, n) for i in ("lab-a10g:18200", "lab-h200:18000") for n in (32, 64)]
    for g in groups:
        assert g["knee"] is None and "only 2 measured point(s)" in g["why_no_knee"]
        raws = [json.loads(p.read_text()) for p in lab_files("preset")
                if json.loads(p.read_text())["instance"] == g["instance"]
                and f"-in{g['input_len']}-" in p.name]
        assert [(f["concurrency"], f["rule"]) for f in g["findings"]] == _little_cliffs(raws)


def test_recorded_lab_curve_lab_h200_c1_to_16():
    """SmolLM2-135M float32 on vLLM 0.32 CPU, lab-h200, (32, 16), c = 1..16: throughput still
    grows at 16 (12.1 -> 55.6 tok/s), so kneed finds no bend; the p99 TTFT rule finds the
    cliff where the figures put it (worked out above from the raw files alone)."""
    from kneed import KneeLocator

    raws, cs, tput = _raw_curve(lab_files("curve"))
    assert cs == [1, 2, 4, 8, 16] and tput == sorted(tput)
    assert KneeLocator(cs, tput, curve="concave", direction="increasing").knee is None
    group = one([bench_results.point_from_result(p) for p in lab_files("curve")])
    assert group["knee"] is None and "on 5 points found none" in group["why_no_knee"]
    expected = _little_cliffs(raws)
    assert expected, "the recorded curve has a p99 jump (the control of this test)"
    assert [(f["concurrency"], f["rule"]) for f in group["findings"]] == expected
    # throughput rises at every step and nothing failed: latency steps, no cliff
    assert group["cliff"] is None and "latency steps are findings, not a cliff" in group["why_no_cliff"]


def test_recorded_lab_curve_lab_h200_c1_to_64_has_its_knee_at_16():
    """The same instance and pair a day later, c = 1..64 (10 to 640 prompts): throughput
    grows x1.22 from 8 to 16 (57.1 -> 69.7 tok/s), then x1.02 to 32 and x1.13 more for
    twice that again (80.4 at 64): the knee is at 16, where kneed puts it on the raw
    figures alone; the cliff is still the p99 TTFT rule's first firing."""
    from kneed import KneeLocator

    raws, cs, tput = _raw_curve(LAB_KNEE.glob("*.json"))
    assert cs == [1, 2, 4, 8, 16, 32, 64] and tput == sorted(tput)
    knee = KneeLocator(cs, tput, curve="concave", direction="increasing").knee
    assert knee == 16
    group = one([bench_results.point_from_result(p) for p in LAB_KNEE.glob("*.json")])
    assert group["knee"]["concurrency"] == knee and group["knee"]["rule"] == "kneed_concave_increasing"
    assert "69.7 tok/s there, 80.4 tok/s at concurrency 64" in group["knee"]["detail"]
    expected = _little_cliffs(raws)
    assert expected and expected[0] == (2, "p99_ttft_jump")
    assert [(f["concurrency"], f["rule"]) for f in group["findings"]] == expected
    # #34 item 7: the service delivered at every point (80.4 tok/s at 64, nothing failed),
    # so there is no cliff; the old rule put one at concurrency 2, below the knee at 16
    assert group["cliff"] is None


REPORTED = FIXTURES / "bench" / "reported-34-7" / "curve"


def test_lab_curve_on_an_idle_machine_has_its_knee_at_16_and_no_cliff():
    """The 7-point lab-h200 curve run on an idle machine right after a clean-clone CI run
    (tests/fixtures/bench/SOURCES.md, lab-2026-12-07): throughput rises at every level
    (33.3 -> 210.9 tok/s), nothing failed, no preemption: kneed's knee is at 16 (x1.32
    from 8 to 16, x1.15 to 32), and there is no cliff and no finding."""
    from kneed import KneeLocator

    raws, cs, tput = _raw_curve(LAB_IDLE.glob("*.json"))
    assert cs == [1, 2, 4, 8, 16, 32, 64] and tput == sorted(tput)
    assert sum(r["failed"] for r in raws) == 0
    assert KneeLocator(cs, tput, curve="concave", direction="increasing").knee == 16
    group = one([bench_results.point_from_result(p) for p in LAB_IDLE.glob("*.json")])
    assert group["knee"]["concurrency"] == 16
    assert "171 tok/s there, 211 tok/s at concurrency 64" in group["knee"]["detail"]
    assert group["cliff"] is None and group["findings"] == []
    assert "delivered at every one of the 7 point(s)" in group["why_no_cliff"]


def _all_recorded_groups():
    """Every recorded curve: the 2026-12-02 preset (4 groups of 2 points) and 5-point
    curve, the 2026-12-07 and 2026-12-03 7-point curves, and the curve of issue #34 item
    7's report (tests/fixtures/bench/SOURCES.md)."""
    return (bench_analysis.analyse([bench_results.point_from_result(p) for p in lab_files("preset")])
            + bench_analysis.analyse([bench_results.point_from_result(p) for p in lab_files("curve")])
            + bench_analysis.analyse([bench_results.point_from_result(p) for p in LAB_IDLE.glob("*.json")])
            + bench_analysis.analyse([bench_results.point_from_result(p) for p in LAB_KNEE.glob("*.json")])
            + bench_analysis.analyse([bench_results.point_from_result(p) for p in REPORTED.glob("*.json")]))


def _stops_delivering(group, c):
    """Why the service stops delivering at concurrency c, from the rows' own figures (not
    the rules under test): the point failed, a request failed, or output throughput or
    goodput fell more than 5% below a lower level's; None when it delivered."""
    lower = [r for r in group["rows"] if r["concurrency"] < c and r["status"] == "ok"]
    row = next(r for r in group["rows"] if r["concurrency"] == c)
    if row["status"] != "ok":
        return "point failed"
    if row["failed"]:
        return f"{row['failed']} requests failed"
    if row.get("preemptions"):
        return f"{row['preemptions']:g} requests preempted"
    for key in ("output_throughput", "request_goodput"):
        before = [r[key] for r in lower if r[key] is not None]
        if row[key] is not None and before and row[key] < 0.95 * max(before):
            return f"{key} fell"
    return None


def _planner_problems(group, knee, cliff):
    """What a capacity planner would find contradictory in (knee, cliff) on this curve:
    a knee at or past the cliff; a cliff where the figures show the service delivering;
    a level that stopped delivering below the cliff (or with no cliff at all)."""
    name = f"{group['instance']} ({group['input_len']}, {group['output_len']})"
    problems = []
    if knee and cliff and knee["concurrency"] >= cliff["concurrency"]:
        problems.append(f"{name}: knee at {knee['concurrency']} is not below the cliff at "
                        f"{cliff['concurrency']} ({cliff['rule']})")
    if cliff and not _stops_delivering(group, cliff["concurrency"]):
        problems.append(f"{name}: cliff at {cliff['concurrency']} ({cliff['rule']}) where the "
                        f"service still delivers (no failure or preemption, and throughput and goodput "
                        f"did not fall)")
    end = cliff["concurrency"] if cliff else float("inf")
    for r in group["rows"]:
        why = _stops_delivering(group, r["concurrency"])
        if why and r["concurrency"] < end:
            problems.append(f"{name}: {why} at {r['concurrency']}, " + (
                f"below the cliff at {cliff['concurrency']}" if cliff else "and no cliff"))
    return problems


def _synthetic_groups():
    def failing(c):
        tput = saturating(8)(c)
        little = 1000.0 * c / (tput / 512)
        return bench_results.point_from_result(result(c, tput, failed=3 if c >= 32 else 0,
                                          p99_e2el=little * (1.1 if c < 16 else 5.0)))
    return [one(rows(f)) for f in (saturating(8), lambda c: 100.0 * c, lambda c: {
        1: 100.0, 2: 190.0, 4: 340.0, 8: 520.0, 16: 600.0, 32: 480.0, 64: 300.0}[c])] + [
        one([failing(c) for c in C]),
        # 30% of the requests miss the latency objectives at every level; goodput rises
        one([bench_results.point_from_result(result(c, saturating(8)(c), goodput=0.7 * saturating(8)(c) / 512))
             for c in C]),
        # goodput halves at 32 while throughput still rises
        one([bench_results.point_from_result(result(c, saturating(8)(c), goodput=(0.5 if c >= 32 else 1.0)
                                        * saturating(8)(c) / 512)) for c in C]),
        # vLLM starts preempting at 32 while throughput still rises
        one(preempting([0, 0, 0, 0, 0, 6, 40]))]


def test_knee_and_cliff_are_consistent_on_every_curve():
    """#34 item 7. On every recorded curve (the lab's preset groups, the 5- and 7-point
    curves, and the reported one: lab preset levels 1, 4, 16, 32, p99 TTFT 3.6x from 1 to
    4 while throughput still rises 1.8x from 4 to 16, knee 16, nothing failed) and seven
    synthetic ones, the knee lies below the cliff and the cliff is the first level where
    the figures show the service stop delivering (a failure, or throughput or goodput
    falling), worked out here from the rows, not by the rules under test."""
    groups = _all_recorded_groups() + _synthetic_groups()
    assert len(groups) == 8 + 7
    problems = [p for g in groups for p in _planner_problems(g, g["knee"], g["cliff"])]
    assert problems == []
    for g in groups:
        decided = [g["cliff"]["detail"] if g["cliff"] else g["why_no_cliff"],
                   g["knee"]["detail"] if g["knee"] else g["why_no_knee"]]
        assert all(isinstance(d, str) and re.search(r"\d", d) for d in decided), g
    reported = _all_recorded_groups()[-1]
    tput = {r["concurrency"]: r["output_throughput"] for r in reported["rows"]}
    assert sorted(tput) == list(b.LAB_CONCURRENCY) and tput[16] / tput[4] == pytest.approx(1.8)
    assert reported["knee"]["concurrency"] == 16 and reported["cliff"] is None
    assert [(f["concurrency"], f["rule"]) for f in reported["findings"]] == [(4, "p99_ttft_jump")]
    assert "jumped 3.6x from concurrency 1 to 4" in reported["findings"][0]["detail"]


def test_the_old_cliff_rule_fails_the_consistency_check():
    """Control of the test above: the old rule (the first finding of any rule is the cliff,
    the knee on every measured point) gives the reported curve its cliff at 4 by
    p99_ttft_jump with the knee at 16, and the 7-point lab curve its cliff at 2 below the
    knee at 16; the check names both."""
    def old(g):
        return _planner_problems(g, g["knee"], g["findings"][0] if g["findings"] else None)
    recorded = _all_recorded_groups()
    reported, seven = recorded[-1], recorded[-2]
    assert (reported["findings"][0]["concurrency"], reported["findings"][0]["rule"]) == (4, "p99_ttft_jump")
    assert "knee at 16 is not below the cliff at 4 (p99_ttft_jump)" in old(reported)[0]
    assert any("knee at 16 is not below the cliff at 2" in p for p in old(seven))
    assert any("where the service still delivers" in p for p in old(reported))


# --- goodput: the latency objective behind the cliff's goodput rule (#34 item 7) --------------
def test_goodput_flags_are_vllms_key_value_pairs():
    assert b.goodput_flags({}) == () and b.goodput_flags(None) == ()
    assert b.goodput_flags({"ttft": 2000, "e2el": 20000.5}) == ("--goodput", "ttft:2000", "e2el:20000.5")
    point = {"input_len": 32, "output_len": 16, "concurrency": 2, "num_prompts": 20}
    argv = b.bench_serve_command(point, host="127.0.0.1", port=8000, model="m", tokenizer="/m",
                                 instance="i", result_dir="/r", result_filename="f.json",
                                 goodput={"tpot": 50})
    assert argv[argv.index("--goodput"):argv.index("--goodput") + 2] == ["--goodput", "tpot:50"]
    assert "--goodput" not in b.bench_serve_command(
        point, host="127.0.0.1", port=8000, model="m", tokenizer="/m", instance="i",
        result_dir="/r", result_filename="f.json")


@pytest.mark.parametrize("goodput, said", [
    ({"latency": 100}, "vLLM's goodput objectives are ttft, tpot, e2el"),
    ({"ttft": 0}, "above 0"), ({"ttft": -5}, "above 0"), ({"ttft": float("nan")}, "above 0"),
    ({"ttft": "2000"}, "above 0"), ({"ttft": True}, "above 0"), ({"e2el": 1e12}, "at most a day"),
    (["ttft:2000"], "must be a mapping"),
])
def test_bad_goodput_is_refused_with_the_rule(goodput, said):
    with pytest.raises(b.BenchError, match=re.escape(said)):
        b.goodput_flags(goodput)


def test_goodput_falling_is_the_cliff_goodput_missing_objectives_while_rising_is_not():
    """With objectives, vLLM's request_goodput (requests/s meeting every one) falls where
    more concurrency costs good requests: at 32 only half the requests are good, so goodput
    falls below 16's though throughput still rises: the cliff (goodput_falls), with the
    knee below it. Controls: the same points without goodput have no cliff; and a curve
    where 30% of the requests miss the objectives at every level while goodput still rises
    has notes (goodput_below_offered), no cliff."""
    def point(c, goodput=True):
        data = result(c, saturating(8)(c))
        if goodput:
            data["request_goodput"] = data["request_throughput"] * (0.5 if c >= 32 else 1.0)
        return bench_results.point_from_result(data)
    group = one([point(c) for c in C])
    assert (group["cliff"]["concurrency"], group["cliff"]["rule"]) == (32, "goodput_falls")
    best16 = saturating(8)(16) / 512
    assert (f"goodput at concurrency 32 is {0.5 * saturating(8)(32) / 512:.3g} req/s, "
            f"{1 - 0.5 * saturating(8)(32) / saturating(8)(16):.0%} below the {best16:.3g} req/s "
            f"of concurrency 16") in group["cliff"]["detail"]
    assert group["knee"] and group["knee"]["concurrency"] < 32
    assert one([point(c, False) for c in C])["cliff"] is None
    missing = one([bench_results.point_from_result(result(c, saturating(8)(c),
                                              goodput=0.7 * saturating(8)(c) / 512)) for c in C])
    assert missing["cliff"] is None and missing["knee"]["concurrency"] == 8
    assert {f["rule"] for f in missing["findings"]} == {"goodput_below_offered"}
    assert "no fall in goodput" in missing["why_no_cliff"]
