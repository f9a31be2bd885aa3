"""NVIDIA repositories, once and verified: one URL rule, keys pinned by fingerprint, one entry point.

- Repository and key URLs go through one helper (hoststack.repository_url) that refuses
  anything that is not a clean URL: a newline or space in nvidia_driver_repo_url used to
  become extra apt source lines.
- The signing key is accepted only with a pinned fingerprint (NVIDIA's published ones by
  default), checked with real `gpg --show-keys --with-colons` on keys generated here, and
  a file with a second key is refused (apt would trust it too).
- The modules (nvidia_repo_info, nvidia_driver_plan) do the same against a loopback copy
  of the lab's stand-in repository with a generated key.
"""
import functools
import http.server
import os
import shutil
import subprocess
import threading

import pytest

from conftest import FIXTURES, ROOT
from gpufleet import gpu, hoststack
from gpufleet.hoststack import HostStackError
from helpers import run_module

GPG = shutil.which("gpg")
needs_gpg = pytest.mark.skipif(GPG is None, reason="gpg is not installed")
ADA = gpu.parse_nvidia_smi_xml((FIXTURES / "nvidia-smi" / "netdata-rtx-4090-driver-535.xml").read_text())["devices"]


# --- URLs -------------------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8081/cuda/debian12/x86_64/",
    "https://mirror.example.internal/nvidia/cuda/repos/ubuntu2404/sbsa",
    "https://mirror.example.internal:8443/libnvidia-container/stable/rpm/$basearch/",
    "http://user@mirror.internal/a~b/c%20d/",
    "file:///srv/mirror/cuda/",
    "",
])
def test_clean_urls_are_accepted(url):
    assert hoststack.repository_url(url, "nvidia_driver_repo_url") == url


@pytest.mark.parametrize("url, reason", [
    ("http://127.0.0.1:8081/cuda/ /\ndeb [trusted=yes] http://evil.example/ /", "character ' '"),
    ("http://mirror.internal/cuda/\ndeb [trusted=yes] http://evil.example/ /", r"character '\\n'"),
    ("http://mirror.internal/cuda/\r\n", r"character '\\r'"),
    ("http://mirror.internal/cu\tda/", r"character '\\t'"),
    (" http://mirror.internal/cuda/", "character ' '"),
    ("http://mirror.internal/cuda/\x00", r"character '\\x00'"),
    ("http://mirror.internal/cüda/", "character 'ü'"),
    ("http://mirror.internal/cuda/#comment", "character.s. #"),
    ("http://mirror.internal/cuda/?x=1", r"character.s. \?"),
    ("http://mirror.internal/[trusted=yes]/", r"character.s. \[ \]"),
    ('http://mirror.internal/"x"/', 'character.s. "'),
    ("http://mirror.internal/a\\b/", r"character.s. \\"),
    ("http://mirror.internal/a%zz/", "not a %XX escape"),
    ("mirror.internal/cuda", "no http://, https:// or file:// scheme"),
    ("ftp://mirror.internal/cuda", "no http://, https:// or file:// scheme"),
    ("http:///cuda/", "no host"),
    ("file://srv/mirror/", "no absolute path"),
])
@pytest.mark.parametrize("setting", ["nvidia_driver_repo_url", "container_toolkit_repo_key_url"])
def test_urls_that_are_not_urls_are_refused(url, reason, setting):
    with pytest.raises(HostStackError, match=reason) as raised:
        hoststack.repository_url(url, setting)
    assert str(raised.value).startswith(setting + " ") and "Nothing was changed" in str(raised.value)


@pytest.mark.parametrize("resolve, setting", [
    (hoststack.cuda_repo, "cuda_toolkit_repo_url"),
    (hoststack.container_toolkit_repo, "container_toolkit_repo_url"),
])
def test_repositories_refuse_an_injected_line_naming_the_variable(resolve, setting):
    with pytest.raises(HostStackError, match=f"^{setting} .*not a usable repository URL"):
        resolve("Debian", "12", "x86_64", "http://m.internal/x/ /\ndeb [trusted=yes] http://evil/ /", setting)
    with pytest.raises(HostStackError, match=f"^{setting[:-4]}_key_url "):
        resolve("Debian", "12", "x86_64", "http://m.internal/x/", setting, key_url="http://m/k\n")


