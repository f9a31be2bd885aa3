"""Small JSON state files (the fleet's instance list, a host's last-good record): read
with a clear error, write atomically (a temporary file in the same folder, then rename),
so a reader never sees half a file. No Ansible imports."""
from __future__ import annotations

import json
import os
import pwd
import stat
import tempfile

__all__ = ["NotPrivateError", "read_json", "write_json"]


class NotPrivateError(ValueError):
    """A file read with `owner` belongs to someone else or others may write it."""


def read_json(path, default, fix, owner=None):
    """The file's JSON, `default` when it does not exist; ValueError naming the file and
    `fix` (what the operator does) when it cannot be read or holds another type.

    owner: a uid; then the file must belong to it and be writable by no one else (no
    write bit for group or others), checked on the file opened (fstat), so the file
    checked is the file read; ValueError naming the owner and mode found otherwise.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            if owner is not None:
                _check_private(path, os.fstat(handle.fileno()), owner, fix)
            data = json.load(handle)
    except FileNotFoundError:
        return default
    except NotPrivateError:
        raise
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}); {fix}") from exc
    if not isinstance(data, type(default)):
        raise ValueError(f"{path} holds {type(data).__name__}, not {type(default).__name__}; {fix}")
    return data


def _user(uid):
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check_private(path, info, owner, fix):
    found = stat.S_IMODE(info.st_mode)
    if info.st_uid != owner or found & 0o022:
        raise NotPrivateError(
            f"{path} is owned by {_user(info.st_uid)} with mode {found:04o}, but it must "
            f"belong to {_user(owner)}, the user reading it, and be writable by no one "
            "else: whoever can write it decides what is read from it. Find out who changed "
            f"it; then `chown {owner} {path}` and `chmod 0600 {path}`, or {fix}")


def write_json(path, data, mode=0o644):
    """Write `data` to `path` atomically with `mode`, creating the folder. The file is a
    new one (renamed over the old): owned by the user writing, with exactly `mode`,
    whatever owner and mode the file it replaces had."""
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
