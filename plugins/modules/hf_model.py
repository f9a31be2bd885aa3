#!/usr/bin/python
"""Ansible module hf_model: verified, resumable model fetch from a Hugging Face mirror."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_model
short_description: Fetch a Hugging Face model repo with every byte verified against the hub's hashes
description:
  - Resolves O(revision) to a commit, lists the repo's files with their hashes from the hub
    API (C(/api/models/REPO/tree/COMMIT?recursive=true), paginated), and downloads the
    missing ones in parallel from C(ENDPOINT/REPO/resolve/COMMIT/PATH).
  - Every byte is hashed while it streams in (sha256 for LFS files, git blob sha1 for the
    others); a file gets its final name only after its hash matched the listing.
  - Partial files are kept in C(DEST/.gpufleet/incomplete/) and resumed with HTTP Range
    on the next attempt or run. Mirrors that ignore Range restart that file; LFS
    redirects are followed.
  - A file that fails verification is moved to C(DEST/.gpufleet/quarantine/) and fetched
    once more; if it fails again the task fails naming the file and both hashes.
  - When the revision moved to a new commit, files the manifest verified at the old one
    are removed and fetched again (not hashed nor quarantined); unchanged files are kept.
  - Retries with backoff on 5xx, 429 (honouring Retry-After), dropped and stalled
    connections.
  - Refuses to start, before writing anything, when O(dest) lacks the space the listing
    needs plus a margin (1% + 64 MiB), or the inodes for its files and folders.
  - Bounded against a hostile mirror (O(max_api_bytes), O(max_listing_entries),
    O(min_rate), O(max_file_attempts), O(max_total_retries), O(deadline)); refuses
    revisions and listed names with quotes, backslashes, whitespace, control characters,
    absolute paths or C(..), and never writes through a symbolic link inside O(dest)
    (one at a file's final name is moved to quarantine and replaced).
  - With O(lock), the commit and every file's sha256 are checked against the model's lock
    written on the control node, not only against the listing the endpoint serves.
  - O(dest) is a symbolic link to C(ROOT/.gpufleet-revisions/NAME/COMMIT/), one folder per
    commit. A new commit is fetched into its own folder, seeded with hard links of the
    files whose hash the listing keeps from the served commit (only changed bytes are
    fetched), and O(dest) is switched to it (a new link renamed over it) only once every
    file verified; a failed or cut fetch leaves O(dest) and the served folder untouched,
    and the next run resumes it. A folder O(dest) of the layout before (with the
    manifest of a commit) is moved into its commit folder first.
  - O(revision) given as a commit whose folder is complete (verified manifest, files
    unchanged) re-points O(dest) without asking the mirror (a rollback works with the
    mirror down). With O(verify=full) the mirror is asked as for any fetch.
  - Refuses a O(dest) that is a symbolic link it did not make, and links where the
    revision folders are.
  - Writes C(DEST/.gpufleet/manifest.json) (commit, files, sizes, hashes, mtimes,
    verification time; never the token) and, while it runs,
    C(ROOT/.gpufleet-revisions/NAME/progress.json) (files and bytes done) for callers
    polling an async task.
options:
  repo_id:
    description: Repo id on the hub, C(org/name).
    type: str
    required: true
  revision:
    description: Branch, tag or commit sha. The resolved commit sha is returned and recorded.
    type: str
    default: main
  dest:
    description: Folder that receives the files (created if missing).
    type: path
    required: true
  endpoint:
    description:
      - Base URL of the hub or mirror.
      - Defaults to the E(HF_ENDPOINT) environment variable of the target, else
        U(https://huggingface.co).
    type: str
  ca_file:
    description:
      - CA certificate (PEM) on the target that an C(https) O(endpoint)'s certificate (and
        that of any host it redirects to) must chain to, e.g. the fleet CA's for a site mirror
        that serves TLS (hf_site_mirror_tls). Empty means the system's trust store (or
        E(REQUESTS_CA_BUNDLE)); given, it is used for every request whatever the environment.
      - Certificates are always verified; there is no option to turn that off.
    type: path
    default: ""
  token:
    description:
      - Hub access token (Bearer). Defaults to E(HF_TOKEN) of the target. Never logged nor
        written to the manifest, and sent only to the O(endpoint)'s scheme, host and port
        (not to a CDN it redirects to, nor to a listing page on another origin).
      - Give it from a vault (O(token) set to C({{ vault_hf_token }})), or leave it unset and
        have E(HF_TOKEN) in the target's environment. Never write the token itself on an
        ad-hoc command line (C(ansible ... -m hf_model -a 'token=hf_...')), as ansible-core
        prints those arguments in the task banner and the shell keeps them in its history.
    type: str
  allow_patterns:
    description: Only files matching one of these fnmatch patterns (C(dir/) means C(dir/*)).
    type: list
    elements: str
  ignore_patterns:
    description: Skip files matching one of these fnmatch patterns.
    type: list
    elements: str
  max_workers:
    description:
      - Files downloaded or hashed in parallel.
      - From 1 to 256.
    type: int
    default: 8
  verify:
    description:
      - C(full) re-hashes every file already in O(dest).
      - C(manifest) trusts a file recorded in the verified manifest when its hash equals the
        listing and its size and mtime are unchanged (a re-run costs seconds); other files
        are hashed.
    type: str
    choices: [full, manifest]
    default: manifest
  timeout:
    description:
      - Seconds to wait to connect and between bytes before a connection counts as stalled.
      - Above 0 and at most 3600 (an hour).
    type: float
    default: 30
  retries:
    description:
      - Failed attempts per request before giving up. An attempt that brought new bytes
        (beyond the most that file ever had) resets the count of a file.
      - From 0 to 100.
    type: int
    default: 5
  max_file_attempts:
    description:
      - Requests for one file's bytes in a run (first try, resumes and retries) before
        that file fails; bounds a mirror that keeps serving a file short.
      - From 1 to 10000.
    type: int
    default: 20
  max_total_retries:
    description:
      - Failed requests retried across the whole fetch before it stops.
      - From 0 to 100000.
    type: int
    default: 100
  deadline:
    description:
      - Seconds the whole fetch may take; past it the fetch stops, keeping partial files
        for the next run. C(0) means no limit.
      - From 0 to 31622400 (a year).
    type: float
    default: 86400
  min_rate:
    description:
      - Bytes per second a download must average over O(timeout) seconds; a slower one is
        cut and retried (its bytes are kept but do not count as progress). C(0) means no floor.
      - From 0 to 2**40 (1 TiB/s).
    type: int
    default: 1024
  max_api_bytes:
    description:
      - Largest API answer (repo info or one page of the listing, after decompression)
        read from the mirror; reading stops there and the fetch fails naming this option.
      - From 1 to 2**40 (1 TiB).
    type: int
    default: 67108864
  lock:
    description:
      - The model's lock (C(plugins/module_utils/gpufleet/model_lock.py)), a dict
        with C(repo_id), C(commit) (40 hex digits) and C(files) (each path to its sha256),
        written once on the control node from a source you trust (M(gpufleet.fleet.hf_model_lock),
        C(playbooks/model_lock.yml)); or the path of such a YAML (or JSON) file on the target.
      - With a lock, O(revision) must resolve to the lock's commit, the files selected by
        O(allow_patterns) and O(ignore_patterns) must be the lock's (none more, none fewer)
        and the listing's sha256 of each LFS file the lock's, all checked before anything is
        written; the bytes of every other file must hash to the lock's sha256 before the
        file gets its final name (it goes to quarantine otherwise) and before the manifest
        says complete. So neither a mirror serving a listing that matches its own other
        bytes nor a swapped local file gets past it.
    type: raw
  max_listing_entries:
    description:
      - Most entries (files and folders) a repo listing may have; a longer one fails the
        fetch before anything is written.
      - From 1 to 100000000.
    type: int
    default: 10000
  revisions_keep:
    description:
      - Commit folders kept in C(ROOT/.gpufleet-revisions/NAME/) (ROOT and NAME are the parent
        and last component of O(dest)); older ones are removed after a new commit is
        switched to. The served commit, the one served before it (the last good one a
        rollback goes back to), commits a running container mounts (read from
        C(/proc/*/mountinfo)), O(revisions_pinned) and a folder another fetch is writing
        are never removed.
      - From 2 to 100.
    type: int
    default: 2
  revisions_pinned:
    description: Commits (40 hex digits) whose folders are never removed, for instance
      those the last-good record names.
    type: list
    elements: str
    default: []
  transport:
    description:
      - How the missing bytes come. C(http) from O(endpoint) (the mirror); C(p2p) over
        BitTorrent (libtorrent, Debian C(python3-libtorrent) on the host) from the fleet's
        other hosts, with the mirror as web seed, using the torrent the site mirror made
        (O(p2p_torrent)). Either way the listing comes from O(endpoint) and every file is
        checked with the same rule (sha256 / git blob sha1, the lock's sha256) before it
        gets its final name; see docs/model-fetch.md, "Peer-to-peer fan-out".
    type: str
    choices: [http, p2p]
    default: http
  p2p_torrent:
    description: Path on the host of the torrent the site mirror made (its root is
      the commit; refused when it differs from the listing).
    type: path
  p2p_infohash:
    description: The torrent's v1 infohash, as the control node computed it; another
      torrent is refused.
    type: str
  p2p_listen:
    description: The host's fleet address (an IP address) to listen and connect from.
    type: str
  p2p_port:
    description: The TCP port the model's swarm listens on (the same on every host).
    type: int
    default: 6881
  p2p_peers:
    description: The fleet hosts' IP addresses (this host's own is left out).
    type: list
    elements: str
    default: []
  p2p_web_seed:
    description: Use O(endpoint) as the web seed (BEP 19; it must honour Range).
    type: bool
    default: true
  p2p_web_seed_delay:
    description:
      - The web-seed policy (model_fetch's C(model_fetch_p2p_web_seed_hosts)). C(0) uses
        the web seed from the start; a number of seconds starts with peers only and adds
        the web seed once no peer has delivered a block for that long (from the start,
        then from each peer block), so the mirror sends about one copy whatever the
        fleet's size, and a fleet of one, or one whose peers are down, still completes.
    type: float
    default: 0
  p2p_mirror_address:
    description: The web seed's IP address, when O(endpoint) names the mirror by name.
    type: str
  p2p_upload_rate:
    description: Bytes per second this host sends to peers at most (C(0) no cap).
    type: int
    default: 0
  p2p_download_rate:
    description: Bytes per second this host receives at most (C(0) no cap).
    type: int
    default: 0
  p2p_timeout:
    description: Seconds the swarm may take to bring the files; what is not complete
      then fails the task (the next run resumes it).
    type: float
    default: 3600
  p2p_seed:
    description:
      - After the files are verified, C(until_rollout_end) and C(forever) leave a
        detached seeder (state in C(ROOT/.gpufleet-revisions/NAME/p2p-seeder.json));
        C(never) seeds nothing. A seeder already seeding this commit is left as is;
        one of another commit is stopped first.
    type: str
    choices: [until_rollout_end, forever, never]
    default: until_rollout_end
  p2p_seed_max:
    description: Seconds an C(until_rollout_end) seeder seeds at most, should the
      stop never come.
    type: float
    default: 86400
  p2p_stop:
    description: Stop the model's seeder (its stop file, then wait for it to end);
      nothing is fetched.
    type: bool
    default: false
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Lists the files and reports which would be downloaded or hashed (with
      O(transport=p2p), from which peers and web seed); writes nothing, starts nothing.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: partial
    details: The commit O(dest) points at, before and after (not the files).
requirements:
  - requests (the Python library, on the host the module runs on; Debian/Ubuntu
    python3-requests, which the model_fetch role installs)
  - PyYAML (optional; without it a lock file given as a path must be JSON)
author:
  - gpufleet maintainers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Fetch Qwen through the company mirror, verified
  gpufleet.fleet.hf_model:
    repo_id: Qwen/Qwen2.5-7B-Instruct
    revision: main
    dest: /srv/models/Qwen2.5-7B-Instruct
    endpoint: https://hf-mirror.example.com
    token: "{{ vault_hf_token }}"
    ignore_patterns: ["*.pth", "original/"]
    max_workers: 8
  async: 86400
  poll: 30

- name: Fetch through a mirror, pinned to the lock written on the control node
  gpufleet.fleet.hf_model:
    repo_id: Qwen/Qwen2.5-7B-Instruct
    revision: a09a35458c702b33eeacc393d103063234e8bc28
    dest: /srv/models/Qwen2.5-7B-Instruct
    endpoint: https://hf-mirror.example.com
    lock: "{{ lookup('ansible.builtin.file', qwen_lock) | from_yaml }}"
  vars:
    qwen_lock: "{{ inventory_dir }}/locks/Qwen2.5-7B-Instruct.lock.yml"

- name: Re-check everything byte by byte
  gpufleet.fleet.hf_model:
    repo_id: Qwen/Qwen2.5-7B-Instruct
    dest: /srv/models/Qwen2.5-7B-Instruct
    verify: full
"""

