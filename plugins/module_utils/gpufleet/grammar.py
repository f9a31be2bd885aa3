"""One grammar per input that reaches a generated configuration or a command line
(issue #32 item 3): served model names, host names and addresses, ports, durations,
configuration paths. Checked once, here, at every module boundary that takes them
(serve.plan and registry_entry, gateway's load_instances and plan_gateway) and in the
preflight of every role that writes them into a file (through the filter
gpufleet_bad_inputs: check_inputs below), so a value holding a newline and HAProxy,
Prometheus, nginx or systemd syntax is refused with what was wrong instead of becoming a
new section of a file or a new argument of a command line.
Plain Python, no Ansible imports.
"""
from __future__ import annotations

import ipaddress
import re

__all__ = ["GrammarError", "address", "api_key", "bad_api_keys", "check_inputs", "config_path", "count", "duration",
           "fraction", "haproxy_time", "host_name", "integer", "keywords", "port",
           "served_model_name", "url_path", "url_paths"]

# Hugging Face repository ids (org/name: letters, digits, '-', '_', '.') and the names
# operators give vLLM's --served-model-name in practice (a ':' tag, an '@' revision, '+').
_SERVED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,255}")
# RFC 1123 host names (inventory names and DNS names): labels of letters, digits and '-',
# joined by dots; an inventory name may also hold '_' (Ansible's own rule is looser).
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
# Prometheus' durations (model.ParseDuration): units from the largest to the smallest,
# each at most once, e.g. 15s, 1m, 1h30m, 15d, 500ms.
_DURATION = re.compile(r"(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?")
# A path written into a configuration file or an argument: absolute, of letters, digits and
# . _ / @ + - only (no space, quote, ';', '$', '#', '{', newline or other control character:
# what nginx, YAML, systemd's EnvironmentFile and a shell-like ARGS line would read as syntax).
_PATH = re.compile(r"/[A-Za-z0-9._/@+-]{0,4095}")
# HAProxy's time format: a whole number, then us, ms (the default), s, m, h or d.
_HAPROXY_TIME = re.compile(r"\d{1,10}(?:us|ms|s|m|h|d)?")
# Space-separated keywords of a directive (balance leastconn, retry-on conn-failure 503,
# balance random(2)): letters, digits and _ ( ) . , - only.
_KEYWORDS = re.compile(r"[A-Za-z0-9_().,-]+(?: [A-Za-z0-9_().,-]+)*")
# A URL path as HAProxy matches it and a health check asks for it: '/' then unreserved
# characters and '/' (no space, query, '#' or percent-escape).
_URL_PATH = re.compile(r"/[A-Za-z0-9._~/-]{0,255}")
# An API key as a bearer token (RFC 6750 section 2.1, b64token: A-Z a-z 0-9 - . _ ~ + /,
# then any '='), 8 to 512 characters. It is written one per line into the gateway's keys
# file and as a YAML string into vLLM's --config file, and compared with the second word
# of the Authorization header.
_API_KEY = re.compile(r"[A-Za-z0-9._~+/-]{8,512}=*")


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
    """A TCP port, 1-65535 (an int, or a string of digits: no sign, space or point).
    The one port rule: serve, gateway, bench, the lab and every role's preflight (through
    check_inputs) call it; tests/unit/test_grammar.py fails when the bound is written
    anywhere else."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None or not text.isdigit() or not 0 < int(text) < 65536:
        raise GrammarError(f"{what} {value!r:.80} is not a TCP port: use a whole number 1-65535")
    return int(text)


def duration(value, what="duration"):
    """A Prometheus duration: whole numbers with units y w d h m s ms, largest first, each
    once, at least one (15s, 1m, 1h30m, 15d)."""
    text = _text(value, what)
    if not text or not _DURATION.fullmatch(text) or not any(c.isdigit() and c != "0" for c in text):
        raise GrammarError(f"{what} {text!r:.120} is not a duration: use whole numbers with the "
                           "units y w d h m s ms, largest first (15s, 1m, 1h30m, 15d), above zero")
    return text


def config_path(value, what="path"):
    """An absolute path of letters, digits and . _ / @ + - (no '..' component)."""
    text = _text(value, what)
    if not _PATH.fullmatch(text) or ".." in text.split("/"):
        raise GrammarError(f"{what} {text!r:.120} is not a usable path: give an absolute path "
                           "of letters, digits and . _ / @ + - without '..' (it is written into "
                           "configuration files)")
    return text


def _number(value, what):
    import math

    if isinstance(value, bool):
        raise GrammarError(f"{what} must be a number, got {value!r}")
    try:
        number = float(value) if isinstance(value, (str, int, float)) else None
    except ValueError:
        number = None
    if number is None or not math.isfinite(number):
        raise GrammarError(f"{what} must be a number, got {value!r:.80}")
    return number


def number(value, what="number"):
    """A finite number (an int or float, or a string that spells one, as an extra var -e
    gives it): an int stays an int, anything else is a float ("12.5" is 12.5)."""
    result = _number(value, what)
    return value if isinstance(value, int) else result


def fraction(value, what="fraction"):
    """A number above 0 and at most 1 (a share, e.g. of the KV cache)."""
    number = _number(value, what)
    if not 0 < number <= 1:
        raise GrammarError(f"{what} must be above 0 and at most 1, got {value!r:.80}")
    return number


def count(value, what="count"):
    """A whole number >= 0 (an int, or a string of digits)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).isdigit():
        raise GrammarError(f"{what} must be a whole number >= 0, got {value!r:.80}")
    return int(value)


