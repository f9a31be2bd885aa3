"""Options and progress line of the model_fetch_wait action (plugins/action/model_fetch_wait.py),
which follows an async hf_model job from the controller in one task.

Plain data in, plain data out; no Ansible imports. Bad options raise WaitOptionError (a
ValueError) with a message that names the option and the accepted range.
"""
from __future__ import annotations

import json
import math

__all__ = ["ARGUMENT_SPEC", "MAX_SECONDS", "WaitOptionError", "wait_options", "read_progress",
           "progress_line"]

# The longest delay, interval or timeout accepted: a year. A longer one is a typo, and
# time.sleep refuses far larger numbers with an OverflowError.
MAX_SECONDS = 366 * 86400

# The options, as plugins/modules/model_fetch_wait.py documents them (the same dict is its
# argument_spec, so tests/unit/test_conventions.py compares the two).
ARGUMENT_SPEC = {
    "jid": {"type": "str", "required": True},
    "progress_path": {"type": "path"},
    "label": {"type": "str"},
    "delay": {"type": "float", "default": 5.0},
    "progress_interval": {"type": "float", "default": 60.0},
    "timeout": {"type": "float", "default": 86400.0},
}

# progress.json's fields (written by hub_fetch.Stats), all counts
PROGRESS_FIELDS = ("files_done", "files_total", "bytes_verified", "bytes_total",
                   "bytes_downloaded")


class WaitOptionError(ValueError):
    pass


def _seconds(name, value):
    """`value` as a float number of seconds in (0, MAX_SECONDS]; a number or a string of one."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise WaitOptionError(f"{name} must be a number of seconds, not {type(value).__name__} "
                              f"({value!r}).")
    try:
        seconds = float(value.strip() if isinstance(value, str) else value)
    except (ValueError, OverflowError):
        if isinstance(value, str):
            raise WaitOptionError(f"{name} must be a number of seconds, not {value!r}.") from None
        seconds = math.inf  # an int too large for a float
    if math.isnan(seconds):
        raise WaitOptionError(f"{name} must be a number of seconds, not NaN.")
    if seconds <= 0:
        raise WaitOptionError(f"{name} must be > 0 seconds, not {value!r}.")
    if seconds > MAX_SECONDS:
        shown = "infinity" if math.isinf(seconds) else repr(value)
        raise WaitOptionError(f"{name} must be at most {MAX_SECONDS} seconds (a year), not "
                              f"{shown}.")
    return seconds


def _text(name, value, required):
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise WaitOptionError(f"{name} must be a non-empty string, not {value!r}.")
    return value


def wait_options(args):
    """The action's options (a dict, as the task gives them) checked and completed with
    their defaults: {jid, progress_path, label, delay, progress_interval, timeout}."""
    if not isinstance(args, dict):
        raise WaitOptionError(f"the options must be a mapping, not {type(args).__name__}.")
    unknown = sorted(set(args) - set(ARGUMENT_SPEC))
    if unknown:
        raise WaitOptionError(f"unsupported option(s) {', '.join(map(str, unknown))}; "
                              f"supported: {', '.join(ARGUMENT_SPEC)}.")
    if args.get("jid") is None:
        raise WaitOptionError("jid is required: the ansible_job_id of the async task to follow.")
    opts = {
        "jid": _text("jid", args["jid"], required=True),
        "progress_path": _text("progress_path", args.get("progress_path"), required=False),
        "label": _text("label", args.get("label"), required=False),
    }
    for name in ("delay", "progress_interval", "timeout"):
        value = args.get(name)
        opts[name] = _seconds(name, ARGUMENT_SPEC[name]["default"] if value is None else value)
    if opts["progress_interval"] < opts["delay"]:
        raise WaitOptionError(f"progress_interval ({opts['progress_interval']:g} s) must be >= "
                              f"delay ({opts['delay']:g} s): a report follows a look at the job.")
    if opts["label"] is None:
        opts["label"] = opts["progress_path"]
    return opts


def read_progress(raw):
    """progress.json's fields from its bytes (or text), or None when they are not a JSON
    object holding each of PROGRESS_FIELDS as a count >= 0."""
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    for field in PROGRESS_FIELDS:
        value = data.get(field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return None
    return data


def _gib(n):
    return "%.2f" % (n / 2**30)


def progress_line(label, progress):
    """One progress report: 'org/name: 3/10 files, 1.20/14.50 GiB verified (1.30 GiB
    downloaded)' from progress.json's fields; a p2p fetch adds its bytes from peers and
    from the web seed."""
    p = progress
    return (f"{label}: {p['files_done']}/{p['files_total']} files, "
            f"{_gib(p['bytes_verified'])}/{_gib(p['bytes_total'])} GiB verified "
            f"({_gib(p['bytes_downloaded'])} GiB downloaded{_sources(p)})")


def _sources(p):
    """', 1.00 from peers, 0.30 from the web seed' of a p2p fetch's progress (its extra
    counts, written by gpufleet.p2p's runner); '' for an http fetch."""
    peers, seed = p.get("bytes_from_peers"), p.get("bytes_from_web_seed")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (peers, seed)):
        return ""
    return f": {_gib(peers)} GiB from peers, {_gib(seed)} GiB from the web seed"
