"""The one reader of Prometheus text (a /metrics page) in gpufleet.

Plain data in, plain data out; no Ansible imports. The parsing is prometheus-client's
(`prometheus_client.parser.text_string_to_metric_families`, pinned in
requirements-runtime.txt), not a pattern of our own: label values may hold '}', escaped
quotes and newlines, values may be NaN or +Inf, samples may carry a timestamp, and a
counter's samples are named with their _total / _created suffix.

Where it runs: on the control node (the benchmark report, the tests) and on a fleet host
(the modules vllm_probe, whose idle wait before a drain reads vLLM's /metrics, and
vllm_bench, which reads vLLM's preemption counter), each with its own Python. The host
gets the library from vllm_server's preflight (python3-prometheus-client beside the
docker SDK, before an upgrade drains anything); a module that needs it and does not find
it fails with `missing_required_lib` (LIBRARY_HINT says what to install). The library is
imported only when a page is read, so this file imports without it.

The read of the page itself (a deadline and a byte cap) is the caller's:
upgrade.read_metrics and vllm_bench's open_capped read at most 16 MiB.
"""
from __future__ import annotations

__all__ = ["LIBRARY", "LIBRARY_HINT", "MetricsError", "import_error", "parse_metrics",
           "samples"]

LIBRARY = "prometheus-client"
LIBRARY_HINT = ("(Debian/Ubuntu: python3-prometheus-client; RHEL/Fedora: "
                "python3-prometheus_client; vllm_server's preflight installs it with "
                "vllm_server_install_docker_sdk)")
# The part of a refused page quoted in the error.
_QUOTE = 200


class MetricsError(ValueError):
    """The page is not Prometheus text; the message names the line."""


def import_error():
    """None when prometheus-client imports here, else the ImportError's text."""
    try:
        import prometheus_client.parser  # noqa: F401 pylint: disable=unused-import
    except ImportError as exc:
        return str(exc)
    return None


def samples(text):
    """[{"name", "labels", "value"}] of every sample of a Prometheus text exposition, in
    page order (the filter gpufleet_metric_samples: Molecule's verify steps read the
    gateway's and vLLM's /metrics with it). A page that is not Prometheus text raises
    MetricsError; ImportError when prometheus-client is missing."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    try:
        for family in text_string_to_metric_families(text or ""):
            out.extend({"name": s.name, "labels": dict(s.labels), "value": float(s.value)}
                       for s in family.samples)
    except ValueError as exc:
        why = str(exc)
        if len(why) > _QUOTE:
            why = why[:_QUOTE] + "..."
        raise MetricsError(f"not Prometheus text: {why}") from None
    return out


def parse_metrics(text):
    """{sample name: sum of its series' values} from a Prometheus text exposition.

    Sample names are as written (a counter's `x_total`, a histogram's `x_bucket`, `x_sum`,
    `x_count`); the sum runs over every label set of that name. A page that is not
    Prometheus text raises MetricsError (no line is skipped silently: a smaller sum would
    read as a wrong count); ImportError when prometheus-client is missing.
    """
    out = {}
    for sample in samples(text):
        out[sample["name"]] = out.get(sample["name"], 0.0) + sample["value"]
    return out
