"""What differs between backends for checkpoints, behind one small interface chosen at start-up.

- reading a checkpoint's ``channel_versions`` as rows (``jsonb_each_text`` LATERAL on PostgreSQL,
  ``json_each`` on SQLite), which is how a checkpoint finds its channel values;
- JSON columns: JSONB on PostgreSQL (bound as text and cast), JSON text on SQLite;
- the metadata filter of a list: ``metadata @> :filter`` served by the GIN index on PostgreSQL;
  on SQLite one ``EXISTS`` per filter entry on ``checkpoint_metadata_terms``, whose rows (the
  top-level scalar entries of each checkpoint's metadata) are written with the checkpoint;
- a bulk delete's join: PostgreSQL is told to hash (``hash_joins``), SQLite needs no telling.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

import orjson
from sqlalchemy import BigInteger, Text, and_, bindparam, case, cast, delete, exists, func, insert, literal, select, text, true, tuple_
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ColumnElement, FromClause

from app.checkpoints.models import checkpoint_blobs as blobs
from app.core.jsonvalue import jsonb_text
from app.checkpoints.models import checkpoint_metadata_terms as terms

Scalar = str | int | float | bool | None


def dumps_text(value: Any) -> str:
    """``value`` as compact JSON text (orjson's), integers beyond 64 bits included: orjson cannot
    write those, and they are JSON all the same (Python's json writes them the same way)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def canonical_json(value: Scalar) -> str:
    """One text per JSON value, so equal values compare equal as text (``1.0`` is ``1``)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return dumps_text(value)


TERM_KEY_MAX_BYTES = 1024  # metadata keys longer than this have no filter term (SQLite)


def scalar_terms(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The top-level scalar entries of ``metadata`` as canonical JSON text (keys of at most
    ``TERM_KEY_MAX_BYTES``: a filter's keys are shorter, ``app.checkpoints.schemas.FilterKey``)."""
    return {
        k: canonical_json(v) for k, v in metadata.items()
        if len(k.encode("utf-8")) <= TERM_KEY_MAX_BYTES and (v is None or isinstance(v, (str, int, float, bool)))
    }


class CheckpointsBackend(Protocol):
    def versions_of(self, table: FromClause) -> FromClause:
        """``table.channel_versions`` as a FROM item with ``key`` and ``value`` (text) columns."""

    def values_of(self, page: FromClause) -> tuple[FromClause, FromClause]:
        """``page`` joined with the stored values of its rows' channel versions (each found by
        its primary key), and the FROM item that has their ``channel``, ``type`` and ``blob``."""

    def json_param(self, name: str) -> ColumnElement[Any]:
        """A bound parameter taking JSON text, as the JSON column type."""

    def json_text(self, column: ColumnElement[Any]) -> ColumnElement[str]:
        """A JSON column read back as its text."""

    def json_member_text(self, column: ColumnElement[Any], key: str) -> ColumnElement[str]:
        """The JSON text of a JSON object column's top-level member ``key`` (NULL without one; on
        SQLite also NULL unless it is an object)."""

    def member_keys(self, column: ColumnElement[Any], key: str) -> FromClause:
        """The keys of a JSON object column's top-level member ``key`` as a FROM item with a
        ``key`` column (no row when the member is missing or not an object)."""

    def metadata_filter_shape(self, table: FromClause, keys: int) -> list[ColumnElement[bool]]:
        """Conditions on ``table`` (the checkpoints table) that a filter of ``keys`` entries holds."""

    def metadata_filter_params(self, filter: Mapping[str, Scalar]) -> dict[str, Any]:
        """The bound values of those conditions for ``filter``."""

    async def write_terms(self, conn: AsyncConnection, thread_pk: int, ns: str, checkpoint_id: str, metadata: Mapping[str, Any]) -> None:
        """Keep what the filter reads in step with a checkpoint just stored."""

    def keys_in(self, table: FromClause) -> ColumnElement[bool]:
        """``table``'s (thread_pk, checkpoint_ns, checkpoint_id) is one of the keys bound by ``keys_params``."""

    def keys_params(self, keys: Sequence[tuple[int, str, str]]) -> dict[str, Any]:
        """The bound values of ``keys_in`` for ``keys`` (at most ``DELETE_CHUNK`` of them)."""

    def hash_joins(self, conn: AsyncConnection) -> AbstractAsyncContextManager[None]:
        """The statements run inside join by hashing whatever the database's statistics say (a
        thread's rows against a set computed from them, such as its checkpoints to delete)."""


def _key(table: FromClause) -> ColumnElement[Any]:
    return tuple_(table.c.thread_pk, table.c.checkpoint_ns, table.c.checkpoint_id)


class PostgresBackend:
    def versions_of(self, table: FromClause) -> FromClause:
        return func.jsonb_each_text(table.c.channel_versions).table_valued("key", "value").lateral("v")

    def values_of(self, page: FromClause) -> tuple[FromClause, FromClause]:
        # one primary-key lookup per version (LATERAL ... LIMIT 1), whatever the planner
        # estimates: a hash join would read every value the thread ever stored
        v = self.versions_of(page)
        value = (
            select(blobs.c.channel, blobs.c.type, blobs.c.blob)
            .where(blobs.c.thread_pk == page.c.thread_pk, blobs.c.checkpoint_ns == page.c.checkpoint_ns,
                   blobs.c.channel == v.c.key, blobs.c.version == v.c.value)
            .limit(1)
            .lateral("b")
        )
        return page.join(v, true()).join(value, true()), value

    def json_param(self, name: str) -> ColumnElement[Any]:
        return cast(bindparam(name, type_=Text), postgresql.JSONB)

    def json_text(self, column: ColumnElement[Any]) -> ColumnElement[str]:
        return cast(column, Text)

    def json_member_text(self, column: ColumnElement[Any], key: str) -> ColumnElement[str]:
        return cast(column.op("->")(literal(key, Text)), Text)

    def member_keys(self, column: ColumnElement[Any], key: str) -> FromClause:
        member = column.op("->")(literal(key, Text))
        an_object = case((func.jsonb_typeof(member) == "object", member), else_=None)
        return func.jsonb_each(an_object).table_valued("key", "value").lateral("k")

    def metadata_filter_shape(self, table: FromClause, keys: int) -> list[ColumnElement[bool]]:
        return [table.c.metadata.op("@>")(self.json_param("mfilter"))] if keys else []

    def metadata_filter_params(self, filter: Mapping[str, Scalar]) -> dict[str, Any]:
        value = dict(filter)  # written as metadata is (integers beyond 64 bits too): numbers then compare alike
        return {"mfilter": jsonb_text(dumps_text(value), value).text}

    async def write_terms(self, conn: AsyncConnection, thread_pk: int, ns: str, checkpoint_id: str, metadata: Mapping[str, Any]) -> None:
        return None  # the GIN index on metadata serves the filter

    def keys_in(self, table: FromClause) -> ColumnElement[bool]:
        # Three arrays, unnested: a list of 1,000 row values took PostgreSQL 225 ms to plan (an
        # OR of 1,000 ANDs) for 15 ms of work.
        k = func.unnest(
            bindparam("key_pks", type_=postgresql.ARRAY(BigInteger)), bindparam("key_nss", type_=postgresql.ARRAY(Text)),
            bindparam("key_ids", type_=postgresql.ARRAY(Text)),
        ).table_valued("pk", "ns", "id").render_derived(name="k")
        return _key(table).in_(select(k.c.pk, k.c.ns, k.c.id))

    def keys_params(self, keys: Sequence[tuple[int, str, str]]) -> dict[str, Any]:
        return {"key_pks": [k[0] for k in keys], "key_nss": [k[1] for k in keys], "key_ids": [k[2] for k in keys]}

    @asynccontextmanager
    async def hash_joins(self, conn: AsyncConnection) -> AsyncIterator[None]:
        # Right after a thread's rows were written in bulk, PostgreSQL's statistics still counted
        # it as one row, and it joined its 11,000 checkpoints with the set of those to delete by
        # a nested loop that computed the set again for each row: over 30 s (the statement
        # timeout: a 503 on every retry) where a hash join takes 21 ms (211,000 rows: 0.46 s).
        # A merge join on the sorted set matched on checkpoint_ns alone, then every pair (4.4 s).
        # Local to the transaction (a failure rolls the settings back with it), and set back
        # after, for the statements the transaction runs next.
        saved = (await conn.execute(_HASH_JOINS_ONLY)).one()
        yield
        await conn.execute(_JOINS_AS_BEFORE, {"nestloop": saved[0], "mergejoin": saved[1]})


_HASH_JOINS_ONLY = text(
    "WITH saved AS MATERIALIZED (SELECT current_setting('enable_nestloop') AS n, current_setting('enable_mergejoin') AS m) "
    "SELECT n, m, set_config('enable_nestloop', 'off', true), set_config('enable_mergejoin', 'off', true) FROM saved"
)
_JOINS_AS_BEFORE = text("SELECT set_config('enable_nestloop', :nestloop, true), set_config('enable_mergejoin', :mergejoin, true)")

_TERM_KEY = (terms.c.thread_pk, terms.c.checkpoint_ns, terms.c.checkpoint_id)


class SqliteBackend:
    def __init__(self) -> None:
        self._delete_terms = delete(terms).where(
            terms.c.thread_pk == bindparam("pk"), terms.c.checkpoint_ns == bindparam("cns"),
            terms.c.checkpoint_id == bindparam("cid"),
        )
        self._insert_terms = insert(terms)

    def versions_of(self, table: FromClause) -> FromClause:
        return func.json_each(table.c.channel_versions).table_valued("key", "value").alias("v")

    def values_of(self, page: FromClause) -> tuple[FromClause, FromClause]:
        v = self.versions_of(page)
        return page.join(v, true()).join(blobs, and_(
            blobs.c.thread_pk == page.c.thread_pk, blobs.c.checkpoint_ns == page.c.checkpoint_ns,
            blobs.c.channel == v.c.key, blobs.c.version == cast(v.c.value, Text),
        )), blobs

    def json_param(self, name: str) -> ColumnElement[Any]:
        return bindparam(name, type_=Text)

    def json_text(self, column: ColumnElement[Any]) -> ColumnElement[str]:
        return column

    def json_member_text(self, column: ColumnElement[Any], key: str) -> ColumnElement[str]:
        # json_extract answers an object as its JSON text (a string it answers bare, so only an
        # object is taken: what the callers look for). Not ->, which needs SQLite 3.38.
        path = literal(f'$."{key}"', Text)
        return case((func.json_type(column, path) == "object", func.json_extract(column, path)), else_=None)

    def member_keys(self, column: ColumnElement[Any], key: str) -> FromClause:
        return func.json_each(self.json_member_text(column, key)).table_valued("key", "value").alias("k")

    def metadata_filter_shape(self, table: FromClause, keys: int) -> list[ColumnElement[bool]]:
        return [
            exists().where(
                terms.c.thread_pk == table.c.thread_pk, terms.c.checkpoint_ns == table.c.checkpoint_ns,
                terms.c.checkpoint_id == table.c.checkpoint_id,
                terms.c.key == bindparam(f"mk{i}", type_=Text), terms.c.value == bindparam(f"mv{i}", type_=Text),
            )
            for i in range(keys)
        ]

    def metadata_filter_params(self, filter: Mapping[str, Scalar]) -> dict[str, Any]:
        params: dict[str, Any] = {}
        for i, (key, value) in enumerate(filter.items()):
            params[f"mk{i}"], params[f"mv{i}"] = key, canonical_json(value)
        return params

    async def write_terms(self, conn: AsyncConnection, thread_pk: int, ns: str, checkpoint_id: str, metadata: Mapping[str, Any]) -> None:
        await conn.execute(self._delete_terms, {"pk": thread_pk, "cns": ns, "cid": checkpoint_id})
        rows = [
            {"thread_pk": thread_pk, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id, "key": k, "value": v}
            for k, v in scalar_terms(metadata).items()
        ]
        if rows:
            await conn.execute(self._insert_terms, rows)

    def keys_in(self, table: FromClause) -> ColumnElement[bool]:
        return _key(table).in_(bindparam("keys", expanding=True))

    def keys_params(self, keys: Sequence[tuple[int, str, str]]) -> dict[str, Any]:
        return {"keys": list(keys)}

    @asynccontextmanager
    async def hash_joins(self, conn: AsyncConnection) -> AsyncIterator[None]:
        yield  # SQLite plans a set of rows to match as an index of its own, built once


def backend_for(dialect: str) -> CheckpointsBackend:
    return PostgresBackend() if dialect == "postgresql" else SqliteBackend()


