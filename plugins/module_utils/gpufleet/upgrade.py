"""Rolling fleet upgrades: batches, gates, the last-good record and its rollback.

Plain data in, plain data out; no Ansible imports. Used by playbooks/upgrade.yml
(through the filters in plugins/filter/gpufleet_upgrade.py), by the modules
`vllm_probe` (idle wait and latency probe against one instance) and `vllm_record`
(the last-good record on the host), and unit-tested in tests/unit/test_upgrade.py.

The order of one host's upgrade (docs/upgrades.md):
compatibility gate -> plan (what changes) -> capacity check -> drain at the gateway ->
wait until vLLM is idle -> probe (before) -> apply (the existing roles) -> readiness
gate -> probe (after) and its verdict -> re-enable at the gateway -> soak window ->
record the new state as the last good one. Any failure after the drain rolls the host
back to its last-good record, re-enables it and stops the rollout.
"""
from __future__ import annotations

import math
import re
import time

from . import bounded
from .prometheus_text import parse_metrics
from .redact import redact_models, restore_models

__all__ = [
    "METRICS_MAX_BYTES", "METRICS_TIMEOUT", "PROBE_MAX_BYTES", "RECORD_INPUTS",
    "RECORD_VERSION", "UpgradeError", "build_record", "capacity_verdict", "driver_change",
    "idle_counts", "parse_metrics", "percentile", "plan_batches", "probe_summary",
    "probe_verdict", "read_metrics", "record_commits", "record_problem", "rollback_vars",
    "run_probe", "soak_verdict", "stop_message", "wait_idle",
]


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class UpgradeError(ValueError):
    """Bad upgrade input; the message says what to change."""


