"""The errors of peer-to-peer fan-out (p2p names them in its __all__)."""
from __future__ import annotations

from .hub_errors import HubError


class P2PError(HubError):
    """A p2p input or outcome that cannot go on; the message says what to do."""


class WebSeedDown(P2PError):
    """The web seed did not answer: peers may still serve every piece."""
