"""The vectors capability over HTTP."""

from __future__ import annotations

from ._resource import Resource


class VectorsAPI(Resource):
    capability = "vectors"
