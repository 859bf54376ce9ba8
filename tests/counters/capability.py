"""The counters capability's descriptor: everything the gateway and the shared tests read."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from app.core.capability import Capability, Change, create_tables
from app.core.config import Database
from app.core.errors import DatabaseErrorRule, InvalidInput
from app.core.state import GatewayState
from tests.counters.models import counters
from tests.counters.repository import CountersRepository
from tests.counters.router import router
from tests.counters.samples import SAMPLES
from tests.counters.service import CountersService


@asynccontextmanager
async def lifecycle(state: GatewayState) -> AsyncIterator[CountersService]:
    await create_tables(state, Database.metadata, counters)
    yield CountersService(CountersRepository(state.databases.dialect(Database.metadata)))


def past_64_bits() -> InvalidInput:
    return InvalidInput("n", "the counter would pass the 64-bit range (-2**63 to 2**63-1)", code="counter_out_of_range")


CAPABILITY = Capability(
    name="counters",
    router=router,
    database=Database.metadata,
    lifecycle=lifecycle,
    tables=(counters,),
    summary="Named 64-bit counters: increment, read, list, delete (a capability that exists for the tests).",
    samples=SAMPLES,
    changes=(
        Change("increment", ("POST /{name}/increment",)),
        Change("delete", ("DELETE /{name}",)),
    ),
    errors=(
        DatabaseErrorRule(past_64_bits, constraint="ck_counters_value_is_integer"),  # SQLite
        DatabaseErrorRule(past_64_bits, sqlstate="22003"),  # PostgreSQL's BIGINT
    ),
)
