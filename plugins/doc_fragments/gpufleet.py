"""Documentation shared by gpufleet's modules (extends_documentation_fragment)."""


class ModuleDocFragment:
    """gpufleet.read_only: a module that only reads or computes.
    gpufleet.nvidia_repository: the options that locate NVIDIA's repository for a host
    (hoststack.REPOSITORY_ARGUMENT_SPEC).
    gpufleet.tls_client: the CA file a client of an https instance verifies with."""

    DOCUMENTATION = r"""
options: {}
"""

    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    support: full
    description: The module only reads or computes; it behaves the same in check mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to diff.
"""

    TLS_CLIENT = r"""
options:
  ca_file:
    description:
      - CA certificate (PEM) that an C(https) O(url)'s certificate must chain to, e.g. the
        fleet CA's (vllm_gateway_tls_ca_path). Empty means the system's trust store.
      - Certificates are always verified; there is no option to turn that off.
    type: path
    default: ""
"""

    NVIDIA_REPOSITORY = r"""
options:
  distribution:
    description: C(ansible_facts.distribution), for example C(Ubuntu).
    type: str
    required: true
  distribution_version:
    description: C(ansible_facts.distribution_version), for example C(24.04).
    type: str
    required: true
  architecture:
    description: C(ansible_facts.architecture), C(x86_64) or C(aarch64).
    type: str
    required: true
  repo_url:
    description:
      - Mirror of NVIDIA's repository for this distribution; empty uses NVIDIA's.
      - An http(s)://HOST/... or file:///PATH URL of URL characters only; whitespace,
        newlines, quotes, brackets, C(#) and C(?) are refused.
    type: str
    default: ""
  trusted:
    description: The repository is unsigned; its key is neither downloaded nor checked.
    type: bool
    default: false
  key_url:
    description:
      - Where the signing key is; empty uses the repository's own copy
        (C(3bf863cc.pub), RHEL C(D42D0685.pub), container toolkit C(gpgkey)).
    type: str
    default: ""
  key_fingerprint:
    description:
      - Fingerprint (40 hex digits) the signing key must have; empty uses NVIDIA's
        published one (C(hoststack.NVIDIA_KEY_FINGERPRINTS)). Set it for a mirror signed
        with its own key.
    type: str
    default: ""
  timeout:
    description:
      - Seconds one download from the repository (the C(Packages) index or
        C(repomd.xml), the signing key) may take in all - connecting, waiting and
        reading, however slowly the server sends. A file is read up to 64 MiB
        (C(hoststack.REPOSITORY_MAX_BYTES)).
      - From 1 to 3600 (an hour).
    type: int
    default: 15
"""
