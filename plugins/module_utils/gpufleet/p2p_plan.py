"""What model_fetch plans for p2p: the transport of each model, the seed policy, ports and
rates, the fleet's addresses, and each host's job for run_peer."""
from __future__ import annotations

from . import grammar
from .p2p_errors import P2PError
from .p2p_swarm import (DEFAULT_PORT, WEB_SEED_FALLBACK, WEB_SEED_HOSTS, allow_list, settings,
                        url_host, web_seed_delay, web_seed_url)

TRANSPORTS = ("http", "p2p")
# After a host's files are verified: seed until the rollout's end (the role's p2p_stop
# entry point, run by playbooks/site.yml's Models play and playbooks/upgrade.yml at their
# end; at most seed_max seconds), until told (forever: only p2p_stop with force, or a new
# commit of the model, stops it), or not at all.
SEED_POLICIES = ("until_rollout_end", "forever", "never")
MAX_RATE = 2 ** 40  # bytes/s: a cap above 1 TiB/s is a typo


def _whole(value, name, low, high):
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise P2PError(f"{name} must be a whole number from {low} to {high}, not {value!r:.40}.")
    return value


def _setting(value):
    """A role variable as a number: an extra var (-e) gives a string of digits, which the
    module's int option takes; anything else is left for the rule to refuse."""
    try:
        return grammar.count(value)
    except grammar.GrammarError:
        return value


def check_settings(transport, seed, upload_rate, download_rate, port,
                   web_seed_hosts=WEB_SEED_HOSTS, web_seed_fallback=WEB_SEED_FALLBACK):
    """The fleet-wide p2p settings of model_fetch (preflight): a list of problems, each
    naming the variable and what it takes (empty: fine)."""
    problems = []
    try:  # the web-seed policy's own rule, on a swarm of one
        web_seed_delay("-", ["-"], web_seed_hosts, web_seed_fallback)
    except P2PError as exc:
        problems.append(str(exc).rstrip("."))
    if transport not in TRANSPORTS:
        problems.append(f"model_fetch_transport is {transport!r:.40}: give http or p2p")
    if seed not in SEED_POLICIES:
        problems.append(f"model_fetch_p2p_seed is {seed!r:.40}: give one of "
                        f"{', '.join(SEED_POLICIES)}")
    for name, value in (("model_fetch_p2p_upload_rate", upload_rate),
                        ("model_fetch_p2p_download_rate", download_rate)):
        try:
            _whole(_setting(value), name, 0, MAX_RATE)
        except P2PError as exc:
            problems.append(str(exc).rstrip("."))
    try:
        _port(port, "model_fetch_p2p_port")
    except P2PError as exc:
        problems.append(str(exc).rstrip("."))
    return problems


def _port(value, name):
    """grammar.port (the one rule of a TCP port), as a P2PError."""
    try:
        return grammar.port(value, name)
    except grammar.GrammarError as exc:
        raise P2PError(str(exc)) from None


def port_option(name, value, show=None):
    """A module option's rule (options.check) for a swarm's port: grammar.port."""
    from .options import OptionError  # noqa: PLC0415

    try:
        return grammar.port(value, name)
    except grammar.GrammarError as exc:
        raise OptionError(str(exc)) from None


def model_transports(items, default):
    """{repo_id: transport} of model_fetch's items (an item's `transport` overrides the
    fleet's), and the problems (a transport that is neither http nor p2p)."""
    out, problems = {}, []
    for item in items or []:
        transport = item.get("transport", default)
        if transport not in TRANSPORTS:
            problems.append(f"model {item.get('repo_id')!r:.80}: transport {transport!r:.40} "
                            "is neither http nor p2p")
        out[item.get("repo_id")] = transport
    return out, problems


def model_port(base, index):
    """The listen port of the index-th model of model_fetch_models: one per model, the
    same on every host (its peers dial it), so two models' seeders never share one."""
    base = _port(base, "model_fetch_p2p_port")
    return _port(base + int(index), f"model_fetch_p2p_port + {int(index)} (the model's place "
                 "in model_fetch_models)")


