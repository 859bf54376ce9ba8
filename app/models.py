"""Imports every capability's tables so that each database's MetaData is complete (Alembic)."""

from app.auth import models as _auth  # noqa: F401
from app.checkpoints import models as _checkpoints  # noqa: F401
from app.files import models as _files  # noqa: F401
from app.kv import models as _kv  # noqa: F401
from app.records import models as _records  # noqa: F401
from app.vectors import models as _vectors  # noqa: F401
