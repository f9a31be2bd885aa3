#!/usr/bin/python
"""Ansible module vllm_serve_plan: the vLLM containers a host should run, and what changes."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_serve_plan
short_description: Plan the vLLM containers of one host and compare them with what runs
description:
  - For each model and its C(vllm_tune) result, computes the containers that serve it
    (one with tensor parallelism, or one replica per GPU group when allowed), with their
    names, host ports, GPUs, command, environment, mounts, labels and a settings hash
    over everything that defines the container (image id, command, environment, GPUs,
    port, mount, shared memory, model revision).
  - Reads the containers gpufleet already runs on the host (docker SDK, label
    C(org.gpufleet.managed-by=vllm_server)) and says per instance C(keep) (running with
    the same settings hash and image), C(create) or C(replace); and which managed
    containers with the same name prefix are no longer planned (C(remove)).
  - Refuses, before anything changes, a host port that another program or container
    already uses (a port held by the container being replaced is fine), and two
    instances on one port.
  - It only reads, so C(changed) is always false.
version_added: "0.1.0"
author: gpufleet maintainers (!UNKNOWN)
options:
  models:
    description:
      - The host's C(vllm_server_models) entries (C(name), C(path), optional C(port),
        C(served_model_name), C(gpus) (GPU indexes), C(replicas), C(env),
        C(speculative_model_path)).
      - An entry's C(speculative_model_path) (an EAGLE / EAGLE-3 draft's folder on the
        host, the one vllm_tune read) is mounted read-only at
        C(<model_mount_root>/<model slug>-draft), and the C(model) of the
        C(--speculative-config) in the tuned args (or C(--spec-model)) is rewritten to
        that path, so vLLM loads the folder the plan sized.
    type: list
    elements: dict
    required: true
  tunes:
    description: The C(vllm_tune) result of each model, in the same order (C(args), C(settings)).
    type: list
    elements: dict
    required: true
  image:
    description: The image reference to run.
    type: str
    required: true
  image_id:
    description: The image's id (C(sha256:...)); recorded in a label and the settings hash.
    type: str
    required: true
  container_prefix:
    description: Prefix of every container name (the model's name follows).
    type: str
    default: vllm-
  port:
    description: Host port of a model without its own C(port).
    type: int
    default: 8000
  bind_address:
    description: Host address vLLM listens on (host network) or the port is published on (bridge).
    type: str
    default: 127.0.0.1
  network_mode:
    description:
      - C(host) (vLLM listens on O(bind_address) and the instance's port itself; no NAT,
        no docker bridge needed) or C(bridge) (vLLM on 8000 in the container, published
        on O(bind_address):port).
    type: str
    choices: [host, bridge]
    default: host
  gpu_runtime:
    description: C(nvidia) or C(cdi) device requests, or C(none) (no GPU; vLLM's CPU backend).
    type: str
    choices: [nvidia, cdi, none]
    default: nvidia
  gpu_indexes:
    description:
      - Indexes of the host's GPUs.
      - Each from 0 to 1023.
    type: list
    elements: int
    default: []
  allow_replicas:
    description: Run one instance per GPU group when one instance does not need all GPUs.
    type: bool
    default: false
  env:
    description: Environment for every container (never the API key).
    type: dict
    default: {}
  shm_size:
    description: /dev/shm size when the container does not share the host's IPC namespace.
    type: str
    default: 8g
  model_mount_root:
    description: Folder inside the container under which model folders are mounted.
    type: str
    default: /models
  metrics_address:
    description:
      - Address the gateway and Prometheus reach this host's instances at, as given.
        Empty uses O(bind_address), or O(host_address) when vLLM listens on every
        interface (C(0.0.0.0), C(::)).
    type: str
    default: ""
  host_name:
    description: The host's inventory name, recorded as the C(host) label of each instance's entry.
    type: str
    default: ""
  host_address:
    description: The inventory's address of the host (C(ansible_host)); see O(metrics_address).
    type: str
    default: ""
  shutdown_timeout:
    description:
      - vLLM's C(--shutdown-timeout) in seconds (in-flight requests finish, new ones get
        503), 0 leaves vLLM's default (abort them). Each instance's C(stop_timeout) is
        set 15 s above it.
      - From 0 to 3600 (an hour).
    type: int
    default: 0
  cache_root:
    description:
      - A host folder for vLLM's cache (C(VLLM_CACHE_ROOT)), kept across restarts and
        replacements; each image gets its own subfolder, named by its id, mounted
        read-write. Empty leaves the cache in the container (lost at every replacement).
      - The planned instance's C(cache_dir) is that subfolder; this module does not
        create it.
    type: str
    default: ""
  check_ports:
    description: Refuse host ports in use by anything but the container being replaced.
    type: bool
    default: true
  key_digests:
    description:
      - The digests (C(key_digest) in plugins/module_utils/gpufleet/serve.py, filter
        C(gpufleet_key_digests)) of every API key the instances accept. Never the keys.
      - With O(auth_dir), each instance mounts the keys file named in its C(auth_file)
        read-only and reads it with C(--config); the digests are in the settings hash (a
        new key replaces the containers) and in the label C(org.gpufleet.api-keys).
      - Empty leaves the key to the caller (the container's environment), as before.
    type: list
    elements: str
    default: []
  auth_dir:
    description: Host folder of the keys files (one per set of keys, root only), needed with O(key_digests).
    type: str
    default: ""
  allow_key_cutover:
    description:
      - Plan the replacement of a running container that accepts none of the keys in
        O(key_digests) (its label says which it accepts). Without it such a plan is
        refused, as every client and the run's own requests would get 401 at once.
    type: bool
    default: false
  tls_dir:
    description:
      - Host folder holding C(cert.pem) and C(key.pem) (the role's fleet_ca call writes them,
        the key root's, 0600). Given, each instance mounts it read-only and serves C(https)
        only (vLLM's C(--ssl-certfile), C(--ssl-keyfile)); its C(url) and its C(file_sd) label
        C(scheme) say C(https). Empty, plain C(http).
    type: str
    default: ""
  tls_digest:
    description: The sha256 of the certificate in O(tls_dir), in the settings hash (a new certificate replaces the containers). Required with O(tls_dir).
    type: str
    default: ""
  tls_ca_file:
    description:
      - Host path of the CA certificate a client on the host verifies an C(https) instance with.
      - Returned as each instance's C(ca_file) (empty, the system's trust store).
    type: str
    default: ""
extends_documentation_fragment:
  - gpufleet.fleet.gpufleet.read_only
requirements:
  - docker (Python SDK)
"""

