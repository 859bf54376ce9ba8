"""The files capability over HTTP."""

from __future__ import annotations

from ._resource import Resource


class FilesAPI(Resource):
    capability = "files"
