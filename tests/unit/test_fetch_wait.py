"""Following an async job in one task (model_fetch_wait): its options and progress line
(module_utils/gpufleet/fetch_wait.py)."""
import json
import math
import pathlib

import pytest

from gpufleet import fetch_wait as fw

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------
# The progress line
# ---------------------------------------------------------------------------

def test_progress_line_is_the_text_the_role_printed():
    p = {"files_done": 3, "files_total": 10, "bytes_verified": 1288490189,
         "bytes_total": 15569256448, "bytes_downloaded": 1395864371, "updated": "x"}
    assert fw.progress_line("Qwen/Qwen2.5-7B-Instruct", p) == (
        "Qwen/Qwen2.5-7B-Instruct: 3/10 files, 1.20/14.50 GiB verified "
        "(1.30 GiB downloaded)")
    zero = dict.fromkeys(fw.PROGRESS_FIELDS, 0)
    assert fw.progress_line("org/x", zero) == \
        "org/x: 0/0 files, 0.00/0.00 GiB verified (0.00 GiB downloaded)"


def test_read_progress_takes_hf_models_file_and_nothing_else(tmp_path):
    from gpufleet import hub

    (tmp_path / hub.STATE_DIR).mkdir()  # hf_model makes it before it fetches
    stats = hub._Stats(str(tmp_path), 2, 3 << 30, write_progress=True)
    stats.add(downloaded=1 << 29, verified=1 << 30, file_done=True)
    raw = (tmp_path / hub.STATE_DIR / hub.PROGRESS_NAME).read_bytes()
    assert fw.progress_line("org/tiny", fw.read_progress(raw)) == \
        "org/tiny: 1/2 files, 1.00/3.00 GiB verified (0.50 GiB downloaded)"
    good = dict.fromkeys(fw.PROGRESS_FIELDS, 1)
    assert fw.read_progress(json.dumps(good)) == good
    for bad in (b"", b"{", b"[]", b"null", b"\xff\xfe", None,
                json.dumps(dict(good, files_done=-1)), json.dumps(dict(good, bytes_total="3")),
                json.dumps(dict(good, files_total=True)), json.dumps(dict(good, bytes_total=1.5)),
                json.dumps({k: v for k, v in good.items() if k != "bytes_downloaded"})):
        assert fw.read_progress(bad) is None, bad


# ---------------------------------------------------------------------------
# Options: a clear error for each wrong value, never a traceback
# ---------------------------------------------------------------------------

def test_options_defaults_and_numbers_as_strings():
    assert fw.wait_options({"jid": "j1.2"}) == {
        "jid": "j1.2", "progress_path": None, "label": None, "delay": 5.0,
        "progress_interval": 60.0, "timeout": 86400.0}
    opts = fw.wait_options({"jid": "j1", "progress_path": "/m/.gpufleet/progress.json",
                            "delay": "0.01", "progress_interval": 1, "timeout": " 86700 "})
    assert (opts["delay"], opts["progress_interval"], opts["timeout"]) == (0.01, 1.0, 86700.0)
    assert opts["label"] == "/m/.gpufleet/progress.json"  # no label: the file names it
    assert fw.wait_options({"jid": "j", "label": "org/x"})["label"] == "org/x"
    assert fw.wait_options({"jid": "j", "delay": 7, "progress_interval": 7})["delay"] == 7.0
    assert fw.wait_options({"jid": "j", "timeout": fw.MAX_SECONDS})["timeout"] == fw.MAX_SECONDS


@pytest.mark.parametrize("args,expected", [
    ({}, "jid is required"),
    ({"jid": None}, "jid is required"),
    ({"jid": ""}, "jid must be a non-empty string"),
    ({"jid": 123}, "jid must be a non-empty string"),
    ({"jid": "j", "progress_path": ""}, "progress_path must be a non-empty string"),
    ({"jid": "j", "progress_path": ["/a"]}, "progress_path must be a non-empty string"),
    ({"jid": "j", "label": 5}, "label must be a non-empty string"),
    ({"jid": "j", "dealy": 5}, "unsupported option(s) dealy; supported: jid,"),
    ({"jid": "j", "delay": "soon"}, "delay must be a number of seconds, not 'soon'"),
    ({"jid": "j", "delay": ""}, "delay must be a number of seconds, not ''"),
    ({"jid": "j", "delay": [5]}, "delay must be a number of seconds, not list"),
    ({"jid": "j", "delay": {"s": 5}}, "delay must be a number of seconds, not dict"),
    ({"jid": "j", "delay": True}, "delay must be a number of seconds, not bool"),
    ({"jid": "j", "delay": 0}, "delay must be > 0 seconds, not 0"),
    ({"jid": "j", "delay": 0.0}, "delay must be > 0 seconds, not 0.0"),
    ({"jid": "j", "delay": -5}, "delay must be > 0 seconds, not -5"),
    ({"jid": "j", "delay": "-0.5"}, "delay must be > 0 seconds, not '-0.5'"),
    ({"jid": "j", "delay": math.nan}, "delay must be a number of seconds, not NaN"),
    ({"jid": "j", "delay": "nan"}, "delay must be a number of seconds, not NaN"),
    ({"jid": "j", "progress_interval": math.inf}, "progress_interval must be at most 31622400 seconds (a year), not infinity"),
    ({"jid": "j", "timeout": "inf"}, "timeout must be at most 31622400 seconds (a year), not infinity"),
    ({"jid": "j", "timeout": -math.inf}, "timeout must be > 0 seconds"),
    ({"jid": "j", "timeout": 1e300}, "timeout must be at most 31622400 seconds (a year), not 1e+300"),
    ({"jid": "j", "timeout": 10 ** 400}, "timeout must be at most 31622400 seconds (a year), not infinity"),
    ({"jid": "j", "timeout": fw.MAX_SECONDS + 1}, "timeout must be at most 31622400 seconds"),
    ({"jid": "j", "timeout": 0}, "timeout must be > 0 seconds"),
    ({"jid": "j", "progress_interval": -60}, "progress_interval must be > 0 seconds"),
    ({"jid": "j", "delay": 10, "progress_interval": 5},
     "progress_interval (5 s) must be >= delay (10 s)"),
])
def test_bad_options_say_which_and_why(args, expected):
    with pytest.raises(fw.WaitOptionError) as exc:
        fw.wait_options(args)
    assert expected in str(exc.value), str(exc.value)


def test_bad_options_not_a_mapping():
    with pytest.raises(fw.WaitOptionError, match="must be a mapping, not list"):
        fw.wait_options(["jid"])


def test_the_documented_options_are_the_ones_checked():
    """library/model_fetch_wait.py's argument_spec is ARGUMENT_SPEC (test_conventions.py
    compares it with DOCUMENTATION); wait_options answers for exactly those names."""
    assert set(fw.wait_options({"jid": "j"})) == set(fw.ARGUMENT_SPEC)
    text = (ROOT / "library" / "model_fetch_wait.py").read_text()
    assert "AnsibleModule(argument_spec=ARGUMENT_SPEC" in text
