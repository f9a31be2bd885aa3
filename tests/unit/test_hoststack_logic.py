"""Host stack logic (plugins/module_utils/gpufleet/hoststack.py) and its two modules.

Distribution paths that cannot run on these machines (Ubuntu 22.04/24.04, RHEL/Rocky 9)
are checked here: repository URLs, package names and streams. GPU inputs are real
nvidia-smi captures (tests/fixtures/nvidia-smi/SOURCES.md). The modules are run against
the lab's stand-in repository (lab/apt/build.sh), served by a loopback HTTP server.
"""
import functools
import http.server
import subprocess
import threading

import pytest

from conftest import FIXTURES, ROOT
from gpufleet import gpu, hoststack
from gpufleet.hoststack import HostStackError
from helpers import run_module


def devices(capture):
    return gpu.parse_nvidia_smi_xml((FIXTURES / "nvidia-smi" / capture).read_text())["devices"]


ADA = devices("netdata-rtx-4090-driver-535.xml")            # 8.9
PASCAL = devices("netdata-tesla-p100.xml")                   # 6.0
BLACKWELL = devices("telegraf-pro-6000-maxq-blackwell-v13.xml")  # 12.0
TURING = devices("telegraf-tesla-t4.xml")                    # 7.5


# --- repositories ---------------------------------------------------------------------

@pytest.mark.parametrize("dist, ver, arch, url", [
    ("Ubuntu", "22.04", "x86_64", "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"),
    ("Ubuntu", "24.04", "aarch64", "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/"),
    ("Debian", "12.8", "x86_64", "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"),
    ("Rocky", "9.4", "x86_64", "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/"),
    ("RedHat", "9.5", "aarch64", "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/sbsa/"),
])
def test_cuda_repo_per_distribution(dist, ver, arch, url):
    repo = hoststack.cuda_repo(dist, ver, arch)
    assert repo["url"] == url
    if repo["manager"] == "apt":
        assert repo["key_url"] == url + "3bf863cc.pub"
        assert repo["probe_url"] == url + "Release"
    else:
        assert repo["key_url"] == url + "D42D0685.pub"
        assert repo["probe_url"] == url + "repodata/repomd.xml"


def test_cuda_repo_mirror_replaces_nvidia_url():
    repo = hoststack.cuda_repo("Debian", "12", "x86_64", "http://mirror.internal/cuda/debian12/x86_64")
    assert repo["url"] == "http://mirror.internal/cuda/debian12/x86_64/"
    assert repo["probe_url"] == "http://mirror.internal/cuda/debian12/x86_64/Release"


@pytest.mark.parametrize("dist, ver, arch, match", [
    ("Ubuntu", "20.04", "x86_64", "Ubuntu 20.04 is not supported"),
    ("Debian", "11", "x86_64", "Debian 11 is not supported"),
    ("Debian", "12", "ppc64le", "architecture 'ppc64le'"),
])
def test_cuda_repo_refuses_unsupported_hosts(dist, ver, arch, match):
    with pytest.raises(HostStackError, match=match):
        hoststack.cuda_repo(dist, ver, arch)


def test_mirror_must_be_a_url():
    with pytest.raises(HostStackError, match="no http://, https:// or file:// scheme"):
        hoststack.cuda_repo("Debian", "12", "x86_64", "mirror.internal/cuda")


@pytest.mark.parametrize("dist, ver, arch, url", [
    ("Ubuntu", "24.04", "x86_64", "https://nvidia.github.io/libnvidia-container/stable/deb/amd64/"),
    ("Debian", "12", "aarch64", "https://nvidia.github.io/libnvidia-container/stable/deb/arm64/"),
    ("Rocky", "9.4", "x86_64", "https://nvidia.github.io/libnvidia-container/stable/rpm/x86_64/"),
])
def test_container_toolkit_repo(dist, ver, arch, url):
    repo = hoststack.container_toolkit_repo(dist, ver, arch)
    assert repo["url"] == url
    assert repo["key_url"] == "https://nvidia.github.io/libnvidia-container/gpgkey"


