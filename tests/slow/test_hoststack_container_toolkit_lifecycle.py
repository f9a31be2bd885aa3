"""container_toolkit role end to end on a Debian 12 container WITHOUT Docker (slow).

The Molecule scenario covers a host with the user's Docker and daemon.json; this covers
the other path: Docker absent, installed by the role from Debian's mirror, and a
daemon.json the role creates. The toolkit packages come from the lab's STAND-IN
libnvidia-container repository (lab/apt/, 127.0.0.1:8081). Shows bad input failing
before any change, then the four steps: check mode predicts, apply, re-apply with
nothing changed, check mode with nothing to change. The inner dockerd is kept off the
machine's network ("bridge": "none", iptables off, and a network namespace of its own:
molecule/shared/docker-private-network.yml) because the container shares it.
"""
import json
import shutil

import pytest

from conftest import ROOT
from helpers import debian_systemd_host, run_playbook, sh

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("docker") is None, reason="docker CLI not installed"),
]

LAB_VARS = {
    "container_toolkit_repo_url": "http://127.0.0.1:8081/libnvidia-container/stable/deb/amd64/",
    "container_toolkit_repo_trusted": True,
    "container_toolkit_verify": False,
    # no driver on this host: nvidia-ctk cdi generate needs one (covered in Molecule)
    "container_toolkit_cdi": False,
}
PLAYBOOK = """
- name: Drive the container_toolkit role
  hosts: all
  gather_facts: true
  pre_tasks:
    - name: Keep the inner dockerd off the shared network
      ansible.builtin.copy:
        content: '{"bridge": "none", "iptables": false, "ip6tables": false}'
        dest: /etc/docker/daemon.json
        mode: "0644"
        force: false
      when: keep_network | default(true)
    - name: Give the inner dockerd a network namespace of its own (the machine's docker0 stays)
      ansible.builtin.include_tasks: """ + str(ROOT / "molecule/shared/docker-private-network.yml") + """
  roles:
    - role: gpufleet.fleet.container_toolkit
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    # NET_ADMIN and tmpfs for the Docker Engine the role installs inside
    for found in debian_systemd_host(
            tmp_path_factory, "hoststack-ctk", PLAYBOOK,
            ("--cap-add", "NET_ADMIN", "--tmpfs", "/var/lib/docker:exec",
             "--tmpfs", "/var/lib/containerd:exec")):
        sh("docker", "exec", found["name"], "mkdir", "-p", "/etc/docker")
        yield found


def play(host, check=False, **extra):
    """Run the role; return (rc, changed task count, messages of failed tasks)."""
    rc, count, failures, changed = run_playbook(host["work"] / "inventory.ini", host["work"] / "site.yml",
                                                host["name"], {**LAB_VARS, **extra}, check)
    return rc, count, " ".join(failures) + (f" (changed: {changed})" if changed else "")


def docker_in(host, *args):
    return sh("docker", "exec", host["name"], *args, check=False)


def test_bad_input_changes_nothing(host):
    rc, _, msg = play(host, container_toolkit_docker_install=False)
    assert rc != 0 and "Docker Engine is not installed" in msg and "container_toolkit_docker_install" in msg
    rc, _, msg = play(host, container_toolkit_repo_url="http://127.0.0.1:9/nothing/")
    assert rc != 0 and "cannot be read" in msg and "container_toolkit_repo_url" in msg
    rc, _, msg = play(host, container_toolkit_version="1.0.0-1")
    assert rc != 0 and "1.17.8-1, 1.18.0-1" in msg
    docker_in(host, "sh", "-c", "echo 'bridge: none' > /etc/docker/daemon.json")
    rc, _, msg = play(host)
    assert rc != 0 and "is not a JSON object" in msg
    assert docker_in(host, "cat", "/etc/docker/daemon.json").stdout == "bridge: none\n"
    docker_in(host, "rm", "/etc/docker/daemon.json")
    assert docker_in(host, "test", "-e", "/usr/bin/dockerd").returncode != 0
    for name in ("nvidia-container-toolkit.sources", "nvidia-container-toolkit.list"):
        assert docker_in(host, "test", "-e", f"/etc/apt/sources.list.d/{name}").returncode != 0


def test_four_steps_installing_docker(host):
    rc, changed, msg = play(host, check=True)
    assert rc == 0, msg
    assert changed > 0
    assert docker_in(host, "test", "-e", "/usr/bin/dockerd").returncode != 0  # nothing installed

    rc, changed, msg = play(host)
    assert rc == 0, msg
    assert changed > 0
    runtimes = json.loads(docker_in(host, "docker", "info", "--format", "{{json .Runtimes}}").stdout)
    assert "nvidia" in runtimes
    cfg = json.loads(docker_in(host, "cat", "/etc/docker/daemon.json").stdout)
    assert cfg["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert cfg["bridge"] == "none"
    holds = set(docker_in(host, "apt-mark", "showhold").stdout.split())
    assert {"nvidia-container-toolkit", "nvidia-container-toolkit-base"} <= holds
    version = docker_in(host, "dpkg-query", "-W", "-f=${Version}", "nvidia-container-toolkit").stdout
    assert version == "1.18.0-1"  # newest on first install

    rc, changed, msg = play(host)
    assert (rc, changed) == (0, 0), msg
    rc, changed, msg = play(host, check=True)
    assert (rc, changed) == (0, 0), msg

    # Only the variable moves the version (here down to 1.17.8-1), and the holds stay.
    rc, changed, msg = play(host, container_toolkit_version="1.17.8-1")
    assert rc == 0 and changed > 0, msg
    version = docker_in(host, "dpkg-query", "-W", "-f=${Version}", "nvidia-container-toolkit-base").stdout
    assert version == "1.17.8-1"
    assert "nvidia-container-toolkit" in docker_in(host, "apt-mark", "showhold").stdout.split()
