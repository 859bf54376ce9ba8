"""The kv capability over HTTP."""

from __future__ import annotations

from ._resource import Resource


class KeyValueAPI(Resource):
    capability = "kv"
