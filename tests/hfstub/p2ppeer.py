#!/usr/bin/python3
"""One p2p host on loopback, for tests: run with the Python that has libtorrent (Debian's
/usr/bin/python3 + python3-libtorrent, as on the GPU hosts), not .venv.

    p2ppeer.py make FOLDER OUT.torrent      torrent of a verified hf_model folder
    p2ppeer.py facts IN.torrent             its facts (JSON)
    p2ppeer.py peer JOB.json RESULT.json    gpufleet.p2p.run_peer(job) -> result
"""
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

from gpufleet import hub_mirror, p2p, p2p_torrent  # noqa: E402


def main(argv):
    if argv[0] == "make":
        data = p2p_torrent.make_torrent(hub_mirror.read_model_folder(argv[1]))
        pathlib.Path(argv[2]).write_bytes(data)
        print(json.dumps(p2p_torrent.torrent_facts(data)))
    elif argv[0] == "facts":
        print(json.dumps(p2p_torrent.torrent_facts(pathlib.Path(argv[1]).read_bytes())))
    elif argv[0] == "peer":
        job = json.loads(pathlib.Path(argv[1]).read_text())
        result = p2p.run_peer(job, log=lambda line: print(line, flush=True))
        pathlib.Path(argv[2]).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
