"""The only modules that touch a framework's internals: one per library, each pinned by a test.

Everything here uses something its library does not document as public, because no public API
does the job. Each module's docstring says what it relies on and why; ``tests/test_fences.py``
pins each of those (signatures, dataclass fields, attribute names) so that a new release that
changes one fails a test instead of the gateway, and ``pyproject.toml`` bounds each library
below the next release nobody has checked. ``tests/test_fences.py`` also scans ``app/`` so no
internal is used outside this package.

- ``fastapi_``: dependency planning (``app.core.fast.plans``) and a route's body model.
- ``starlette_``: the route path of a request, as Starlette's router matches it.
- ``sqlalchemy_``: closing a pooled connection from async code; asyncpg errors translated and
  a pool recycled as SQLAlchemy's ``Connection`` does (``app.core.fast.fixed_statements``).
- ``aiohttp_``: how far an S3 download's body is read ahead (the reader's water marks, which
  aiobotocore gives no way to set; ``app.files.s3``).
- asyncpg: none. (``asyncpg.exceptions._base.DataError`` was used to recognise a value asyncpg
  could not encode; asyncpg raises the public SQLSTATE 22000 ``DataError`` for that instead.)
- uvicorn's fence is ``app.core.http.server`` (its protocol subclass), pinned by
  ``tests/test_server_protocol.py``.
"""
