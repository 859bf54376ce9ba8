"""Tables of the auth capability."""

from app.core.schema import METADATA  # noqa: F401
