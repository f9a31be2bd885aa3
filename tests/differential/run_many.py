"""Run several differential scripts of this folder in ONE Python process, so vLLM and
torch are imported once (about 10 s of a core each time on the lab machine):

    docker run --rm --network none -v /work/main:/src:ro --entrypoint python \
        gpufleet/vllm-cpu:lab /src/tests/differential/run_many.py \
        deepseek_v4_vllm.py gemma4_vllm.py "families_vllm.py --models gemma2,deepseek_v2"

Each argument is a script of this folder with its own arguments; each runs as
`python script args` would (runpy, __name__ == "__main__", its own sys.argv), in the
order given, and its standard output (one JSON document) is kept. Prints one JSON
object: {argument: the script's document}. A script that fails ends the run with its
traceback (exit 1), naming it. tests/slow/test_kv_plan_vs_vllm.py runs its checks so.
"""
import contextlib
import io
import json
import os
import runpy
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(argument):
    script, *args = shlex.split(argument)
    path = os.path.join(HERE, script)
    if os.path.dirname(os.path.normpath(script)) or not os.path.isfile(path):
        raise SystemExit(f"run_many.py: {script!r} is not a script of {HERE}")
    saved = sys.argv
    sys.argv = [path, *args]
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise SystemExit(f"run_many.py: {argument} exited with {exc.code}") from exc
    finally:
        sys.argv = saved
    return json.loads(buffer.getvalue())


def main(arguments):
    if not arguments:
        raise SystemExit("usage: run_many.py SCRIPT[ ARGS] ...")
    sys.path.insert(0, HERE)
    out = {argument: run(argument) for argument in arguments}
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
