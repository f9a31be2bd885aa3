"""Who a host's BitTorrent session may talk to, and when it may use the mirror's web seed.

:func:`settings` / :func:`allow_list` / :func:`ip_filter_rules`: no DHT, LSD, UPnP,
NAT-PMP, PEX or uTP; listen and connect from one address; every address but the
inventory's peers and the mirror is blocked (libtorrent applies the filter to web seeds
too). :func:`web_seed_delay` / :class:`WebSeedGate`: the web-seed policy, so that the
mirror sends about one copy whatever the fleet's size: the first host(s) of the swarm (the
inventory's order) use the web seed from the start; the others fetch from peers only and
add the web seed once no peer delivered a block for ``fallback`` seconds.
:func:`web_seed_verdict`: a web seed must honour Range (206); olah 0.5.4 ignores it, so p2p
mode refuses such an endpoint instead of fetching whole files per piece.
"""
from __future__ import annotations

import ipaddress
import re

from . import grammar
from .hub_names import validate_repo_id
from .p2p_errors import P2PError, WebSeedDown

DEFAULT_PORT = 6881
_OLAH_HINT = ("olah (and any mirror that ignores Range) answers every piece request with the "
              "whole file")


# ---------------------------------------------------------------- the session

def allow_list(peers, mirror=None):
    """Sorted, de-duplicated IP addresses the session may talk to: the inventory's peers
    and the mirror's address. Names are refused (the role passes the addresses Ansible
    gathered): a name would be resolved differently by each host."""
    out = set()
    for value in list(peers or []) + ([mirror] if mirror else []):
        try:
            if not isinstance(value, str) or value != value.strip():
                raise ValueError(value)
            addr = ipaddress.ip_address(value)
        except ValueError:
            raise P2PError(f"peer address {value!r:.80} is not an IP address; give the "
                           "inventory hosts' addresses (for example ansible_host), not "
                           "names or networks.") from None
        if addr.is_unspecified or addr.is_multicast:
            raise P2PError(f"peer address {value} is unspecified or multicast: not a host.")
        out.add(addr)
    if not out:
        raise P2PError("the allow-list is empty: give at least one peer or the mirror.")
    return [str(a) for a in sorted(out, key=lambda a: (a.version, a))]


def ip_filter_rules(allowed):
    """(first, last, blocked) ranges: everything blocked, each allowed address open."""
    rules = [("0.0.0.0", "255.255.255.255", True),
             ("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", True)]
    rules += [(a, a, False) for a in allowed]
    return rules


def settings(listen_address, port=DEFAULT_PORT, upload_rate=0, download_rate=0):
    """libtorrent settings_pack of a fleet session: private to the fleet, one address."""
    try:
        addr = ipaddress.ip_address(listen_address)
    except ValueError:
        raise P2PError(f"listen address {listen_address!r:.80} is not an IP address: give "
                       "the host's fleet address.") from None
    if addr.is_unspecified:
        raise P2PError("listen address 0.0.0.0/:: would listen on every interface; give "
                       "the host's fleet address.")
    try:
        port = grammar.port(port, "listen port")
    except grammar.GrammarError as exc:
        raise P2PError(str(exc)) from None
    host = f"[{addr}]" if addr.version == 6 else str(addr)
    return {
        "listen_interfaces": f"{host}:{port}",
        "outgoing_interfaces": str(addr),
        "enable_dht": False, "enable_lsd": False, "enable_upnp": False,
        "enable_natpmp": False, "enable_incoming_utp": False, "enable_outgoing_utp": False,
        "enable_incoming_tcp": True, "enable_outgoing_tcp": True,
        "allow_multiple_connections_per_ip": False,
        # a fleet peer that dropped a connection is dialled again within seconds (run_peer
        # redials the inventory's peers it has no connection with), not after a minute
        "min_reconnect_time": 2,
        "ban_web_seeds": True,
        "upload_rate_limit": int(upload_rate), "download_rate_limit": int(download_rate),
        "user_agent": "gpufleet-p2p", "peer_fingerprint": "-GF0001-",
        "announce_to_all_trackers": False,
        # plaintext only: RC4 obfuscation gives no confidentiality, integrity comes from
        # the piece hashes and hf_model's file hashes, and the fleet network is the fence
        "out_enc_policy": 2, "in_enc_policy": 2,
        "handshake_client_version": "gpufleet",
    }


