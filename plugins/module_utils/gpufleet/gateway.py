"""The vLLM gateway (HAProxy in front of the fleet): backends, server names, stats.

Plain data in, plain data out; no Ansible imports. Used by the modules
`vllm_gateway_plan` (which frontends and backends HAProxy renders, validated before
anything changes) and `vllm_gateway_stats` (what the admin socket's `show stat` says),
and by roles/vllm_gateway.

The instances come from one place: the Prometheus file_sd list that roles/vllm_server
writes on the control node (`vllm_server_file_sd_path`), one entry per serving instance:
`{"targets": ["ADDRESS:PORT"], "labels": {"host", "container", "model",
"served_model_name", "runner", "port"}}`. `targets[0]` is where others reach it.

`show stat` columns are HAProxy's (doc/management.txt, "9.1. CSV format", 2.6):
pxname, svname, scur, eresp, wretr, wredis, status, chkfail, hrsp_5xx...
"""
from __future__ import annotations

import csv
import functools
import json
import re
import socket
import ssl
import time
import urllib.error
import urllib.request

from . import bounded, grammar, serve

__all__ = [
    "COUNTERS", "GatewayError", "NAME_RE", "OK_STATUSES", "SHOW_STAT_MAX_BYTES",
    "backend_name", "host_of_server", "backends", "host_view", "load_instances",
    "OPENAPI_MAX_BYTES", "OPENAPI_MAX_PATHS", "OPENAPI_TIMEOUT", "openapi_routes",
    "parse_show_stat", "plan_gateway", "plan_routes", "read_openapi", "read_show_stat",
    "route_plan", "safe_name", "server_name", "servers", "watch",
]

# HAProxy proxy and server names: "letters, digits, '-', '_', '.' and ':'" (configuration
# manual 2.6, section 4 "Proxies", and `server <name>`).
NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.:-]")
BACKEND_PREFIX = "vllm_"
# Counters the stats module reports and whose growth a watch window measures.
COUNTERS = ("hrsp_5xx", "eresp", "wretr", "wredis", "chkfail")
# Statuses that are not a problem during a soak window: serving, or put aside on purpose.
OK_STATUSES = ("UP", "DRAIN", "MAINT")
_LABELS = ("host", "served_model_name", "port")


class GatewayError(ValueError):
    """The gateway cannot be configured as asked; the message says what to change."""


def _scheme(labels, where):
    """An instance's label scheme (serve.scheme_of, the one rule), refused as a GatewayError."""
    try:
        return serve.scheme_of(labels)
    except serve.PlanError as exc:
        raise GatewayError(f"{where}: label {exc}: write the file with the vllm_server role") from None


def _checked(check, value, what):
    """grammar's check of `value`, its refusal as a GatewayError."""
    try:
        return check(value, what)
    except grammar.GrammarError as exc:
        raise GatewayError(str(exc)) from None


# ----------------------------------------------------------------- names
def safe_name(text):
    """`text` with every character HAProxy refuses in a name replaced by `_`."""
    text = str(text)
    if not text:
        raise GatewayError("an empty name cannot name an HAProxy backend or server")
    return _NOT_NAME.sub("_", text)


def server_name(host, port):
    """The HAProxy server name of the instance of inventory host `host` on `port`:
    `<host>_<port>`, stable across runs (no index, no order)."""
    port = _checked(grammar.port, port, f"port of host {host}")
    return f"{safe_name(host)}_{port}"


def host_of_server(name):
    """The (sanitized) host part of a server name made by server_name, or None."""
    host, sep, port = str(name).rpartition("_")
    if not sep or not host or not port.isdigit():
        return None
    return host


def backend_name(served_model_name):
    """The HAProxy frontend and backend name of a served model: `vllm_<name>`."""
    return BACKEND_PREFIX + safe_name(served_model_name)


