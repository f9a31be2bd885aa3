"""What vLLM's start-up log says about its KV cache, and how far a prediction is from it.

Plain data in, plain data out; no Ansible imports.  Reads the "KV cache size: N tokens",
"Maximum concurrency" and "Available KV cache memory" lines vLLM logs when it starts.
"""
from __future__ import annotations

import re

from .tune_errors import TuneError


_KV_TOKENS_RE = re.compile(r"(?:\b(GPU|CPU|XPU|TPU)\s+)?KV cache size:\s*([\d,]+)\s+tokens")
_CONCURRENCY_RE = re.compile(
    r"Maximum concurrency for ([\d,]+) tokens per request:\s*([\d.]+)x")
_AVAILABLE_RE = re.compile(r"Available KV cache memory:\s*([\d.]+)\s*GiB")


def parse_kv_cache_log(text):
    """Read vLLM's start-up log lines about the KV cache.

    Returns {"kv_cache_tokens", "device", "max_model_len", "max_concurrency",
    "available_kv_gib"} (values None when a line is absent); raises TuneError when
    the log has no "KV cache size: N tokens" line.
    """
    match = _KV_TOKENS_RE.search(text)
    if not match:
        raise TuneError("no 'KV cache size: N tokens' line in the vLLM log")
    out = {"kv_cache_tokens": int(match.group(2).replace(",", "")),
           "device": match.group(1), "max_model_len": None, "max_concurrency": None,
           "available_kv_gib": None}
    conc = _CONCURRENCY_RE.search(text)
    if conc:
        out["max_model_len"] = int(conc.group(1).replace(",", ""))
        out["max_concurrency"] = float(conc.group(2))
    avail = _AVAILABLE_RE.search(text)
    if avail:
        out["available_kv_gib"] = float(avail.group(1))
    return out


def compare_with_log(predicted_tokens, log_text):
    """Compare a predicted KV token count with a real vLLM start-up log.

    Returns {"predicted", "observed", "relative_error"}; the error is
    (predicted - observed) / observed.
    """
    observed = parse_kv_cache_log(log_text)["kv_cache_tokens"]
    if observed == 0:
        raise TuneError("the vLLM log reports a KV cache of 0 tokens")
    return {"predicted": predicted_tokens, "observed": observed,
            "relative_error": (predicted_tokens - observed) / observed}
