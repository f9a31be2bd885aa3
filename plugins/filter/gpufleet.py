"""gpufleet's filters: thin wrappers of plugins/module_utils/gpufleet (upgrade.py, serve.py,
engine_args.py, hub.py).

They run on the control node and only compute (no host is contacted), so decisions
(batches, what changes, gates, rollback variables, an instance's address) stay plain,
unit-tested Python (tests/unit/test_upgrade.py, test_serve.py) instead of Jinja.
"""
from __future__ import annotations

import os

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import (
    engine_args, p2p_errors, p2p_plan, p2p_swarm, p2p_torrent, prometheus_text, rollout, serve,
    upgrade)

# The collection's root (the checkout, through collections/, or an installed copy): the
# state check's roles and code are this folder's, wherever the playbook that runs it lives
# (an imported or collection playbook has playbook_dir = <root>/playbooks).
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _wrap(func):
    def call(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except upgrade.UpgradeError as exc:
            raise AnsibleFilterError(str(exc)) from exc
    call.__name__ = func.__name__
    call.__doc__ = func.__doc__
    return call


def p2p_problems(models, transport, seed, upload_rate, download_rate, port,
                 web_seed_hosts=p2p_swarm.WEB_SEED_HOSTS,
                 web_seed_fallback=p2p_swarm.WEB_SEED_FALLBACK):
    """model_fetch's preflight of its p2p settings (p2p_plan.check_settings,
    p2p_plan.model_transports): the problems, each naming the variable and what it takes."""
    _transports, problems = p2p_plan.model_transports(models, transport)
    return p2p_plan.check_settings(transport, seed, upload_rate, download_rate, port,
                                   web_seed_hosts, web_seed_fallback) + problems


def p2p_web_seed_delay(host, hosts, first, fallback):
    """The web-seed policy's seconds of peers only for `host` (p2p_swarm.web_seed_delay,
    which also takes an extra var's string of digits, as preflight does)."""
    try:
        return p2p_swarm.web_seed_delay(host, list(hosts or []), first, fallback)
    except p2p_errors.P2PError as exc:
        raise AnsibleFilterError(str(exc)) from None


def p2p_fleet(hosts, hostvars):
    """{addresses: {host: IP}, problems} of the p2p hosts (p2p_plan.fleet_addresses)."""
    pairs, problems = p2p_plan.fleet_addresses(hosts, hostvars)
    return {"addresses": dict(pairs), "problems": problems}


def torrent_infohash(path):
    """The v1 infohash of a torrent file on the control node (p2p_torrent.infohashes, plain
    Python): what the hosts are told to accept."""
    try:
        with open(path, "rb") as fh:
            return p2p_torrent.infohashes(fh.read())[0]
    except (OSError, p2p_errors.P2PError) as exc:
        raise AnsibleFilterError(f"torrent {path}: {exc}") from exc


def metric_samples(text):
    """Every sample of a Prometheus text page (prometheus_text.samples, prometheus-client's
    parser): [{name, labels, value}]; a page that is not Prometheus text fails the task."""
    try:
        return prometheus_text.samples(text)
    except prometheus_text.MetricsError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def bad_repo_ids(repo_ids):
    """The entries of `repo_ids` that hf_model would refuse (gpufleet.hub_names.validate_repo_id,
    the one rule), so a role's preflight refuses them before anything is fetched."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import hub_errors, hub_names  # no requests needed

    bad = []
    for repo_id in repo_ids or []:
        try:
            hub_names.validate_repo_id(repo_id)
        except hub_errors.HubError:
            bad.append(repo_id)
    return bad


def model_locks(entries, locks=None, lock_dir="", require=False, role="model_fetch"):
    """gpufleet.model_lock.resolve_locks: {items, problems}, the models with each one's lock
    read and checked on the control node (model_fetch's and hf_site_mirror's preflights)."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import model_lock

    items, problems = model_lock.resolve_locks(entries, locks, lock_dir, require, role)
    return {"items": items, "problems": problems}


def bad_addresses(values, networks=False):
    """gpufleet.hub_mirror.bad_addresses: entries that are not an IP address (or, with
    networks=True, not an address or CIDR network)."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import hub_mirror  # needs requests, like hub

    return hub_mirror.bad_addresses(values, networks)


def bad_inputs(inputs):
    """gpufleet.grammar.check_inputs: the messages for the values of `inputs`
    ({variable: [kind, value]}) that break their kind's rule; [] when all hold."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import grammar

    try:
        return grammar.check_inputs(inputs)
    except grammar.GrammarError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def tls_problems(cert_pem, key_pem, cert_name="the certificate", key_name="the key"):
    """gpufleet.tls.pair_problems: what is wrong with a certificate and its key (parse,
    match, validity now); [] when they suit HAProxy's `bind ... ssl crt`. No key text in
    any message."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import tls  # here: it needs cryptography, which only the controller has

    return tls.pair_problems(cert_pem, key_pem, cert_name, key_name)


def tls_ca_problems(ca_pem, name="the CA certificate"):
    """gpufleet.tls.ca_problems: what is wrong with the CA certificate HAProxy verifies
    the backends with; [] when none."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import tls

    return tls.ca_problems(ca_pem, name)


def tls_san(names):
    """gpufleet.tls.san_entries: ['IP:...', 'DNS:...'] for a certificate the fleet CA signs."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import tls

    try:
        return tls.san_entries(names)
    except tls.TLSError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def _keys(func):
    """serve's API-key helpers as filters: a bad key is an AnsibleFilterError whose message
    names the variable, never the value."""
    def call(*args, **kwargs):
        from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import grammar

        try:
            return func(*args, **kwargs)
        except (serve.PlanError, grammar.GrammarError) as exc:
            raise AnsibleFilterError(str(exc)) from None
    call.__name__ = func.__name__
    call.__doc__ = func.__doc__
    return call


def bad_api_keys(keys):
    """gpufleet.grammar.bad_api_keys: the positions of the entries of `keys` that are not
    a bearer token of 8-512 characters ([] when all are), never a key."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import grammar

    return grammar.bad_api_keys(keys)


def key_digests(current, retiring=()):
    """serve.key_digest of every key serve.accepted_keys(current, retiring) names."""
    return [serve.key_digest(k) for k in serve.accepted_keys(current, retiring)]


def auth_config(current, retiring=()):
    """serve.auth_config of serve.accepted_keys(current, retiring): the keys file's text."""
    return serve.auth_config(serve.accepted_keys(current, retiring))


def goodput_problem(goodput):
    """gpufleet.bench.goodput_flags' refusal of latency objectives ('' when they hold), so
    the benchmark's preflight says it before any point runs."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import bench

    try:
        bench.goodput_flags(goodput)
    except bench.BenchError as exc:
        return str(exc)
    return ""


def host_models(instances, hosts):
    """{host: [served model names]} for `hosts` (in their order) from the fleet's list."""
    out = {h: [] for h in hosts}
    for entry in instances or []:
        labels = entry.get("labels") or {}
        if labels.get("host") in out:
            out[labels["host"]].append(labels.get("served_model_name", ""))
    return out


def reachable_target(bind_address, port, host_address="", advertised=""):
    """`address:port` other hosts (Prometheus) reach a listener at: gpufleet.serve's one
    address rule (reachable_address) written as a target (serve.target, IPv6 in brackets)."""
    return serve.target(serve.reachable_address(bind_address, advertised, host_address), port)


def missing_packages(wanted, installed):
    """gpufleet.hoststack.missing_packages: the apt names (name or name=version) of
    `wanted` that ansible_facts.packages does not show installed at that version
    (`wanted | gpufleet_missing_packages(ansible_facts.packages)`)."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import hoststack

    return hoststack.missing_packages(installed, wanted)


def packages_to_hold(dpkg_query_lines, names):
    """gpufleet.hoststack.packages_to_hold: the installed names not yet held, from
    dpkg-query's `${Package} ${db:Status-Want} ${db:Status-Status}` lines."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import hoststack

    return hoststack.packages_to_hold(dpkg_query_lines, names)


def state_var_pattern(prefix="gpufleet", root=None):
    """The variables that are a host's inputs for the state check: every variable named
    after one of the collection's roles (`<root>/roles/<name>`; root: COLLECTION_ROOT
    unless given) or `<prefix>_`, except the state check's own `gpufleet_state_*`."""
    root = root or COLLECTION_ROOT
    roles = sorted(n for n in os.listdir(os.path.join(root, "roles"))
                   if os.path.isdir(os.path.join(root, "roles", n)))
    return "^(?!gpufleet_state_)(%s)_" % "|".join(roles + [prefix])


_CODE_DIGESTS = {}


def state_digest(values, names, extra=(), root=None):
    """gpufleet.hoststate.inputs_digest of a host: its variables (names and values) and
    the collection's code under `root` (COLLECTION_ROOT unless given; its digest computed
    once per process)."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import hoststate

    root = root or COLLECTION_ROOT
    if root not in _CODE_DIGESTS:
        _CODE_DIGESTS[root] = hoststate.code_digest(root)
    try:
        return hoststate.inputs_digest(list(names), list(values), _CODE_DIGESTS[root],
                                       extra)
    except hoststate.HostStateError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def state_published(plan, tunes):
    """gpufleet.hoststate.published_facts: what the state record keeps for later plays."""
    from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import hoststate

    return hoststate.published_facts(plan, tunes)


class FilterModule:
    def filters(self):
        return {
            "gpufleet_bad_addresses": bad_addresses,
            "gpufleet_bad_inputs": bad_inputs,
            "gpufleet_bad_api_keys": bad_api_keys,
            "gpufleet_tls_problems": tls_problems,
            "gpufleet_tls_san": tls_san,
            "gpufleet_tls_ca_problems": tls_ca_problems,
            "gpufleet_key_digests": _keys(key_digests),
            "gpufleet_auth_config": _keys(auth_config),
            "gpufleet_probe_key": _keys(serve.probe_key),
            "gpufleet_goodput_problem": goodput_problem,
            "gpufleet_bad_repo_ids": bad_repo_ids,
            "gpufleet_model_locks": model_locks,
            "gpufleet_host_models": host_models,
            "gpufleet_models_with_secret_args": engine_args.models_with_secret_args,
            "gpufleet_batches": _wrap(upgrade.plan_batches),
            "gpufleet_driver_change": _wrap(upgrade.driver_change),
            "gpufleet_capacity": _wrap(upgrade.capacity_verdict),
            "gpufleet_soak_verdict": _wrap(upgrade.soak_verdict),
            "gpufleet_failure_message": _wrap(upgrade.failure_message),
            "gpufleet_stop_message": _wrap(upgrade.stop_message),
            "gpufleet_held_hosts": _wrap(rollout.held_hosts),
            "gpufleet_held_messages": _wrap(rollout.held_messages),
            "gpufleet_held_message": _wrap(rollout.held_message),
            "gpufleet_lost_report": _wrap(rollout.lost_report),
            "gpufleet_build_record": _wrap(upgrade.build_record),
            "gpufleet_rollback_vars": _wrap(upgrade.rollback_vars),
            "gpufleet_record_commits": _wrap(upgrade.record_commits),
            "gpufleet_metric_samples": metric_samples,
            "gpufleet_p2p_problems": p2p_problems,
            "gpufleet_p2p_fleet": p2p_fleet,
            "gpufleet_p2p_port": p2p_plan.model_port,
            "gpufleet_p2p_web_seed_delay": p2p_web_seed_delay,
            "gpufleet_torrent_infohash": torrent_infohash,
            "gpufleet_torrent_name": p2p_torrent.torrent_name,
            "gpufleet_local_url": serve.local_url,
            "gpufleet_target": serve.target,
            "gpufleet_stale_cache_dirs": serve.stale_cache_dirs,
            "gpufleet_reachable_target": reachable_target,
            "gpufleet_missing_packages": missing_packages,
            "gpufleet_packages_to_hold": packages_to_hold,
            "gpufleet_state_var_pattern": state_var_pattern,
            "gpufleet_state_digest": state_digest,
            "gpufleet_state_published": state_published,
        }
