#!/usr/bin/python
"""Ansible module vllm_gateway_stats: HAProxy's per-server state and counters."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_gateway_stats
short_description: Read the gateway's backend servers' status and counters from HAProxy's admin socket
description:
  - Sends C(show stat) to HAProxy's stats socket and returns per backend server its
    status, C(scur) (current sessions), C(hrsp_5xx), C(eresp), C(wretr), C(wredis) and
    C(chkfail), and per backend how many servers are UP.
  - With O(server_host), also the servers of that inventory host (server names
    C(<host>_<port>)) and, per backend where it has one, how many other servers are UP.
  - With O(watch_seconds), samples every O(interval) seconds for that long and returns the
    growth of those counters and every status that was not exactly UP, DRAIN or MAINT in
    the window (of O(server_host)'s servers, or of all).
  - It only reads, so C(changed) is always false.
version_added: "0.1.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  socket:
    description: HAProxy's stats socket (C(vllm_gateway_stats_socket)).
    type: path
    default: /run/haproxy/admin.sock
  server_host:
    description: Inventory name of a GPU host whose servers to single out.
    type: str
  watch_seconds:
    description:
      - Seconds to watch; 0 reads once.
      - From 0 to 86400 (a day).
    type: int
    default: 0
  interval:
    description:
      - Seconds between samples while watching.
      - From 0.1 to 3600 (an hour).
    type: float
    default: 1.0
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.read_only
"""

EXAMPLES = r"""
- name: How many other servers of each backend are UP before lab-h200 goes out
  gpufleet.fleet.vllm_gateway_stats:
    server_host: lab-h200
  delegate_to: "{{ groups['gateways'][0] }}"
  register: stats

- name: Soak lab-h200 for 60 s after its upgrade
  gpufleet.fleet.vllm_gateway_stats:
    server_host: lab-h200
    watch_seconds: 60
  delegate_to: "{{ groups['gateways'][0] }}"
  register: soak
  failed_when: soak.bad_statuses | length > 0 or soak.deltas | map(attribute='hrsp_5xx') | sum > 0
"""

RETURN = r"""
servers:
  description: Every backend server with C(backend), C(server), C(host), C(status), C(scur),
    C(hrsp_5xx), C(eresp), C(wretr), C(wredis), C(chkfail).
  returned: always
  type: list
  elements: dict
backends:
  description: Per backend name its C(status), C(scur), C(servers) and C(up) (servers UP).
  returned: always
  type: dict
host_servers:
  description: The servers of O(server_host) (same keys as RV(servers)).
  returned: when O(server_host) is given
  type: list
  elements: dict
others_up:
  description: Per backend where O(server_host) has a server, the number of other servers UP.
  returned: when O(server_host) is given
  type: dict
  sample: {vllm_HuggingFaceTB_SmolLM2-135M-Instruct: 1}
samples:
  description: Number of samples taken in the window.
  returned: when O(watch_seconds) > 0
  type: int
deltas:
  description: Per server, growth of C(hrsp_5xx), C(eresp), C(wretr), C(wredis), C(chkfail)
    over the window, and C(scur_max).
  returned: when O(watch_seconds) > 0
  type: list
  elements: dict
bad_statuses:
  description: C({backend, server, status, at}) for each sample whose status was not UP, DRAIN or MAINT.
  returned: when O(watch_seconds) > 0
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.gateway import (
    GatewayError, backends, host_view, parse_show_stat, read_show_stat, servers, watch)


def run(params, read):
    result = {}
    if params["watch_seconds"] > 0:
        result.update(watch(read, params["watch_seconds"], host=params["server_host"],
                            interval=params["interval"]))
    rows = parse_show_stat(read())
    result.update(servers=servers(rows), backends=backends(rows))
    if params["server_host"]:
        view = host_view(rows, params["server_host"])
        result.update(host_servers=view["servers"], others_up=view["others_up"])
    return result


def main():
    module = AnsibleModule(
        argument_spec={
            "socket": {"type": "path", "default": "/run/haproxy/admin.sock"},
            "server_host": {"type": "str"},
            "watch_seconds": {"type": "int", "default": 0},
            "interval": {"type": "float", "default": 1.0},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec, {
            "watch_seconds": options.whole(0, options.DAY, "seconds"),
            "interval": options.number(0.1, options.HOUR, unit="seconds"),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    try:
        result = run(module.params, lambda: read_show_stat(module.params["socket"]))
    except GatewayError as exc:
        module.fail_json(msg=str(exc), changed=False)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
