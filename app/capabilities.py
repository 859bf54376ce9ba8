"""The registry: every capability the gateway serves, in the order their gates are tried.

Adding a capability is a package under ``app/`` with a ``capability.py`` exporting a
``Capability`` (``app.core.capability``) and one line here. Nothing else lists capabilities.
Deployments (and tests) can add their own with the ``extra_capabilities`` setting
(``module:attribute`` import paths).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

from app.checkpoints.capability import CAPABILITY as checkpoints
from app.core.capability import Capability, check_unique
from app.files.capability import CAPABILITY as files
from app.kv.capability import CAPABILITY as kv
from app.records.capability import CAPABILITY as records
from app.store.capability import CAPABILITY as store
from app.vectors.capability import CAPABILITY as vectors

BUILTIN: tuple[Capability[Any], ...] = (records, kv, files, vectors, checkpoints, store)


def load(extra: Iterable[str] = ()) -> tuple[Capability[Any], ...]:
    """The built-in capabilities followed by each ``module:attribute`` in ``extra``."""
    loaded = [*BUILTIN]
    for path in extra:
        module, sep, attribute = path.partition(":")
        if not sep:
            raise ValueError(f"extra capability {path!r} is not module:attribute")
        capability = getattr(importlib.import_module(module), attribute)
        if not isinstance(capability, Capability):
            raise TypeError(f"{path} is a {type(capability).__name__}, not a Capability")
        loaded.append(capability)
    return check_unique(loaded)
