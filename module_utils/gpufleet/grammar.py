"""One grammar per input that reaches a generated configuration or a command line
(issue #32 item 3): served model names, host names and addresses, ports. Checked once,
here, at every module boundary that takes them (serve.plan and registry_entry, gateway's
load_instances and plan_gateway), so a value holding a newline and HAProxy, Prometheus or
systemd syntax is refused with what was wrong instead of becoming a new section of a file.
Plain Python, no Ansible imports.
"""
from __future__ import annotations

import ipaddress
import re

__all__ = ["GrammarError", "address", "host_name", "port", "served_model_name"]

# Hugging Face repository ids (org/name: letters, digits, '-', '_', '.') and the names
# operators give vLLM's --served-model-name in practice (a ':' tag, an '@' revision, '+').
_SERVED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,255}")
# RFC 1123 host names (inventory names and DNS names): labels of letters, digits and '-',
# joined by dots; an inventory name may also hold '_' (Ansible's own rule is looser).
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


class GrammarError(ValueError):
    """A value that may not reach a configuration; the message names it and the rule."""


def _text(value, what):
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise GrammarError(f"{what} must be a string, got {type(value).__name__} {value!r:.80}")
    return str(value)


def served_model_name(value, what="served_model_name"):
    """A served model name: 1-256 of letters, digits and . _ / : @ + -, starting with a
    letter or digit (no space, quote, '#' or control character)."""
    text = _text(value, what)
    if not _SERVED.fullmatch(text):
        raise GrammarError(f"{what} {text!r:.120} is not a served model name: use 1-256 "
                           "letters, digits and . _ / : @ + - (starting with a letter or digit); "
                           "it is written into HAProxy's and Prometheus' configuration")
    return text


def host_name(value, what="host name"):
    """An inventory or DNS host name: dot-separated labels of letters, digits, '_' and
    '-' (not at a label's ends), at most 253 characters."""
    text = _text(value, what)
    if not text or len(text) > 253 or not all(_LABEL.fullmatch(label) for label in text.split(".")):
        raise GrammarError(f"{what} {text!r:.120} is not a host name: use dot-separated labels "
                           "of letters, digits, '_' and '-' (at most 253 characters)")
    return text


def address(value, what="address"):
    """An IP address (IPv6 with or without brackets) or a host name (host_name)."""
    text = _text(value, what)
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    try:
        return host_name(text, what)
    except GrammarError:
        raise GrammarError(f"{what} {text!r:.120} is neither an IP address nor a host name") from None


def port(value, what="port"):
    """A TCP port, 1-65535 (an int, or a string of digits)."""
    if isinstance(value, bool):
        raise GrammarError(f"{what} must be a whole number 1-65535, got {value!r}")
    text = str(value) if isinstance(value, (str, int)) else None
    if text is None or not text.isdigit() or not 0 < int(text) < 65536:
        raise GrammarError(f"{what} must be a whole number 1-65535, got {value!r:.80}")
    return int(text)
