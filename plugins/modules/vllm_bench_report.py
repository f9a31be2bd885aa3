#!/usr/bin/python
"""Ansible module vllm_bench_report: a benchmark run's folder (raw results, CSV, plots, HTML)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_bench_report
short_description: Write a benchmark run's folder - raw results, CSV per instance, PNG plots, one HTML report
description:
  - Takes the C(vllm_bench) results of a run (every point, measured or failed) and the
    instances they measured, analyses them with gpufleet.bench (knee and cliff per
    instance and input/output pair) and writes, in a new folder O(output_dir)/O(run_id)
    on the node it runs on (the control node), C(raw/INSTANCE/cC-inI-outO.json) (the
    saved results; C(.failed.json) with the reason and log tail for a failed point),
    C(INSTANCE.csv), C(INSTANCE-throughput.png), C(INSTANCE-latency-vs-concurrency.png),
    C(INSTANCE-latency-vs-input.png) (matplotlib, Agg), C(summary.json) and
    C(report.html) (self-contained, the plots embedded as base64 data URIs).
  - Never overwrites - an existing run folder fails the module.
  - Returns the knee per instance (RV(knee_facts), by host) and, per host, the knee
    request throughput of the other instances of each model it serves
    (RV(knee_rps_by_host), what upgrade.yml's capacity gate reads as C(benchmark_knee_rps)).
version_added: "0.3.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  output_dir:
    description: Folder holding the runs (one sub-folder per run).
    type: path
    required: true
  run_id:
    description: Name of this run's folder, the UTC timestamp (C(20261202T171500Z)).
    type: str
    required: true
  points:
    description: The C(vllm_bench) results with a point, each with C(instance) added.
    type: list
    elements: dict
    required: true
  instances:
    description:
      - The instances measured, each C({instance, host, container, model, served_model_name,
        image, settings, max_model_len, notes, gpu_facts}) (C(gpu_facts) is the host's
        C(ansible_facts.gpu)).
    type: list
    elements: dict
    required: true
  skipped:
    description: Instances not measured, each with C(host), C(container) and C(reason).
    type: list
    elements: dict
    default: []
  matrix:
    description:
      - The matrix asked for - C(preset), C(concurrency), C(pairs) (empty lists mean the preset's) and
        the run's settings; the summary and the report list what ran beside it (RV(summary)).
    type: dict
    default: {}
  p99_jump:
    description: Latency-step finding p99_*_jump (never the cliff) - factor above what concurrency explains (gpufleet.bench.analyse).
    type: float
    default: 2.0
  min_rate_ratio:
    description: Notes rate_below_offered and goodput_below_offered (never the cliff) - fraction of the offered request rate.
    type: float
    default: 0.8
  min_success_rate:
    description: Cliff rule failed_requests - fraction of requests that must succeed.
    type: float
    default: 1.0
  knee_sensitivity:
    description:
      - kneed's S for the knee.
      - Above 0 and at most 100.
    type: float
    default: 1.0
attributes:
  check_mode:
    support: full
    description: Analyses and builds everything, writes nothing, and reports changed as a run would.
  diff_mode:
    support: none
    description: A run writes a new folder; there is no previous state to diff.
requirements:
  - matplotlib, kneed (requirements-runtime.txt)
"""

EXAMPLES = r"""
- name: Write the run's folder
  gpufleet.fleet.vllm_bench_report:
    output_dir: "{{ playbook_dir }}/../benchmarks"
    run_id: "{{ now(utc=true, fmt='%Y%m%dT%H%M%SZ') }}"
    points: "{{ points }}"
    instances: "{{ instances }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
path:
  description: The run's folder (null in check mode).
  returned: always
  type: str
files:
  description: Paths written (would be written in check mode), relative to RV(path).
  returned: always
  type: list
  elements: str
summary:
  description:
    - >-
      Points (total, ok, failed), groups (knee, cliff, findings per instance and pair, and C(ran),
      each concurrency level with its status), failed points with their reasons, notes, the fleet
      table.
    - >-
      C(matrix) is the matrix that ran - C(concurrency) and C(pairs) from the points (measured or
      failed, after clipping), C(instances) the same per instance, C(asked) the O(matrix)'s axes
      with an empty list resolved to its preset's, and O(matrix)'s other settings.
  returned: always
  type: dict
knee_facts:
  description: "{host: {instance: {concurrency, output_throughput, request_throughput, input_len, output_len, why_no_knee, pairs}}}."
  returned: always
  type: dict
knee_rps_by_host:
  description: "{host: {backend: requests/s}}: the knee request throughput of the other hosts' instances of each model the host serves."
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.bench import BenchError
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.bench_report import build_report, check_run_id, write_run


def main():
    module = AnsibleModule(
        argument_spec={
            "output_dir": {"type": "path", "required": True},
            "run_id": {"type": "str", "required": True},
            "points": {"type": "list", "elements": "dict", "required": True},
            "instances": {"type": "list", "elements": "dict", "required": True},
            "skipped": {"type": "list", "elements": "dict", "default": []},
            "matrix": {"type": "dict", "default": {}},
            "p99_jump": {"type": "float", "default": 2.0},
            "min_rate_ratio": {"type": "float", "default": 0.8},
            "min_success_rate": {"type": "float", "default": 1.0},
            "knee_sensitivity": {"type": "float", "default": 1.0},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec, {
            "knee_sensitivity": options.number(above=0, high=100),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    p = module.params
    analysis = {k: p[k] for k in ("p99_jump", "min_rate_ratio", "min_success_rate",
                                  "knee_sensitivity")}
    try:
        check_run_id(p["run_id"])  # in check mode too
        report = build_report(p["points"], p["instances"], p["skipped"], p["run_id"],
                              p["matrix"], analysis, with_plots=True)
        path = None if module.check_mode else write_run(p["output_dir"], p["run_id"],
                                                        report["files"])
    except (BenchError, OSError) as exc:
        module.fail_json(msg=str(exc))
    summary = report["summary"]
    module.exit_json(changed=True, path=path, files=sorted(report["files"]), summary=summary,
                     knee_facts=summary["knee_facts"],
                     knee_rps_by_host=summary["knee_rps_by_host"])


if __name__ == "__main__":
    main()
