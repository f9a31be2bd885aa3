"""plugins/module_utils/gpufleet/prometheus_text.py: the one reader of Prometheus text (#33 item 7).

The pages below are what prometheus-client (the library vLLM exposes its metrics with)
writes or accepts: label values holding '}', escaped quotes, backslashes and newlines,
NaN and +Inf values, timestamps, counters with their _total and _created samples,
histograms and summaries, and Prometheus 3's quoted metric names. Every expected sum
below was read by hand from the page.

Control: the hand-written pattern gpufleet read /metrics with before (upgrade._SAMPLE at
6f3f330, the one issue #33 item 7 names, and the one ad037c1 widened) is kept here as
OLD_PATTERNS; test_the_old_patterns_misread_these_pages shows which of these cases each
gets wrong (the figures are in the test).
"""
import math
import pathlib
import re
import sys

import pytest

import vllm_bench
import vllm_probe
from gpufleet import bench_results, prometheus_text, upgrade
from helpers import run_module

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"

# (page, {sample name: sum}); None: the page is refused (MetricsError)
CASES = {
    "label value holding }": (
        f'{RUNNING}{{engine="0",model_name="a {{b}} c"}} 2.0\n'
        f'{WAITING}{{engine="0",model_name="a {{b}} c"}} 0.0\n',
        {RUNNING: 2.0, WAITING: 0.0}),
    "escaped quote and } in a label value": (
        f'{RUNNING}{{model_name="say \\"}}\\" x"}} 2.0\n', {RUNNING: 2.0}),
    "escaped newline in a label value": (
        f'{RUNNING}{{model_name="a\\nb}}"}} 2.0\n', {RUNNING: 2.0}),
    "escaped backslash ending a label value": (
        f'{RUNNING}{{model_name="a\\\\"}} 2.0\n{RUNNING}{{model_name="b"}} 1\n', {RUNNING: 3.0}),
    "NaN and infinities": ('x{a="1"} NaN\ny +Inf\nz -Inf\n',
                           {"x": math.nan, "y": math.inf, "z": -math.inf}),
    "timestamps": (
        'vllm:num_preemptions_total{engine="0"} 2.0 1733450000000\n'
        'vllm:num_preemptions_total{engine="1"} 3.0 1733450000001\n',
        {"vllm:num_preemptions_total": 5.0}),
    "counter with _total and _created": (
        "# HELP vllm:num_preemptions Cumulative number of preemption from the engine.\n"
        "# TYPE vllm:num_preemptions counter\n"
        'vllm:num_preemptions_total{engine="0"} 3\n'
        'vllm:num_preemptions_created{engine="0"} 1.7e9\n',
        {"vllm:num_preemptions_total": 3.0, "vllm:num_preemptions_created": 1.7e9}),
    "histogram": (
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{le="0.1"} 1\n'
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 2\n'
        "vllm:e2e_request_latency_seconds_sum 0.25\n"
        "vllm:e2e_request_latency_seconds_count 2\n",
        {"vllm:e2e_request_latency_seconds_bucket": 3.0,
         "vllm:e2e_request_latency_seconds_sum": 0.25,
         "vllm:e2e_request_latency_seconds_count": 2.0}),
    "summary": ('# TYPE s summary\ns{quantile="0.5"} 0.1\ns_sum 3\ns_count 7\n',
                {"s": 0.1, "s_sum": 3.0, "s_count": 7.0}),
    "trailing comma in the labels": (f'{RUNNING}{{model_name="m",}} 4\n', {RUNNING: 4.0}),
    "quoted metric name (Prometheus 3)": (f'{{"{RUNNING}", model_name="m"}} 4\n', {RUNNING: 4.0}),
    "a line that is not a sample": (
        f'{RUNNING}{{model_name="m" 4\n{RUNNING}{{model_name="n"}} 1\n', None),
    "an HTML page": ("<html><body>Bad gateway</body></html>\n", None),
}


def _same(got, want):
    return got.keys() == want.keys() and all(
        (math.isnan(v) and math.isnan(got[k])) or got[k] == v for k, v in want.items())


@pytest.mark.parametrize("name", CASES)
def test_parse_metrics_reads_what_prometheus_text_allows(name):
    page, want = CASES[name]
    if want is None:
        with pytest.raises(prometheus_text.MetricsError, match="^not Prometheus text: "):
            prometheus_text.parse_metrics(page)
    else:
        assert _same(prometheus_text.parse_metrics(page), want), prometheus_text.parse_metrics(page)


def test_the_error_quotes_at_most_a_bounded_part_of_the_page():
    with pytest.raises(prometheus_text.MetricsError) as exc:
        prometheus_text.parse_metrics(f'{RUNNING}{{model_name="{"x" * 100000}" 1\n')
    assert len(str(exc.value)) < 300


