"""nvidia_driver role end to end on a real Debian 12 container (slow: docker + lab mirror).

The mirror is the lab's apt repository of STAND-IN NVIDIA packages (lab/apt/, served on
127.0.0.1:8081 by lab/apt/serve.sh): NVIDIA's package names, versions and dependency
structure, with an nvidia-smi that prints a real captured `nvidia-smi -q -x` reporting
the installed driver's version. Shows:
- bad input (unknown branch, branch that dropped the GPU, unreachable mirror, Secure
  Boot without a key) fails with a message saying what to do, and changes nothing;
- the four-step pattern: check mode predicts the change and changes nothing, apply,
  re-apply reports nothing changed, check mode reports nothing to change;
- the branch moves 535 -> 580 only through the variable (version and holds change);
- without changing the variables the driver is never upgraded although the repository
  has a newer 580 release; changing nvidia_driver_version upgrades it.
"""
import shutil

import pytest

from conftest import FIXTURES
from helpers import debian_systemd_host, run_playbook, sh

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("docker") is None, reason="docker CLI not installed"),
]

MIRROR = "http://127.0.0.1:8081/cuda/debian12/x86_64/"
LAB_VARS = {
    "nvidia_driver_repo_url": MIRROR,
    "nvidia_driver_repo_trusted": True,
    "nvidia_driver_kernel_module_check": False,
    "nvidia_driver_nvidia_smi_xml": "/etc/gpufleet-lab/nvidia-smi.xml",
}
PLAYBOOK = """
- name: Drive the nvidia_driver role
  hosts: all
  gather_facts: true
  roles:
    - role: gpufleet.fleet.nvidia_driver
"""
# A stand-in mokutil for the Secure Boot case (the container has no EFI): it prints what
# the real `mokutil --sb-state` prints on a machine with Secure Boot enabled.
MOKUTIL_SB_ON = "#!/bin/sh\n# test stand-in for mokutil\necho 'SecureBoot enabled'\n"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    for found in debian_systemd_host(tmp_path_factory, "hoststack-driver", PLAYBOOK):
        name = found["name"]
        sh("docker", "exec", name, "mkdir", "-p", "/etc/gpufleet-lab")
        # Real captures (tests/fixtures/nvidia-smi/SOURCES.md): RTX 4090 (Ada, 8.9) is the
        # host's GPU; Tesla P100 (Pascal, 6.0) is used for the dropped-GPU case.
        sh("docker", "cp", str(FIXTURES / "nvidia-smi/netdata-rtx-4090-driver-535.xml"),
           f"{name}:/etc/gpufleet-lab/nvidia-smi.xml")
        sh("docker", "cp", str(FIXTURES / "nvidia-smi/netdata-tesla-p100.xml"),
           f"{name}:/etc/gpufleet-lab/p100.xml")
        yield found


def play(host, check=False, **extra):
    """Run the role; return (rc, changed task count, messages of failed tasks)."""
    rc, changed, failures, _ = run_playbook(host["work"] / "inventory.ini", host["work"] / "site.yml",
                                            host["name"], {**LAB_VARS, **extra}, check, timeout=600)
    return rc, changed, " ".join(failures)


def state(host):
    """What a failed run must not touch: installed packages, holds, repository files."""
    out = sh("docker", "exec", host["name"], "sh", "-c",
             "dpkg-query -W -f='${Package} ${Version}\\n' 'nvidia-*' 'cuda-drivers-*' 2>/dev/null;"
             " echo HOLDS; apt-mark showhold; echo FILES;"
             " ls /etc/apt/sources.list.d /etc/apt/preferences.d /etc/modprobe.d 2>/dev/null", check=False)
    return out.stdout


def installed(host):
    lines = sh("docker", "exec", host["name"], "dpkg-query", "-W", "-f=${Package} ${Version}\\n",
               "nvidia-*", "cuda-drivers-*", check=False).stdout.splitlines()
    return dict(line.split(" ", 1) for line in lines if line.strip())


def holds(host):
    return set(sh("docker", "exec", host["name"], "apt-mark", "showhold").stdout.split())


def reported_driver(host):
    xml = sh("docker", "exec", host["name"], "nvidia-smi", "-q", "-x").stdout
    return xml.split("<driver_version>")[1].split("<")[0]


@pytest.mark.parametrize("extra, expected", [
    ({"nvidia_driver_branch": "581"}, "is not a known NVIDIA driver branch"),
    ({"nvidia_driver_branch": "590", "nvidia_driver_nvidia_smi_xml": "/etc/gpufleet-lab/p100.xml"},
     "no longer supports the GPU(s) with compute capability 6.0"),
    ({"nvidia_driver_repo_url": "http://127.0.0.1:9/cuda/debian12/x86_64/"},
     "cannot be read"),
    ({"nvidia_driver_version": "580.1.2"}, "driver 580.1.2 is not in the repository"),
    ({"__secure_boot": True}, "Secure Boot is enabled"),
])
def test_bad_input_fails_before_any_change(host, extra, expected):
    secure_boot = extra.pop("__secure_boot", False)
    if secure_boot:
        sh("docker", "exec", host["name"], "sh", "-c",
           f"printf %s \"{MOKUTIL_SB_ON}\" > /usr/local/bin/mokutil && chmod +x /usr/local/bin/mokutil")
    before = state(host)
    try:
        rc, _, message = play(host, **extra)
    finally:
        sh("docker", "exec", host["name"], "rm", "-f", "/usr/local/bin/mokutil")
    assert rc != 0
    assert expected in message, message
    assert "set nvidia_driver_" in message.lower(), message  # says which variable to fix
    assert state(host) == before


