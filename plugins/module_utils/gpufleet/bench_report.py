"""The benchmark run's files: raw results, one CSV per instance, PNG plots and one
self-contained HTML report (plots embedded as base64 data URIs).

Plain data in, bytes out (build_report), and one writer that never overwrites a run
folder (write_run). The plots use matplotlib with the Agg backend (no display),
imported only when a report is built; the analysis is gpufleet.bench's (analyse,
knee_summary), so the knee and the cliff drawn are the ones the analysis reports.
"""
from __future__ import annotations

import base64
import html
import io
import json
import os
import re

from .bench import PRESETS, BenchError, settings_text
from .bench_analysis import CLIFF_RULES, analyse, knee_rps_by_host, knee_summary, rows_to_csv
from .gateway import backend_name

__all__ = ["axis_notes", "build_report", "fleet_row", "gpu_text", "matrix_ran", "plot_files",
           "write_run"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _safe(name):
    return _SAFE.sub("_", str(name)).strip("_") or "instance"


def gpu_text(gpu_facts):
    """`8x H200` from ansible_facts.gpu (names without the NVIDIA prefix; `-` without GPUs)."""
    facts = gpu_facts or {}
    devices = facts.get("devices") or []
    if not facts.get("present") or not devices:
        return "-"
    names = {}
    for device in devices:
        name = re.sub(r"^NVIDIA\s+", "", str(device.get("name") or "?"))
        names[name] = names.get(name, 0) + 1
    return ", ".join(f"{count}x {name}" for name, count in names.items())


def fleet_row(instance):
    """One row of the fleet table: host, GPUs, driver, CUDA, image, model, settings."""
    facts = instance.get("gpu_facts") or {}
    return {"instance": instance["instance"], "host": instance.get("host") or "-",
            "gpus": gpu_text(facts), "driver": facts.get("driver_version") or "-",
            "cuda": facts.get("cuda_driver_version") or "-",
            "image": instance.get("image") or "-",
            "model": instance.get("served_model_name") or instance.get("model") or "-",
            "settings": settings_text(instance.get("settings"))}


# ---------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------

def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise BenchError("the plots need matplotlib (requirements-runtime.txt): "
                         "pip install -r requirements-runtime.txt") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _png(fig, plt):
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buffer.getvalue()


def _pair(group):
    return f"in={group['input_len']} out={group['output_len']}"


def _failed_marks(ax, rows, x_key):
    failed = [r for r in rows if r["status"] == "failed"]
    if failed:
        ax.scatter([r[x_key] for r in failed], [0] * len(failed), marker="x", color="red",
                   s=60, zorder=5, label="failed point")


def plot_files(instance, groups):
    """{file name: PNG bytes} for one instance: throughput vs concurrency (knee marked),
    p99 TTFT and E2E vs concurrency (cliff marked), and vs input length (the cliff
    points marked)."""
    plt = _pyplot()
    name = _safe(instance)
    files = {}

    concurrencies, input_lens = _axes(groups)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for group in groups if not _too_few(ax, concurrencies, "concurrency level") else ():
        ok = [r for r in group["rows"] if r["status"] == "ok"]
        line = ax.plot([r["concurrency"] for r in ok], [r["output_throughput"] for r in ok],
                       marker="o", label=_pair(group))[0]
        knee = group["knee"]
        if knee:
            row = next(r for r in ok if r["concurrency"] == knee["concurrency"])
            ax.scatter([knee["concurrency"]], [row["output_throughput"]], marker="*", s=260,
                       color=line.get_color(), edgecolor="black", zorder=6)
            ax.annotate(f"knee c={knee['concurrency']}",
                        (knee["concurrency"], row["output_throughput"]),
                        textcoords="offset points", xytext=(6, -14), fontsize=8)
        _failed_marks(ax, group["rows"], "concurrency")
    ax.set_xscale("log", base=2)
    _ticks(ax, [r["concurrency"] for g in groups for r in g["rows"]])
    ax.set_xlabel("concurrency (--max-concurrency)")
    ax.set_ylabel("output throughput (tokens/s)")
    ax.set_title(f"{instance}: throughput vs concurrency (star = knee)")
    ax.grid(True, alpha=0.3)
    _legend(ax)
    files[f"{name}-throughput.png"] = _png(fig, plt)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, metric, label in ((axes[0], "p99_ttft_ms", "p99 TTFT (ms)"),
                              (axes[1], "p99_e2el_ms", "p99 E2E latency (ms)")):
        for group in groups if not _too_few(ax, concurrencies, "concurrency level") else ():
            ok = [r for r in group["rows"] if r["status"] == "ok"]
            line = ax.plot([r["concurrency"] for r in ok], [r[metric] for r in ok],
                           marker="o", label=_pair(group))[0]
            cliff = group["cliff"]
            if cliff:
                # named in the legend: a text beside the line hid under the legend box
                ax.axvline(cliff["concurrency"], color=line.get_color(), linestyle="--",
                           alpha=0.8, label=f"cliff c={cliff['concurrency']} "
                                            f"({cliff['rule']}), {_pair(group)}")
            _failed_marks(ax, group["rows"], "concurrency")
        ax.set_xscale("log", base=2)
        _ticks(ax, [r["concurrency"] for g in groups for r in g["rows"]])
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        _legend(ax)
    fig.suptitle(f"{instance}: p99 latency vs concurrency (dashed = cliff)")
    files[f"{name}-latency-vs-concurrency.png"] = _png(fig, plt)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    series = {}
    for group in groups:
        for row in group["rows"]:
            series.setdefault((row["concurrency"], group["output_len"]), []).append((group, row))
    for ax, metric, label in ((axes[0], "p99_ttft_ms", "p99 TTFT (ms)"),
                              (axes[1], "p99_e2el_ms", "p99 E2E latency (ms)")):
        for (conc, out), items in (sorted(series.items())
                                   if not _too_few(ax, input_lens, "input length") else ()):
            items.sort(key=lambda item: item[0]["input_len"])
            ok = [(g, r) for g, r in items if r["status"] == "ok"]
            ax.plot([g["input_len"] for g, _result in ok], [r[metric] for _point, r in ok],
                    marker="o", label=f"c={conc} out={out}")
            at_cliff = [(g, r) for g, r in ok
                        if g["cliff"] and g["cliff"]["concurrency"] == conc]
            if at_cliff:
                ax.scatter([g["input_len"] for g, _result in at_cliff], [r[metric] for _point, r in at_cliff],
                           s=180, facecolors="none", edgecolors="red", linewidths=2, zorder=6,
                           label=f"cliff (c={conc})")
            failed = [g for g, r in items if r["status"] == "failed"]
            if failed:
                ax.scatter([g["input_len"] for g in failed], [0] * len(failed), marker="x",
                           color="red", s=60, zorder=5, label="failed point")
        ax.set_xscale("log")
        _ticks(ax, [g["input_len"] for g in groups])
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        _legend(ax)
    fig.suptitle(f"{instance}: p99 latency vs input length (red ring = cliff point)")
    files[f"{name}-latency-vs-input.png"] = _png(fig, plt)
    return files


def _axes(groups):
    """The x values of the plots: every concurrency level, every input length measured."""
    return ([r["concurrency"] for g in groups for r in g["rows"]],
            [g["input_len"] for g in groups])


def axis_notes(groups):
    """Sentences for the plots of one instance whose x axis has one measured value (the
    plot then says so instead of drawing one-point lines; the report repeats it)."""
    notes = []
    for values, what, plots in zip(_axes(groups), ("concurrency level", "input length"),
                                   ("throughput and latency vs concurrency",
                                    "latency vs input length")):
        distinct = sorted(set(values) - {None})
        if len(distinct) < 2:
            notes.append(f"{plots}: one {what} measured ("
                         f"{', '.join(map(str, distinct)) or 'none'}), no curve drawn; "
                         f"measure two or more")
    return notes


def _too_few(ax, values, what):
    """True, with a note drawn in the axes instead of a curve, when fewer than two distinct
    values of the x axis were measured: one point per line is no curve."""
    distinct = sorted({v for v in values if v is not None})
    if len(distinct) >= 2:
        return False
    ax.text(0.5, 0.5, f"one {what} measured ({', '.join(map(str, distinct)) or 'none'}):\n"
            f"no curve to draw; measure two or more", ha="center", va="center",
            transform=ax.transAxes, fontsize=10)
    ax.set_xticks([])
    ax.set_yticks([])
    return True


def _ticks(ax, values):
    """Plain numbers at the measured values on a log axis (not 2^n); none for one value
    (the axes then hold _too_few's note, not a curve)."""
    values = sorted({v for v in values if v})
    if len(values) < 2:
        ax.set_xticks([])
        ax.minorticks_off()
    else:
        ax.set_xticks(values)
        ax.set_xticklabels([str(v) for v in values])
        ax.minorticks_off()


def _legend(ax):
    handles, labels = ax.get_legend_handles_labels()
    seen = {}
    for handle, label in zip(handles, labels):
        seen.setdefault(label, handle)
    if seen:
        ax.legend(list(seen.values()), list(seen), fontsize=7, loc="upper left")


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------

def _point_name(point):
    row = point["row"]
    return f"c{row['concurrency']}-in{row['input_len']}-out{row['output_len']}"


def _pairs_text(pairs):
    return ", ".join(f"({i}, {o})" for i, o in pairs) or "none"


def matrix_ran(points, matrix=None):
    """The run's matrix for summary.json: the caller's settings (preset, min_prompts, ...)
    with `concurrency` and `pairs` the levels and (input, output) pairs that ran (every
    point, measured or failed; after clipping), `instances` the same per instance, and
    `asked` the caller's concurrency and pairs, an empty list resolved to the preset's
    (the role passes fleet_benchmark_concurrency / _pairs, empty for the preset)."""
    matrix = dict(matrix or {})
    asked = {}
    preset = PRESETS.get(matrix.get("preset"))
    for axis in ("concurrency", "pairs"):
        given = list(matrix.pop(axis, None) or [])
        if not given and preset:
            given = [list(v) if isinstance(v, tuple) else v for v in preset[axis]]
        asked[axis] = given
    by_instance = {}
    for point in points:
        row = point["row"]
        entry = by_instance.setdefault(point["instance"], {"concurrency": set(), "pairs": set()})
        entry["concurrency"].add(row["concurrency"])
        entry["pairs"].add((row["input_len"], row["output_len"]))
    levels = sorted({c for e in by_instance.values() for c in e["concurrency"]})
    pairs = sorted({p for e in by_instance.values() for p in e["pairs"]})
    return dict(matrix, concurrency=levels, pairs=[list(p) for p in pairs], asked=asked,
                instances={name: {"concurrency": sorted(e["concurrency"]),
                                  "pairs": [list(p) for p in sorted(e["pairs"])]}
                           for name, e in sorted(by_instance.items())})


def build_report(points, instances, skipped=(), run_id="", matrix=None, analysis=None,
                 with_plots=True):
    """Everything a run writes, in memory: {"files": {relative path: bytes}, "summary":
    {...}}. points: the vllm_bench results of the run, each with `instance`, `status`,
    `row` and, when measured, `result`; failed ones `error` and `log_tail`, and `gpu`.
    instances: [{instance, host, container, model, served_model_name, image, settings,
    max_model_len, notes, gpu_facts}]. skipped: [{instance or container, host, reason}].
    analysis: keyword arguments of bench.analyse()."""
    analysis = dict(analysis or {})
    for index, inst in enumerate(instances):
        if not isinstance(inst, dict) or not all(isinstance(inst.get(key), str) and inst[key]
                                                 for key in ("instance", "host")):
            raise BenchError(f"instances[{index}] has no `instance` and `host` (the instances "
                             f"vllm_bench planned), got {inst!r:.120}")
    by_name = {i["instance"]: i for i in instances}
    for point in points:
        if not isinstance(point, dict):
            raise BenchError(f"a point is not a vllm_bench result, got {point!r:.120}")
        if point.get("instance") not in by_name:
            raise BenchError(f"a point names instance {point.get('instance')!r}, which is not "
                             f"in the run's instances {sorted(by_name)}")
        if not isinstance(point.get("row"), dict):
            raise BenchError(f"a point of {point['instance']} has no row (a vllm_bench result "
                             f"with a point)")
        if point.get("status") == "ok" and not isinstance(point.get("result"), dict):
            raise BenchError(f"a point of {point['instance']} is ok but has no result (a "
                             f"vllm_bench result with a point)")
        if not isinstance(point.get("status"), str):
            raise BenchError(f"a point of {point['instance']} has no status (a vllm_bench "
                             f"result with a point)")
    files, groups_by_instance = {}, {}
    all_groups = analyse([p["row"] for p in points], **analysis) if points else []
    for group in all_groups:
        groups_by_instance.setdefault(group["instance"], []).append(group)
    for point in points:
        base = f"raw/{_safe(point['instance'])}/{_point_name(point)}"
        if point["status"] == "ok":
            files[base + ".json"] = (json.dumps(point["result"], indent=2) + "\n").encode()
        else:
            files[base + ".failed.json"] = (json.dumps(
                {"status": "failed", "error": point.get("error"), "point": point["row"],
                 "command": point.get("command"), "log_tail": point.get("log_tail")},
                indent=2) + "\n").encode()
    images = {}
    for inst in instances:
        name = inst["instance"]
        rows = [r for g in groups_by_instance.get(name, []) for r in g["rows"]]
        files[f"{_safe(name)}.csv"] = rows_to_csv(rows).encode()
        if with_plots and groups_by_instance.get(name):
            plots = plot_files(name, groups_by_instance[name])
            files.update(plots)
            images[name] = list(plots)
    knees = knee_summary(all_groups)
    knee_facts = {}
    for inst in instances:
        if inst["instance"] in knees:
            knee_facts.setdefault(inst["host"], {})[inst["instance"]] = knees[inst["instance"]]
    knee_rps = knee_rps_by_host(
        [{"host": i["host"], "container": i["instance"],
          "served_model_name": i.get("served_model_name") or i.get("model")} for i in instances],
        knees, backend_name)
    counts = {"total": len(points), "ok": sum(p["status"] == "ok" for p in points),
              "failed": sum(p["status"] != "ok" for p in points)}
    summary = {
        "run_id": run_id, "points": counts, "matrix": matrix_ran(points, matrix),
        # each group says what ran: every concurrency level with its status
        "groups": [dict({k: v for k, v in g.items() if k != "rows"},
                        ran=[{"concurrency": r["concurrency"], "status": r["status"]}
                             for r in g["rows"]]) for g in all_groups],
        "knees": knees, "knee_facts": knee_facts, "knee_rps_by_host": knee_rps,
        "failed_points": [{"instance": p["instance"], **{k: p["row"][k] for k in
                           ("concurrency", "input_len", "output_len")}, "error": p.get("error")}
                          for p in points if p["status"] != "ok"],
        "skipped": list(skipped),
        "notes": {i["instance"]: list(i.get("notes") or []) for i in instances},
        "fleet": [fleet_row(i) for i in instances]}
    files["summary.json"] = (json.dumps(summary, indent=2) + "\n").encode()
    files["report.html"] = _html(summary, instances, groups_by_instance, points, files,
                                 images).encode()
    return {"files": files, "summary": summary}


def _e(value):
    return html.escape("-" if value is None else str(value))


def _gpu_cell(gpu):
    if not gpu or not gpu.get("sampled"):
        return _e((gpu or {}).get("reason") or "no GPU on this host: no utilisation sampled")
    return "; ".join(f"GPU{d['index']}: util {d['util_mean']}% mean / {d['util_max']}% max, "
                     f"memory bandwidth {d.get('mem_util_mean')}% mean / "
                     f"{d.get('mem_util_max')}% max, "
                     f"{d['fb_max_mib']} MiB, {d['power_mean_w']} W" for d in gpu["devices"])


_CSS = ("body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:"
        "collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:4px 8px;font-size:13px;"
        "text-align:left;vertical-align:top}th{background:#eee}.failed{color:#b00}"
        "img{max-width:100%;border:1px solid #ddd;margin:4px 0}code{background:#f4f4f4}")


def _matrix_html(matrix):
    settings = {k: v for k, v in matrix.items()
                if k not in ("concurrency", "pairs", "asked", "instances")}
    asked = matrix["asked"]
    return (f"<p>Matrix (what ran): concurrency <code>"
            f"{_e(', '.join(map(str, matrix['concurrency'])) or 'none')}</code> x (input, "
            f"output) <code>{_e(_pairs_text(matrix['pairs']))}</code> on "
            f"{len(matrix['instances'])} instance(s); asked: concurrency <code>"
            f"{_e(', '.join(map(str, asked['concurrency'])) or 'none')}</code>, pairs <code>"
            f"{_e(_pairs_text(asked['pairs']))}</code>; settings <code>"
            f"{_e(json.dumps(settings, sort_keys=True))}</code></p>")


def _html(summary, instances, groups_by_instance, points, files, images):
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
           f"<title>gpufleet benchmark {_e(summary['run_id'])}</title>",
           f"<style>{_CSS}</style></head><body>",
           f"<h1>gpufleet benchmark {_e(summary['run_id'])}</h1>",
           f"<p>{summary['points']['total']} point(s): {summary['points']['ok']} measured, "
           f"{summary['points']['failed']} failed (each with its reason below).</p>",
           _matrix_html(summary["matrix"]),
           "<h2>Fleet</h2><table id='fleet'><tr><th>host</th><th>instance</th><th>GPUs</th>"
           "<th>driver</th><th>CUDA</th><th>image</th><th>model</th><th>settings</th>"
           "<th>knee</th><th>cliff</th></tr>"]
    for row in summary["fleet"]:
        knee = summary["knees"].get(row["instance"]) or {}
        groups = groups_by_instance.get(row["instance"], [])
        cliffs = [f"c={g['cliff']['concurrency']} ({g['cliff']['rule']}, in={g['input_len']} "
                  f"out={g['output_len']})" for g in groups if g["cliff"]]
        knee_text = (f"c={knee['concurrency']}: {knee['output_throughput']:.1f} tok/s, "
                     f"{knee['request_throughput']:.3g} req/s (in={knee['input_len']} "
                     f"out={knee['output_len']})" if knee.get("concurrency") else "none")
        out.append("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in (
            row["host"], row["instance"], row["gpus"], row["driver"], row["cuda"], row["image"],
            row["model"], row["settings"], knee_text, "; ".join(cliffs) or "none")) + "</tr>")
    out.append("</table>")
    if summary["skipped"]:
        out.append("<h2>Skipped instances</h2><ul>")
        out += [f"<li>{_e(s.get('host'))} {_e(s.get('instance') or s.get('container'))}: "
                f"{_e(s.get('reason'))}</li>" for s in summary["skipped"]]
        out.append("</ul>")
    out.append("<h2>How to read this</h2><p>The <b>knee</b> is where more concurrency stops "
               "buying output throughput (kneed, concave increasing, on the measured points of "
               "one input/output pair, below the cliff). The <b>cliff</b> is the first "
               "concurrency where the service stops delivering: a failed point, failed "
               "requests, requests preempted by vLLM, or output throughput or goodput (requests/s within the latency "
               "objectives) falling below a lower level's. A p99 TTFT / E2E jump larger than "
               "the concurrency explains, or a rate below what the concurrency offers "
               "(Little's law), is a note, not a cliff: on a curve whose throughput still "
               "rises it is queueing. Rules, thresholds and sources: docs/benchmark.md.</p>")
    for inst in instances:
        name = inst["instance"]
        out.append(f"<h2 id='{_e(_safe(name))}'>{_e(name)} on {_e(inst.get('host'))}</h2>")
        out.append(f"<p>CSV: <code>{_e(_safe(name))}.csv</code>; max_model_len "
                   f"{_e(inst.get('max_model_len'))}</p>")
        ran = summary["matrix"]["instances"].get(name) or {"concurrency": [], "pairs": []}
        out.append(f"<p>Ran: concurrency {_e(', '.join(map(str, ran['concurrency'])) or 'none')}"
                   f" x (input, output) {_e(_pairs_text(ran['pairs']))}</p>")
        notes = inst.get("notes") or []
        out.append("<p>Clipping: " + ("; ".join(_e(n) for n in notes) if notes else
                                      "none: every pair fits max_model_len") + "</p>")
        out.append("<table><tr><th>pair</th><th>knee</th><th>cliff</th><th>findings</th></tr>")
        for g in groups_by_instance.get(name, []):
            knee = (f"c={g['knee']['concurrency']} [{g['knee']['rule']}]: {g['knee']['detail']}"
                    if g["knee"] else g["why_no_knee"])
            cliff = (f"c={g['cliff']['concurrency']} [{g['cliff']['rule']}]: {g['cliff']['detail']}"
                     if g["cliff"] else g["why_no_cliff"])
            findings = "<br>".join(
                f"c={f['concurrency']} [{_e(f['rule'])}{'' if f['rule'] in CLIFF_RULES else ', note'}]"
                f" {_e(f['detail'])}" for f in g["findings"]) or "-"
            out.append(f"<tr><td>in={g['input_len']} out={g['output_len']}</td><td>{_e(knee)}</td>"
                       f"<td>{_e(cliff)}</td><td>{findings}</td></tr>")
        out.append("</table>")
        mine = sorted((p for p in points if p["instance"] == name),
                      key=lambda p: (p["row"]["input_len"], p["row"]["output_len"],
                                     p["row"]["concurrency"]))
        out.append("<table><tr><th>point</th><th>status</th><th>output tok/s</th><th>req/s</th>"
                   "<th>p99 TTFT ms</th><th>p99 E2E ms</th><th>preempted</th><th>GPU utilisation</th></tr>")
        for p in mine:
            r = p["row"]
            status = ("ok" if p["status"] == "ok"
                      else f"<span class='failed'>failed: {_e(p.get('error'))}</span>")
            cells = [_fmt(r.get(k)) for k in ("output_throughput", "request_throughput",
                                              "p99_ttft_ms", "p99_e2el_ms")]
            pre = p.get("preemptions") or {}
            cells.append(_fmt(r.get("preemptions")) if r.get("preemptions") is not None
                         else _e(f"- ({pre['reason']})" if pre.get("reason") else "-"))
            out.append(f"<tr><td>c={r['concurrency']} in={r['input_len']} out={r['output_len']}"
                       f"</td><td>{status}</td>" + "".join(f"<td>{c}</td>" for c in cells)
                       + f"<td>{_gpu_cell(p.get('gpu'))}</td></tr>")
        out.append("</table>")
        for note in axis_notes(groups_by_instance.get(name, [])):
            out.append(f"<p class='note'>Plot: {_e(note)}</p>")
        for image in images.get(name, []):
            data = base64.b64encode(files[image]).decode("ascii")
            out.append(f"<p><img alt='{_e(image)}' src='data:image/png;base64,{data}'></p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _fmt(value):
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else _e(value)


def check_run_id(run_id):
    """BenchError unless `run_id` is a folder name: 1-255 letters, digits, . _ -."""
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,255}", str(run_id or "")) or run_id in (".", ".."):
        raise BenchError(f"run id {run_id!r:.80} must be a folder name (1-255 letters, "
                         f"digits, . _ -)")
    return run_id


def write_run(root, run_id, files):
    """Write `files` under root/run_id, which must not exist (a run never overwrites
    another); return the folder's path."""
    check_run_id(run_id)
    folder = os.path.join(os.fspath(root), run_id)
    os.makedirs(os.fspath(root), exist_ok=True)
    try:
        os.mkdir(folder)
    except FileExistsError:
        raise BenchError(f"{folder} exists already: a run never overwrites another; "
                         f"use a new run id (the UTC timestamp) or another output folder") from None
    for rel, data in sorted(files.items()):
        path = os.path.join(folder, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(data)
    return folder