REDIAL = 2.0  # seconds between dials of the inventory's peers a host has no connection with
WEB_SEED_HOSTS = 1  # hosts of the swarm that use the web seed from the start
WEB_SEED_FALLBACK = 30.0  # seconds without a peer's block before the others add it


def web_seed_delay(host, hosts, first=WEB_SEED_HOSTS, fallback=WEB_SEED_FALLBACK):
    """Seconds `host` fetches from peers only before it may add the web seed: 0 for the
    first `first` of `hosts` (the swarm's hosts taking part, in the inventory's order: the
    same answer on every host), `fallback` for the others. A host not in `hosts` is
    refused (it would not be among its peers' allow-lists). Both numbers may come as
    strings of digits (an extra var, -e, is a string): preflight and the role's filter
    read them through this one rule."""
    try:
        count = grammar.count(first)
    except grammar.GrammarError:
        raise P2PError(f"model_fetch_p2p_web_seed_hosts must be a whole number from 0 (no "
                       f"host from the start) up, not {first!r:.40}.") from None
    try:
        seconds = grammar.number(fallback)
    except grammar.GrammarError:
        seconds = None
    if seconds is None or not 0 < seconds <= 86400:
        raise P2PError(f"model_fetch_p2p_web_seed_fallback must be a number of seconds "
                       f"above 0 and at most 86400, not {fallback!r:.40}.")
    hosts = list(hosts or [])
    if host not in hosts:
        raise P2PError(f"host {host!r:.80} is not among the swarm's hosts "
                       f"({', '.join(map(str, hosts[:5])) or 'none'}); put it in "
                       "model_fetch_p2p_group.")
    return 0 if hosts.index(host) < count else seconds


class WebSeedGate:
    """When a host that starts with peers only adds the web seed: once no peer has
    delivered a block for `delay` seconds (counted from the start, then from each peer
    block), so a swarm whose peers stall, or a fleet of one, still completes. delay 0:
    open from the start."""

    def __init__(self, delay, start):
        self.delay, self.last_peer, self.opened_at = float(delay), start, None
        if self.delay <= 0:
            self.opened_at = start

    def peer_block(self, now):
        self.last_peer = max(self.last_peer, now)

    def due(self, now):
        """True once, when the web seed is to be added now."""
        if self.opened_at is not None or now - self.last_peer < self.delay:
            return False
        self.opened_at = now
        return True


def web_seed_verdict(url, status, headers):
    """A probe of the web seed (GET with ``Range: bytes=0-0``) -> None when usable, else
    the reason it is refused. A server that ignores Range cannot be a BEP 19 seed."""
    headers = {k.lower(): v for k, v in (headers or {}).items()}
    if status == 206 and re.match(r"^bytes 0-0/\d+$", headers.get("content-range", "")):
        return None
    return (f"the web seed {url} ignores Range (answered {status}, Content-Range "
            f"{headers.get('content-range')!r}): {_OLAH_HINT}. Use the site mirror "
            "(hf_site_mirror, nginx) as the p2p web seed, or model_fetch_transport: http.")


def probe_web_seed(base_url, commit, path, timeout=10):
    """Ask the web seed for the first byte of one file; P2PError when it cannot serve
    pieces (web_seed_verdict), or cannot be reached."""
    import requests  # noqa: PLC0415 - hub needs it anyway; kept out of the decisions

    url = f"{base_url}{commit}/{path}"
    try:
        with requests.get(url, headers={"Range": "bytes=0-0"}, stream=True,
                          timeout=timeout, allow_redirects=False) as r:
            why = web_seed_verdict(url, r.status_code, dict(r.headers))
    except requests.RequestException as exc:
        raise WebSeedDown(f"the web seed {url} did not answer ({type(exc).__name__}); start "
                          "the site mirror or leave the web seed out.") from None
    if why:
        raise P2PError(why)


def web_seed_url(endpoint, repo_id):
    """BEP 19 base URL: libtorrent appends ``<commit>/<path>`` (the torrent's root and a
    file's path), giving the site mirror's ``/<repo>/resolve/<commit>/<path>``."""
    validate_repo_id(repo_id)
    if not re.match(r"^https?://[^/\s]+/?$", str(endpoint)):
        raise P2PError(f"web seed endpoint {endpoint!r:.80} is not http(s)://host[:port].")
    return f"{str(endpoint).rstrip('/')}/{repo_id}/resolve/"


def url_host(url):
    if not url:
        return None
    from urllib.parse import urlsplit  # noqa: PLC0415
    return urlsplit(url).hostname
