#!/usr/bin/python
"""Ansible module vllm_bench: one `vllm bench serve` point against a serving vLLM instance."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_bench
short_description: Load-test a serving vLLM instance with vLLM's own benchmark client, from its own image
description:
  - Reads the serving container O(container) through the docker SDK (C(docker inspect)) -
    the image it runs (by id), the model folder it mounts, its C(--max-model-len) and
    settings, and its environment (variables whose name says key, token, secret or
    password left out).
  - Without O(point), returns the matrix to run (O(concurrency) x O(pairs), clipped to
    the instance's max_model_len, each clip or drop as a note, and the prompts per point),
    and runs nothing.
  - With O(point), runs one throwaway container of that same image, entrypoint C(vllm),
    command C(bench serve --dataset-name random ... --save-result), against O(target),
    on the host's network when the target address is loopback, the model folder mounted
    read-only for the tokenizer, the API key in the environment as C(OPENAI_API_KEY) (how
    vLLM's benchmark client sends it; never in the argv). The point has a time limit
    (O(timeout)); the container is removed whatever happens.
  - A point that fails (non-zero exit, timeout, no or unreadable result) is returned with
    C(status=failed), its reason and the log tail, not as a module failure, so that a run
    records every point. The module fails only for invalid options.
  - Where the host has NVIDIA GPUs, samples them while the point runs (NVML through
    nvidia-ml-py when importable, else C(nvidia-smi dmon -s pum -d 1)); otherwise C(gpu)
    says C(no GPU on this host, no utilisation sampled) with what was tried.
  - It changes nothing on the host (the throwaway container is removed), so C(changed) is
    always false. In check mode it inspects the instance and returns the command it would
    run, and runs nothing.
version_added: "0.3.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  container:
    description: Name of the serving vLLM container (the C(container) label of the fleet's instance list).
    type: str
    required: true
  target:
    description: C(ADDRESS:PORT) the instance serves at (the instance list's target).
    type: str
    required: true
  served_model_name:
    description: The model name the instance serves (sent as each request's C(model)).
    type: str
    required: true
  instance:
    description: Name of the instance in the results (C(--metadata instance=...)); empty uses O(container).
    type: str
    default: ""
  point:
    description:
      - One point C({input_len, output_len, concurrency, num_prompts}) to run. Without
        it the module returns the matrix (RV(plan)) and runs nothing.
    type: dict
  preset:
    description:
      - The matrix when O(concurrency) or O(pairs) is empty - C(default)
        (gpufleet.bench DEFAULT_CONCURRENCY 1-64, DEFAULT_PAIRS (1000, 512), (10000, 512),
        (100000, 512), (1000, 128), (50, 20)) or C(lab) (LAB_CONCURRENCY 1, 4, 16, 32 and
        LAB_PAIRS (32, 16), for the lab's small model on CPU).
    type: str
    choices: [default, lab]
    default: default
  concurrency:
    description: Concurrency levels of the matrix (without O(point)); empty uses O(preset)'s.
    type: list
    elements: int
    default: []
  pairs:
    description: (input tokens, output tokens) pairs of the matrix (without O(point)); empty uses O(preset)'s.
    type: list
    elements: list
    default: []
  min_prompts:
    description:
      - Prompts per point are max(10 x concurrency, O(min_prompts)).
      - From 1 to 100000.
    type: int
    default: 50
  overflow:
    description: A pair longer than max_model_len has its input clipped (C(clip)) or is dropped (C(drop)).
    type: str
    choices: [clip, drop]
    default: clip
  percentiles:
    description: Latency percentiles saved (C(--metric-percentiles)); must include 50, 90 and 99.
    type: list
    elements: int
    default: [50, 90, 99]
  goodput:
    description:
      - Latency objectives in milliseconds, by vLLM's names C(ttft), C(tpot), C(e2el)
        (C(--goodput KEY:VALUE)). A request meeting all of them is good; the result's
        C(request_goodput) then feeds the cliff rule C(goodput_falls) (goodput falling as
        concurrency grows) and the note C(goodput_below_offered).
      - Empty (the default) measures no goodput.
    type: dict
    default: {}
  timeout:
    description:
      - Seconds the point may run; past it the container is removed and the point fails.
      - From 1 to 86400 (a day).
    type: int
    default: 900
  api_key:
    description: The instance's API key (vllm_server_api_key); passed as C(OPENAI_API_KEY) in the environment.
    type: str
    default: ""
  name:
    description: Name of the throwaway container; empty uses C(gpufleet-bench-<container>).
    type: str
    default: ""
  sample_gpus:
    description: Sample GPU utilisation during the point (NVML or nvidia-smi dmon).
    type: bool
    default: true
  seed:
    description:
      - Seed of the random dataset (C(--seed)), so that runs are comparable.
      - From 0 to 4294967295.
    type: int
    default: 0
  log_lines:
    description:
      - Lines of the benchmark's log returned for a failed point.
      - From 0 to 10000.
    type: int
    default: 40
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.read_only
requirements:
  - docker (Python SDK)
  - prometheus-client, to read vLLM's preemption counter (Debian/Ubuntu
    python3-prometheus-client; the vllm_server role installs it on the host)
  - nvidia-ml-py or nvidia-smi on the host, for GPU sampling (optional)
"""