def test_versions_sort_numerically():
    versions = ["580.95.05-1", "535.129.03-1", "580.65.06-1", "580.105.08-1", "1:550.1-1"]
    ordered = sorted(versions, key=hoststack.version_key)
    assert ordered == ["535.129.03-1", "580.65.06-1", "580.95.05-1", "580.105.08-1", "1:550.1-1"]
    assert hoststack.upstream_version("1:580.95.05-1") == "580.95.05"


# --- kernel module flavour ------------------------------------------------------------

@pytest.mark.parametrize("devs, branch, flavor", [
    (ADA, "580", "open"), (TURING, "535", "open"), (BLACKWELL, "590", "open"),
    (PASCAL, "580", "proprietary"), (PASCAL, "535", "proprietary"),
])
def test_flavor_from_real_captures(devs, branch, flavor):
    assert hoststack.kernel_module_flavor(branch, devs) == flavor


def test_branch_that_dropped_the_gpu_is_refused():
    with pytest.raises(HostStackError, match=r"driver branch 590 no longer supports .* 6\.0.*set nvidia_driver_branch"):
        hoststack.kernel_module_flavor("590", PASCAL)


@pytest.mark.parametrize("branch", ["581", "abc", "", "58"])
def test_unknown_branch_is_refused(branch):
    with pytest.raises(HostStackError, match="not a known NVIDIA driver branch.*580"):
        hoststack.kernel_module_flavor(branch, ADA)


def test_open_modules_refused_for_pascal_and_proprietary_for_blackwell():
    with pytest.raises(HostStackError, match="open kernel modules do not support.*6.0"):
        hoststack.kernel_module_flavor("580", PASCAL, "open")
    with pytest.raises(HostStackError, match="Blackwell GPUs .* need the open kernel modules"):
        hoststack.kernel_module_flavor("580", BLACKWELL, "proprietary")
    assert hoststack.kernel_module_flavor("580", ADA, "proprietary") == "proprietary"


def test_mixed_pascal_and_blackwell_host_is_refused():
    with pytest.raises(HostStackError, match="mixes pre-Turing GPUs"):
        hoststack.kernel_module_flavor("580", PASCAL + BLACKWELL)


def test_no_gpu_or_unknown_gpu_needs_an_explicit_flavor():
    with pytest.raises(HostStackError, match="no NVIDIA GPU was found"):
        hoststack.kernel_module_flavor("580", [])
    assert hoststack.kernel_module_flavor("580", [], "proprietary") == "proprietary"
    with pytest.raises(HostStackError, match="compute capability is unknown"):
        hoststack.kernel_module_flavor("580", [{"compute_capability": None}])


# --- packages and versions ------------------------------------------------------------

def test_apt_packages_up_to_580_use_branch_metas():
    pkgs = hoststack.driver_packages("apt", "580", "open", fabricmanager=True)
    assert pkgs["install"] == ["nvidia-open-580", "nvidia-fabricmanager-580"]
    assert pkgs["hold"] == ["nvidia-open-580", "nvidia-driver", "nvidia-driver-cuda",
                            "nvidia-kernel-open-dkms", "nvidia-persistenced", "nvidia-fabricmanager-580"]
    assert hoststack.driver_packages("apt", "535", "proprietary")["meta"] == "cuda-drivers-535"


def test_ubuntu_holds_ubuntu_package_names():
    pkgs = hoststack.driver_packages("apt", "580", "open", distribution="Ubuntu")
    assert pkgs["install"] == ["nvidia-open-580"]
    assert {"nvidia-driver-580-open", "nvidia-dkms-580-open", "nvidia-utils-580"} <= set(pkgs["hold"])
    assert "nvidia-dkms-535" in hoststack.driver_packages("apt", "535", "proprietary", distribution="Ubuntu")["hold"]


def test_apt_packages_from_590_use_the_pinning_package():
    pkgs = hoststack.driver_packages("apt", "595", "open")
    assert pkgs["install"] == ["nvidia-driver-pinning-595", "nvidia-open"]
    assert hoststack.driver_packages("apt", "610", "proprietary")["meta"] == "cuda-drivers"


