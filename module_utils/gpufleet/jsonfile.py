"""Small JSON state files (the fleet's instance list, a host's last-good record): read
with a clear error, write atomically (a temporary file in the same folder, then rename),
so a reader never sees half a file. No Ansible imports."""
from __future__ import annotations

import json
import os
import tempfile

__all__ = ["read_json", "write_json"]


def read_json(path, default, fix):
    """The file's JSON, `default` when it does not exist; ValueError naming the file and
    `fix` (what the operator does) when it cannot be read or holds another type."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return default
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}); {fix}") from exc
    if not isinstance(data, type(default)):
        raise ValueError(f"{path} holds {type(data).__name__}, not {type(default).__name__}; {fix}")
    return data


def write_json(path, data, mode=0o644):
    """Write `data` to `path` atomically with `mode`, creating the folder."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gpufleet-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