def test_the_idle_wait_and_the_benchmark_read_through_it():
    """upgrade (the idle wait before a drain) and bench_results (the preemption counter) read
    /metrics through this one reader; a '}' in a label value no longer hides the gauges."""
    assert upgrade.parse_metrics is prometheus_text.parse_metrics
    assert bench_results.parse_metrics is prometheus_text.parse_metrics
    page = CASES["label value holding }"][0]
    assert upgrade.idle_counts(upgrade.parse_metrics(page)) == (2, 0)
    idle = page.replace(" 2.0\n", " 0.0\n")
    assert upgrade.idle_counts(upgrade.parse_metrics(idle)) == (0, 0)


# The control: the patterns gpufleet read /metrics with before prometheus-client.
OLD_PATTERNS = {
    # upgrade._SAMPLE as first written (6f3f330): the one issue #33 item 7 measured
    "6f3f330": re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)"),
    # as widened by ad037c1 (quoted label values may hold '}' or escaped quotes)
    "ad037c1": re.compile(
        r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)'),
}


def _old_parse(pattern, text):
    out = {}
    for line in (text or "").splitlines():
        if not line or line.startswith("#"):
            continue
        match = pattern.match(line)
        if not match:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        out[match.group(1)] = out.get(match.group(1), 0.0) + value
    return out


def test_the_old_patterns_misread_these_pages():
    """Of the 13 cases, the first pattern misreads 6 (the three label values with '}', the
    quoted name, and both pages it should refuse: it returns a smaller sum, or nothing,
    silently); the widened one misreads 3 (the quoted name, the two pages to refuse)."""
    wrong = {}
    for label, pattern in OLD_PATTERNS.items():
        wrong[label] = sorted(name for name, (page, want) in CASES.items()
                              if want is None or not _same(_old_parse(pattern, page), want))
    assert wrong == {
        "6f3f330": sorted(["label value holding }", "escaped quote and } in a label value",
                           "escaped newline in a label value",
                           "quoted metric name (Prometheus 3)", "a line that is not a sample",
                           "an HTML page"]),
        "ad037c1": sorted(["quoted metric name (Prometheus 3)", "a line that is not a sample",
                           "an HTML page"]),
    }


# --------------------------------------------------------- without prometheus-client
@pytest.fixture
def no_library(monkeypatch):
    """The host's Python without prometheus-client (an import of it fails)."""
    for name in [m for m in sys.modules if m == "prometheus_client" or m.startswith("prometheus_client.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.setitem(sys.modules, "prometheus_client.parser", None)


def test_import_error_says_whether_the_library_is_there(no_library):
    assert prometheus_text.import_error()
    with pytest.raises(ImportError):
        prometheus_text.parse_metrics("x 1\n")


def test_import_error_is_none_with_the_library():
    assert prometheus_text.import_error() is None


def test_vllm_probe_refuses_the_idle_wait_without_the_library(no_library, monkeypatch):
    """Before its first poll (nothing listens at the URL: a poll would fail differently)."""
    result, failed = run_module(vllm_probe.main, {"url": "http://127.0.0.1:9", "wait_idle": True},
                                monkeypatch)
    assert failed
    assert "prometheus-client" in result["msg"] and "python3-prometheus-client" in result["msg"]
    assert "idle" not in result


def test_vllm_bench_says_why_a_page_is_not_counted(monkeypatch):
    """A page that is not Prometheus text is a reason on the row, never a smaller count."""
    def fake_open(opener, url, cap, seconds, what):
        return b"<html>Bad gateway</html>\n"
    monkeypatch.setattr(vllm_bench, "open_capped", fake_open)
    count, why = vllm_bench.read_preemptions("127.0.0.1", 9)
    assert count is None
    assert why.startswith("http://127.0.0.1:9/metrics could not be read: not Prometheus text")


def test_samples_and_the_filter_molecule_verifies_with():
    """gpufleet_metric_samples (Molecule's verify of the gateway's and vLLM's /metrics):
    each sample with its labels; a page with only HELP lines naming the metrics has no
    sample (the substring check it replaced said yes); an HTML page fails the task."""
    import importlib.util

    from ansible.errors import AnsibleFilterError
    path = pathlib.Path(__file__).resolve().parents[2] / "plugins/filter/gpufleet.py"
    spec = importlib.util.spec_from_file_location("gpufleet_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    metric_samples = module.FilterModule().filters()["gpufleet_metric_samples"]
    page = ('haproxy_server_status{proxy="vllm_a",server="gpu-a_28101",state="UP"} 1\n'
            'haproxy_backend_active_servers{proxy="vllm_a"} 2\n'
            f'{RUNNING}{{model_name="a {{b}}"}} 0.0\n')
    assert metric_samples(page) == [
        {"name": "haproxy_server_status", "value": 1.0,
         "labels": {"proxy": "vllm_a", "server": "gpu-a_28101", "state": "UP"}},
        {"name": "haproxy_backend_active_servers", "labels": {"proxy": "vllm_a"}, "value": 2.0},
        {"name": RUNNING, "labels": {"model_name": "a {b}"}, "value": 0.0}]
    help_only = f"# HELP {RUNNING} x\n# HELP vllm:kv_cache_usage_perc y\n"
    assert RUNNING in help_only and metric_samples(help_only) == []
    with pytest.raises(AnsibleFilterError, match="not Prometheus text"):
        metric_samples("<html>bad gateway</html>\n")
