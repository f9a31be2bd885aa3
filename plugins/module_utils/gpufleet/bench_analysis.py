"""What a curve of points says: the knee, the cliff, the findings; the knee as facts.

The knee uses `kneed` (pinned in requirements-runtime.txt), imported only when a knee is
looked for.

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
import math
import warnings

from .bench import BenchError
from .bench_results import PREEMPTION_METRIC, ROW_FIELDS, result_row


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
LATENCY_RULES = ("p99_ttft_jump", "p99_e2el_jump")
NOTE_RULES = LATENCY_RULES + ("goodput_below_offered", "rate_below_offered")
# Output throughput more than this share below the best of the lower concurrencies falls.
THROUGHPUT_DROP = FLAT_TOLERANCE


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
        row = result_row(point)
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