EXAMPLES = r"""
- name: The matrix for this instance, clipped to its max_model_len
  gpufleet.fleet.vllm_bench:
    container: vllm-qwen3-8b
    target: 10.0.0.5:8000
    served_model_name: Qwen/Qwen3-8B
    concurrency: [1, 4, 16, 64]
    pairs: [[1000, 512], [100000, 512]]
  register: plan

- name: Run each point
  gpufleet.fleet.vllm_bench:
    container: vllm-qwen3-8b
    target: 10.0.0.5:8000
    served_model_name: Qwen/Qwen3-8B
    api_key: "{{ vllm_server_api_key }}"
    point: "{{ item }}"
    timeout: 600
  loop: "{{ plan.plan.points }}"
  no_log: true
"""

RETURN = r"""
instance:
  description: >-
    What was read from the serving container (image, image_id, model_path, model_mount,
    max_model_len, settings, gpu_device_ids, network_mode, env_names).
  returned: always
  type: dict
plan:
  description: Without O(point) - C(points) (each with C(num_prompts)), C(notes) (clips and drops), C(max_model_len), C(asked) (preset, concurrency, pairs).
  returned: when no point was given
  type: dict
command:
  description: The bench container's argv after the C(vllm) entrypoint (the API key is not in it).
  returned: when a point was given
  type: list
  elements: str
network_mode:
  description: C(host) for a loopback target, else C(default).
  returned: when a point was given
  type: str
status:
  description: C(ok) (measured), C(failed) (with RV(error)) or C(not_run) (check mode).
  returned: when a point was given
  type: str
error:
  description: Why the point failed.
  returned: when a point was given
  type: str
result:
  description: The saved result JSON of C(vllm bench serve), parsed.
  returned: when the point succeeded
  type: dict
row:
  description: The point as a row of gpufleet.bench (point_from_result, or failed_point for a failure).
  returned: when a point was run
  type: dict
log_tail:
  description: The last O(log_lines) lines of the benchmark's output.
  returned: when a point was run
  type: str
preemptions:
  description:
    - >-
      C(count) - requests vLLM preempted during the point (the rise of C(vllm:num_preemptions_total)
      on the instance's C(/metrics), read before and after; also the row's C(preemptions), which the
      cliff rule C(preemptions_start) reads), or null with C(reason) where it could not be read.
    - Counts the instance's preemptions from any load, so run nothing else against it meanwhile.
  returned: when a point was run
  type: dict
gpu:
  description: >-
    C(sampled), C(source), C(reason) and per GPU C(util_mean), C(util_max), C(mem_util_mean),
    C(mem_util_max) (memory bandwidth, as NVML's memory utilisation or dmon's C(mem) column give
    it), C(fb_max_mib), C(power_mean_w).
  returned: when a point was run
  type: dict
seconds:
  description: How long the point took.
  returned: always
  type: float
"""