# --- fingerprints -----------------------------------------------------------------------

@pytest.mark.parametrize("resolve, dist, ver, fingerprint", [
    (hoststack.cuda_repo, "Debian", "12", "EB693B3035CD5710E231E123A4B469963BF863CC"),
    (hoststack.cuda_repo, "Ubuntu", "22.04", "EB693B3035CD5710E231E123A4B469963BF863CC"),
    (hoststack.cuda_repo, "Ubuntu", "24.04", "EB693B3035CD5710E231E123A4B469963BF863CC"),
    (hoststack.cuda_repo, "Rocky", "9.4", "610C7B14E068A878070DA4E99CD0A493D42D0685"),
    (hoststack.container_toolkit_repo, "Ubuntu", "24.04", "C95B321B61E88C1809C4F759DDCAE044F796ECB0"),
    (hoststack.container_toolkit_repo, "RedHat", "9.5", "C95B321B61E88C1809C4F759DDCAE044F796ECB0"),
])
def test_nvidia_published_fingerprints_are_the_default(resolve, dist, ver, fingerprint):
    assert resolve(dist, ver, "x86_64")["key_fingerprint"] == fingerprint
    # a mirror: the key comes from the mirror, the fingerprint stays NVIDIA's
    mirrored = resolve(dist, ver, "x86_64", "http://mirror.internal/nv/")
    assert mirrored["key_url"].startswith("http://mirror.internal/nv/")
    assert mirrored["key_fingerprint"] == fingerprint


def test_a_mirrors_own_key_and_fingerprint():
    repo = hoststack.cuda_repo("Debian", "12", "x86_64", "http://mirror.internal/cuda/",
                               key_url="https://keys.internal/site.asc",
                               fingerprint="0123 4567 89ab cdef 0123  4567 89AB CDEF 0123 4567")
    assert repo["key_url"] == "https://keys.internal/site.asc"
    assert repo["key_fingerprint"] == "0123456789ABCDEF0123456789ABCDEF01234567"


@pytest.mark.parametrize("value", ["3BF863CC", "A4B469963BF863CC", "EB693B30-35CD", "G" * 40, "EB69" * 11])
def test_short_ids_and_garbage_are_not_fingerprints(value):
    with pytest.raises(HostStackError, match="^nvidia_driver_repo_key_fingerprint .*40 hex digits"):
        hoststack.cuda_repo("Debian", "12", "x86_64", fingerprint=value)


COLONS = """\
pub:-:4096:1:A4B469963BF863CC:1650534442:::-:::scESC::::::23::0:
fpr:::::::::EB693B3035CD5710E231E123A4B469963BF863CC:
uid:-::::1650534442::C9A1AC5CFCB39BCB02DF3B4B9A6B1DB2D1B6C1F8::cudatools <cudatools@nvidia.com>::::::::::0:
sub:-:4096:1:1111111111111111:1650534442::::::e::::::23:
fpr:::::::::2222222222222222222222221111111111111111:
"""


