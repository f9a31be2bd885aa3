"""What the container really loads: the image's CUDA forward-compatibility libraries
(/usr/local/cuda/compat) under the container toolkit (issue #14 item 3).

Sources, cited per case below:
  [HOOK]   NVIDIA/nvidia-container-toolkit d34b3046758cb1a5db606b2a39519c731bbf9f56,
           cmd/nvidia-cdi-hook/cudacompat/cudacompat.go and cuda-elf-header.go (the
           enable-cuda-compat hook); < 1.20.0 compares majors (tag v1.19.0, same file,
           extractMajorVersion); 1.20.0 reads the ELF note (commit f7cf48fe).
  [LEGACY] the same repo, cmd/nvidia-container-runtime-hook/hook_config.go
           (--cuda-compat-mode from 1.17.7, --no-cntlibs in 1.17.4 to 1.17.6, tags
           v1.17.4..v1.17.7) and NVIDIA/libnvidia-container src/cli/compat_mode.c at
           0d289cb51cd2301661da9391150bf21c2e07f440 (filter_by_major_version: a library
           whose major is not greater than the driver's is dropped).
  [NOTE]   tests/fixtures/cuda-compat: NVIDIA's libcuda.so.575.57.08 (CUDA 12.9) and
           libcuda.so.590.44.01 (CUDA 13.1), truncated to their ELF notes, from the
           toolkit's testdata/compat (see SOURCES.md there).
  [FWD]    NVIDIA CUDA Compatibility guide, Forward Compatibility: only data-center GPUs
           (and select NGC Server Ready RTX SKUs, Jetson); cuda-compat-12-8 is built from
           the 570 driver.  https://docs.nvidia.com/deploy/cuda-compatibility/forward-compatibility.html
  [BASE]   NVIDIA's CUDA base Dockerfile installs ${NV_CUDA_COMPAT_PACKAGE}
           (cuda-compat-X-Y): tests/fixtures/images/nvidia-cuda-12.2.2-runtime.env.json.
  [804]    CUDA runtime API: cudaErrorCompatNotSupportedOnDevice = 804 "forward
           compatibility was attempted on non supported HW".
"""
import io
import shutil
import subprocess
import tarfile
import uuid

import pytest

from conftest import FIXTURES
from gpufleet import cuda
from gpufleet import compat_libs
from helpers import docker_answers, run_module

import cuda_compat

COMPAT = FIXTURES / "cuda-compat"
LIB_129 = (COMPAT / "libcuda.so.575.57.08").read_bytes()
LIB_131 = (COMPAT / "libcuda.so.590.44.01").read_bytes()

# An image built FROM nvidia/cuda:12.9.1 (vllm/vllm-openai:*-cu129): NVIDIA_REQUIRE_CUDA
# of tests/fixtures/images/vllm-openai-v0.16.0-cu129.env.json, brand alternatives for
# geforce and tesla among them (so the toolkit starts it on a 570 GeForce host).
REQUIRE_129 = ("cuda>=12.9 brand=unknown,driver>=570,driver<571 brand=geforce,driver>=570,"
               "driver<571 brand=tesla,driver>=570,driver<571 brand=nvidia,driver>=570,driver<571")


def image_129(note=True, version="575.57.08"):
    """compat_libs as read from the image: libcuda.so.575.57.08 with its note [NOTE]."""
    names = ["libcuda.so", "libcuda.so.1", f"libcuda.so.{version}", "libnvidia-nvvm.so.4"]
    return compat_libs.compat_libs_from_image(names, LIB_129 if note else None)


GEFORCE = dict(compute_capabilities=["8.9"], brand="GeForce", datacenter_gpu=False)  # RTX 4090
DATACENTER = dict(compute_capabilities=["9.0"], brand="NVIDIA", datacenter_gpu=True)  # H100


def verdict(driver, gpu, compat, **kw):
    kw.setdefault("toolkit_version", "1.18.0")
    return cuda.check(driver, require_cuda=REQUIRE_129, compat_libs=compat, **gpu, **kw)


# --- the note and the names, as the hook reads them [HOOK][NOTE] ---------------------