def test_dnf_packages_use_module_streams():
    pkgs = hoststack.driver_packages("dnf", "580", "open", fabricmanager=True)
    assert pkgs["install"] == ["@nvidia-driver:580-open", "nvidia-fabric-manager"]
    assert "kmod-nvidia-open-dkms" in pkgs["hold"]
    assert hoststack.driver_packages("dnf", "535", "proprietary")["stream"] == "535-dkms"


AVAILABLE = ["580.65.06-1", "580.95.05-1"]


@pytest.mark.parametrize("requested, installed, upgrade, expected", [
    ("", None, False, "580.95.05-1"),            # first install: newest of the branch
    ("", "580.65.06-1", False, "580.65.06-1"),   # installed: never moves by itself
    ("", "580.65.06-1", True, "580.95.05-1"),    # explicit upgrade
    ("580.65.06", "580.95.05-1", False, "580.65.06-1"),  # explicit version (downgrade too)
])
def test_resolve_driver_version(requested, installed, upgrade, expected):
    assert hoststack.resolve_driver_version("580", requested, installed, AVAILABLE, upgrade) == expected


def test_resolve_driver_version_errors():
    with pytest.raises(HostStackError, match="580.1.2 is not in the repository.*580.65.06, 580.95.05"):
        hoststack.resolve_driver_version("580", "580.1.2", None, AVAILABLE)
    with pytest.raises(HostStackError, match="not in branch 580.*set\n?.*nvidia_driver_branch to 535"):
        hoststack.resolve_driver_version("580", "535.129.03", None, AVAILABLE)
    with pytest.raises(HostStackError, match="carries no package of driver branch 550"):
        hoststack.resolve_driver_version("550", "", None, [])


def test_plan_branch_change_removes_the_old_branch_and_holds_the_new():
    installed = {"nvidia-open-535": [{"version": "535.129.03-1"}], "nvidia-driver": [{"version": "535.129.03-1"}],
                 "nvidia-fabricmanager-535": [{"version": "535.129.03-1"}],
                 "nvidia-kernel-open-dkms": [{"version": "535.129.03-1"}]}
    plan = hoststack.plan_driver("apt", "580", "580.65.06", False, "open", False, installed,
                                 {"nvidia-open-580": AVAILABLE})
    assert plan["install"] == ["nvidia-open-580=580.65.06-1"]
    assert plan["remove"] == ["nvidia-fabricmanager-535", "nvidia-open-535"]
    assert plan["installed_kernel_module"] == {"package": "nvidia-kernel-open-dkms", "version": "535.129.03-1"}
    assert plan["changes"] is True
    assert plan["driver_version"] == "580.65.06"


def test_plan_without_changes_when_installed_matches():
    installed = {"nvidia-open-580": [{"version": "580.65.06-1"}]}
    plan = hoststack.plan_driver("apt", "580", "", False, "open", False, installed,
                                 {"nvidia-open-580": AVAILABLE})
    assert (plan["changes"], plan["version"], plan["remove"]) == (False, "580.65.06-1", [])


def test_plan_flavour_switch_removes_the_other_meta():
    installed = {"nvidia-open-580": [{"version": "580.65.06-1"}]}
    plan = hoststack.plan_driver("apt", "580", "", False, "proprietary", False, installed,
                                 {"cuda-drivers-580": AVAILABLE})
    assert plan["remove"] == ["nvidia-open-580"]
    assert plan["install"] == ["cuda-drivers-580=580.95.05-1"]


def test_plan_dnf_leaves_the_version_to_dnf():
    plan = hoststack.plan_driver("dnf", "580", "", False, "open", False, {}, None)
    assert plan["install"] == ["@nvidia-driver:580-open"]
    assert plan["version"] is None and plan["changes"] is True


def test_nvswitches_and_fabric_manager():
    # class values as /sys/bus/pci/devices/*/class reads them
    bus = [(0x10DE, 0x030200), (0x10DE, 0x068000), (0x10DE, 0x068000), (0x8086, 0x068000)]
    assert hoststack.nvswitch_count(bus) == 2
    assert hoststack.wants_fabricmanager("auto", 2) is True
    assert hoststack.wants_fabricmanager("auto", 0) is False
    assert hoststack.wants_fabricmanager("enabled", 0) is True
    with pytest.raises(HostStackError):
        hoststack.wants_fabricmanager("yes", 0)