# ----------------------------------------------------------------- instances
def load_instances(data, source="the instances file"):
    """The instances of a vllm_server file_sd list (a JSON text or the parsed list):
    [{host, address, port, served_model_name, model, runner, container, server}]."""
    if isinstance(data, (str, bytes)):
        if not str(data).strip():
            raise GatewayError(f"{source} is empty: run the vllm_server role (it writes "
                               "vllm_server_file_sd_path) or set vllm_gateway_instances_file")
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise GatewayError(f"{source} is not JSON ({exc}): it must be the file_sd list "
                               "the vllm_server role writes") from None
    if not isinstance(data, list):
        raise GatewayError(f"{source} must be a JSON list of {{targets, labels}} entries "
                           f"(a Prometheus file_sd list), not {type(data).__name__}")
    instances = []
    for index, entry in enumerate(data):
        where = f"{source}, entry {index}"
        if not isinstance(entry, dict):
            raise GatewayError(f"{where} is not an object with targets and labels")
        targets, labels = entry.get("targets"), entry.get("labels")
        if not isinstance(targets, list) or not targets or not isinstance(targets[0], str):
            raise GatewayError(f"{where}: targets must be a non-empty list of 'ADDRESS:PORT'")
        if not isinstance(labels, dict):
            raise GatewayError(f"{where}: labels must be an object with "
                               f"{', '.join(_LABELS)}")
        missing = [key for key in _LABELS if not str(labels.get(key, "")).strip()]
        if missing:
            raise GatewayError(f"{where} ({targets[0]}) has no label {', '.join(missing)}: "
                               "write the file with the vllm_server role")
        address, sep, port = targets[0].rpartition(":")
        if not sep or not address:
            raise GatewayError(f"{where}: target {targets[0]!r:.120} is not ADDRESS:PORT")
        try:
            grammar.port(port, "its port")
        except grammar.GrammarError as exc:
            raise GatewayError(f"{where}: target {targets[0]!r:.120} is not ADDRESS:PORT ({exc})") from None
        # what reaches haproxy.cfg: the address, the served name and the host (issue #32)
        _checked(grammar.address, address, f"{where}: the target's address")
        _checked(grammar.served_model_name, labels["served_model_name"], f"{where}: label served_model_name")
        _checked(grammar.host_name, labels["host"], f"{where}: label host")
        if str(labels["port"]) != port:
            raise GatewayError(f"{where}: label port {labels['port']} differs from the "
                               f"target's port in {targets[0]}")
        instances.append({
            "host": str(labels["host"]),
            "address": address[1:-1] if address.startswith("[") and address.endswith("]") else address,
            "port": int(port),
            "target": targets[0],
            "served_model_name": str(labels["served_model_name"]),
            "model": str(labels.get("model", "")),
            "runner": str(labels.get("runner", "")),
            "container": str(labels.get("container", "")),
            "scheme": _scheme(labels, where),
            "server": server_name(labels["host"], port),
        })
    return instances