def test_note_of_nvidia_12_9_compat_lib_lists_575():
    note = compat_libs.parse_compat_note(LIB_129)
    assert note == {"cuda": "12.9", "driver": (535, 550, 560, 565, 570, 575),
                    "device": (1, 2, 7, 8, 9, 10, 11, 12, 13, 14)}
    assert compat_libs.NVML_BRANDS["geforce"] not in note["device"]      # GeForce = 5 (nvml.h)
    assert compat_libs.NVML_BRANDS["nvidia"] in note["device"]           # A100/H100 = 14


def test_note_of_nvidia_13_1_compat_lib():
    assert compat_libs.parse_compat_note(LIB_131)["driver"] == (535, 550, 570, 575, 580, 590)


def test_not_an_elf_file_has_no_note():
    # GetCUDACompatElfHeaderFromReader fails; the hook warns and reads no note [HOOK]
    assert compat_libs.parse_compat_note(b"not elf at all, not elf at all, not elf at all!!!") is None


@pytest.mark.parametrize("names,expected", [
    (["libcuda.so.1", "libcuda.so.575.57.08", "libcuda.so"], "575.57.08"),
    (["libcuda.so.1"], None),                                            # no libcuda.so.*.*
    (["libcuda.so.575.57.08", "libcuda.so.570.124.06"], None),           # more than one
    ([], None),
])
def test_compat_lib_version_globs_like_the_hook(names, expected):
    assert compat_libs.compat_lib_version(names) == expected


@pytest.mark.parametrize("text,expected", [
    ("1.17.8", (1, 17, 8)), ("1.17.8-1", (1, 17, 8)), ("1.18.0~rc.1-1", (1, 18, 0)),
    ("NVIDIA Container Toolkit CLI version 1.17.8\ncommit: f202b80", (1, 17, 8)),
    # the lab's stand-in nvidia-ctk (lab/apt): a note after the version (an upgrade's
    # compatibility gate refused every lab host on it before _TOOLKIT_CLI_RE)
    ("NVIDIA Container Toolkit CLI version 1.18.0 (gpufleet lab stand-in)", (1, 18, 0)),
])
def test_parse_toolkit_version(text, expected):
    assert compat_libs.parse_toolkit_version(text) == expected


def test_bad_toolkit_version_says_what_to_pass():
    with pytest.raises(ValueError, match="toolkit_version 'latest' is not"):
        cuda.check("570.195.03", cuda_version="12.9", toolkit_version="latest")
    with pytest.raises(ValueError, match="gpu_runtime 'podman' is not one of nvidia, cdi"):
        cuda.check("570.195.03", cuda_version="12.9", gpu_runtime="podman")


# --- GeForce host (RTX 4090, driver 570) -------------------------------------------

def test_geforce_compat_newer_than_driver_fails_with_804():
    # [LEGACY] 1.18.0 ldconfig mode: 575 > 570 -> on the loader path; [FWD][804]
    r = verdict("570.195.03", GEFORCE, image_129())
    assert r["compat_libs"]["loaded"] is True and r["require_cuda_satisfied"] is True
    assert r["mode"] == "incompatible" and not r["compatible"]
    text = " ".join(r["reasons"])
    assert "error 804" in text and "does not list the GeForce brand" in text
    assert "minor-version compatibility would run it" in text
    fixes = " ".join(r["suggestions"])
    assert "Install driver branch 575 or newer" in fixes
    assert "image without /usr/local/cuda/compat" in fixes
    assert 'cuda-compat-mode = "disabled"' in fixes


def test_geforce_cdi_fix_is_the_disable_hook_flag():
    # [HOOK] < 1.20 compares majors; the fix for CDI is --disable-hook (1.18.0)
    r = verdict("570.195.03", GEFORCE, image_129(), gpu_runtime="cdi", toolkit_version="1.19.0")
    assert r["mode"] == "incompatible" and r["compat_libs"]["loaded"]
    assert any("--disable-hook enable-cuda-compat" in s for s in r["suggestions"])