def fleet_addresses(hosts, hostvars):
    """[(host, address)] of the inventory's p2p hosts and the problems: each host's fleet
    address by the one rule other roles use (serve.reachable_address: the operator's
    model_fetch_p2p_address, else the inventory's ansible_host, else the host's name),
    which must be an IP address (a name would be resolved differently by each peer)."""
    from .serve import reachable_address  # noqa: PLC0415 - plain Python, no cycle

    out, problems = [], []
    for host in hosts or []:
        hv = hostvars.get(host, {}) if hasattr(hostvars, "get") else {}
        addr = reachable_address("0.0.0.0", hv.get("model_fetch_p2p_address", ""),
                                 hv.get("ansible_host", host))
        try:
            allow_list([addr])
        except P2PError:
            problems.append(f"{host}: its fleet address {addr!r:.80} is not an IP address; "
                            "set model_fetch_p2p_address (or ansible_host) to the address "
                            "the other GPU hosts reach it at")
            continue
        out.append((host, addr))
    return out, problems


def peer_job(opts, repo_id, endpoint):
    """run_peer's job (without dest, listing, commit) from hf_model's p2p options: the
    host's listen address, the other fleet hosts' addr:port, the allow-list (those and
    the mirror) and the web seed URL (None without one), caps and timeout."""
    listen = opts.get("listen")
    try:
        listen = allow_list([listen])[0]
        fleet = allow_list(list(opts.get("peers") or []) + [listen])
    except P2PError as exc:
        raise P2PError(f"p2p.listen / p2p.peers: {exc}") from None
    port = opts.get("port", DEFAULT_PORT)
    others = [a for a in fleet if a != listen]
    peers = [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in others]
    seed_url = web_seed_url(endpoint, repo_id) if opts.get("web_seed", True) else None
    mirror = opts.get("mirror_address") or (url_host(seed_url) if seed_url else None)
    if seed_url:
        try:
            allow_list([mirror])
        except P2PError:
            raise P2PError(f"the web seed's host {mirror!r:.80} is not an IP address: set "
                           "model_fetch_p2p_mirror_address to the site mirror's address "
                           "(libtorrent's filter allows addresses, not names).") from None
    job = {"listen": listen, "port": port, "peers": peers,
           "allow": allow_list(fleet, mirror if seed_url else None), "web_seed": seed_url,
           "torrent": opts.get("torrent"), "infohash": opts.get("infohash") or None,
           "upload_rate": opts.get("upload_rate", 0) or 0,
           "download_rate": opts.get("download_rate", 0) or 0,
           "timeout": opts.get("timeout", 3600),
           "web_seed_delay": opts.get("web_seed_delay", 0) or 0,
           "seed": opts.get("seed", "until_rollout_end"), "seed_max": opts.get("seed_max", 86400)}
    for name in ("upload_rate", "download_rate"):
        _whole(job[name], f"p2p.{name} (bytes/s, 0: no cap)", 0, MAX_RATE)
    if isinstance(job["web_seed_delay"], bool) \
            or not isinstance(job["web_seed_delay"], (int, float)) \
            or not 0 <= job["web_seed_delay"] <= 86400:
        raise P2PError(f"p2p.web_seed_delay must be a number of seconds from 0 to 86400, "
                       f"not {job['web_seed_delay']!r:.40}.")
    if not isinstance(job["timeout"], (int, float)) or job["timeout"] <= 0:
        raise P2PError(f"p2p.timeout must be a number of seconds above 0, not "
                       f"{job['timeout']!r:.40}.")
    settings(listen, port, job["upload_rate"], job["download_rate"])  # refuses a bad port
    return job


def seeds_after_fetch(policy):
    """Whether a host keeps seeding once its files are verified."""
    if policy not in SEED_POLICIES:
        raise P2PError(f"seed policy {policy!r:.40} is not one of {', '.join(SEED_POLICIES)}.")
    return policy != "never"


def stops_at_rollout_end(policy, force=False):
    """Whether the role's p2p_stop entry point stops a seeder of this policy."""
    return force or policy == "until_rollout_end"


def check_plan(result, job):
    """What check mode says about a p2p fetch: bytes from where, nothing changed."""
    return {"transport": "p2p", "would_fetch_bytes": result.get("bytes_to_download", 0),
            "from_peers": job.get("peers", []), "web_seed": job.get("web_seed"),
            "web_seed_delay": job.get("web_seed_delay", 0),
            "listen": f"{job.get('listen')}:{job.get('port')}"}