# ----------------------------------------------------------------- plan
def plan_gateway(instances, frontends, metrics_port, require_tls=False):
    """Frontends with their backend servers, from loaded instances and
    vllm_gateway_frontends ([{served_model_name, port}]). Refuses a frontend whose model
    no instance serves, two frontends for one model, a port used twice (frontends and the
    metrics port), two backends or servers with the same name, and, with require_tls
    (vllm_gateway_backend_tls), an instance of a frontend that serves plain http.
    Returns {frontends: [{name, served_model_name, port, servers: [{name, address,
    port, host, endpoint, scheme}]}], unserved: [served_model_name of instances no frontend
    takes]}. A server whose scheme is https gets TLS on its server line, verified against
    the CA and its host name (templates/haproxy.cfg.j2)."""
    if not isinstance(frontends, list) or not frontends:
        raise GatewayError("vllm_gateway_frontends is empty: list one {served_model_name, port} "
                           "per model the gateway serves")
    ports = {_checked(grammar.port, metrics_port, "vllm_gateway_metrics_port"): "the metrics/stats frontend "
             "(vllm_gateway_metrics_port)"}
    by_model, names, planned = {}, {}, []
    for instance in instances:
        by_model.setdefault(instance["served_model_name"], []).append(instance)
    for index, frontend in enumerate(frontends):
        if not isinstance(frontend, dict) or not str(frontend.get("served_model_name") or "").strip():
            raise GatewayError(f"vllm_gateway_frontends[{index}] needs served_model_name and port")
        model = _checked(grammar.served_model_name, frontend["served_model_name"],
                         f"vllm_gateway_frontends[{index}] served_model_name")
        port = _checked(grammar.port, frontend.get("port"), f"vllm_gateway_frontends[{index}] ({model}) port")
        if port in ports:
            raise GatewayError(f"port {port} of the frontend for {model} is already taken by "
                               f"{ports[port]}: give each frontend its own port in "
                               "vllm_gateway_frontends")
        ports[port] = f"the frontend for {model}"
        name = backend_name(model)
        if name in names:
            what = ("is listed twice" if names[name] == model
                    else f"and {names[name]} both make the HAProxy name {name}")
            raise GatewayError(f"vllm_gateway_frontends: {model} {what}: one frontend per "
                               "served model")
        names[name] = model
        members = by_model.get(model)
        if not members:
            served = ", ".join(sorted(by_model)) or "none"
            raise GatewayError(f"no instance serves {model} (vllm_gateway_frontends[{index}]): "
                               f"the instances file lists {served}; serve it with "
                               "vllm_server first or remove the frontend")
        servers, seen = [], {}
        for member in members:
            if member["server"] in seen:
                raise GatewayError(
                    f"{model}: {member['target']} and {seen[member['server']]} both make "
                    f"server {member['server']} (host {member['host']}, port "
                    f"{member['port']}): the instances file lists one instance twice")
            seen[member["server"]] = member["target"]
            if require_tls and member.get("scheme", "http") != "https":
                raise GatewayError(
                    f"{model}: {member['target']} (host {member['host']}) serves plain http, and "
                    "vllm_gateway_backend_tls asks for TLS to every backend: serve it with "
                    "vllm_server_tls: true (roll it out with playbooks/upgrade.yml), or set "
                    "vllm_gateway_backend_tls: false while the fleet moves to TLS "
                    "(docs/gateway.md)")
            # HAProxy takes the last colon as the port separator, IPv6 included
            servers.append({"name": member["server"], "address": member["address"],
                            "port": member["port"], "host": member["host"],
                            "scheme": member.get("scheme", "http"),
                            "endpoint": f"{member['address']}:{member['port']}"})
        planned.append({"name": name, "served_model_name": model, "port": port,
                        "servers": sorted(servers, key=lambda s: s["name"])})
    unserved = sorted(set(by_model) - {f["served_model_name"] for f in planned})
    return {"frontends": planned, "unserved": unserved}