def test_geforce_compat_older_than_driver_is_not_loaded():
    # [LEGACY] 575 is not greater than 580: dropped; CUDA 13.0 driver runs 12.9 natively
    r = verdict("580.95.05", GEFORCE, image_129())
    assert r["compat_libs"]["loaded"] is False and r["mode"] == "native" and r["compatible"]


def test_geforce_no_compat_libs_minor_version():
    # the image has no /usr/local/cuda/compat: nothing to load, minor-version applies
    r = verdict("570.195.03", GEFORCE, compat_libs.compat_libs_from_image(None))
    assert r["compat_libs"] == {**r["compat_libs"], "present": False, "loaded": False}
    assert r["mode"] == "minor_version" and r["compatible"]


def test_geforce_hook_disabled_minor_version():
    # [LEGACY] cuda-compat-mode = "disabled" -> --cuda-compat-mode=disabled
    r = verdict("570.195.03", GEFORCE, image_129(), cuda_compat_disabled=True)
    assert r["mode"] == "minor_version" and r["compatible"] and not r["compat_libs"]["loaded"]
    assert any('cuda-compat-mode = "disabled"' in x for x in r["reasons"])


@pytest.mark.parametrize("toolkit", ["1.17.4", "1.17.6"])
def test_geforce_toolkit_with_no_cntlibs_minor_version(toolkit):
    # [LEGACY] 1.17.4-1.17.6: --no-cntlibs, and no enable-cuda-compat hook on --gpus
    r = verdict("570.195.03", GEFORCE, image_129(), toolkit_version=toolkit)
    assert r["mode"] == "minor_version" and not r["compat_libs"]["loaded"]


def test_geforce_old_toolkit_mounts_compat_libs():
    # [LEGACY] before 1.17.4 libnvidia-container mounted them (filter_libraries); no
    # setting turns it off, so the fix names the upgrade
    r = verdict("570.195.03", GEFORCE, image_129(), toolkit_version="1.17.3")
    assert r["mode"] == "incompatible" and r["compat_libs"]["loaded"]
    assert any("upgrade nvidia-container-toolkit to 1.17.7" in s for s in r["suggestions"])


def test_geforce_cdi_old_toolkit_has_no_hook():
    # [HOOK] the CDI spec carries enable-cuda-compat from 1.17.5 (pkg/nvcdi/driver-nvml.go)
    r = verdict("570.195.03", GEFORCE, image_129(), gpu_runtime="cdi", toolkit_version="1.17.3")
    assert r["mode"] == "minor_version" and not r["compat_libs"]["loaded"]


# --- data-center host (H100) -----------------------------------------------------------

def test_datacenter_compat_newer_than_driver_runs_forward_compat():
    # [NOTE] 570 is in 12.9's list, brand NVIDIA (14) listed: forward compatibility
    r = verdict("570.195.03", DATACENTER, image_129())
    assert r["compat_libs"]["loaded"] and r["mode"] == "forward_compat" and r["compatible"]


def test_datacenter_branch_not_in_the_compat_table_fails_with_803():
    # [NOTE] 590.44.01 (CUDA 13.1) supports 535 550 570 575 580 590, not 560
    compat = compat_libs.compat_libs_from_image(["libcuda.so.590.44.01"], LIB_131)
    r = cuda.check("560.35.03", cuda_version="13.1", compat_libs=compat, toolkit_version="1.18.0",
                   **DATACENTER)
    assert r["mode"] == "incompatible" and "error 803" in " ".join(r["reasons"])


def test_datacenter_compat_older_than_driver_native():
    r = verdict("580.95.05", DATACENTER, image_129())
    assert not r["compat_libs"]["loaded"] and r["mode"] == "native"


def test_datacenter_no_compat_libs_minor_version():
    r = verdict("570.195.03", DATACENTER, compat_libs.compat_libs_from_image([]))
    assert r["mode"] == "minor_version" and not r["compat_libs"]["present"]


def test_datacenter_hook_disabled_cdi_minor_version():
    # [HOOK] a spec generated with --disable-hook enable-cuda-compat has no hook
    r = verdict("570.195.03", DATACENTER, image_129(), gpu_runtime="cdi",
                cuda_compat_disabled=True)
    assert r["mode"] == "minor_version" and not r["compat_libs"]["loaded"]