import io
import json
import tarfile
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.urls import ConnectionError as UrlsConnectionError, open_url
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options, prometheus_text
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.bench import (
    PRESETS, BenchError, bench_env, bench_plan, bench_serve_command, goodput_flags,
    instance_from_inspect, is_loopback, percentile_flags, split_target)
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.bench_gpu import GpuSampler, summarise_gpu_samples
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.bench_results import (
    PREEMPTION_METRIC, failed_point, point_from_result, preemptions_from_metrics)
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.bounded import BoundError, join_capped, open_capped
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.serve import LABEL_PREFIX, remove_container

try:
    import docker
    from docker import errors as docker_errors
    HAS_DOCKER = True
except ImportError:
    docker = docker_errors = None
    HAS_DOCKER = False

RESULT_DIR = "/tmp/gpufleet-bench"
RESULT_FILE = "result.json"
# `--save-result` (without --save-detailed) writes a few KiB of figures; its archive is
# read up to this many bytes.
RESULT_MAX_BYTES = 16 << 20


def _read_result(container, path):
    """The saved result (text) from the stopped container, or raise."""
    stream, _stat = container.get_archive(path)
    data = join_capped(stream, RESULT_MAX_BYTES, f"the bench container's {path}",
                       "`vllm bench serve --save-result` writes a few KiB: check the "
                       "bench command (no --save-detailed) and the image.")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = next(m for m in tar.getmembers() if m.isfile())
        return tar.extractfile(member).read().decode("utf-8")


def _tail(text, lines):
    return "\n".join(text.splitlines()[-lines:]) if lines > 0 else ""


def inspect(client, params):
    """instance_from_inspect() of the running serving container, or raise BenchError."""
    try:
        serving = client.containers.get(params["container"])
    except docker_errors.NotFound:
        raise BenchError(f"container {params['container']} does not exist on this host's Docker "
                         f"engine: is the fleet's instance list up to date (site.yml)?") from None
    if serving.status != "running":
        raise BenchError(f"container {params['container']} is {serving.status}, not running")
    return instance_from_inspect(serving.attrs)


def run_point(client, params, info, command, network_mode, sampler):
    """Run the bench container for one point; return (result text or None, error or None,
    log tail, exit code)."""
    name = params["name"] or f"gpufleet-bench-{params['container']}"
    try:  # a container left by an interrupted earlier run
        remove_container(client.containers.get(name), docker_errors.NotFound)
    except docker_errors.NotFound:
        pass
    mount = info["model_mount"]
    kwargs = {"network_mode": "host"} if network_mode == "host" else {}
    container = client.containers.run(
        info["image_id"] or info["image"], entrypoint=["vllm"], command=command, name=name,
        environment=bench_env(info["env"], params["api_key"]), detach=True,
        volumes={mount["source"]: {"bind": mount["target"], "mode": "ro"}},
        labels={LABEL_PREFIX + "role": "vllm-bench"}, **kwargs)
    text, error, exit_code = None, None, None
    try:
        sampler.start()
        try:
            exit_code = container.wait(timeout=params["timeout"]).get("StatusCode")
        except Exception:  # requests' ReadTimeout / ConnectionError: still running
            error = (f"timed out after {params['timeout']} s (the point's time limit): "
                     f"the benchmark was stopped")
        logs = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
        if error is None and exit_code != 0:
            last = [ln for ln in logs.splitlines() if ln.strip()][-1:] or ["no output"]
            error = f"vllm bench serve exited with status {exit_code}: {last[0].strip()[:300]}"
        if error is None:
            try:
                text = _read_result(container, f"{RESULT_DIR}/{RESULT_FILE}")
            except Exception as exc:  # NotFound, tar errors
                error = f"vllm bench serve exited 0 but saved no result: {exc}"
    finally:
        remove_container(container, docker_errors.NotFound)
    return text, error, _tail(logs, params["log_lines"]), exit_code


