"""Pins what ``app.core.http.server`` relies on in uvicorn's httptools protocol (its one fence).

``GatewayHttpProtocol`` overrides parser callbacks and ``send_400_response`` and reads a few
attributes; if an uvicorn upgrade renames or re-signs any of them, this fails before the server
quietly stops enforcing its limits. The behaviour itself is tested on real processes in
``tests/test_pipeline.py``.
"""

from __future__ import annotations

import inspect

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.core.http.server import GatewayHttpProtocol

OVERRIDDEN = {
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "data_received": ["self", "data"],
    "on_message_begin": ["self"],
    "on_url": ["self", "url"],
    "on_header": ["self", "name", "value"],
    "on_headers_complete": ["self"],
    "on_message_complete": ["self"],
    "on_response_complete": ["self"],
    "send_400_response": ["self", "msg"],
}


def test_the_overridden_hooks_keep_their_signatures() -> None:
    for name, parameters in OVERRIDDEN.items():
        assert list(inspect.signature(getattr(HttpToolsProtocol, name)).parameters) == parameters, name
        assert getattr(GatewayHttpProtocol, name) is not getattr(HttpToolsProtocol, name), name


def test_parse_errors_are_still_answered_through_send_400_response() -> None:
    source = inspect.getsource(HttpToolsProtocol.data_received)
    assert "except httptools.HttpParserError" in source and "self.send_400_response(" in source


def test_the_attributes_read_are_still_set() -> None:
    init = inspect.getsource(HttpToolsProtocol.__init__)
    for attribute in ("self.connections =", "self.loop =", "self.server_state =", "self.cycle", "self.transport"):
        assert attribute in init, attribute
    assert "default_headers" in inspect.getsource(HttpToolsProtocol.send_400_response)
    # uvicorn's own limit_concurrency is off (app.cli); the check that honours it is where we expect
    assert "limit_concurrency" in inspect.getsource(HttpToolsProtocol.on_headers_complete)
