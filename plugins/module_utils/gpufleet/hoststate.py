"""A host's state record: what a full site.yml run left on a GPU host, so that the next run
can skip the host in one round trip when neither its inputs nor its state have changed.

site.yml's first play asks the host (plugins/modules/host_state.py, state=check) to observe what
the record lists and compare: the inputs' digest (every role variable of the host and the
code's own files, computed on the control node), the package database (dpkg's status file:
a removed hold or an upgraded package changes it), every file under the configuration
trees the roles write (apt sources, keys and pins, /etc/docker, the container toolkit's
and CDI's files, modprobe and DKMS settings, systemd units and their enablement links),
the services, each vLLM container (id, image, state, health, restarts), the model folders
(every file's size and mtime), the GPUs (count, UUIDs, driver), the kernel and the boot.
Anything that differs sends the host through the whole run, which repairs it (a hand edit
of /etc/docker/daemon.json or `apt-mark unhold` included); only an exact match skips it.
The record is written (state=record) at the end of a full run that changed or verified
everything. Plain Python, no Ansible imports.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat

__all__ = [
    "FORMAT", "RECORD_PATH", "TREES", "FILES", "SERVICES", "HostStateError", "code_digest",
    "inputs_digest", "published_facts", "spec_for", "observe", "compare", "build_record",
]

FORMAT = 1
RECORD_PATH = "/var/lib/gpufleet/host-state.json"

# Everything the host-stack roles write lives under these trees (nvidia_repo: sources,
# keys, pins; nvidia_driver: modprobe, DKMS, pins; container_toolkit: /etc/docker,
# /etc/nvidia-container-toolkit, /etc/cdi; cuda_toolkit: /etc/profile.d; services and their
# drop-ins and enablement links: /etc/systemd/system). A change by anyone to any file there
# sends the host through the full run: more than the roles need, never less.
TREES = (
    "/etc/apt/sources.list.d", "/etc/apt/preferences.d", "/etc/apt/keyrings",
    "/etc/apt/trusted.gpg.d", "/usr/share/keyrings", "/etc/yum.repos.d", "/etc/pki/rpm-gpg",
    "/etc/dnf/plugins", "/etc/docker", "/etc/nvidia-container-toolkit",
    "/etc/nvidia-container-runtime", "/etc/cdi", "/etc/modprobe.d", "/etc/dkms",
    "/etc/profile.d", "/etc/systemd/system", "/etc/containerd",
)
# Single files read whole (the OS release decides the repository lines).
FILES = ("/etc/os-release", "/var/lib/dpkg/status", "/etc/apt/sources.list")
# Services whose state (active, enabled) is recorded; "not-found" is a state like any other.
SERVICES = ("docker", "containerd", "nvidia-persistenced", "nvidia-fabricmanager")
_MAX_REASONS = 12


class HostStateError(ValueError):
    """Bad input to the state record: the message says what was wrong and what to do."""


def _sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def code_digest(root, parts=("playbooks", "roles", "plugins", "meta", "ansible.cfg")):
    """sha256 over the path and bytes of every file of the collection's own code under
    `root` (a role default, a task or a module changed: every host runs in full). A part
    that is not there (ansible.cfg in an installed copy) adds nothing."""
    digest = hashlib.sha256()
    for part in parts:
        top = os.path.join(root, part)
        if os.path.isfile(top):
            files = [top]
        else:
            files = []
            for folder, dirs, names in os.walk(top):
                dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "molecule"))
                files += [os.path.join(folder, n) for n in sorted(names)
                          if not n.endswith((".pyc", ".pyo"))]
        for path in files:
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            digest.update(_sha256_file(path).encode() + b"\n")
    return digest.hexdigest()


def inputs_digest(names, values, code, extra=()):
    """sha256 of the host's inputs: each variable name with its value (JSON, keys sorted),
    the code's digest and `extra` (the host's name, address and groups)."""
    if len(names) != len(values):
        raise HostStateError(f"{len(names)} variable names but {len(values)} values")
    body = json.dumps({"vars": dict(zip(names, values)), "code": code, "extra": list(extra)},
                      sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def published_facts(plan, tunes):
    """What the later plays read from a host that the state check skips: the serving
    instances of vllm_serve_plan's result (for the fleet's instance list and the summary's
    requests) and each model's chosen settings (for the fleet table). Nothing else of the
    plan (its environment may hold a user's secret)."""
    keep = ("name", "url", "ca_file", "runner", "served_model_name", "port", "file_sd", "mount")
    plan = plan or {}
    instances = [{k: inst[k] for k in keep if k in inst} for inst in plan.get("instances", [])]
    settings = [{"item": {"name": (t.get("item") or {}).get("name")}, "settings": t["settings"]}
                for t in (tunes or []) if isinstance(t, dict) and "settings" in t]
    return {"plan": {"host": plan.get("host"), "instances": instances, "remove": []}
            if plan else {}, "tunes": {"results": settings}}


def _at(root, path):
    """`path` (absolute) on the host whose / is `root` (tests observe a folder)."""
    return root + path if root != "/" else path


def _tree(root, top):
    """{relative path: fingerprint} of every entry under `top`: a file by its bytes' sha256,
    mode and owner, a link by its target, a folder by its mode and owner."""
    seen = {}
    base = _at(root, top)
    if not os.path.lexists(base):
        return None
    for folder, dirs, names in os.walk(base):
        dirs.sort()
        for name in sorted(dirs) + sorted(names):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, base)
            try:
                info = os.lstat(path)
                if stat.S_ISLNK(info.st_mode):
                    seen[rel] = "link:" + os.readlink(path)
                elif stat.S_ISDIR(info.st_mode):
                    seen[rel] = "dir:%o:%d:%d" % (stat.S_IMODE(info.st_mode), info.st_uid,
                                                  info.st_gid)
                elif stat.S_ISREG(info.st_mode):
                    seen[rel] = "file:%s:%o:%d:%d" % (_sha256_file(path),
                                                      stat.S_IMODE(info.st_mode),
                                                      info.st_uid, info.st_gid)
                else:
                    seen[rel] = "other:%o" % info.st_mode
            except OSError as exc:
                seen[rel] = "unreadable:%s" % exc.strerror
    return seen


