"""The errors of a verified model fetch (hub, hub_client, hub_fetch, hub_manifest ...).

Every one is a HubError (a ValueError) whose message says what was wrong and what to do;
hub.py names them in its __all__, the entry point callers import them from. The two
raised only while bytes stream in (ShortFileError, VerificationError) live in hub_fetch.
"""
from __future__ import annotations


class HubError(ValueError):
    """A fetch that cannot go on; the message says what was wrong and what to do."""


class DiskSpaceError(HubError):
    """dest lacks the space the listing needs; raised before anything is written."""


class UnsafePathError(HubError):
    """A name or path that could leave its root (dest, the site root) or inject lines."""


class DeadlineError(HubError):
    """The fetch ran past its deadline."""


class LockMismatchError(HubError):
    """The endpoint's commit, listing or bytes differ from the model's lock (model_lock)."""