def bench(params, client, check_mode, sampler_factory=None):
    start = time.monotonic()
    instance = params["instance"] or params["container"]
    address, port = split_target(params["target"])
    point = params["point"]
    if point is None:
        info = inspect(client, params)
        preset = PRESETS[params["preset"]]
        concurrency = params["concurrency"] or list(preset["concurrency"])
        pairs = [tuple(p) for p in (params["pairs"] or preset["pairs"])]
        plan = bench_plan(concurrency, pairs, info["max_model_len"], params["min_prompts"],
                          overflow=params["overflow"])
        plan["asked"] = {"preset": params["preset"], "concurrency": concurrency,
                         "pairs": [list(p) for p in pairs]}
        return {"instance": _public(info), "plan": plan,
                "seconds": round(time.monotonic() - start, 1)}
    point = {k: point.get(k) for k in ("input_len", "output_len", "concurrency", "num_prompts")}
    percentile_flags(params["percentiles"])  # refuse a bad list before anything runs
    goodput_flags(params["goodput"])
    network_mode = "host" if is_loopback(address) else "default"
    out = {"status": None, "error": None, "network_mode": network_mode, "point": point}
    try:
        info = inspect(client, params)
        if not info["model_mount"]:
            raise BenchError(f"container {params['container']} mounts no folder holding its "
                             f"model {info['model_path']}: the tokenizer cannot be read")
    except (BenchError, docker_errors.DockerException) as exc:
        return _failed(out, point, instance, str(exc), "", start)
    out["instance"] = _public(info)
    out["command"] = bench_serve_command(
        point, host=address, port=port, model=params["served_model_name"],
        tokenizer=info["model_path"], instance=instance, result_dir=RESULT_DIR,
        result_filename=RESULT_FILE, percentiles=params["percentiles"], seed=params["seed"],
        goodput=params["goodput"])
    if check_mode:
        out.update(status="not_run", seconds=round(time.monotonic() - start, 1))
        return out
    before = read_preemptions(address, port, params["api_key"])
    sampler = (sampler_factory or GpuSampler)() if params["sample_gpus"] else None
    if sampler is None:
        gpu = summarise_gpu_samples([], None, "GPU sampling off (sample_gpus: false)")
    try:
        text, error, tail, exit_code = run_point(client, params, info, out["command"],
                                                 network_mode, sampler or _NoSampler())
    except docker_errors.DockerException as exc:
        text, error, tail, exit_code = None, f"the bench container could not run: {exc}", "", None
    if sampler is not None:
        gpu = sampler.summary()
    out.update(gpu=gpu, exit_code=exit_code,
               preemptions=_preemptions(before, read_preemptions(address, port,
                                                                 params["api_key"])))
    if error is None:
        label = f"{instance} c={point['concurrency']} in={point['input_len']} out={point['output_len']}"
        try:
            result = json.loads(text)
            row = point_from_result(result, instance, point["input_len"], point["output_len"],
                                    source=label)
        except (ValueError, BenchError) as exc:
            error = f"the saved result cannot be used: {exc}"
        else:
            row["preemptions"] = out["preemptions"]["count"]
            # Requests that failed inside a measured point: their errors are in the log.
            out.update(status="ok", result=result, row=row,
                       log_tail=tail if row["failed"] else "",
                       seconds=round(time.monotonic() - start, 1))
            return out
    return _failed(out, point, instance, error, tail, start)


METRICS_TIMEOUT = 10  # seconds for one read of the instance's /metrics
METRICS_MAX_BYTES = 8 << 20