EXAMPLES = r"""
- name: Plan this host's vLLM containers
  gpufleet.fleet.vllm_serve_plan:
    models: "{{ vllm_server_models }}"
    tunes: "{{ vllm_server_tunes.results }}"
    image: vllm/vllm-openai:v0.32.0
    image_id: "{{ __vllm_server_image.images[0].Id }}"
    gpu_indexes: "{{ ansible_facts.gpu.devices | map(attribute='index') | list }}"
    allow_replicas: true
  register: plan
"""

RETURN = r"""
instances:
  description:
    - One entry per container, with C(name), C(model), C(port), C(url) (for a client on
      the host itself), C(stop_timeout), C(device_ids),
      C(network_mode), C(published_ports), C(command), C(env), C(mounts), C(ipc_mode), C(shm_size), C(device_requests),
      C(labels), C(settings_hash), C(args_hash), C(revision), C(served_model_name), C(runner),
      C(scheme) (C(https) with O(tls_dir), else C(http)), C(ca_file) (O(tls_ca_file) for an C(https) instance, else empty),
      C(cache_dir) (the host folder of its kept vLLM cache, empty without O(cache_root)),
      C(auth_file) (the host file of its API keys, empty without O(key_digests)), and
      C(action) (C(keep), C(create) or C(replace)), and C(file_sd) (its entry in the
      fleet's list of serving instances, a Prometheus file_sd entry with C(targets) and
      C(labels) C(host), C(container), C(model), C(served_model_name), C(runner), C(port), C(scheme)).
  returned: success
  type: list
  elements: dict
host:
  description: O(host_name), so a list of plans says whose each is (vllm_instances).
  returned: success
  type: str
remove:
  description: Names of managed containers with the prefix that are no longer planned.
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.serve import (
    LABEL_PREFIX, PlanError, check_unique_ports, decide_action, key_cut, local_url,
    model_revision, plan_instances, port_is_free, reachable_address, registry_entry)

try:
    import docker
    from docker import errors as docker_errors
    HAS_DOCKER = True
except ImportError:
    docker = docker_errors = None
    HAS_DOCKER = False


def _managed(client):
    """{name: {running, labels, image_id, host_ports}} of gpufleet's vLLM containers."""
    found = {}
    for cont in client.containers.list(
            all=True, filters={"label": f"{LABEL_PREFIX}managed-by=vllm_server"}):
        port = str((cont.labels or {}).get(LABEL_PREFIX + "port", ""))
        found[cont.name] = {"running": cont.status == "running", "labels": cont.labels,
                            "image_id": cont.attrs.get("Image"),
                            "port": int(port) if port.isdigit() else None}
    return found


def _port_user(client, port):
    """Name of a running container publishing `port` or labelled with it, if any."""
    for cont in client.containers.list():
        if str((cont.labels or {}).get(LABEL_PREFIX + "port")) == str(port):
            return cont.name
        for bindings in (cont.attrs.get("NetworkSettings", {}).get("Ports") or {}).values():
            if any(b.get("HostPort") == str(port) for b in bindings or []):
                return cont.name
    return None