def test_primary_fingerprints_skip_subkeys():
    assert hoststack.primary_fingerprints(COLONS) == ["EB693B3035CD5710E231E123A4B469963BF863CC"]
    assert hoststack.primary_fingerprints("") == []


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two real keys made with gpg: {"a": (fingerprint, armored), "b": ...}."""
    if GPG is None:
        pytest.skip("gpg is not installed")
    home = tmp_path_factory.mktemp("gnupg")
    os.chmod(home, 0o700)
    out = {}
    for name in ("a", "b"):
        subprocess.run([GPG, "--homedir", str(home), "--batch", "--passphrase", "", "--quick-gen-key",
                        f"gpufleet test {name} <{name}@gpufleet.invalid>", "ed25519", "sign", "never"],
                       check=True, capture_output=True)
        colons = subprocess.run([GPG, "--homedir", str(home), "--with-colons", "--list-keys",
                                 f"{name}@gpufleet.invalid"], check=True, capture_output=True, text=True).stdout
        fpr = hoststack.primary_fingerprints(colons)[0]
        armored = subprocess.run([GPG, "--homedir", str(home), "--armor", "--export", fpr],
                                 check=True, capture_output=True).stdout
        binary = subprocess.run([GPG, "--homedir", str(home), "--export", fpr],
                                check=True, capture_output=True).stdout
        out[name] = (fpr, armored, binary)
    return out


def _show_keys(data):
    def run(argv, stdin):
        done = subprocess.run(argv, input=stdin, capture_output=True)
        return done.returncode, done.stdout.decode(), done.stderr.decode()
    return hoststack.gpg_show_keys(run, GPG, data)


def _repo(fingerprint=""):
    return hoststack.cuda_repo("Debian", "12", "x86_64", "http://mirror.internal/cuda/",
                               setting="cuda_toolkit_repo_url", fingerprint=fingerprint)


@needs_gpg
def test_the_pinned_key_is_accepted_and_returned_armored(keys):
    fpr, armored, _ = keys["a"]
    key = hoststack.verify_key(_repo(fpr), lambda url: armored, _show_keys, "cuda_toolkit_repo_url")
    assert key.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----") and key.endswith("\n")


@needs_gpg
@pytest.mark.parametrize("served, found", [
    ("b", "b"),          # another key: a mirror's, or an attacker's
    ("a+b", "a, b"),     # the right key plus one more, which apt would trust as well
    ("garbage", None),   # not a key at all
])
def test_another_key_is_refused_naming_expected_and_found(keys, served, found):
    expected = keys["a"][0]
    data = {"b": keys["b"][1], "a+b": keys["a"][1] + keys["b"][1],
            "garbage": b"<html>404 Not Found</html>"}[served]
    with pytest.raises(HostStackError) as raised:
        hoststack.verify_key(_repo(expected), lambda url: data, _show_keys, "cuda_toolkit_repo_url")
    msg = str(raised.value)
    assert f"expected exactly {expected}" in msg and "Nothing was changed" in msg
    assert "cuda_toolkit_repo_key_fingerprint" in msg
    if found is None:
        assert "none (not an OpenPGP key)" in msg
    else:
        assert ", ".join(keys[k][0] for k in found.split(", ")) in msg


@needs_gpg
def test_nvidias_default_fingerprint_refuses_a_test_key(keys):
    with pytest.raises(HostStackError, match="EB693B3035CD5710E231E123A4B469963BF863CC"):
        hoststack.verify_key(_repo(), lambda url: keys["a"][1], _show_keys, "cuda_toolkit_repo_url")


@needs_gpg
def test_a_binary_key_is_refused_with_how_to_armor_it(keys):
    fpr, _, binary = keys["a"]
    with pytest.raises(HostStackError, match="ASCII-armored"):
        hoststack.verify_key(_repo(fpr), lambda url: binary, _show_keys, "cuda_toolkit_repo_url")


def test_an_unreachable_key_names_the_key_url_variable():
    def fetch(url):
        raise OSError("Connection refused")
    with pytest.raises(HostStackError, match="cannot be downloaded.*Connection refused.*container_toolkit_repo_key_url"):
        hoststack.verify_key(hoststack.container_toolkit_repo("Debian", "12", "x86_64"), fetch,
                             lambda d: "", "container_toolkit_repo_url")


def test_no_gpg_on_the_host_is_a_clear_refusal():
    with pytest.raises(HostStackError, match="gpg is not installed.*Nothing was changed"):
        hoststack.gpg_show_keys(lambda argv, data: (0, "", ""), None, b"")


# --- the modules against a signed copy of the lab's stand-in repository -----------------

@pytest.fixture(scope="module")
def signed_repo(keys, tmp_path_factory):
    """The lab's stand-in repositories on loopback, each with key "a" where NVIDIA keeps it."""
    subprocess.run(["bash", str(ROOT / "lab/apt/build.sh")], check=True)
    root = tmp_path_factory.mktemp("apt")
    shutil.copytree(ROOT / ".cache/lab/apt", root, dirs_exist_ok=True)
    (root / "cuda/debian12/x86_64/3bf863cc.pub").write_bytes(keys["a"][1])
    (root / "libnvidia-container/stable/deb/amd64/gpgkey").write_bytes(keys["a"][1])
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@needs_gpg
def test_repo_info_module_verifies_the_key(signed_repo, keys, monkeypatch):
    import nvidia_repo_info
    args = {"component": "container_toolkit", "distribution": "Debian", "distribution_version": "12",
            "architecture": "x86_64", "repo_url": f"{signed_repo}/libnvidia-container/stable/deb/amd64/",
            "key_fingerprint": keys["a"][0], "packages": ["nvidia-container-toolkit"],
            "setting": "container_toolkit_repo_url"}
    result, failed = run_module(nvidia_repo_info.main, args, monkeypatch, check_mode=True)
    assert not failed and result["changed"] is False
    assert result["repo"]["key_fingerprint"] == keys["a"][0]
    assert result["repo"]["key"].startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")

    result, failed = run_module(nvidia_repo_info.main, dict(args, key_fingerprint=keys["b"][0]), monkeypatch)
    assert failed and f"expected exactly {keys['b'][0]}" in result["msg"] and keys["a"][0] in result["msg"]
    assert "container_toolkit_repo_key_fingerprint" in result["msg"]

    # NVIDIA's fingerprint by default: the test key is not NVIDIA's
    result, failed = run_module(nvidia_repo_info.main, dict(args, key_fingerprint=""), monkeypatch)
    assert failed and "C95B321B61E88C1809C4F759DDCAE044F796ECB0" in result["msg"]

    result, failed = run_module(nvidia_repo_info.main, dict(args, trusted=True), monkeypatch)
    assert not failed and result["repo"]["key"] is None