def test_datacenter_old_toolkit_without_hook_minor_version():
    r = verdict("570.195.03", DATACENTER, image_129(), toolkit_version="1.17.5")
    assert r["mode"] == "minor_version" and not r["compat_libs"]["loaded"]


def test_hook_1_20_uses_a_newer_build_of_the_same_branch():
    # [HOOK] 1.20.0 UseCompat: 575 in the note and 575.57.08 > 575.51.03 -> used; the
    # toolkit's own e2e test "Testing CUDA Minor Version compatibility" expects this
    r = verdict("575.51.03", DATACENTER, image_129(), gpu_runtime="cdi", toolkit_version="1.20.0")
    assert r["compat_libs"]["loaded"] and r["mode"] == "native" and r["compatible"]
    # ... and on a GeForce host the same hook makes CUDA fail with 804
    g = verdict("575.51.03", GEFORCE, image_129(), gpu_runtime="cdi", toolkit_version="1.20.0")
    assert g["mode"] == "incompatible" and "error 804" in " ".join(g["reasons"])
    # 1.19 compares majors only: same branch, not used
    old = verdict("575.51.03", GEFORCE, image_129(), gpu_runtime="cdi", toolkit_version="1.19.0")
    assert old["mode"] == "native" and not old["compat_libs"]["loaded"]


def test_hook_1_20_without_note_falls_back_to_majors():
    r = verdict("575.51.03", GEFORCE, image_129(note=False, version="575.57.08"),
                gpu_runtime="cdi", toolkit_version="1.20.0")
    assert not r["compat_libs"]["loaded"] and r["mode"] == "native"


# --- no image: what NVIDIA's base images ship is assumed [BASE][FWD] ----------------

def test_no_image_assumes_nvidia_base_image_and_says_so():
    r = cuda.check("570.195.03", cuda_version="12.9", compat_libs="assume", **GEFORCE)
    assert r["compat_libs"]["source"] == "assumed"
    assert r["compat_libs"]["package"] == "cuda-compat-12-9" and r["compat_libs"]["branch"] == 575
    assert any("assumed what NVIDIA's CUDA 12.9 base images ship" in x for x in r["reasons"])
    assert any("version not given" in x for x in r["reasons"])
    assert r["mode"] == "incompatible" and "error 804" in " ".join(r["reasons"])


def test_refused_container_loads_nothing():
    # nvidia-container-cli refuses first: the compat prediction is only "were it started"
    r = cuda.check("565.57.01", require_cuda="cuda>=12.9", compat_libs="assume",
                   toolkit_version="1.18.0", **DATACENTER)
    assert r["require_cuda_satisfied"] is False
    assert any(x.startswith("Were the container started: nvidia-container-toolkit 1.18.0")
               for x in r["reasons"])


def test_default_check_does_not_evaluate_compat_libs():
    assert "compat_libs" not in cuda.check("570.195.03", cuda_version="12.9", **GEFORCE)


# --- the module ------------------------------------------------------------------------

class FakeAPI:
    """docker.APIClient's create_container / get_archive / remove_container."""

    def __init__(self, files):
        self.files, self.created, self.removed = files, [], []

    def create_container(self, image, **kw):
        self.created.append((image, kw))
        return {"Id": "c0ffee"}

    def get_archive(self, cid, path):
        assert path == "/usr/local/cuda/compat/."
        if self.files is None:
            raise cuda_compat.docker_errors.NotFound("Could not find the file")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in self.files.items():
                info = tarfile.TarInfo("./" + name)
                if data is None:
                    info.type, info.linkname = tarfile.SYMTYPE, "libcuda.so.575.57.08"
                    tar.addfile(info)
                else:
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        raw = buf.getvalue()
        return (raw[i:i + 1000] for i in range(0, len(raw), 1000)), {}

    def remove_container(self, cid, force=False):
        self.removed.append((cid, force))


class FakeImage:
    attrs = {"Config": {"Env": [f"NVIDIA_REQUIRE_CUDA={REQUIRE_129}", "CUDA_VERSION=12.9.1"]}}