def run(params, client):
    models, tunes = params["models"], params["tunes"]
    if len(models) != len(tunes):
        raise PlanError(f"{len(models)} models but {len(tunes)} tune results; pass the "
                        "vllm_tune results in the order of the models")
    instances = []
    for index, (model, tune) in enumerate(zip(models, tunes)):
        for key in ("name", "path"):  # the model's entry is not quoted: its env may hold a key
            if not isinstance(model.get(key), str) or not model[key].strip():
                keys = ", ".join(sorted(map(str, model))) or "nothing"
                raise PlanError(f"models[{index}] has no `{key}`: every vllm_server_models "
                                f"entry needs name and path (it has {keys})")
        if not tune.get("args") or not tune.get("settings"):
            raise PlanError(f"model {model.get('name')!r} has no vllm_tune result (args and "
                            "settings); tune it first")
        instances += plan_instances(
            model, tune, image=params["image"], image_id=params["image_id"],
            container_prefix=params["container_prefix"],
            default_port=params["port"] + 100 * index if not model.get("port") else None,
            gpu_indexes=params["gpu_indexes"], gpu_runtime=params["gpu_runtime"],
            allow_replicas=params["allow_replicas"], base_env=params["env"],
            shm_size=params["shm_size"], revision=model_revision(model["path"]),
            model_mount_root=params["model_mount_root"],
            network_mode=params["network_mode"], bind_address=params["bind_address"],
            shutdown_timeout=params["shutdown_timeout"], cache_root=params["cache_root"],
            key_digests=params["key_digests"], auth_dir=params["auth_dir"],
            tls_dir=params["tls_dir"], tls_digest=params["tls_digest"])
    check_unique_ports(instances)
    existing = _managed(client)
    address = reachable_address(params["bind_address"], params["metrics_address"],
                                params["host_address"])
    for inst in instances:
        current = existing.get(inst["name"])
        inst["action"] = decide_action(inst, current)
        if (inst["action"] == "replace" and current["running"] and params["key_digests"]
                and not params["allow_key_cutover"]):
            cut = key_cut(inst["name"], current["labels"], params["key_digests"])
            if cut:
                raise PlanError(cut)
        inst["url"] = local_url(params["bind_address"], inst["port"], inst["scheme"])
        inst["ca_file"] = params["tls_ca_file"] if inst["scheme"] == "https" else ""
        inst["file_sd"] = registry_entry(inst, params["host_name"], address)
        ours = bool(current and current["running"] and current["port"] == inst["port"])
        if params["check_ports"] and inst["action"] != "keep" and not ours \
                and not port_is_free(params["bind_address"], inst["port"]):
            user = _port_user(client, inst["port"])
            by = f"container {user}" if user else "another program"
            raise PlanError(
                f"port {inst['port']} on {params['bind_address']} is already in use by {by}, "
                f"so {inst['name']} ({inst['model']}) cannot listen there. Nothing was "
                f"changed. Give the model another `port`, or stop what listens there.")
    planned = {inst["name"] for inst in instances}
    remove = sorted(name for name in existing
                    if name.startswith(params["container_prefix"]) and name not in planned)
    return {"host": params["host_name"], "instances": instances, "remove": remove}


def main():
    module = AnsibleModule(
        argument_spec={
            "models": {"type": "list", "elements": "dict", "required": True},
            "tunes": {"type": "list", "elements": "dict", "required": True},
            "image": {"type": "str", "required": True},
            "image_id": {"type": "str", "required": True},
            "container_prefix": {"type": "str", "default": "vllm-"},
            "port": {"type": "int", "default": 8000},
            "bind_address": {"type": "str", "default": "127.0.0.1"},
            "network_mode": {"type": "str", "choices": ["host", "bridge"], "default": "host"},
            "gpu_runtime": {"type": "str", "choices": ["nvidia", "cdi", "none"],
                            "default": "nvidia"},
            "gpu_indexes": {"type": "list", "elements": "int", "default": []},
            "allow_replicas": {"type": "bool", "default": False},
            "env": {"type": "dict", "default": {}},
            "shm_size": {"type": "str", "default": "8g"},
            "model_mount_root": {"type": "str", "default": "/models"},
            "metrics_address": {"type": "str", "default": ""},
            "host_name": {"type": "str", "default": ""},
            "host_address": {"type": "str", "default": ""},
            "shutdown_timeout": {"type": "int", "default": 0},
            "cache_root": {"type": "str", "default": ""},
            "check_ports": {"type": "bool", "default": True},
            "key_digests": {"type": "list", "elements": "str", "default": [],
                            "no_log": False},  # sha256 digests of the keys, not the keys
            "auth_dir": {"type": "str", "default": ""},
            "allow_key_cutover": {"type": "bool", "default": False},
            "tls_dir": {"type": "str", "default": ""},
            "tls_digest": {"type": "str", "default": ""},
            "tls_ca_file": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec, {
            "image": options.text(empty=False),
            "image_id": options.text(empty=False),
            "gpu_indexes": options.items(options.whole(0, 1023)),
            "shutdown_timeout": options.whole(0, options.HOUR, "seconds"),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    if not HAS_DOCKER:
        module.fail_json(msg=missing_required_lib("docker") + " (Debian/Ubuntu: python3-docker)")
    try:
        result = run(module.params, docker.from_env())
    except (PlanError, OSError) as exc:
        module.fail_json(msg=str(exc), changed=False)
    except docker_errors.DockerException as exc:
        module.fail_json(msg=f"cannot list containers through docker: {exc}", changed=False)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
