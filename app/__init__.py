"""storage-gateway: isolated records, key-value, files and vectors for every plugin, over HTTP."""

# Must run before aiosqlite or SQLAlchemy's SQLite dialect import ``sqlite3``.
from app.core.db import sqlite as _sqlite  # noqa: F401

__version__ = "0.1.0"
