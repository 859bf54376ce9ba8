"""The records capability over HTTP."""

from __future__ import annotations

from ._resource import Resource


class RecordsAPI(Resource):
    capability = "records"