RETURN = r"""
changed:
  description: True when a file was downloaded or replaced, or the manifest changed.
  returned: always
  type: bool
locked:
  description: Whether a lock pinned this fetch (O(lock)).
  returned: success
  type: bool
commit:
  description: The commit sha the revision resolved to.
  returned: success
  type: str
  sample: 0f3f8b2ac1d5e6b7a8c9d0e1f2a3b4c5d6e7f809
files:
  description: >-
    The listed files: path, size, algorithm (sha256 or sha1), digest and status
    (downloaded, verified, trusted; in check mode would_download, would_verify, trusted).
  returned: success
  type: list
  elements: dict
bytes_downloaded:
  description: Bytes received from the mirror in this run.
  returned: success
  type: int
bytes_verified:
  description: Bytes hashed in this run (downloaded, resumed or already on disk).
  returned: success
  type: int
bytes_to_download:
  description: Bytes missing before this run (what check mode would fetch).
  returned: success
  type: int
quarantined:
  description: Files whose bytes failed verification, with expected and received hashes.
  returned: success
  type: list
  elements: dict
removed:
  description: >-
    Files a previous run verified that the repo no longer has at this commit, removed
    (in check mode, that would be removed). Files hf_model did not verify are never removed.
  returned: success
  type: list
  elements: str
manifest:
  description: Path of the manifest written in the commit folder.
  returned: success
  type: str
path:
  description: The commit folder O(dest) points at (in check mode, would point at).
  returned: success
  type: str
  sample: /srv/models/.gpufleet-revisions/Qwen2.5-7B-Instruct/0f3f8b2ac1d5e6b7a8c9d0e1f2a3b4c5d6e7f809
previous:
  description: The commit O(dest) pointed at before this run (null when none).
  returned: success
  type: str
switched:
  description: Whether O(dest) was re-pointed to another commit folder.
  returned: success
  type: bool
migrated:
  description: The commit of a plain folder O(dest) moved into its commit folder (null when none).
  returned: success
  type: str
linked:
  description: Files hard-linked from the served commit's folder instead of fetched (in
    check mode, that would be).
  returned: success
  type: list
  elements: str
offline:
  description: Whether O(dest) was re-pointed to a complete commit folder without a request
    to the mirror.
  returned: success
  type: bool
offline_refused:
  description:
    - Why the complete folder of the asked commit was not re-pointed to offline, because
      today's O(allow_patterns) and O(ignore_patterns) select a file of that commit the
      folder lacks, or the folder keeps no file list to check them against.
    - The commit was then fetched from the mirror. Without the mirror the fetch fails
      with this text.
  returned: when the folder was refused
  type: str
p2p:
  description:
    - With O(transport=p2p) bytes_from_peers, bytes_from_web_seed, banned_peers (the
      addresses of peers that sent bad pieces, dropped), blocked_peers (addresses outside
      the fleet that knocked), hash_failures, web_seed_down, web_seed_delay (the policy
      applied, null without a web seed), web_seed_after (seconds into the run when the
      web seed was added, null when it never was), seeding (the seeder left
      running, or null); in check mode would_fetch_bytes, from_peers, web_seed,
      would_seed. With O(p2p_stop), stopped (the seeder's state, or null).
  returned: with transport p2p
  type: dict
pruned:
  description: Commits whose folders were removed beyond O(revisions_keep) (in check mode,
    would be).
  returned: success
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import options
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import hub_client
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import model_lock
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import p2p
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import p2p_plan
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import p2p_seeder
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import p2p_swarm
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import revisions
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet import tls
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.hub import HubError
from ansible_collections.gpufleet.fleet.plugins.module_utils.gpufleet.hub_client import PUBLIC_ENDPOINT, HubClient


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo_id=dict(type="str", required=True),
            revision=dict(type="str", default="main"),
            dest=dict(type="path", required=True),
            endpoint=dict(type="str"),
            ca_file=dict(type="path", default=""),
            token=dict(type="str", no_log=True),
            allow_patterns=dict(type="list", elements="str"),
            ignore_patterns=dict(type="list", elements="str"),
            max_workers=dict(type="int", default=8),
            verify=dict(type="str", choices=["full", "manifest"], default="manifest"),
            timeout=dict(type="float", default=30),
            retries=dict(type="int", default=5),
            max_file_attempts=dict(type="int", default=hub_client.MAX_FILE_ATTEMPTS),
            max_total_retries=dict(type="int", default=hub_client.MAX_TOTAL_RETRIES),
            deadline=dict(type="float", default=hub_client.DEADLINE),
            min_rate=dict(type="int", default=hub_client.MIN_RATE),
            max_api_bytes=dict(type="int", default=hub_client.MAX_API_BYTES),
            max_listing_entries=dict(type="int", default=hub_client.MAX_LISTING_ENTRIES),
            lock=dict(type="raw"),
            revisions_keep=dict(type="int", default=revisions.KEEP_MIN),
            revisions_pinned=dict(type="list", elements="str", default=[]),
            transport=dict(type="str", choices=["http", "p2p"], default="http"),
            # the swarm (transport p2p): flat options, checked by options.check below
            p2p_torrent=dict(type="path"), p2p_infohash=dict(type="str"),
            p2p_listen=dict(type="str"), p2p_port=dict(type="int", default=p2p_swarm.DEFAULT_PORT),
            p2p_peers=dict(type="list", elements="str", default=[]),
            p2p_web_seed=dict(type="bool", default=True), p2p_mirror_address=dict(type="str"),
            p2p_web_seed_delay=dict(type="float", default=0),
            p2p_upload_rate=dict(type="int", default=0),
            p2p_download_rate=dict(type="int", default=0),
            p2p_timeout=dict(type="float", default=3600),
            p2p_seed=dict(type="str", choices=list(p2p_plan.SEED_POLICIES),
                               default="until_rollout_end"),
            p2p_seed_max=dict(type="float", default=86400),
            p2p_stop=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    try:  # ranges Ansible's types leave open (issue #32 item 9)
        options.check(module.params, module.argument_spec, {
            "max_workers": options.whole(1, 256),
            "timeout": options.number(above=0, high=options.HOUR, unit="seconds"),
            "retries": options.whole(0, 100),
            "max_file_attempts": options.whole(1, 10000),
            "max_total_retries": options.whole(0, 100000),
            "deadline": options.number(0, options.YEAR, unit="seconds"),
            "min_rate": options.whole(0, 2 ** 40, "bytes per second"),
            "max_api_bytes": options.whole(1, 2 ** 40, "bytes"),
            "max_listing_entries": options.whole(1, 10 ** 8),
            "revisions_keep": options.whole(revisions.KEEP_MIN, revisions.KEEP_MAX),
            "p2p_port": p2p_plan.port_option,
            "p2p_upload_rate": options.whole(0, p2p_plan.MAX_RATE, "bytes per second"),
            "p2p_download_rate": options.whole(0, p2p_plan.MAX_RATE, "bytes per second"),
            "p2p_timeout": options.number(above=0, high=options.YEAR, unit="seconds"),
            "p2p_web_seed_delay": options.number(0, 86400, unit="seconds"),
            "p2p_seed_max": options.number(above=0, high=options.YEAR, unit="seconds"),
        })
    except options.OptionError as exc:
        module.fail_json(msg=str(exc))
    p = module.params
    lock = None
    if p["lock"] is not None:  # read and checked before any request or write
        try:
            lock = (model_lock.load_lock_file(p["lock"]) if isinstance(p["lock"], str)
                    else model_lock.parse_lock(p["lock"]))
            model_lock.check_commit(lock, p["repo_id"], lock.commit)
        except model_lock.LockError as exc:
            module.fail_json(msg=f"lock: {exc} Nothing was fetched.")
    token = p["token"] or os.environ.get("HF_TOKEN") or None
    if token:
        module.no_log_values.add(token)
    endpoint = p["endpoint"] or os.environ.get("HF_ENDPOINT") or PUBLIC_ENDPOINT
    job = runner = None
    if p["transport"] == "p2p":
        opts = {k[len("p2p_"):]: v for k, v in p.items() if k.startswith("p2p_")}
        try:
            store = revisions.Layout(p["dest"]).store
        except HubError as exc:
            module.fail_json(msg=str(exc))
        if opts.get("stop"):
            _stop(module, store)
        try:
            job = p2p_plan.peer_job(opts, p["repo_id"], endpoint)
            if not module.check_mode and not job["torrent"]:
                raise p2p.P2PError("p2p_torrent is required to fetch (the site mirror's "
                                   "torrent of the model, copied to the host).")
        except (p2p.P2PError, HubError) as exc:
            module.fail_json(msg=f"p2p: {exc} Nothing was fetched.")
        runner = None if module.check_mode else p2p.Runner(job, p["repo_id"])
    try:
        session = None
        if p["ca_file"]:  # gpufleet.tls.client_session: the one rule of a verifying client
            try:
                import requests
            except ImportError:
                module.fail_json(msg="ca_file needs the Python library requests on this host "
                                     "(Debian: python3-requests). Nothing was fetched.")
            try:
                session = tls.client_session(requests.Session(), p["ca_file"])
            except tls.TLSError as exc:
                module.fail_json(msg=f"{exc}. Nothing was fetched.")
        client = HubClient(endpoint, token=token, timeout=p["timeout"], retries=p["retries"],
                           session=session,
                           max_file_attempts=p["max_file_attempts"],
                           max_total_retries=p["max_total_retries"], deadline=p["deadline"],
                           min_rate=p["min_rate"], max_api_bytes=p["max_api_bytes"],
                           max_listing_entries=p["max_listing_entries"])
        result = revisions.sync_revision(
            client, p["repo_id"], p["revision"], p["dest"], keep=p["revisions_keep"],
            pinned=p["revisions_pinned"], allow_patterns=p["allow_patterns"],
            ignore_patterns=p["ignore_patterns"], verify=p["verify"],
            max_workers=p["max_workers"], check_mode=module.check_mode, lock=lock,
            **({"runner": runner} if runner else {}))
        if job is not None:
            result["p2p"], seeded = p2p_seeder.report(result, job, runner, store, p["p2p_seed"],
                                                      module.check_mode)
            result["changed"] = bool(result["changed"] or seeded)
    except HubError as exc:
        partial = getattr(exc, "result", {})
        if runner is not None and runner.result:  # the swarm's verdict: who sent bad pieces
            partial = dict(partial, p2p={"banned_peers": runner.result["banned_peers"],
                                         "bytes_by_source": runner.result["bytes_by_source"]})
        module.fail_json(msg=str(exc), **partial)
    except OSError as exc:  # dest cannot be made or read: a path, a permission, a full disk
        module.fail_json(msg=f"cannot fetch into dest {p['dest']}: {exc.strerror or exc}")
    if result.get("offline_refused"):
        module.warn(result["offline_refused"])
    if module._diff:  # pylint: disable=protected-access
        result["diff"] = revisions.diff(p["dest"], result)
    module.exit_json(**result)


def _stop(module, store):
    """p2p_stop: end the model's seeder; changed when one was running."""
    state = p2p_seeder.seeder_state(store)
    running = bool(state and state["running"])
    if module.check_mode:
        module.exit_json(changed=running, p2p={"stopped": state if running else None})
    try:
        stopped = p2p_seeder.stop_seeder(store)
    except (p2p.P2PError, OSError) as exc:
        module.fail_json(msg=f"p2p: {exc}")
    module.exit_json(changed=stopped is not None, p2p={"stopped": stopped})


if __name__ == "__main__":
    main()
