"""asyncpg's client-side ``DataError``: a value asyncpg refused to encode before sending anything.

``asyncpg.exceptions._base.DataError`` (an ``InterfaceError``, not SQLSTATE 22) has no public
name: ``asyncpg.exceptions.DataError`` and ``asyncpg.DataError`` are the server's SQLSTATE 22
class, which shadows it. ``app.core.statements`` needs it to tell that the connection is still
good after such an error. Pinned by ``tests/test_fences.py``: the class exists, is an
``InterfaceError`` and a ``ValueError``, and is what asyncpg raises for a value it cannot encode.
"""

from __future__ import annotations

from asyncpg.exceptions import _base

ClientDataError: type[Exception] = _base.DataError
