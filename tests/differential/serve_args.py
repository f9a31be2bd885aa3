"""Every option string of `vllm serve`, as vLLM's own parser defines it.

Runs INSIDE the lab image (vllm 0.32.0; gpufleet/vllm-cpu:lab):
    docker run --rm --network none --entrypoint python3 \
        -v $PWD/tests/differential:/d:ro gpufleet/vllm-cpu:lab /d/serve_args.py
Prints JSON: {"vllm_version": ..., "arguments": [{"dest", "flags"}, ...]} in the
parser's order. tests/fixtures/vllm-args/serve-<version>.json is its recorded output;
tests/slow/test_vllm_image.py runs it again and compares, so an argument a new vLLM adds
fails there until plugins/module_utils/gpufleet/engine_args.py classifies it.
"""
import importlib.metadata
import json
import logging
import os

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
logging.disable(logging.WARNING)

from vllm.entrypoints.launchers.cli_args import make_arg_parser  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

parser = make_arg_parser(FlexibleArgumentParser())
arguments = [{"dest": action.dest, "flags": list(action.option_strings)}
             for action in parser._actions if action.option_strings]
print(json.dumps({"vllm_version": importlib.metadata.version("vllm"),
                  "arguments": arguments}, indent=1))
