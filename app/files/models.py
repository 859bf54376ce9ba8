"""Tables of the files capability."""

from app.core.schema import METADATA  # noqa: F401
