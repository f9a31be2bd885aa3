"""Documentation shared by gpufleet's modules (extends_documentation_fragment)."""


class ModuleDocFragment:
    """gpufleet.read_only: a module that only reads or computes."""

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
