"""Imports every capability's tables so that each database's MetaData is complete (Alembic).

The built-in capabilities come from the registry (``app.capabilities``); auth's keys table is
the gateway's own.
"""

from app import capabilities as _capabilities  # noqa: F401
from app.auth import models as _auth  # noqa: F401
from app.portability import staging as _staging  # noqa: F401  (namespace_imports)
