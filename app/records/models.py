"""Tables of the records capability."""

from app.core.schema import METADATA  # noqa: F401
