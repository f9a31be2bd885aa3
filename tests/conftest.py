"""pytest setup shared by every test.

`module_utils/` is put on sys.path so pure logic is imported as `gpufleet.<name>`
(no Ansible needed), and it is also added to `ansible.module_utils` so the modules in
`library/` import it as Ansible does at run time.
"""
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

sys.path.insert(0, str(ROOT / "module_utils"))
sys.path.insert(0, str(ROOT / "library"))

try:
    import ansible.module_utils

    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
except ImportError:  # pure-logic tests still run without Ansible
    pass