def _matching(value, what, pattern, rule, max_len=None):
    """The text of `value` when `pattern` matches all of it (and it is at most max_len
    long); else GrammarError: '<what> <value> <rule>'."""
    text = _text(value, what)
    if (max_len is not None and len(text) > max_len) or not pattern.fullmatch(text):
        raise GrammarError(f"{what} {text!r:.120} {rule}")
    return text


def haproxy_time(value, what="time"):
    """An HAProxy time: a whole number, then us, ms (the default), s, m, h or d."""
    return _matching(value, what, _HAPROXY_TIME, "is not an HAProxy time: a whole number, "
                     "then us, ms, s, m, h or d (5s, 30m)")


def keywords(value, what="keywords"):
    """1-256 characters of space-separated keywords (letters, digits, _ ( ) . , -)."""
    return _matching(value, what, _KEYWORDS, "is not a list of keywords: words of letters, "
                     "digits and _ ( ) . , - separated by single spaces (at most 256 "
                     "characters)", max_len=256)


def url_path(value, what="URL path"):
    """'/' then up to 255 of A-Z a-z 0-9 - . _ ~ /."""
    return _matching(value, what, _URL_PATH, "is not a URL path: '/' then up to 255 of "
                     "A-Z a-z 0-9 - . _ ~ / (no space, query or percent-escape)")


def url_paths(value, what="URL paths"):
    """A list of url_path; the message names every entry that breaks the rule."""
    if not isinstance(value, (list, tuple)):
        raise GrammarError(f"{what} must be a list of URL paths, got {type(value).__name__}")
    bad = []
    for entry in value:
        try:
            url_path(entry, what)
        except GrammarError:
            bad.append(f"{entry!r:.80}")
    if bad:
        raise GrammarError(f"{what}: {', '.join(bad[:10])}{' ...' if len(bad) > 10 else ''} "
                           f"{'is not a URL path' if len(bad) == 1 else 'are not URL paths'}: "
                           "'/' then up to 255 of A-Z a-z 0-9 - . _ ~ / (no space, query or "
                           "percent-escape)")
    return list(value)


def api_key(value, what="API key"):
    """A bearer token of 8-512 characters (RFC 6750's b64token). The message never shows
    the value: it is a secret even when it is wrong."""
    if isinstance(value, bool) or not isinstance(value, str) or not _API_KEY.fullmatch(value):
        raise GrammarError(f"{what} is not 8 to 512 characters of A-Z a-z 0-9 - . _ ~ + / "
                           "(then any '='), the form RFC 6750 gives a bearer token; make a new "
                           "key of that form (the value is not shown)")
    return value


def bad_api_keys(keys):
    """The positions (0-based) of the entries of `keys` that break api_key; [] when all
    hold. A role's preflight names the positions, never a key."""
    if not isinstance(keys, (list, tuple)):
        raise GrammarError(f"API keys must be a list, got {type(keys).__name__}")
    bad = []
    for index, key in enumerate(keys):
        try:
            api_key(key)
        except GrammarError:
            bad.append(index)
    return bad


def integer(value, what="number"):
    """A whole number, negative or not (an int, or a string of digits after an optional '-')."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text is None or not re.fullmatch(r"-?\d{1,18}", text):
        raise GrammarError(f"{what} must be a whole number, got {value!r:.80}")
    return int(text)


_KINDS = {"address": address, "config_path": config_path, "count": count,
          "duration": duration, "fraction": fraction, "haproxy_time": haproxy_time,
          "host_name": host_name, "integer": integer, "keywords": keywords, "port": port,
          "served_model_name": served_model_name, "url_path": url_path, "url_paths": url_paths}


def check_inputs(inputs):
    """The messages for the entries of `inputs` ({name: [kind, value]}, kinds: the
    functions of this module) that break their grammar; [] when every one holds. A role's
    preflight fails with them before it changes anything."""
    if not isinstance(inputs, dict):
        raise GrammarError(f"inputs must be a mapping of name: [kind, value], got {type(inputs).__name__}")
    errors = []
    for name, spec in inputs.items():
        if not isinstance(spec, (list, tuple)) or len(spec) != 2 or spec[0] not in _KINDS:
            raise GrammarError(f"{name}: give [kind, value] with a kind of {sorted(_KINDS)}, got {spec!r:.120}")
        try:
            _KINDS[spec[0]](spec[1], name)
        except GrammarError as exc:
            errors.append(str(exc))
    return errors