def test_unreachable_repository_message_names_the_variable():
    def fetch(url):
        raise OSError("Connection refused")
    repo = hoststack.cuda_repo("Debian", "12", "x86_64", "http://127.0.0.1:9/cuda/")
    with pytest.raises(HostStackError, match=r"cannot be read.*Connection refused.*Nothing was changed.*nvidia_driver_repo_url"):
        hoststack.read_repository(repo, fetch, "nvidia_driver_repo_url")


# --- modules against the lab's stand-in repository -------------------------------------

@pytest.fixture(scope="module")
def lab_repo():
    subprocess.run(["bash", str(ROOT / "lab/apt/build.sh")], check=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(ROOT / ".cache/lab/apt"))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_parse_the_built_packages_index():
    subprocess.run(["bash", str(ROOT / "lab/apt/build.sh")], check=True)
    index = hoststack.parse_packages_index(
        (ROOT / ".cache/lab/apt/cuda/debian12/x86_64/Packages").read_text())
    assert sorted(index["nvidia-open-580"], key=hoststack.version_key) == AVAILABLE
    assert index["cuda-toolkit-12-8"] == ["12.8.1-1"]


def test_driver_plan_module(lab_repo, monkeypatch):
    import nvidia_driver_plan
    args = {"branch": "580", "distribution": "Debian", "distribution_version": "12.8",
            "architecture": "x86_64", "repo_url": f"{lab_repo}/cuda/debian12/x86_64/",
            "trusted": True, "devices": ADA, "fabricmanager": "enabled",
            "installed": {"nvidia-open-580": [{"version": "580.65.06-1"}]}}
    result, failed = run_module(nvidia_driver_plan.main, args, monkeypatch, check_mode=True)
    assert not failed and result["changed"] is False
    plan = result["plan"]
    assert plan["flavor"] == "open" and plan["fabricmanager"] is True
    assert plan["install"] == ["nvidia-open-580=580.65.06-1", "nvidia-fabricmanager-580=580.65.06-1"]
    assert plan["changes"] is False  # installed and not asked to move

    result, failed = run_module(nvidia_driver_plan.main, dict(args, upgrade=True), monkeypatch)
    assert result["plan"]["driver_version"] == "580.95.05" and result["plan"]["changes"] is True

    result, failed = run_module(nvidia_driver_plan.main, dict(args, branch="590", devices=PASCAL), monkeypatch)
    assert failed and "no longer supports" in result["msg"]


def test_driver_plan_module_unreachable_mirror(monkeypatch):
    import nvidia_driver_plan
    args = {"branch": "580", "distribution": "Debian", "distribution_version": "12",
            "architecture": "x86_64", "repo_url": "http://127.0.0.1:9/cuda/", "devices": ADA,
            "timeout": 3}
    result, failed = run_module(nvidia_driver_plan.main, args, monkeypatch)
    assert failed and "nvidia_driver_repo_url" in result["msg"] and "Nothing was changed" in result["msg"]


def test_repo_info_module(lab_repo, monkeypatch):
    import nvidia_repo_info
    args = {"component": "container_toolkit", "distribution": "Ubuntu", "distribution_version": "24.04",
            "architecture": "x86_64", "repo_url": f"{lab_repo}/libnvidia-container/stable/deb/amd64/",
            "trusted": True, "packages": ["nvidia-container-toolkit"], "setting": "container_toolkit_repo_url"}
    result, failed = run_module(nvidia_repo_info.main, args, monkeypatch)
    assert not failed
    assert sorted(result["available"]["nvidia-container-toolkit"]) == ["1.17.8-1", "1.18.0-1"]

    result, failed = run_module(nvidia_repo_info.main, dict(args, packages=["nvidia-container-toolkit", "nope"]),
                                monkeypatch)
    assert failed and "has no package nope" in result["msg"] and "container_toolkit_repo_url" in result["msg"]