def test_four_steps_then_branch_upgrade_only_through_variables(host):
    assert installed(host) == {}
    branch535 = {"nvidia_driver_branch": "535"}

    # 1. check mode predicts a change and changes nothing
    rc, changed, msg = play(host, check=True, **branch535)
    assert rc == 0, msg
    assert changed > 0
    assert installed(host) == {}
    # 2. apply
    rc, changed, msg = play(host, **branch535)
    assert rc == 0, msg
    assert changed > 0
    assert installed(host)["nvidia-open-535"] == "535.129.03-1"
    assert reported_driver(host) == "535.129.03"
    assert {"nvidia-open-535", "nvidia-driver", "nvidia-kernel-open-dkms"} <= holds(host)
    # 3. re-apply: nothing changed
    rc, changed, msg = play(host, **branch535)
    assert (rc, changed) == (0, 0), msg
    # 4. check mode: nothing to change
    rc, changed, msg = play(host, check=True, **branch535)
    assert (rc, changed) == (0, 0), msg

    # The branch moves only when the variable says so: 535 -> 580 (pinned release).
    rc, changed, msg = play(host, nvidia_driver_branch="580", nvidia_driver_version="580.65.06")
    assert rc == 0, msg
    assert changed > 0
    pkgs = installed(host)
    assert pkgs["nvidia-open-580"] == "580.65.06-1"
    assert pkgs["nvidia-driver"] == "580.65.06-1"
    assert "nvidia-open-535" not in pkgs
    assert "nvidia-open-580" in holds(host) and "nvidia-open-535" not in holds(host)
    assert reported_driver(host) == "580.65.06"

    # Defaults (no version): the repository has 580.95.05, but nothing moves.
    rc, changed, msg = play(host, nvidia_driver_branch="580")
    assert (rc, changed) == (0, 0), msg
    assert installed(host)["nvidia-driver"] == "580.65.06-1"
    # apt itself will not upgrade it either (held and pinned).
    simulate = sh("docker", "exec", host["name"], "apt-get", "--simulate", "upgrade").stdout
    assert "Inst nvidia" not in simulate

    # Explicit upgrade through the variable.
    rc, changed, msg = play(host, nvidia_driver_branch="580", nvidia_driver_upgrade=True)
    assert rc == 0, msg
    assert changed > 0
    assert installed(host)["nvidia-driver"] == "580.95.05-1"
    assert reported_driver(host) == "580.95.05"
    assert {"nvidia-open-580", "nvidia-driver", "nvidia-driver-cuda"} <= holds(host)


# mokutil stand-in for a machine with Secure Boot on and the MOK already enrolled
# (real messages: "SecureBoot enabled", "<cert> is already enrolled").
MOKUTIL_ENROLLED = """#!/bin/sh
# test stand-in for mokutil
case "$1" in
  --sb-state) echo 'SecureBoot enabled' ;;
  --test-key) echo "$2 is already enrolled" ;;
esac
"""


def test_secure_boot_with_an_enrolled_key_signs_through_dkms(host):
    sh("docker", "exec", host["name"], "sh", "-c",
       f"cat > /usr/local/bin/mokutil <<'EOS'\n{MOKUTIL_ENROLLED}EOS\nchmod +x /usr/local/bin/mokutil;"
       " mkdir -p /var/lib/dkms && echo key > /var/lib/dkms/mok.key && echo cert > /var/lib/dkms/mok.der")
    try:
        rc, changed, msg = play(host, nvidia_driver_branch="580",
                                nvidia_driver_mok_key="/var/lib/dkms/mok.key",
                                nvidia_driver_mok_cert="/var/lib/dkms/mok.der")
        assert rc == 0, msg
        assert changed == 2  # only the DKMS signing configuration (directory, file) is new
        conf = sh("docker", "exec", host["name"], "cat", "/etc/dkms/framework.conf.d/gpufleet-mok.conf").stdout
        assert 'mok_signing_key="/var/lib/dkms/mok.key"' in conf
        assert 'mok_certificate="/var/lib/dkms/mok.der"' in conf
        # a certificate that is not enrolled stops the role
        sh("docker", "exec", host["name"], "sh", "-c",
           "sed -i 's/is already enrolled/is not enrolled/' /usr/local/bin/mokutil")
        rc, _, msg = play(host, nvidia_driver_branch="580", nvidia_driver_mok_key="/var/lib/dkms/mok.key",
                          nvidia_driver_mok_cert="/var/lib/dkms/mok.der")
        assert rc != 0 and "enrolled" in msg
    finally:
        sh("docker", "exec", host["name"], "rm", "-f", "/usr/local/bin/mokutil")
