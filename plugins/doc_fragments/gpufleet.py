"""Documentation shared by gpufleet's modules (extends_documentation_fragment)."""


class ModuleDocFragment:
    """gpufleet.read_only: a module that only reads or computes.
    gpufleet.nvidia_repository: the options that locate NVIDIA's repository for a host
    (hoststack.REPOSITORY_ARGUMENT_SPEC)."""

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
    description: Mirror of NVIDIA's repository for this distribution; empty uses NVIDIA's.
    type: str
    default: ""
  timeout:
    description: Seconds to wait for the repository.
    type: int
    default: 15
"""
