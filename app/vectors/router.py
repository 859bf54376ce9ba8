"""HTTP routes of the vectors capability."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI

router = APIRouter(prefix="/vectors", tags=["vectors"])


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start-up and shutdown work of this capability (background tasks, backend choice)."""
    yield