def read_preemptions(address, port, api_key=""):
    """(count, None) of vLLM's preemption counter on http://ADDRESS:PORT/metrics, or
    (None, reason) when it cannot be read (no such counter, refused, timed out)."""
    host = f"[{address}]" if ":" in address else address
    url = f"http://{host}:{port}/metrics"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def opener(target, timeout):
        return open_url(target, headers=headers, timeout=timeout)
    try:
        body = open_capped(opener, url, METRICS_MAX_BYTES, METRICS_TIMEOUT, what=url)
    except (OSError, UrlsConnectionError, BoundError, ValueError) as exc:
        return None, f"{url} could not be read: {exc}"
    try:
        count = preemptions_from_metrics(body.decode("utf-8", "replace"))
    except prometheus_text.MetricsError as exc:
        return None, f"{url} could not be read: {exc}"
    if count is None:
        return None, f"{url} has no {PREEMPTION_METRIC}"
    return count, None


def _preemptions(before, after):
    """{"count", "reason"} from the reads before and after a point."""
    if before[0] is None or after[0] is None:
        return {"count": None, "reason": before[1] or after[1]}
    if after[0] < before[0]:
        return {"count": None, "reason": f"{PREEMPTION_METRIC} went down during the point "
                                         f"({before[0]:g} -> {after[0]:g}): the server restarted"}
    return {"count": after[0] - before[0], "reason": None}


class _NoSampler:
    def start(self):
        return None


def _failed(out, point, instance, error, tail, start):
    row = failed_point(point["concurrency"], point["input_len"], point["output_len"], error,
                       instance)
    out.update(status="failed", error=error, row=row, log_tail=tail,
               seconds=round(time.monotonic() - start, 1))
    out.setdefault("gpu", summarise_gpu_samples([], None, "the point did not run"))
    return out


def _public(info):
    """The inspected instance without its environment's values."""
    public = {k: v for k, v in info.items() if k != "env"}
    public["env_names"] = sorted(info["env"])
    return public


def main():
    module = AnsibleModule(
        argument_spec={
            "container": {"type": "str", "required": True},
            "target": {"type": "str", "required": True},
            "served_model_name": {"type": "str", "required": True},
            "instance": {"type": "str", "default": ""},
            "point": {"type": "dict"},
            "preset": {"type": "str", "choices": ["default", "lab"], "default": "default"},
            "concurrency": {"type": "list", "elements": "int", "default": []},
            "pairs": {"type": "list", "elements": "list", "default": []},
            "min_prompts": {"type": "int", "default": 50},
            "overflow": {"type": "str", "choices": ["clip", "drop"], "default": "clip"},
            "percentiles": {"type": "list", "elements": "int", "default": [50, 90, 99]},
            "goodput": {"type": "dict", "default": {}},
            "timeout": {"type": "int", "default": 900},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "name": {"type": "str", "default": ""},
            "sample_gpus": {"type": "bool", "default": True},
            "seed": {"type": "int", "default": 0},
            "log_lines": {"type": "int", "default": 40},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec, {
            "container": options.text(empty=False),
            "served_model_name": options.text(empty=False),
            "min_prompts": options.whole(1, 100000),
            "timeout": options.whole(1, options.DAY, "seconds"),
            "seed": options.whole(0, 2 ** 32 - 1),
            "log_lines": options.whole(0, 10000),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    if not HAS_DOCKER:
        module.fail_json(msg=missing_required_lib("docker") + " (Debian/Ubuntu: python3-docker)")
    missing = prometheus_text.import_error()
    if missing:
        module.fail_json(msg=f"{missing_required_lib(prometheus_text.LIBRARY)} "
                             f"{prometheus_text.LIBRARY_HINT}", exception=missing)
    try:
        client = docker.from_env()
    except docker_errors.DockerException as exc:
        module.fail_json(msg=f"cannot reach the Docker engine (DOCKER_HOST): {exc}")
    try:
        result = bench(module.params, client, module.check_mode)
    except BenchError as exc:
        module.fail_json(msg=str(exc))
    except docker_errors.DockerException as exc:
        module.fail_json(msg=f"container {module.params['container']}: {exc}")
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