class FakeDocker:
    def __init__(self, files):
        self.api = FakeAPI(files)
        self.images = self

    def get(self, name):
        return FakeImage()


def test_module_reads_the_image_compat_libs(monkeypatch):
    client = FakeDocker({"libcuda.so.1": None, "libcuda.so.575.57.08": LIB_129})
    monkeypatch.setattr(cuda_compat.docker, "from_env", lambda: client)
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "570.195.03", "compute_capabilities": ["8.9"], "brand": "GeForce",
        "image": "vllm/vllm-openai:v0.16.0", "toolkit_version": "1.17.8",
        "fail_on_incompatible": False}, monkeypatch)
    assert not failed and result["mode"] == "incompatible"
    assert result["compat_libs"]["source"] == "image"
    assert result["compat_libs"]["version"] == "575.57.08" and result["compat_libs"]["loaded"]
    assert result["compat_libs"]["note"]["driver"] == [535, 550, 560, 565, 570, 575]
    assert client.api.created[0][1]["command"] == ["true"]            # never started
    assert client.api.removed == [("c0ffee", True)]                   # always removed


def test_module_image_without_compat_dir(monkeypatch):
    client = FakeDocker(None)
    monkeypatch.setattr(cuda_compat.docker, "from_env", lambda: client)
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "570.195.03", "compute_capabilities": ["8.9"],
        "image": "x:1", "toolkit_version": "1.17.8"}, monkeypatch)
    assert not failed and result["mode"] == "minor_version"
    assert result["compat_libs"]["present"] is False and client.api.removed


def test_module_require_cuda_assumes_base_image(monkeypatch):
    result, failed = run_module(cuda_compat.main, {
        "driver_version": "570.195.03", "compute_capabilities": ["9.0"], "brand": "NVIDIA",
        "datacenter_gpu": True, "require_cuda": REQUIRE_129, "gpu_runtime": "cdi",
        "toolkit_version": "NVIDIA Container Toolkit CLI version 1.18.0"}, monkeypatch)
    assert not failed and result["mode"] == "forward_compat"
    assert result["compat_libs"]["source"] == "assumed"


@pytest.mark.slow
@pytest.mark.skipif(not docker_answers(), reason="no docker engine answers")
def test_module_reads_compat_libs_of_a_real_local_image(tmp_path, monkeypatch):
    # The layout of NVIDIA's images: /usr/local/cuda -> cuda-12.9, compat/libcuda.so.1 ->
    # libcuda.so.575.57.08 (here the truncated copy of NVIDIA's library [NOTE]).
    base = "gpufleet/debian:12"
    if subprocess.run(["docker", "image", "inspect", base], capture_output=True).returncode:
        pytest.skip(f"{base} is not built on this host (scripts build it)")
    tag = f"cudacompat-libs-test:{uuid.uuid4().hex[:8]}"
    shutil.copy(COMPAT / "libcuda.so.575.57.08", tmp_path / "libcuda.so.575.57.08")
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base}\n"
        "COPY libcuda.so.575.57.08 /usr/local/cuda-12.9/compat/\n"
        "RUN ln -s libcuda.so.575.57.08 /usr/local/cuda-12.9/compat/libcuda.so.1 && "
        "ln -s cuda-12.9 /usr/local/cuda\n"
        "ENV CUDA_VERSION=12.9.1\n"
        f"ENV NVIDIA_REQUIRE_CUDA=\"{REQUIRE_129}\"\n")
    subprocess.run(["docker", "build", "--network=none", "-q", "-t", tag, str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    try:
        before = subprocess.run(["docker", "ps", "-aq"], capture_output=True, text=True).stdout
        result, failed = run_module(cuda_compat.main, {
            "driver_version": "570.195.03", "compute_capabilities": ["8.9"], "image": tag,
            "brand": "GeForce", "toolkit_version": "1.17.8"}, monkeypatch)
        assert failed and "error 804" in result["msg"]
        assert result["compat_libs"]["version"] == "575.57.08"
        assert result["compat_libs"]["note"]["cuda"] == "12.9"
        after = subprocess.run(["docker", "ps", "-aq"], capture_output=True, text=True).stdout
        assert before == after                       # the created container is gone
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
