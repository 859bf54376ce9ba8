"""What every capability API of the client shares: the transport and the namespace's URL prefix."""

from __future__ import annotations

from ._paths import segment
from ._transport import Transport


class Resource:
    capability: str = ""

    def __init__(self, transport: Transport, namespace: str) -> None:
        self._transport = transport
        self._namespace = namespace

    @property
    def namespace(self) -> str:
        return self._namespace

    def _path(self, *parts: str) -> str:
        """``/v1/{namespace}/{capability}/{part}/...`` with every part percent-encoded."""
        encoded = "/".join(segment(p) for p in parts)
        base = f"/v1/{segment(self._namespace)}/{self.capability}"
        return f"{base}/{encoded}" if encoded else base
