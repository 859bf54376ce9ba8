"""The sqlite3 module the gateway uses: the interpreter's own when it can load extensions,
otherwise a drop-in build that can (``sqlean``, then ``pysqlite3``).

sqlite-vec is a loadable extension, and some Pythons (pyenv's default build among them) ship a
``sqlite3`` without ``enable_load_extension``. aiosqlite and SQLAlchemy import ``sqlite3`` by that
name, so the chosen module is installed as ``sys.modules["sqlite3"]`` before either is imported.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

_ALTERNATIVES = ("sqlean", "pysqlite3")


def _can_load_extensions(module: ModuleType) -> bool:
    try:
        conn = module.connect(":memory:")
    except Exception:  # noqa: BLE001  # pragma: no cover - a broken build
        return False
    try:
        conn.enable_load_extension(True)
        conn.enable_load_extension(False)
        return True
    except (AttributeError, module.Error):
        return False
    finally:
        conn.close()


def select_sqlite_module() -> ModuleType:
    """Install and return a sqlite3 module that can load extensions (the stdlib's if it can)."""
    current = sys.modules.get("sqlite3") or importlib.import_module("sqlite3")
    if _can_load_extensions(current):
        return current
    for name in _ALTERNATIVES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if _can_load_extensions(module):
            sys.modules["sqlite3"] = module
            sys.modules["sqlite3.dbapi2"] = importlib.import_module(f"{name}.dbapi2")
            return module
    # Nothing better: keep the stdlib; opening the vectors database will then fail clearly.
    return current


SQLITE = select_sqlite_module()


WRITER_PRAGMAS = (
    "PRAGMA foreign_keys=ON",
    "PRAGMA synchronous=NORMAL",
    # Builds with SQLITE_SECURE_DELETE (Debian's) overwrite every freed page, so a DELETE
    # needs as much new WAL space as it frees and cannot run on a full disk. FAST zeroes
    # deleted cells in b-tree pages only, not pages going to the freelist.
    "PRAGMA secure_delete=FAST",
)
"""Per-connection settings of every connection that writes: the pool's (``app.core.db.databases``)
and the inline writer's (``app.core.fast.inline_sqlite``)."""
