"""TLS at the gateway (issue #32 item 2): the checks of a certificate and its key before
they reach HAProxy, and the subject alternative names of a certificate the fleet CA signs.

Runs on the control node only (filters gpufleet_tls_problems and gpufleet_tls_san), where
Ansible's controller has `cryptography` (community.crypto needs it too). The key's text
is read, never echoed: a message names the file and what was wrong, not its content.
Plain Python, no Ansible imports.
"""
from __future__ import annotations

import datetime
import ipaddress

from . import grammar

__all__ = ["TLSError", "ca_problems", "client_session", "pair_problems", "san_entries"]


class TLSError(ValueError):
    """A name that cannot go into a certificate, or a CA file a client cannot use."""


def _load(cert_pem, key_pem):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = key = None
    problems = []
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode() if isinstance(cert_pem, str) else cert_pem)
    except (ValueError, TypeError, AttributeError):
        problems.append("the certificate file holds no PEM certificate (BEGIN CERTIFICATE) first")
    try:
        key = serialization.load_pem_private_key(
            key_pem.encode() if isinstance(key_pem, str) else key_pem, password=None)
    except TypeError:
        problems.append("the key file holds a passphrase-protected key: HAProxy cannot ask for a "
                        "passphrase; keep it unencrypted in a vault-encrypted file instead")
    except (ValueError, AttributeError):
        problems.append("the key file holds no PEM private key (BEGIN ... PRIVATE KEY)")
    except Exception as exc:  # cryptography's UnsupportedAlgorithm  # pylint: disable=broad-except
        problems.append(f"the key file's key is not usable ({type(exc).__name__})")
    return cert, key, problems


def _public(obj):
    from cryptography.hazmat.primitives import serialization

    return obj.public_key().public_bytes(serialization.Encoding.DER,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def pair_problems(cert_pem, key_pem, cert_name="the certificate", key_name="the key", now=None):
    """What is wrong with a certificate (PEM, the server's first, then its chain) and its
    private key (PEM, unencrypted) as HAProxy's `bind ... ssl crt` would load them: [] when
    both parse, the key is the certificate's, and the certificate is valid now.

    Args:
        cert_pem, key_pem: the files' text.
        cert_name, key_name: how the messages name the files (their paths).
        now: the time to check the validity at (default: now, UTC).
    Returns:
        A list of messages naming the file, what was wrong and what to do; never key text.
    """
    cert, key, problems = _load(cert_pem, key_pem)
    problems = [p.replace("the certificate file", cert_name).replace("the key file", key_name)
                for p in problems]
    if cert is None:
        return problems
    problems += _validity(cert, cert_name, now)
    if key is not None and _public(cert) != _public(key):
        problems.append(f"{key_name} is not the private key of {cert_name} (their public keys "
                        "differ): give the key the certificate was issued for")
    return problems


def _validity(cert, name, now):
    now = now or datetime.datetime.now(datetime.timezone.utc)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now > end:
        return [f"{name} expired on {end.isoformat()}: renew it (or, with the fleet CA, "
                "remove it and run the role again)"]
    if now < start:
        return [f"{name} is not valid before {start.isoformat()}: check the control "
                "node's clock or the certificate"]
    return []


def ca_problems(ca_pem, name="the CA certificate", now=None):
    """What is wrong with a CA certificate (PEM) HAProxy verifies the backends with
    (`ca-file`): [] when its first certificate parses, is a CA's (basicConstraints CA:TRUE)
    and is valid now."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(ca_pem.encode() if isinstance(ca_pem, str) else ca_pem)
    except (ValueError, TypeError, AttributeError):
        return [f"{name} holds no PEM certificate (BEGIN CERTIFICATE) first"]
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    problems = [] if is_ca else [f"{name} is not a CA certificate (no basicConstraints CA:TRUE): "
                                 "give the CA that signed the backends' certificates, not a server's"]
    return problems + _validity(cert, name, now)


def san_entries(names):
    """community.crypto's subject_alt_name entries for `names` (host names and IP
    addresses, each checked by grammar.address): 'IP:<address>' or 'DNS:<name>', in the
    order given, without repeats. A wildcard address (0.0.0.0, ::) names no host and is
    left out."""
    if not isinstance(names, (list, tuple)):
        raise TLSError(f"the certificate's names must be a list, got {type(names).__name__}")
    entries = []
    for name in names:
        try:
            text = grammar.address(name, "a name for the gateway's certificate")
        except grammar.GrammarError as exc:
            raise TLSError(str(exc)) from None
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            entry = f"DNS:{text.lower()}"
        else:
            if ip.is_unspecified:
                continue
            entry = f"IP:{ip}"
        if entry not in entries:
            entries.append(entry)
    if not entries:
        raise TLSError("the gateway's certificate needs at least one host name or address: set "
                       "vllm_gateway_tls_names")
    return entries


def client_session(session, ca_file=""):
    """`session` (a requests.Session) set to verify https certificates with `ca_file` (a
    PEM CA certificate, e.g. the fleet CA's), or with the system's trust store when it is
    empty. gpufleet's clients of the gateway and the instances (vllm_probe, vllm_ready)
    take their session from here; verification is never turned off."""
    import os

    if ca_file:
        if not (os.path.isfile(ca_file) and os.access(ca_file, os.R_OK)):
            raise TLSError(f"ca_file {ca_file} is not a readable file: give the CA certificate (PEM) "
                           "the URL's certificate chains to, or leave it empty for the system's "
                           "trust store")
        session.verify = ca_file
        # requests prefers REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE to session.verify (it merges
        # the environment per request): give every request the CA file itself.
        request = session.request

        def verified(method, url, **kwargs):
            kwargs["verify"] = ca_file
            return request(method, url, **kwargs)

        session.request = verified
    return session
