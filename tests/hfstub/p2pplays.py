"""The three plays a p2p fetch through the role needs, written into a test's or a bench's
folder: the mirror publishes the folder and makes its torrent (hf_mirror_index, as
hf_site_mirror does), the GPU hosts fetch (the model_fetch role), then they stop their
seeders (its p2p_stop entry point). Used by tests/slow/test_p2p_model_fetch.py (hosts on
loopback, connection local) and tests/bench/bench_fanout.py --fleet-lab (the fleet lab's
hosts over SSH, as root: `become`, as playbooks/site.yml's Models play)."""


def p2p_plays(stop_hosts="{{ fetchers }}", become=False):
    """{file name: play text}: mirror.yml, fetch.yml, stop.yml."""
    root = "\n  become: true" if become else ""
    return {
        "mirror.yml": """
- name: Mirror | Publish the folder and make its torrent (as hf_site_mirror does)
  hosts: mirror
  gather_facts: false
  tasks:
    - name: Mirror | Publish
      gpufleet.fleet.hf_mirror_index:
        root: "{{ site }}"
        models: [{path: "{{ folder }}"}]
        torrents: "{{ torrents }}"
""",
        "fetch.yml": """
- name: Models | Fetch
  hosts: "{{ fetchers }}"
  gather_facts: false%s
  roles:
    - role: gpufleet.fleet.model_fetch
""" % root,
        "stop.yml": """
- name: Models | Stop the seeders
  hosts: "%s"
  gather_facts: false%s
  tasks:
    - name: Models | Stop
      ansible.builtin.include_role:
        name: gpufleet.fleet.model_fetch
        tasks_from: p2p_stop
""" % (stop_hosts, root),
    }