# ----------------------------------------------------------------- show stat
def parse_show_stat(text):
    """Rows of `show stat` CSV (first line `# pxname,svname,...`) as dicts; counters that
    HAProxy leaves empty for a row type are None, numbers are ints."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# pxname,svname,"):
        first = lines[0][:80] if lines else "nothing"
        raise GatewayError(f"not a show stat answer (it starts with {first!r}): is the "
                           "socket HAProxy's stats socket?")
    rows = []
    for row in csv.DictReader([lines[0][2:]] + lines[1:]):
        parsed = {}
        for key, value in row.items():
            if key is None or key == "":
                continue
            value = value or ""
            parsed[key] = int(value) if value.isdigit() else (value if value else None)
        rows.append(parsed)
    return rows


def servers(rows):
    """The server rows (not FRONTEND/BACKEND) as {backend, server, host, status, scur,
    and COUNTERS}."""
    result = []
    for row in rows:
        if row.get("svname") in ("FRONTEND", "BACKEND"):
            continue
        entry = {"backend": row["pxname"], "server": row["svname"],
                 "host": host_of_server(row["svname"]), "status": row.get("status"),
                 "scur": row.get("scur") or 0}
        entry.update({key: row.get(key) or 0 for key in COUNTERS})
        result.append(entry)
    return result


def backends(rows):
    """{backend: {status, scur, servers, up}} from the BACKEND rows and their servers."""
    result = {}
    for row in rows:
        if row.get("svname") == "BACKEND":
            result[row["pxname"]] = {"status": row.get("status"), "scur": row.get("scur") or 0,
                                     "servers": 0, "up": 0}
    for entry in servers(rows):
        backend = result.setdefault(entry["backend"], {"status": None, "scur": 0,
                                                       "servers": 0, "up": 0})
        backend["servers"] += 1
        backend["up"] += _is_up(entry["status"])
    return result


def _is_up(status):
    # "UP", "UP 1/2" (going down, still serving); not "DOWN 1/3" (coming up), NOLB, DRAIN
    return bool(status) and status.split()[0] == "UP"


def host_view(rows, host):
    """The servers of inventory host `host`, and per backend where it has one how many
    OTHER servers are UP (the capacity left while it is out)."""
    wanted = safe_name(host)
    mine = [entry for entry in servers(rows) if entry["host"] == wanted]
    others_up = {}
    for entry in servers(rows):
        if entry["backend"] in {m["backend"] for m in mine} and entry["host"] != wanted:
            others_up[entry["backend"]] = others_up.get(entry["backend"], 0) + _is_up(entry["status"])
    for entry in mine:
        others_up.setdefault(entry["backend"], 0)
    return {"servers": mine, "others_up": others_up}


# `show stat` is one CSV line (under 1 KiB) per frontend, backend and server: a fleet of
# thousands of instances answers in a few MiB. More than this is not HAProxy answering
# `show stat`.
SHOW_STAT_MAX_BYTES = 16 << 20


def read_show_stat(path, timeout=5.0):
    """Ask HAProxy's stats socket at `path` for `show stat`; return the CSV text.

    The whole exchange (connect, ask, read the answer) takes at most `timeout` seconds:
    the socket's timeout is the time left before each step, so a peer that drips its
    answer cannot hold the read longer; the answer is read up to SHOW_STAT_MAX_BYTES.
    Raises GatewayError (unreachable socket, a cap or the deadline passed)."""
    deadline = bounded.Deadline(
        timeout, f"HAProxy's stats socket {path}",
        "HAProxy answers `show stat` at once, in under 1 KiB a server: check that the "
        "socket is HAProxy's (vllm_gateway_stats_socket) and that HAProxy is not stuck.")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(deadline.left())
        sock.connect(path)
        sock.settimeout(deadline.left())
        sock.sendall(b"show stat\n")
        data = bounded.read_capped(sock.recv, SHOW_STAT_MAX_BYTES, deadline,
                                   settimeout=sock.settimeout)
    except bounded.BoundError as exc:
        raise GatewayError(str(exc)) from None
    except OSError as exc:
        raise GatewayError(f"cannot read HAProxy's stats socket {path}: {exc} (is haproxy "
                           "running with `stats socket` there, see vllm_gateway_stats_socket?)") from None
    finally:
        sock.close()
    return data.decode("utf-8", "replace")


def _bad_status(status):
    # UP (also "UP 1/2"), DRAIN or MAINT (also "MAINT (via b/s)" when tracking) are fine;
    # DOWN, "DOWN 1/3" (coming up), NOLB, "no check"... are not. "UP 1/2" is a serving
    # server below full health: right after it leaves maintenance (seen on the lab's
    # gateway: tests/fixtures/haproxy/show-stat-2.6.12-left-maint.csv, chkfail 0) or after
    # a failed check, which the soak counts in chkfail.
    return (status or "").split(" ")[0] not in OK_STATUSES


def watch(read, seconds, host=None, interval=1.0, sleep=time.sleep):
    """Sample `read()` (show stat CSV text) every `interval` s for `seconds` s. Returns
    {samples, deltas: [{backend, server, COUNTERS growth, scur_max}], bad_statuses:
    [{backend, server, status, at}] (each status not exactly UP/DRAIN/MAINT seen in the
    window)} for the servers of `host` (all servers when None)."""
    wanted = safe_name(host) if host else None
    count = max(1, int(round(seconds / interval))) + 1 if seconds > 0 else 1
    first = last = None
    scur_max, bad = {}, []
    for index in range(count):
        if index:
            sleep(interval)
        at = round(index * interval, 1)
        current = {(e["backend"], e["server"]): e for e in servers(parse_show_stat(read()))
                   if wanted is None or e["host"] == wanted}
        first = current if first is None else first
        last = current
        for key, entry in current.items():
            scur_max[key] = max(scur_max.get(key, 0), entry["scur"])
            if _bad_status(entry["status"]):
                bad.append({"backend": key[0], "server": key[1], "status": entry["status"],
                            "at": at})
    deltas = []
    for key, entry in sorted(last.items()):
        before = first.get(key, entry)
        delta = {"backend": key[0], "server": key[1], "scur_max": scur_max[key]}
        delta.update({c: entry[c] - before[c] for c in COUNTERS})
        deltas.append(delta)
    return {"samples": count, "deltas": deltas, "bad_statuses": bad}


# ----------------------------------------------------------------- routes
# What each model frontend forwards (issue #32 item 1): the routes its instances list in
# their own OpenAPI document (vLLM's FastAPI app serves it at /openapi.json; which routers
# it holds depends on the model's tasks: vllm/entrypoints/launchers/api_server/routers.py,
# register_api_routers, 0.32.0), intersected with the operator's allowlist
# (vllm_gateway_routes). vLLM 0.32's document is about a few hundred KiB; more than
# OPENAPI_MAX_BYTES or OPENAPI_MAX_PATHS is not vLLM's.
OPENAPI_MAX_BYTES = 8 << 20
OPENAPI_MAX_PATHS = 4096
OPENAPI_TIMEOUT = 10.0
_PATH_MAX = 1024
# OpenAPI 3 Path Item fields that are operations; the others (summary, description,
# servers, parameters, $ref) are not routes.
_OPERATIONS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_PRINTABLE = re.compile(r"^[\x21-\x7e]+$")


def openapi_routes(document, source="the OpenAPI document"):
    """{path: [METHOD, ...]} of an OpenAPI document (its JSON bytes or text, or parsed):
    each entry of `paths` with at least one operation. A path template
    (/v1/responses/{response_id}) is kept as written. Raises GatewayError for a document
    that is not JSON, not an OpenAPI document with a `paths` object, has more than
    OPENAPI_MAX_PATHS paths, or a path that is not '/' then printable ASCII (at most
    1024 characters)."""
    if isinstance(document, (bytes, bytearray)):
        if len(document) > OPENAPI_MAX_BYTES:
            raise GatewayError(f"{source} is {len(document)} bytes, more than "
                               f"{OPENAPI_MAX_BYTES >> 20} MiB: not vLLM's OpenAPI document")
        document = bytes(document).decode("utf-8", "replace")
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except ValueError as exc:
            raise GatewayError(f"{source} is not JSON ({str(exc)[:80]})") from None
    if not isinstance(document, dict) or not isinstance(document.get("paths"), dict):
        raise GatewayError(f"{source} is not an OpenAPI document: it has no `paths` object")
    if not isinstance(document.get("openapi", document.get("swagger")), str):
        raise GatewayError(f"{source} is not an OpenAPI document: it has no `openapi` version")
    paths = document["paths"]
    if len(paths) > OPENAPI_MAX_PATHS:
        raise GatewayError(f"{source} lists {len(paths)} paths, more than "
                           f"{OPENAPI_MAX_PATHS}: not vLLM's OpenAPI document")
    routes = {}
    for path, item in paths.items():
        if (not isinstance(path, str) or not path.startswith("/") or len(path) > _PATH_MAX
                or not _PRINTABLE.match(path)):
            raise GatewayError(f"{source} lists the path {path!r:.80}, which is not '/' then "
                               f"at most {_PATH_MAX} printable ASCII characters")
        if not isinstance(item, dict):
            raise GatewayError(f"{source}: the path {path} is not an object of operations")
        methods = sorted(m.upper() for m in item if isinstance(m, str) and m.lower() in _OPERATIONS)
        if methods:
            routes[path] = methods
    return routes


def route_plan(served, allowlist, keyless=()):
    """What a frontend forwards: the allowlisted paths its image serves.

    served: openapi_routes() of one instance; allowlist: vllm_gateway_routes (exact
    paths); keyless: vllm_gateway_keyless_paths (answered without a key, not routes).
    A path template never matches: the allowlist holds exact paths only.
    Returns {routes: [forwarded], closed: [served, not listed (templates included)],
    unserved: [listed, not served]}, each sorted."""
    listed = list(dict.fromkeys(allowlist))
    return {
        "routes": sorted(path for path in listed if path in served),
        "closed": sorted(path for path in served if path not in listed and path not in keyless),
        "unserved": sorted(path for path in listed if path not in served),
    }


def _open_with(https, target, timeout, headers):
    return https.open(urllib.request.Request(target, headers=headers), timeout=timeout)


def _url(server, scheme):
    host = f"[{server['address']}]" if ":" in server["address"] else server["address"]
    return f"{scheme}://{host}:{server['port']}/openapi.json"


def read_openapi(server, api_keys=(), ca_file="", timeout=OPENAPI_TIMEOUT,
                 max_bytes=OPENAPI_MAX_BYTES):
    """The body of `server`'s (a plan_gateway server: address, port, scheme) /openapi.json:
    over its scheme (a server without one: https when `ca_file` is given, else http),
    https verified with `ca_file` (empty: the system's trust store). Asked without a key
    first, then (on 401) with each of `api_keys` in turn; the whole of each answer within
    `timeout` seconds and at most `max_bytes`. Raises GatewayError naming the URL and why
    (unreachable, a status other than 200, the cap or the deadline passed)."""
    scheme = server.get("scheme") or ("https" if ca_file else "http")
    url = _url(server, scheme)
    try:
        context = (ssl.create_default_context(cafile=ca_file or None)
                   if scheme == "https" else None)
    except (OSError, ssl.SSLError) as exc:  # not copied yet (a first run), or not PEM
        raise GatewayError(f"{url} was not read: the CA file {ca_file} cannot be used "
                           f"({exc})") from None
    # what urllib.request's urlopen(..., context=context) builds for itself
    https = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
    last = None
    for key in [None, *api_keys]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        opener = functools.partial(_open_with, https, headers=headers)
        try:
            return bounded.open_capped(opener, url, max_bytes, timeout, what=url,
                                       advice="vLLM sends its OpenAPI document at once, a "
                                       "few hundred KiB: check what answers there")
        except urllib.error.HTTPError as exc:
            last = f"{url} answered HTTP {exc.code}"
            exc.close()
            if exc.code != 401:
                break
        except bounded.BoundError as exc:
            raise GatewayError(str(exc)) from None
        except (OSError, ValueError, ssl.SSLError) as exc:
            raise GatewayError(f"{url} could not be read: {exc}") from None
    raise GatewayError(f"{last}{' with each key of vllm_gateway_api_keys' if api_keys else ''}"
                       " (a vLLM started with --disable-fastapi-docs serves no OpenAPI document)")


def plan_routes(frontends, allowlist, keyless=(), read=None):
    """Each planned frontend (plan_gateway's) with what it forwards: the routes its model's
    instances serve (read(server) -> the body of its /openapi.json, one server after
    another until one gives a valid document) intersected with `allowlist`.

    When no server's document can be read or used (none serving yet: a first install; or
    read is None: vllm_gateway_routes_from_openapi off), the frontend forwards the whole
    allowlist, and says so. Adds to each frontend: routes, routes_source ("openapi" or
    "allowlist"), routes_from (the server read, or None), routes_closed,
    routes_unserved, routes_note (one line for the operator). Raises GatewayError when
    the image serves none of the allowlisted routes (the frontend would forward nothing).
    """
    planned = []
    for frontend in frontends:
        frontend = dict(frontend)
        reasons, served, source = [], None, None
        for server in frontend["servers"] if read is not None else ():
            try:
                served = openapi_routes(read(server), f"{server['endpoint']}'s /openapi.json")
                source = server["name"]
                break
            except GatewayError as exc:
                reasons.append(str(exc))
        model = frontend["served_model_name"]
        if served is None:
            why = "; ".join(reasons) if reasons else "reading it is turned off (vllm_gateway_routes_from_openapi)"
            frontend.update(routes=sorted(dict.fromkeys(allowlist)), routes_source="allowlist",
                            routes_from=None, routes_closed=[], routes_unserved=[],
                            routes_note=(f"{model}: forwards the whole allowlist "
                                         "(vllm_gateway_routes), not checked against what the "
                                         f"image serves: no instance's OpenAPI document was used ({why})"))
        else:
            plan = route_plan(served, allowlist, keyless)
            if not plan["routes"]:
                raise GatewayError(
                    f"{model}: its image ({source}) serves none of vllm_gateway_routes, so its "
                    f"frontend would forward nothing; it serves {', '.join(plan['closed'][:20])}: "
                    "list the ones to forward in vllm_gateway_routes")
            frontend.update(routes=plan["routes"], routes_source="openapi", routes_from=source,
                            routes_closed=plan["closed"], routes_unserved=plan["unserved"],
                            routes_note=(f"{model}: forwards {len(plan['routes'])} routes its image "
                                         f"serves ({source}'s /openapi.json); served but closed (not "
                                         f"in vllm_gateway_routes): {', '.join(plan['closed']) or 'none'}; "
                                         f"listed but not served by this image: "
                                         f"{', '.join(plan['unserved']) or 'none'}"))
        planned.append(frontend)
    return planned