@needs_gpg
def test_driver_plan_module_verifies_the_key(signed_repo, keys, monkeypatch):
    import nvidia_driver_plan
    args = {"branch": "580", "distribution": "Debian", "distribution_version": "12",
            "architecture": "x86_64", "repo_url": f"{signed_repo}/cuda/debian12/x86_64/",
            "key_fingerprint": keys["a"][0], "devices": ADA}
    result, failed = run_module(nvidia_driver_plan.main, args, monkeypatch)
    assert not failed and result["repo"]["key"].startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")

    result, failed = run_module(nvidia_driver_plan.main, dict(args, key_fingerprint=keys["b"][0]), monkeypatch)
    assert failed and "nvidia_driver_repo_key_fingerprint" in result["msg"] and keys["a"][0] in result["msg"]


@pytest.mark.parametrize("module_name, extra", [
    ("nvidia_repo_info", {"component": "cuda", "setting": "cuda_toolkit_repo_url"}),
    ("nvidia_driver_plan", {"branch": "580", "devices": ADA}),
])
def test_modules_refuse_an_injected_source_line(module_name, extra, monkeypatch):
    module = __import__(module_name)
    args = dict({"distribution": "Debian", "distribution_version": "12", "architecture": "x86_64",
                 "repo_url": "http://127.0.0.1:9/cuda/ /\ndeb [trusted=yes] http://evil.example/ /"}, **extra)
    result, failed = run_module(module.main, args, monkeypatch)
    setting = extra.get("setting", "nvidia_driver_repo_url")
    assert failed and result["msg"].startswith(f"{setting} ") and "not a usable repository URL" in result["msg"]
