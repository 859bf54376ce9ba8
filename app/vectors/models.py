"""Tables of the vectors capability."""

from app.core.schema import METADATA  # noqa: F401
