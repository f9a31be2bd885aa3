"""Load tests: the matrix to run and the `vllm bench serve` runs that measure it.

Plain data in, plain data out; no Ansible imports. What the saved results say is in
bench_results (reading one result, a failed point) and bench_analysis (the knee, the cliff,
the findings, the knee as facts); GPU utilisation during a point in bench_gpu.

The matrix
    `matrix_points()` crosses concurrency levels with (input, output) token pairs and
    clips them to the instance's max_model_len: vLLM refuses a request whose prompt plus
    max_tokens exceeds max_model_len, so a pair must have input + output <= max_model_len.
    A pair that does not fit has its input clipped to max_model_len - output (the longest
    prompt that fits, which still measures the long-context regime the pair stands for),
    or is dropped when overflow="drop", when the output alone does not fit, or when the
    clipped pair repeats one already kept. Every change is returned as a note.
"""
from __future__ import annotations

import ipaddress
import math
import re

from . import grammar

__all__ = ["BenchError", "BENCH_SERVE_FLAGS", "DEFAULT_CONCURRENCY", "DEFAULT_PAIRS",
           "GOODPUT_METRICS", "LAB_CONCURRENCY", "LAB_PAIRS", "METRICS", "PERCENTILES",
           "PRESETS", "bench_env", "bench_plan", "bench_serve_command", "goodput_flags",
           "instance_from_inspect", "is_loopback", "matrix_points", "percentile_flags",
           "plan_instances", "positive_int", "settings_text", "split_target"]


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


# ---------------------------------------------------------------------------
# The matrix
# ---------------------------------------------------------------------------

def positive_int(value, what):
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
    levels = sorted({positive_int(c, "a concurrency level") for c in concurrency})
    if not levels:
        raise BenchError("no concurrency levels given")
    if max_model_len is not None:
        positive_int(max_model_len, "max_model_len")
    kept, notes = [], []
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise BenchError(f"a pair is (input_len, output_len), not {pair!r}")
        inp = positive_int(pair[0], "input_len")
        out = positive_int(pair[1], "output_len")
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
    positive_int(min_prompts, "min_prompts")
    positive_int(prompts_per_concurrency, "prompts_per_concurrency")
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
    inp = positive_int(point.get("input_len"), "input_len")
    out = positive_int(point.get("output_len"), "output_len")
    conc = positive_int(point.get("concurrency"), "concurrency")
    prompts = positive_int(point.get("num_prompts"), "num_prompts")
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
