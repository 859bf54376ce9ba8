"""Tables of the kv capability."""

from app.core.schema import METADATA  # noqa: F401
