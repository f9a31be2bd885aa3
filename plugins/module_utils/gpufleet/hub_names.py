"""What a name, a path or a URL from a hub may be, checked before anything is opened.

Repo ids, revisions and listed file names (the Hub's git ref and path rules), an
endpoint's URL and origin (scheme, host, port: where a token may go), credentials kept out
of messages, and a path under a root that no symbolic link can lead out of.
"""
from __future__ import annotations

import os
import re
import stat
from urllib.parse import urlsplit, urlunsplit

from .hub_errors import HubError, UnsafePathError

STATE_DIR = ".gpufleet"  # dest's state folder (manifest, partial files, lock): no listed path
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
# Never in a revision or a listed file name: quotes, backslashes, whitespace (Unicode too)
# and control characters (C0, DEL, C1).
UNSAFE_NAME_CHARS = re.compile(r"[\s\"'`\\\x00-\x1f\x7f-\x9f]")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def validate_repo_id(repo_id):
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or ".." in repo_id:
        raise HubError(f"repo_id {repo_id!r} is not a Hugging Face repo id: use "
                       "'org/name' (letters, digits, '.', '_', '-').")
    return repo_id


def normalize_endpoint(endpoint):
    """Strip the trailing slash; refuse what is not an http(s) URL."""
    endpoint = (endpoint or "").strip().rstrip("/")
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HubError(f"endpoint {endpoint!r} is not an http(s) URL: give the mirror's "
                       "base URL, e.g. https://hf-mirror.example.com (like HF_ENDPOINT).")
    return endpoint


def redact_url(url):
    """The URL without user:password, for messages and the manifest."""
    try:
        parts = urlsplit(url)
        if parts.username or parts.password:
            parts = parts._replace(netloc=parts.netloc.rsplit("@", 1)[1])
        return urlunsplit(parts)
    except ValueError:
        return scrub(str(url))


def scrub(text):
    """Credentials (user:password@) out of any text that may hold a URL."""
    return re.sub(r"//[^/@\s'\"]*@", "//", str(text))


def origin(url):
    """(scheme, host, port) of an http(s) URL; HubError for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise HubError(f"{redact_url(url)} is not a valid URL.") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise HubError(f"{redact_url(url)} is not an http(s) URL.")
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def validate_name(value, what):
    """The one check of a revision or a listed file name (hf_model, hf_mirror_index).

    What the Hub allows (git ref and path rules): no quotes, backslashes, whitespace,
    control characters or newlines, no absolute path, no empty, '.' or '..' component
    (and, as git refs, no '..' anywhere in a revision). Raises UnsafePathError.
    """
    problem = None
    if not isinstance(value, str) or not value:
        problem = "empty or not a string"
    elif UNSAFE_NAME_CHARS.search(value):
        problem = "quotes, backslashes, whitespace or control characters"
    elif value.startswith("/"):
        problem = "an absolute path"
    elif any(p in ("", ".", "..") for p in value.split("/")):
        problem = "an empty, '.' or '..' component"
    elif what == "revision" and ".." in value:
        problem = "'..'"
    if problem:
        raise UnsafePathError(f"unsafe {what} {value!r} ({problem}): the Hub allows none of "
                              "these; refusing it.")
    return value


def safe_relpath(path):
    """A listing path must stay inside dest and outside our state folder."""
    validate_name(path, "path")
    if path.split("/")[0] == STATE_DIR:
        raise UnsafePathError(f"unsafe path {path!r} (the state folder {STATE_DIR}); "
                              "refusing it.")
    return path


def path_under(root, rel, final_may_be_link=False):
    """root/rel, checked before it is opened: no existing component below root is a
    symbolic link (the last one may be when final_may_be_link: it is then replaced or
    removed, never followed) and the path resolves under root. Raises UnsafePathError."""
    parts = validate_name(rel, "path").split("/")
    path = root
    for i, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            break
        except NotADirectoryError:
            raise UnsafePathError(f"{path}: a file stands where a folder is needed; "
                                  "remove it and run again.") from None
        if stat.S_ISLNK(st.st_mode) and not (final_may_be_link and i == len(parts) - 1):
            raise UnsafePathError(
                f"{path} is a symbolic link inside {root}; gpufleet never writes through "
                "links there: remove it (or make it a real folder) and run again.")
    path = os.path.join(root, *parts)
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.dirname(path) if final_may_be_link else path)
    if os.path.commonpath([real_root, real]) != real_root:
        raise UnsafePathError(f"{path} resolves to {real}, outside {root}; refusing it.")
    return path