# ----------------------------------------------------------------- batches
def plan_batches(host_models, canary=1, max_fraction=0.5, batch_size=0, first=()):
    """Hosts in the order they are upgraded, cut into batches.

    host_models: {host: [served model names it serves]}, in inventory order (hosts that
      serve nothing yet have []).
    canary: size of the first batch (at least 1): the canary.
    max_fraction: of each model's instances, at most this fraction (rounded down, but at
      least one) is out of service in one batch; a model served by one host only is
      still upgraded (that host alone in its batch), which the capacity gate then
      refuses unless downtime is allowed.
    batch_size: most hosts in one later batch (0: no limit besides max_fraction).
    first: hosts a rollout left mid-change (rollout_state "held"): they come first, so a
      rerun resumes them (and puts them back in service) before it changes another host.
    Returns {"batches": [[host, ...], ...], "sizes": [len, ...]} (sizes feed `serial`).
    """
    if isinstance(canary, bool) or not isinstance(canary, int) or canary < 1:
        raise UpgradeError(f"upgrade_canary_hosts must be a whole number >= 1, got {canary!r}")
    try:
        fraction = float(max_fraction)
    except (TypeError, ValueError):
        fraction = math.nan
    if not 0 < fraction <= 1:
        raise UpgradeError("upgrade_max_unavailable_fraction must be above 0 and at most 1, "
                           f"got {max_fraction!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
        raise UpgradeError(f"upgrade_batch_size must be a whole number >= 0, got {batch_size!r}")
    counts = {}
    for models in host_models.values():
        for model in set(models):
            counts[model] = counts.get(model, 0) + 1
    allowed = {m: max(1, math.floor(n * fraction)) for m, n in counts.items()}
    pending = [h for h in host_models if h in first] + [h for h in host_models if h not in first]
    batches = []
    while pending:
        limit = canary if not batches else (batch_size or len(pending))
        batch, used = [], {}
        for host in list(pending):
            if len(batch) >= limit:
                break
            models = set(host_models[host])
            if any(used.get(m, 0) + 1 > allowed[m] for m in models):
                continue
            batch.append(host)
            pending.remove(host)
            for m in models:
                used[m] = used.get(m, 0) + 1
        batches.append(batch)
    return {"batches": batches, "sizes": [len(b) for b in batches]}


# ----------------------------------------------------------------- what changes
def driver_change(installed_version, branch, version=""):
    """True when the driver installed (gpu facts) is not the branch / version asked for."""
    installed = str(installed_version or "")
    if not installed:
        return True
    if str(version or ""):
        return installed != str(version)
    return installed.split(".", maxsplit=1)[0] != str(branch)


# ----------------------------------------------------------------- capacity gate
def capacity_verdict(servers, host, allow_downtime=False, knee_rps=None, load_rps=None):
    """May `host` leave service? servers: the gateway's servers, each
    {backend, server, host, status}. Every backend (model) `host` is in must keep at
    least one other server UP, unless allow_downtime. When benchmark figures are given
    (knee_rps: {backend: requests/s the other instances sustain at their knee},
    load_rps: {backend: requests/s measured at the gateway}), the rest must also carry
    the load. Returns {"ok", "reasons", "backends": {backend: {"others_up", ...}}}.
    """
    mine = {s["backend"] for s in servers if s.get("host") == host}
    reasons, backends, ok = [], {}, True
    for backend in sorted(mine):
        others = [s for s in servers if s["backend"] == backend and s.get("host") != host]
        up = [s["server"] for s in others if str(s.get("status", "")).upper().startswith("UP")]
        info = {"others_up": len(up), "others": len(others)}
        if not up:
            if allow_downtime:
                reasons.append(f"{backend}: no other server is UP; downtime allowed "
                               "(fleet_upgrade_allow_downtime)")
            else:
                ok = False
                reasons.append(
                    f"{backend}: {host} is its last server in service ({len(others)} others, "
                    "none UP), so draining it would stop the model. Bring another instance "
                    "up first, or set fleet_upgrade_allow_downtime: true to accept the outage.")
        knee = (knee_rps or {}).get(backend)
        load = (load_rps or {}).get(backend)
        if knee is not None and load is not None:
            info.update(knee_rps=knee, load_rps=load)
            if float(knee) < float(load):
                ok = ok and allow_downtime
                reasons.append(f"{backend}: the other instances' knee capacity {knee} req/s "
                               f"is below the load at the gateway {load} req/s")
        elif up:
            reasons.append(f"{backend}: {len(up)} other server(s) UP ({', '.join(up)}); no "
                           "benchmark figures, so only availability was checked")
        backends[backend] = info
    if not mine:
        reasons.append(f"{host} has no server at the gateway: nothing to keep in service")
    return {"ok": ok, "reasons": reasons, "backends": backends}


# ----------------------------------------------------------------- vLLM metrics
def idle_counts(metrics):
    """(running, waiting) requests from vLLM's gauges (None when the server has none)."""
    if "vllm:num_requests_running" not in metrics:
        return None
    return (int(metrics.get("vllm:num_requests_running", 0)),
            int(metrics.get("vllm:num_requests_waiting", 0)))


# vLLM's /metrics is a few hundred KiB (histograms per model); one poll reads at most
# this, within METRICS_TIMEOUT seconds in all.
METRICS_MAX_BYTES = 16 << 20
METRICS_TIMEOUT = 10
# A probe's answer (16 tokens, or one embedding: 4096 floats are ~80 KiB of JSON).
PROBE_MAX_BYTES = 16 << 20


def read_metrics(session, base_url, seconds=None):
    """GET base_url/metrics (a requests Response, its body read), within `seconds`
    (default METRICS_TIMEOUT) in all and at most METRICS_MAX_BYTES; bounded.BoundError
    past either."""
    return bounded.http_request(
        session, "GET", f"{base_url}/metrics", METRICS_MAX_BYTES,
        METRICS_TIMEOUT if seconds is None else seconds,
        advice="vLLM's /metrics answers at once, in a few hundred KiB: check the "
               "instance, or what answers at its address.")


def wait_idle(session, base_url, timeout=120, interval=1, clock=time.monotonic,
              sleep=time.sleep):
    """Poll /metrics until vLLM has no request running or waiting.

    Returns {"elapsed", "polls", "running", "waiting"}; raises UpgradeError after
    `timeout` seconds with the last counts. Each poll is read_metrics (METRICS_TIMEOUT
    seconds in all), so an instance that drips its answer holds the wait at most that
    much past `timeout`.
    """
    start, polls, last = clock(), 0, "no answer yet"
    while True:
        polls += 1
        try:
            resp = read_metrics(session, base_url)
            counts = idle_counts(parse_metrics(resp.text)) if resp.status_code == 200 else None
            if counts is None:
                last = f"/metrics answered {resp.status_code} without vllm:num_requests_running"
            elif counts == (0, 0):
                return {"elapsed": round(clock() - start, 1), "polls": polls, "running": 0,
                        "waiting": 0}
            else:
                last = f"{counts[0]} running, {counts[1]} waiting"
        except ImportError:
            raise  # prometheus-client missing: the module says what to install
        except Exception as exc:  # noqa: BLE001 - any transport or page error: retry until timeout
            last = f"{type(exc).__name__}: {exc}"
        if clock() - start + interval > timeout:
            raise UpgradeError(f"{base_url} did not become idle within {timeout}s (last: {last})")
        sleep(interval)


# ----------------------------------------------------------------- probe gate
def percentile(values, pct):
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def probe_summary(latencies_ms, errors):
    """Figures of one probe: count, errors, error_rate, p50/p95/max latency (ms)."""
    count = len(latencies_ms) + len(errors)
    out = {"count": count, "errors": len(errors), "error_rate":
           round(len(errors) / count, 4) if count else 1.0, "error_samples": errors[:3]}
    if latencies_ms:
        out.update(p50_ms=round(percentile(latencies_ms, 50), 1),
                   p95_ms=round(percentile(latencies_ms, 95), 1),
                   max_ms=round(max(latencies_ms), 1))
    return out


def run_probe(session, base_url, api_key, served_name, runner="generate", count=5,
              max_tokens=16, timeout=120, clock=time.monotonic):
    """Send `count` real requests one after another; return probe_summary's figures.

    The same request every time (temperature 0, fixed prompt and length), so the probe
    before and after a change measure the same work. Each request and its answer take
    at most `timeout` seconds in all and PROBE_MAX_BYTES (bounded.http_request); past
    either, the request counts as an error.
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if runner == "pooling":
        path, body = "/v1/embeddings", {"model": served_name, "input": "gpufleet probe"}
    else:
        path, body = "/v1/completions", {"model": served_name, "prompt": "gpufleet probe:",
                                         "max_tokens": int(max_tokens), "temperature": 0}
    latencies, errors = [], []
    for _request in range(int(count)):
        start = clock()
        try:
            resp = bounded.http_request(session, "POST", f"{base_url}{path}",
                                        PROBE_MAX_BYTES, timeout, json=body, headers=headers)
            ok = resp.status_code == 200 and bool(
                (resp.json().get("data") if runner == "pooling" else resp.json().get("choices")))
            if ok:
                latencies.append((clock() - start) * 1000.0)
            else:
                errors.append(f"{path} answered {resp.status_code}: {resp.text[:200]}")
        except Exception as exc:  # noqa: BLE001 - a failed request is a probe error
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
    return probe_summary(latencies, errors)


def probe_verdict(before, after, max_latency_ratio=2.0, max_latency_increase_ms=500,
                  max_error_rate=0.0):
    """Does the probe after the change pass against the one before?

    Fails when the error rate is above max_error_rate, or when p95 latency grew by more
    than max_latency_ratio x AND by more than max_latency_increase_ms (both, so a fast
    model's noise of a few ms cannot fail it). Returns {"ok", "reasons"}.
    """
    reasons, ok = [], True
    if after.get("error_rate", 1.0) > float(max_error_rate):
        ok = False
        reasons.append(f"error rate {after.get('error_rate')} ({after.get('errors')} of "
                       f"{after.get('count')}) is above {max_error_rate}: "
                       f"{'; '.join(after.get('error_samples') or [])}")
    b95, a95 = before.get("p95_ms"), after.get("p95_ms")
    if b95 is not None and a95 is not None:
        if a95 > b95 * float(max_latency_ratio) and a95 - b95 > float(max_latency_increase_ms):
            ok = False
            reasons.append(f"p95 latency {a95} ms after vs {b95} ms before: more than "
                           f"{max_latency_ratio}x and {max_latency_increase_ms} ms slower")
        else:
            reasons.append(f"p95 latency {a95} ms after vs {b95} ms before")
    elif a95 is None and ok:
        ok = False
        reasons.append("the probe after the change got no answer")
    return {"ok": ok, "reasons": reasons}


def probe_gate(probe, baseline, attempts=2, max_latency_ratio=2.0,
               max_latency_increase_ms=500, max_error_rate=0.0):
    """The probe gate: probe() (run_probe bound to the instance) compared with baseline.

    A probe that is only too slow (no error beyond max_error_rate) is measured again, up
    to `attempts` probes in all, and the gate fails only when every probe fails: on a
    busy host one stalled request is the p95 of a few, and must not roll a good change
    back, while a change that made the host slower fails each time. An error fails at
    once. Returns {"verdict", "attempts": [{"probe", "verdict"}], "summary"}.
    """
    tries = []
    for _attempt in range(max(1, int(attempts))):
        figures = probe()
        verdict = probe_verdict(baseline, figures, max_latency_ratio,
                                max_latency_increase_ms, max_error_rate)
        tries.append({"probe": figures, "verdict": verdict})
        errors_ok = figures.get("error_rate", 1.0) <= float(max_error_rate)
        if verdict["ok"] or not errors_ok:
            break
    last = tries[-1]["verdict"]
    summary = " ".join(last["reasons"])
    if len(tries) > 1:
        summary = (f"{summary} (probe {len(tries)} of {len(tries)}; before it: "
                   + "; ".join(" ".join(t["verdict"]["reasons"]) for t in tries[:-1]) + ")")
    return {"verdict": last, "attempts": tries, "summary": summary}


def failure_message(result, limit=3000):
    """What a failed task said, for the rollout's stop message. A looped task's own msg
    is Ansible's "One or more items failed"; the figures are in its failed items, so
    those are named instead (label: msg)."""
    result = result or {}
    parts = []
    for item in result.get("results") or []:
        if isinstance(item, dict) and item.get("failed"):
            label = item.get("_ansible_item_label", item.get("item"))
            if isinstance(label, dict):
                label = label.get("name", label)
            parts.append(f"{label}: {item.get('msg', '')}")
    text = "; ".join(parts) if parts else str(result.get("msg", ""))
    return text[:int(limit)]


def stop_message(result, host, where="unknown", limit=3000):
    """The message a host stops the rollout with (roles/fleet_upgrade/tasks/main.yml keeps
    it until its batch is done). The gates' own messages already say where and what
    ("UPGRADE STOPPED at HOST ..."); any other failure is named by its task."""
    text = failure_message(result, limit)
    if text.startswith("UPGRADE STOPPED"):
        return text
    return f'UPGRADE STOPPED at {host}: "{where}" failed: {text}'


def soak_verdict(deltas, bad_statuses, max_5xx=0, max_retries=0, max_check_failures=0):
    """The soak window after re-enabling: counters that grew at the gateway for the
    host's servers (deltas: {server: {hrsp_5xx, wretr, wredis, chkfail, eresp}}, or
    vllm_gateway_stats' list of {backend, server, ...}) and any status seen that was not
    UP (bad_statuses: {server: [status, ...]}, or its list of {backend, server, status})."""
    if isinstance(deltas, list):  # vllm_gateway_stats: [{backend, server, counters...}]
        deltas = {f"{d.get('backend')}/{d.get('server')}": d for d in deltas}
    if isinstance(bad_statuses, list):  # [{backend, server, status, at}]
        grouped = {}
        for item in bad_statuses:
            grouped.setdefault(f"{item.get('backend')}/{item.get('server')}", []).append(
                str(item.get("status")))
        bad_statuses = grouped
    reasons, ok = [], True
    for server, delta in sorted((deltas or {}).items()):
        for key, limit, what in (("hrsp_5xx", max_5xx, "5xx answers"),
                                 ("eresp", max_5xx, "response errors"),
                                 ("wretr", max_retries, "retries"),
                                 ("wredis", max_retries, "redispatches"),
                                 ("chkfail", max_check_failures, "failed health checks")):
            if int(delta.get(key, 0) or 0) > int(limit):
                ok = False
                reasons.append(f"{server}: {delta.get(key)} {what} during the soak window "
                               f"(limit {limit})")
    for server, statuses in sorted((bad_statuses or {}).items()):
        if statuses:
            ok = False
            reasons.append(f"{server}: status {', '.join(sorted(set(statuses)))} during the "
                           "soak window")
    return {"ok": ok, "reasons": reasons or ["no errors, retries or failed checks"]}


# ----------------------------------------------------------------- last-good record
# The inventory variables a deploy is made of; the record keeps their values (the image
# by id), so a rollback re-runs the same roles with them. vllm_server_models may carry
# secrets (a model's env, a token option in its extra_args): the record keeps those as
# digests only (gpufleet.redact, the one rule), and a rollback takes them back from the
# inventory. vllm_server_api_key is not among them.
RECORD_INPUTS = ("vllm_server_image", "vllm_server_vllm_version", "vllm_server_models",
                 "vllm_server_port")
# 2: every secret redacted (redact.redact_models). 1 (before): values verbatim; still read,
# and replaced by the next write.
RECORD_VERSION = 2


def build_record(inputs, image_id, instances, driver_version=""):
    """The last-good record of a host whose deploy passed its gates.

    inputs: the RECORD_INPUTS values of the deploy; image_id: the image's id (sha256:..);
    instances: the plan's instances (name, model, revision, settings_hash, args_hash,
    mounts). The image is recorded by id so a rollback runs exactly those bytes, whatever
    the tag points at by then; each model folder by the commit its manifest recorded.
    Each instance's args_hash (serve.args_check_hash: image, arguments, environment)
    tells vllm_server's preflight that vLLM accepted those arguments here: a rollback, or
    a change that keeps them (a model revision, a driver), needs no argument check.
    The models' secrets are kept as digests (redact.redact_models): the record holds no
    secret, and rollback_vars takes the values back from the inventory.
    """
    missing = [k for k in RECORD_INPUTS if k not in inputs]
    if missing:
        raise UpgradeError(f"the record needs {', '.join(missing)}")
    record_inputs = {k: inputs[k] for k in RECORD_INPUTS}
    record_inputs["vllm_server_image"] = str(image_id)
    record_inputs["vllm_server_models"] = redact_models(inputs["vllm_server_models"])
    return {
        "version": RECORD_VERSION,
        "image_ref": str(inputs["vllm_server_image"]),
        "image_id": str(image_id),
        "driver_version": str(driver_version or ""),
        "inputs": record_inputs,
        "models": sorted({(i.get("model_path") or i["mounts"][0]["source"],
                           str(i["revision"])) for i in instances
                          if i.get("mounts")}),
        "instances": [{"name": i["name"], "model": i["model"],
                       "settings_hash": i["settings_hash"], "revision": i["revision"],
                       "args_hash": i.get("args_hash")}
                      for i in instances],
    }


def record_problem(record, image_present, path=""):
    """Why a rollback to `record` could not run ("" when it could): checked before a host
    is drained (issue #31 item 7), since a rollback runs the recorded image by id and never
    pulls it. An unreadable record never gets here: reading it fails with its own reason."""
    if not record:
        return (f"it has no last-good record{' at ' + path if path else ''}, so it could not be "
                "rolled back if the change failed. Run site.yml on it once (a deploy that passes "
                "its gates writes the record), or set fleet_upgrade_allow_downtime: true to change "
                "it without a way back")
    if not image_present:
        return (f"its last-good record names the image {record.get('image_ref', '?')} "
                f"({record.get('image_id') or 'no id'}), which is no longer on the host, so a "
                "rollback would have nothing to run (it never pulls). Put that image back (docker "
                "pull/load, then check its id), or run site.yml to deploy and record the current "
                "state, or set fleet_upgrade_allow_downtime: true to change it without a way back")
    return ""


def record_commits(record):
    """The model commits a last-good record names (its `models`: [folder, commit]): what a
    rollback goes back to, so model_fetch pins them (hf_model revisions_pinned) and a
    prune never removes one. Only 40-hex commits (a `local-...` folder has no commit
    folder); sorted, once each. An empty or unreadable record names none."""
    models = record.get("models") if isinstance(record, dict) else None
    out = set()
    for item in models if isinstance(models, list) else []:
        if isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[1], str) \
                and _COMMIT.match(item[1]):
            out.add(item[1])
    return sorted(out)


def rollback_vars(record, model_fetch_models=(), model_fetch_root="", driver_changed=False,
                  instances=None, current_models=None):
    """The variables that re-run the roles to the recorded state.

    The vllm_server inputs come from the record (image by id, never pulled); each
    model_fetch entry whose folder is in the record is pinned to the recorded commit;
    the driver to the recorded version when this upgrade changed it.

    `instances` (the failed upgrade's plan: each with its folder and the commit it holds
    now) leaves out the entries whose folder still holds the recorded commit: nothing is
    fetched for them, so a rollback of a bad setting never depends on the mirror still
    serving an older commit (a mirror that publishes only its current commit answers 404).

    `current_models` (the inventory's vllm_server_models now) gives back the secrets the
    record keeps as digests (redact.restore_models): a value whose digest matches is the
    recorded one; one that differs or is gone is taken as the inventory has it, and
    `record_notes` says which model and env key or option (never a value). A model with
    a redacted value that is no longer in the inventory is refused. A record written
    before secrets were redacted (version 1) is used as it is.
    """
    if not record or record.get("version") not in (1, RECORD_VERSION) or "inputs" not in record:
        raise UpgradeError("no usable last-good record on the host (it is written when a "
                           "deploy passes its gates: run site.yml once before upgrading)")
    out = dict(record["inputs"])
    out["record_notes"] = []
    if record["version"] == RECORD_VERSION:
        models, notes, missing = restore_models(out.get("vllm_server_models"), current_models)
        if missing:
            raise UpgradeError(
                "the last-good record keeps no secret, only digests, and a rollback takes "
                "the values back from the inventory's vllm_server_models, which no longer "
                f"has {'; '.join(missing)}: put the entry back in the inventory with the "
                "values it had, then run upgrade.yml again")
        out["vllm_server_models"], out["record_notes"] = models, notes
    out["vllm_server_image_pull"] = "never"
    commits = dict(record.get("models", []))
    holds = {i.get("model_path") or i["mounts"][0]["source"]: str(i.get("revision"))
             for i in instances or [] if i.get("mounts")}
    pinned = []
    for entry in model_fetch_models or []:
        dest = entry.get("dest") or f"{str(model_fetch_root).rstrip('/')}/{entry['repo_id']}"
        item = dict(entry)
        commit = commits.get(dest)
        if commit and holds.get(dest) == commit:
            continue
        if commit and not commit.startswith("local-"):
            item["revision"] = commit
        pinned.append(item)
    out["model_fetch_models"] = pinned
    if driver_changed and record.get("driver_version"):
        version = record["driver_version"]
        out["nvidia_driver_branch"] = version.split(".")[0]
        out["nvidia_driver_version"] = version
    return out
