"""Helpers for tests of module main() functions (ansible-core 2.19)."""
import json

import pytest
from ansible.module_utils.testing import patch_module_args


class ModuleExit(Exception):
    def __init__(self, result, failed):
        super().__init__(result.get("msg", ""))
        self.result = result
        self.failed = failed


def run_module(main, args, monkeypatch, check_mode=False):
    """Run a module's main() with `args`; return (result dict, failed bool)."""
    from ansible.module_utils import basic

    def _exit(self, **kw):
        raise ModuleExit(kw, False)

    def _fail(self, msg, **kw):
        kw["msg"] = msg
        kw["failed"] = True
        raise ModuleExit(kw, True)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", _exit)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", _fail)
    args = dict(args)
    if check_mode:
        args["_ansible_check_mode"] = True
    with patch_module_args(args):
        with pytest.raises(ModuleExit) as exc:
            main()
    # round-trip through JSON like Ansible does, so non-serialisable results fail here
    return json.loads(json.dumps(exc.value.result)), exc.value.failed