def _models(root, folders):
    """{folder: {relative path: [size, mtime_ns]}} of the model folders (the bytes were
    verified when model_fetch wrote them; a truncated, replaced or removed file changes its
    size or mtime)."""
    result = {}
    for top in folders:
        base = _at(root, top)
        entries = {}
        if not os.path.isdir(base):
            result[top] = None
            continue
        for folder, dirs, names in os.walk(base):
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(folder, name)
                try:
                    info = os.stat(path)
                    entries[os.path.relpath(path, base)] = [info.st_size, info.st_mtime_ns]
                except OSError as exc:
                    entries[os.path.relpath(path, base)] = "unreadable:%s" % exc.strerror
        result[top] = entries
    return result


def _gpus(facts):
    """The GPU facts that a full run depends on (gpu_facts' result)."""
    facts = facts or {}
    return {"present": bool(facts.get("present")), "count": facts.get("count", 0),
            "driver_version": facts.get("driver_version"),
            "cuda_driver_version": facts.get("cuda_driver_version"),
            "uuids": [d.get("uuid") for d in facts.get("devices", [])]}


def _text(root, path):
    try:
        with open(_at(root, path), encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def observe(spec, run, gpu_facts, root="/"):
    """What the host looks like now, for what `spec` lists (services, containers, model
    folders; the trees and files are always read). `run(argv)` returns (rc, stdout) and is
    how services and containers are asked; `gpu_facts` is gpu_facts' result."""
    def read(path):
        try:
            return _sha256_file(_at(root, path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            return "unreadable:%s" % exc.strerror

    services = {}
    for name in spec.get("services", SERVICES):
        _rc, active = run(["systemctl", "is-active", name + ".service"])
        _rc, enabled = run(["systemctl", "is-enabled", name + ".service"])
        services[name] = "%s/%s" % (active.strip() or "unknown", enabled.strip() or "not-found")
    containers = {}
    names = list(spec.get("containers", []))
    if names:
        rc, out = run(["docker", "inspect", "--type", "container"] + names)
        found = {}
        try:
            for data in json.loads(out) if out.strip() else []:
                state = data.get("State") or {}
                found[data.get("Name", "").lstrip("/")] = {
                    "id": data.get("Id"), "image": data.get("Image"),
                    "status": state.get("Status"),
                    "health": (state.get("Health") or {}).get("Status"),
                    "restarts": data.get("RestartCount")}
        except ValueError:
            found = {}
        for name in names:
            containers[name] = found.get(name)
    return {
        "format": FORMAT,
        "kernel": os.uname().release,
        "boot_id": _text(root, "/proc/sys/kernel/random/boot_id"),
        "files": {path: read(path) for path in FILES + tuple(spec.get("files", []))},
        "trees": {top: _tree(root, top) for top in TREES},
        "services": services,
        "containers": containers,
        "models": _models(root, spec.get("models", [])),
        "gpus": _gpus(gpu_facts),
    }


def _diff_maps(kind, before, after, reasons):
    before, after = before or {}, after or {}
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            if key not in after or after.get(key) is None:
                reasons.append(f"{kind} {key}: gone")
            elif key not in before or before.get(key) is None:
                reasons.append(f"{kind} {key}: new")
            else:
                reasons.append(f"{kind} {key}: changed")


def compare(recorded, observed):
    """The differences between a record's observation and the host now, as short reasons
    (the first twelve); an empty list means the host is as the last full run left it."""
    reasons = []
    if recorded.get("format") != observed.get("format"):
        return [f"the record is format {recorded.get('format')}, this code writes {FORMAT}"]
    if recorded.get("boot_id") != observed.get("boot_id"):
        reasons.append("the host rebooted since the last full run")
    if recorded.get("kernel") != observed.get("kernel"):
        reasons.append(f"kernel {recorded.get('kernel')} -> {observed.get('kernel')}")
    _diff_maps("file", recorded.get("files"), observed.get("files"), reasons)
    for top in sorted(set(recorded.get("trees", {})) | set(observed.get("trees", {}))):
        before = recorded.get("trees", {}).get(top)
        after = observed.get("trees", {}).get(top)
        if before is None and after is None:
            continue
        if before is None or after is None:
            reasons.append(f"folder {top}: {'gone' if after is None else 'new'}")
            continue
        _diff_maps("file", {f"{top}/{k}": v for k, v in before.items()},
                   {f"{top}/{k}": v for k, v in after.items()}, reasons)
    _diff_maps("service", recorded.get("services"), observed.get("services"), reasons)
    _diff_maps("container", recorded.get("containers"), observed.get("containers"), reasons)
    for top in sorted(set(recorded.get("models", {})) | set(observed.get("models", {}))):
        before = recorded.get("models", {}).get(top)
        after = observed.get("models", {}).get(top)
        if before != after:
            if after is None:
                reasons.append(f"model folder {top}: gone")
            else:
                _diff_maps("model file", {f"{top}/{k}": v for k, v in (before or {}).items()},
                           {f"{top}/{k}": v for k, v in after.items()}, reasons)
    if recorded.get("gpus") != observed.get("gpus"):
        reasons.append("GPUs %s -> %s" % (_gpu_line(recorded.get("gpus")),
                                          _gpu_line(observed.get("gpus"))))
    if len(reasons) > _MAX_REASONS:
        reasons = reasons[:_MAX_REASONS] + [f"and {len(reasons) - _MAX_REASONS} more"]
    return reasons


def _gpu_line(gpus):
    gpus = gpus or {}
    return "%s x driver %s" % (gpus.get("count", 0), gpus.get("driver_version") or "-")


def spec_for(published):
    """What to observe for a host, from its published facts: its vLLM containers and the
    model folders they mount (the trees, files and services are always read)."""
    instances = ((published or {}).get("plan") or {}).get("instances", [])
    return {"containers": sorted({i["name"] for i in instances if i.get("name")}),
            "models": sorted({i["mount"][0] for i in instances
                              if isinstance(i.get("mount"), list) and i["mount"]})}


def build_record(digest, observed, published, recorded_at):
    """The record written after a full run."""
    if not isinstance(digest, str) or len(digest) != 64:
        raise HostStateError("inputs_digest must be the 64-hex sha256 site.yml's state play "
                             f"computes (got {digest!r:.80}); run site.yml, not this task alone")
    return {"format": FORMAT, "inputs_digest": digest, "observed": observed,
            "published": published, "recorded_at": recorded_at}
