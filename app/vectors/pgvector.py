"""PostgreSQL + pgvector: one table per collection, an HNSW index, JSONB payloads.

Filtered search must return ``min(limit, matches)`` points. An HNSW scan applies the WHERE
clause after the graph search, so before pgvector 0.8 (no iterative scans) a selective filter
silently returns too few rows. The plan here:

1. A filter that matches at most ``exact_threshold`` points is searched exactly over the matching
   rows (the ORDER BY is kept away from the HNSW index; the payload GIN index still narrows the
   rows).
2. Otherwise the HNSW index is used (with ``hnsw.iterative_scan`` on pgvector 0.8+, and a larger
   ``ef_search`` for filtered queries).
3. Whenever a search returns fewer than ``limit`` rows while more points match, it is redone exactly.

Searches are the hot path: they run as one statement on the request connection's asyncpg
driver connection (no ORM, no statement compilation); everything else goes through SQLAlchemy.
Only the SQL and the PostgreSQL facts are here; the steps around them (the plan-search-fallback
sequence included) are ``VectorIndex``'s (``app.vectors.backend``), the filter walk
``FilterSql``'s (``app.vectors.filters``).

A collection with a text field keeps each point's terms (``app.vectors.text``) with the row: ``tf``
(term -> count, JSONB, a GIN index) and ``dl`` (its length). PostgreSQL has no BM25, so the
collection's statistics are kept beside it in ``fts_<id>`` (documents and terms as ``term ''``,
each term's document frequency), by statement triggers on the data table
(``gateway_text_stats``): in the writing transaction, from the rows each statement inserted,
updated or deleted, whatever the path (a delete by filter too), in up to ``TEXT_SHARDS`` rows a
term so that concurrent writers rarely wait for each other. A text search reads the statistics
of its terms, then scores the points that hold its rarest terms (MaxScore: see
``_text_rank``) with the formula FTS5's ``bm25()`` uses on SQLite.

Collections above HNSW's 2000-dimension limit get a ``halfvec`` expression index up to 4000
dimensions on pgvector 0.7+, and exact search otherwise.

The HNSW index is not made with the table: pgvector inserts into an HNSW graph row by row (about
1,000 vectors/s), while a table without it takes about 90,000/s and ``CREATE INDEX`` afterwards
builds the graph in bulk. ``app.vectors.builder`` builds it in the background (``CREATE INDEX
CONCURRENTLY``) once a collection is big enough and quiet. The search SQL is the same either way:
without the index PostgreSQL's ``ORDER BY distance LIMIT k`` is an exact scan, with it the planner
uses HNSW. Dropping or resetting a collection cancels a build running on its table first.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import math
import re
import struct
import sys
import time
import weakref
from array import array
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.core.fences.sqlalchemy_ import resize_statement_cache
from app.core.fast.fixed_statements import translate_driver_error
from app.core.jsonvalue import jsonb_text
from app.vectors.backend import (
    CollectionInfo, Hit, IndexKind, IndexState, MissingTable, PayloadIndexState, PointIn, Search, TextRanking, VectorIndex,
)
from app.vectors import feedback, recall, subgraphs, text as bm25
from app.vectors.filters import COMPARE_SQL, And, Compare, Eq, Exists, FilterSql, Node, SqlBuilder
from app.vectors.estimate import FieldStats, estimate, field_stats
from app.vectors.nulescape import escape_json, escape_text, unescape_json, unescape_text
from app.vectors.planner import GRAPH_PLANS, ITERATIVE_SCAN_MAX, Plan, Subgraph, choose
from app.vectors.payload_index import (
    MAX_DECLARED_VALUE_BYTES, PayloadIndex, PayloadKind, create_index_sql, serves_value, sql_index_name,
)


HNSW_MAX_DIMS = 2000
HALFVEC_MAX_DIMS = 4000

_OPERATOR = {"cosine": "<=>", "l2": "<->", "ip": "<#>"}
_OPCLASS = {"cosine": "cosine", "l2": "l2", "ip": "ip"}
# The text half (module docstring): at most about this many points are scored per text search
# (the rarest terms' postings), unless the rarest term alone holds more.
TEXT_CANDIDATES = 2000
TEXT_SHARDS = 8
# A text collection's rows stay uncompressed up to a page: a row with a 384-d vector passes
# PostgreSQL's default 2 kB, and a compressed ``tf`` was decompressed for each term a search
# read from it (the GIN index's recheck, then each term's count): 1.7x the text half's time.
TEXT_STORAGE = "toast_tuple_target = 8160"
# The trigger function of every text collection's statistics (made by migration 0009): the
# terms and lengths of the rows a statement inserted, updated or deleted (its transition
# tables) added to or taken from the statistics table named by the trigger's argument, in
# the writer's shard, in term order (concurrent writers of a shard wait, never deadlock).
TEXT_STATS_FUNCTION = f"""
CREATE OR REPLACE FUNCTION gateway_text_stats() RETURNS trigger LANGUAGE plpgsql AS $f$
DECLARE
  changes text;
BEGIN
  IF TG_OP = 'INSERT' THEN
    changes := 'SELECT tf, dl, 1 AS sign FROM new_rows';
  ELSIF TG_OP = 'DELETE' THEN
    changes := 'SELECT tf, dl, -1 AS sign FROM old_rows';
  ELSE
    changes := 'SELECT tf, dl, 1 AS sign FROM new_rows UNION ALL SELECT tf, dl, -1 FROM old_rows';
  END IF;
  EXECUTE format(
    'INSERT INTO %1$I AS s (term, shard, df, len) SELECT term, $1, sum(d), sum(l) FROM ('
    'SELECT k.term, c.sign AS d, 0 AS l FROM (%2$s) c, jsonb_object_keys(c.tf) AS k(term) WHERE c.tf IS NOT NULL '
    'UNION ALL SELECT '''', c.sign, c.sign * c.dl FROM (%2$s) c WHERE c.tf IS NOT NULL'
    ') x GROUP BY term HAVING sum(d) <> 0 OR sum(l) <> 0 ORDER BY term '
    'ON CONFLICT (term, shard) DO UPDATE SET df = s.df + EXCLUDED.df, len = s.len + EXCLUDED.len',
    TG_ARGV[0], changes) USING CAST(pg_backend_pid() % {TEXT_SHARDS} AS smallint);
  RETURN NULL;
END
$f$
"""
HNSW_KINDS = ("hnsw", "hnsw_halfvec")
# PostgreSQL's planner switches turned off for the iterative walk's statement (``_walk_only``).
WALK_ONLY = ("enable_seqscan", "enable_bitmapscan")
BUILDER_APPLICATION_NAME = "storage-gateway index builder"
# Dropping or truncating a table waits for every lock on it; a build is cancelled first and the
# wait bounded, then retried (a build may start between the cancel and the DROP).
# Key 1 of the session-level advisory lock a build holds (key 2: the collection id).
BUILD_LOCK_CLASS = 0x76656374  # "vect" = 1986356084
EXCLUSIVE_LOCK_TIMEOUT_MS = 1000
EXCLUSIVE_ATTEMPTS = 5
_LOCK_NOT_AVAILABLE = "55P03"

# Builds running on a table: pgvector's own progress rows, and the gateway's builder connections
# holding a lock on it (a DROP INDEX CONCURRENTLY of a stale index is not a CREATE INDEX).
_CANCEL_BUILDS = (
    "SELECT pg_cancel_backend(b.pid) FROM ("
    "SELECT p.pid FROM pg_stat_progress_create_index p "
    "WHERE p.relid = to_regclass(:t) AND p.datid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "UNION SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.relation = to_regclass(:t) AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND a.application_name = :app AND l.pid <> pg_backend_pid()"
    ") b"
)


# Planner inputs: the table's size and index state, and each filter's sampled selectivity. A
# collection's size and index state are read again after STATS_TTL while it is big and has no
# valid graph (a build's end is seen within a second, where its searches compare every point),
# otherwise after STABLE_STATS_TTL: a stale "ready" or "small" plans a search that is correct
# either way (without the index PostgreSQL runs the same statement as a scan), and with 1,000
# collections a catalog read per collection and second was a read on most searches (issue 49).
# This process's builder, a reset and a drop forget a collection's at once (``forget``); one this
# process wrote points to in the last STABLE_STATS_TTL is read again after STATS_TTL, as before:
# its plans follow its growth (a calibrated ef_search grows with the rows) once PostgreSQL's
# counters have it, while a collection only searched keeps its read for STABLE_STATS_TTL.
STATS_TTL = 1.0
STABLE_STATS_TTL = 30.0
SMALL_ROWS = 10_000
SELECTIVITY_TTL = 30.0
SAMPLE_ROWS = 2000
CACHE_ENTRIES = 4096
# A table's estimated rows ($1: the table).
_ROWS_ESTIMATE = "GREATEST(c.reltuples, COALESCE(s.n_live_tup, 0), 0)"
_OF_TABLE = "FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = to_regclass($1)"
TABLE_ROWS = f"SELECT {_ROWS_ESTIMATE} {_OF_TABLE}"
# ... with its HNSW index's validity ($2), the names of its valid payload subgraphs
# (``app.vectors.subgraphs``; $3: their LIKE) and the index's comment (``app.vectors.recall``).
_STATS = (
    f"SELECT {_ROWS_ESTIMATE}, "
    "(SELECT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass($2)), "
    "(SELECT array_agg(CAST(x.relname AS text)) FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid "
    f"WHERE i.indrelid = c.oid AND i.indisvalid AND x.relname LIKE $3), "
    f"obj_description(to_regclass($2), 'pg_class') {_OF_TABLE}"
)
# An index's comment, where the recall calibration of an HNSW index is kept (asyncpg's parameter
# for the builder, SQLAlchemy's for describe).
_INDEX_COMMENT = "SELECT obj_description(to_regclass({i}), 'pg_class')"
INDEX_COMMENT = _INDEX_COMMENT.format(i="$1")
_INDEX_COMMENT_NAMED = _INDEX_COMMENT.format(i=":i")
# A table's payload subgraph indexes: name, valid, being built (asyncpg's parameters for the
# builder, SQLAlchemy's for describe and reset).
_SUBGRAPH_INDEXES = (
    "SELECT CAST(x.relname AS text), i.indisvalid, EXISTS (SELECT 1 FROM pg_stat_progress_create_index p "
    "WHERE p.index_relid = i.indexrelid) FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid "
    "WHERE i.indrelid = to_regclass({t}) AND x.relname LIKE {like}"
)
SUBGRAPH_INDEXES = _SUBGRAPH_INDEXES.format(t="$1", like="$2")
_SUBGRAPH_INDEXES_NAMED = _SUBGRAPH_INDEXES.format(t=":t", like=":like")

# The builder's record of the payload indexes PostgreSQL refused to build: the comment of the
# collection's payload GIN index (``{table}_payload``, made with the table: the gateway's own
# object, where a table's comment may be an operator's); $1 is the table.
PAYLOAD_FAILURES_COMMENT = "SELECT obj_description(to_regclass($1 || '_payload'), 'pg_class')"
PAYLOAD_FAILURES_MARK = "storage-gateway payload index failures"


@dataclass(frozen=True)
class PayloadFailure:
    """A payload index PostgreSQL refused to build from the stored values (a value too large
    for a B-tree key, stored by a version that did not refuse it): why, and when (epoch
    seconds). Kept as the payload GIN index's comment (``payload_failures_sql``), so that every
    process's describe says so, and the builder waits before it tries again."""

    error: str
    at: float


def parse_payload_failures(comment: str | None) -> dict[int, PayloadFailure]:
    """The failures kept in a table's comment, by declaration position (none for another comment)."""
    try:
        data = json.loads(comment) if comment else None
    except ValueError:
        return {}
    if not isinstance(data, dict) or data.get("mark") != PAYLOAD_FAILURES_MARK or not isinstance(data.get("failed"), dict):
        return {}
    out: dict[int, PayloadFailure] = {}
    for position, failure in data["failed"].items():
        try:
            at = float(failure["at"])
            if math.isfinite(at):  # a comment written by another hand may hold anything
                out[int(position)] = PayloadFailure(str(failure["error"]), at)
        except (KeyError, TypeError, ValueError, ArithmeticError):
            continue
    return out


BUILD_MARK = "storage-gateway build"


def build_record(seconds: float, points: int) -> str:
    """The comment a payload index keeps of its build (describe's ``payload_indexes[].build``)."""
    return json.dumps({"mark": BUILD_MARK, "seconds": round(seconds, 2), "points": int(points),
                       "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def parse_build_record(comment: str | None) -> dict[str, Any] | None:
    """What ``build_record`` kept (None for no comment or another one)."""
    try:
        data = json.loads(comment) if comment else None
        if isinstance(data, dict) and data.get("mark") == BUILD_MARK:
            return {"seconds": float(data["seconds"]), "points": int(data["points"]), "built_at": str(data["built_at"])}
    except (ValueError, TypeError, KeyError):
        pass
    return None


def index_comment_sql(index: str, comment: str | None) -> str:
    """``COMMENT ON INDEX`` setting ``comment`` (None: clearing it), quoted as a SQL literal
    (``COMMENT`` takes no parameter)."""
    if comment is None:
        return f"COMMENT ON INDEX {index} IS NULL"
    return f"COMMENT ON INDEX {index} IS '{comment.replace(chr(39), chr(39) * 2)}'"


def payload_failures_sql(table: str, failures: Mapping[int, PayloadFailure]) -> str:
    """The ``COMMENT ON INDEX`` that keeps ``failures`` (or clears the comment)."""
    kept = json.dumps({
        "mark": PAYLOAD_FAILURES_MARK,
        "failed": {str(k): {"error": f.error, "at": round(f.at, 3)} for k, f in sorted(failures.items())},
    })  # ASCII: ensure_ascii
    return index_comment_sql(f"{table}_payload", kept if failures else None)


def offending_points_sql(coll: CollectionInfo, index: PayloadIndex) -> str:
    """Up to $1 ids of the points whose value of ``index``'s field a write is refused now
    (``payload_index.declared_value_problem``): an array or object, or past
    ``MAX_DECLARED_VALUE_BYTES`` of JSON."""
    value = f"(payload -> '{index.field}')"
    return (
        f"SELECT id FROM {coll.data_table} WHERE jsonb_typeof({value}) IN ('object', 'array') "
        f"OR octet_length(CAST({value} AS text)) > {MAX_DECLARED_VALUE_BYTES} ORDER BY id LIMIT $1"
    )


# The statistics of the declared payload indexes' expressions (a B-tree's single column "expr"),
# by index name ($1), values as stored (NUL-escaped: ``declared_stats`` reads them).
FIELD_STATS = (
    "SELECT tablename, null_frac, n_distinct, CAST(CAST(most_common_vals AS text) AS text[]), most_common_freqs "
    "FROM pg_stats WHERE schemaname = current_schema() AND tablename = ANY($1::text[]) AND attname = 'expr'"
)


def declared_stats(row: Any, rows: int, kind: PayloadKind, value: Callable[[str], str] = str) -> FieldStats:
    """A ``FIELD_STATS`` row of a table of ``rows`` points, of a declared field of ``kind``;
    ``value`` reads a keyword field's common value (``unescape_text``: as searched; the default:
    as stored). The other kinds' values are jsonb's text."""
    keyword = kind == "keyword"
    values = [value(v) if keyword else v for v in row[3] or ()]
    return field_stats(float(row[1]), float(row[2]), rows, values, [float(f) for f in row[4] or ()], keyword)


def hnsw_index_name(coll: CollectionInfo) -> str:
    return f"{coll.data_table}_hnsw"


def text_statements(data_table: str, text_table: str) -> builtins.list[str]:
    """What a text collection has beside its data table's ``tf`` and ``dl`` columns: their GIN
    index, the statistics table and the triggers that keep it (one per kind of statement: a
    trigger with transition tables has one)."""
    out = [
        f"CREATE INDEX {data_table}_tf ON {data_table} USING gin (tf)",
        f'CREATE TABLE {text_table} (term text COLLATE "C" NOT NULL, shard smallint NOT NULL, '
        "df bigint NOT NULL, len bigint NOT NULL, PRIMARY KEY (term, shard))",
    ]
    for kind, tables in (("insert", "NEW TABLE AS new_rows"), ("update", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
                         ("delete", "OLD TABLE AS old_rows")):
        out.append(
            f"CREATE TRIGGER {data_table}_text_{kind} AFTER {kind.upper()} ON {data_table} REFERENCING {tables} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION gateway_text_stats('{text_table}')"
        )
    return out


def text_rank_sql(coll: CollectionInfo, n_terms: int, where: str, also: bool, placeholders: Mapping[str, str]) -> str:
    """The text half's statement (``PgVectorIndex._text_rank``): the statistics of ``:terms``
    (the collection's totals as the term ''), each term's weight (idf x (k1 + 1)), which are
    essential (the rarest, and the next rarest while their postings stay within ``:budget``)
    and the bound of the others, each read once (uncorrelated subqueries); then the ``:limit``
    best points holding an essential term and matching ``where``, and (``also``) the scores of
    the points ``:also``; columns id, score, whether an ``also`` row, the bound. Each ``:name``
    is written as ``placeholders[name]`` (``where`` comes with its own)."""
    t = coll.data_table
    weight = "(SELECT w FROM w WHERE term = CAST(:t{i} AS text))"
    tf = "CAST(tf ->> CAST(:t{i} AS text) AS float8)"
    score = " + ".join(
        f"coalesce({weight.format(i=i)} * {tf.format(i=i)} / ({tf.format(i=i)} + norm), 0)" for i in range(n_terms)
    )
    norm = ("CAST(:k1 AS float8) * (CAST(:omb AS float8) + CAST(:b AS float8) * dl / "
            "(SELECT CAST(len AS float8) / NULLIF(n, 0) FROM tot))")
    bound = "(SELECT coalesce(sum(w) FILTER (WHERE NOT essential), 0) FROM w)"
    ranked = (
        f"(SELECT id, {score} AS score, FALSE AS also, {bound} AS bound FROM (SELECT id, tf, {norm} AS norm FROM {t} "
        "WHERE tf ?| (SELECT array_agg(term) FROM w WHERE essential) AND <where>) AS s ORDER BY score DESC, id LIMIT :limit)"
    )
    if also:
        ranked += (
            f" UNION ALL SELECT id, {score}, TRUE, {bound} FROM (SELECT id, tf, {norm} AS norm FROM {t} "
            "WHERE id = ANY(CAST(:also AS text[])) AND tf IS NOT NULL) AS a"
        )
    statement = (
        f"WITH st AS (SELECT term, CAST(sum(df) AS float8) AS df, CAST(sum(len) AS float8) AS len FROM {coll.text_table} "
        "WHERE term = ANY(CAST(:terms AS text[])) GROUP BY term), "
        "tot AS (SELECT coalesce(sum(df) FILTER (WHERE term = ''), 0) AS n, coalesce(sum(len) FILTER (WHERE term = ''), 0) "
        "AS len FROM st), "
        "w AS (SELECT st.term, greatest(ln(greatest((tot.n - st.df + 0.5) / (st.df + 0.5), 1e-9)), CAST(:floor AS float8)) "
        "* CAST(:k1p1 AS float8) AS w, row_number() OVER (ORDER BY st.df, st.term) = 1 "
        "OR sum(st.df) OVER (ORDER BY st.df, st.term) <= CAST(:budget AS float8) AS essential "
        "FROM st, tot WHERE st.term <> '' AND st.df > 0 AND tot.n > 0) "
        f"{ranked}"
    )
    return re.sub(r":(\w+)", lambda m: placeholders[m.group(1)], statement).replace("<where>", where)


def _tf_json(terms: builtins.list[str] | None) -> str | None:
    """A point's terms as the ``tf`` column holds them (JSON text: term -> count)."""
    return None if not terms else json.dumps(Counter(terms), ensure_ascii=False, separators=(",", ":"))


def hnsw_index_sql(coll: CollectionInfo) -> str:
    """``CREATE INDEX CONCURRENTLY`` of a collection's HNSW index, from its stored options."""
    return _hnsw_sql(coll, hnsw_index_name(coll), "")


def _hnsw_sql(coll: CollectionInfo, name: str, where: str) -> str:
    t = coll.data_table
    n = int(coll.vector_size)
    m = int(coll.index.get("m", 16))
    efc = int(coll.index.get("ef_construction", 64))
    ops = _OPCLASS[coll.distance]
    if coll.index.get("kind") == "hnsw_halfvec":
        column = f"(CAST(embedding AS halfvec({n}))) halfvec_{ops}_ops"
    else:
        column = f"embedding vector_{ops}_ops"
    return (
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {t} USING hnsw ({column}) "
        f"WITH (m = {m}, ef_construction = {efc}){where}"
    )


def subgraph_predicate(index: PayloadIndex, stored_value: str) -> str:
    """The predicate of the payload subgraph of a declared field's value (as stored: a keyword
    field's text, jsonb's text of another kind's value): a search must spell it the same way for
    PostgreSQL to use the partial index."""
    if index.kind == "keyword":
        return f"{keyword_expr(index.field)} = {subgraphs.sql_literal(stored_value)}"
    return f"{value_expr(index.field)} = CAST({subgraphs.sql_literal(stored_value)} AS jsonb)"


def subgraph_index_sql(coll: CollectionInfo, index: PayloadIndex, stored_value: str) -> str:
    """``CREATE INDEX CONCURRENTLY`` of a payload subgraph: the main index's HNSW over the
    points whose declared field is ``stored_value``."""
    name = subgraphs.index_name(coll.data_table, index, stored_value)
    return _hnsw_sql(coll, name, f" WHERE {subgraph_predicate(index, stored_value)}")


def subgraph_like(data_table: str) -> str:
    """A ``LIKE`` pattern of the table's subgraph index names (checked with ``is_subgraph_name``)."""
    return subgraphs.name_prefix(data_table).replace("_", "\\_") + "%\\_g%"


def parse_version(value: str | None) -> tuple[int, ...]:
    if not value:
        return (0,)
    parts = []
    for piece in value.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


_LITTLE = sys.byteorder == "little"


def encode_vector(vec: array[float] | bytes) -> bytes:
    """pgvector's binary form: dimensions (int16), unused (int16), big-endian float32 values."""
    if isinstance(vec, bytes):
        return vec
    data = array("f", vec)
    if _LITTLE:
        data.byteswap()
    return struct.pack(">HH", len(data), 0) + data.tobytes()


def decode_vector(data: bytes) -> array[float]:
    out = array("f")
    out.frombytes(data[4:])
    if _LITTLE:
        out.byteswap()
    return out


# Prepared statements asyncpg keeps per vectors connection (its default is 100). A search's
# statements name the collection's table, so 1,000 collections searched in turn missed a cache
# of 100 on every search: a Parse round trip and PostgreSQL's parse and analysis again (searches
# of 1,000 small tables 1.5-5x the statement time of 10; issue 49 measured 1.32-1.55x the p50
# through the gateway). Each cached statement holds ~28 KB of the server process's memory
# (measured: a backend with 1,000 of them 42 MiB, with 100 14 MiB, 12 of which its catalog
# caches of the 1,000 tables); asyncpg closes the least recently used one past the bound.
STATEMENT_CACHE = 1024


def install_vector_codec(engine: AsyncEngine, ef_search: int) -> None:
    """Send and receive ``vector`` values in binary on every new connection of ``engine``
    (about 6x faster than pgvector's text form for a 500 x 384 batch), give each connection the
    default ``hnsw.ef_search`` (``PgVectorIndex`` tracks changes to it), and a statement cache
    of ``STATEMENT_CACHE``."""

    async def register(conn: Any) -> None:
        await conn.set_type_codec(
            "vector", schema="public", encoder=encode_vector, decoder=decode_vector, format="binary"
        )
        await conn.execute(f"SET hnsw.ef_search = {int(ef_search)}")
        resize_statement_cache(conn, STATEMENT_CACHE)  # this engine's alone

    @event.listens_for(engine.sync_engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.run_async(register)


def keyword_expr(field: str) -> str:
    """The expression a declared ``keyword`` field is indexed on (and compared with)."""
    return f"((payload ->> '{field}') COLLATE \"C\")"


def value_expr(field: str) -> str:
    """The expression a declared ``integer``/``float``/``bool`` field is indexed on."""
    return f"(payload -> '{field}')"


def payload_index_sql(coll: CollectionInfo, index: PayloadIndex) -> str:
    """``CREATE INDEX CONCURRENTLY`` of a declared payload index (a B-tree on an expression)."""
    expr = keyword_expr(index.field) if index.kind == "keyword" else value_expr(index.field)
    return create_index_sql(coll.data_table, index, expr, concurrently=True)


def compile_filter(node: Node | None, sql: SqlBuilder, declared: Mapping[str, PayloadKind] | None = None) -> str:
    """SQL for a filter tree on ``payload`` that the indexes can serve.

    Equality is plain containment (``payload @> {"k": v}``, which the payload GIN index serves)
    AND the exact typed test (containment alone would also match an array holding ``v``);
    ``$in`` is an OR of those. A condition on a declared field is written with the expression its
    B-tree index is on (a string equality on a declared ``keyword`` field with that alone). A
    negation is ``x IS NOT TRUE`` (see ``FilterSql``; AND and OR never turn a NULL into true).
    """
    return PgFilter(sql, declared or {}).compile(node)


class PgFilter(FilterSql):
    """Filters on the ``payload`` JSONB; operands are escaped as stored payloads are
    (``app.vectors.nulescape``). An index narrows an equality (the GIN index) or a range on a
    declared field."""

    def _key(self, key: str) -> str:
        # A declared field is a literal (checked by FIELD_PATTERN), so expression indexes match.
        return f"'{key}'" if key in self.declared else f"CAST({self.sql.bind(escape_text(key))} AS text)"

    def eq(self, node: Eq) -> str:
        sql = self.sql
        key = self._key(node.key)
        if self.declared.get(node.key) == "keyword" and isinstance(node.value, str):
            # The field's B-tree serves this alone. A containment beside it made PostgreSQL AND
            # in a GIN bitmap too: at 500,000 points a 0.1% filter took 43 ms instead of 2 ms.
            # The type test keeps a number 7 from matching "7" (``->>`` gives both as text).
            return (f"({keyword_expr(node.key)} = CAST({sql.bind(escape_text(node.value))} AS text) "
                    f"AND jsonb_typeof(payload -> {key}) = 'string')")
        # Numbers as payloads are stored (``jsonb_text``): 2.0**70 written 1.1805916207174113e+21
        # would be the decimal 1180591620717411300000 here, not the float a payload holds.
        hint = sql.bind(escape_json(_jsonb({node.key: node.value})))
        exact = f"(payload -> {key}) = CAST({sql.bind(escape_json(_jsonb(node.value)))} AS jsonb)"
        return f"(payload @> CAST({hint} AS jsonb) AND {exact})"

    def compare(self, node: Compare) -> str:
        key = self._key(node.key)
        op = COMPARE_SQL[node.op]
        if isinstance(node.value, str):
            value = self.sql.bind(escape_text(node.value))
            text_value = keyword_expr(node.key) if self.declared.get(node.key) == "keyword" else (
                f"((payload ->> {key}) COLLATE \"C\")"
            )
            return f"(jsonb_typeof(payload -> {key}) = 'string' AND {text_value} {op} CAST({value} AS text))"
        value = self.sql.bind(_jsonb(node.value))
        return f"(jsonb_typeof(payload -> {key}) = 'number' AND (payload -> {key}) {op} CAST({value} AS jsonb))"

    def exists(self, node: Exists) -> str:
        return f"((payload -> {self._key(node.key)}) IS NOT NULL)"

    def negate(self, condition: str) -> str:
        return f"(({condition}) IS NOT TRUE)"

    def serves(self, node: Eq | Compare) -> bool:
        if isinstance(node, Eq):
            return True
        kind = self.declared.get(node.key)
        return kind is not None and kind != "bool" and serves_value(kind, node.value)


def _jsonb(value: Any) -> str:
    """A filter's operand as JSON text for jsonb, its numbers written as payloads' are."""
    return jsonb_text(json.dumps(value), value).text


class _Positional(SqlBuilder):
    """Filter parameters as asyncpg's ``$n`` placeholders, numbered from ``first``."""

    def __init__(self, first: int) -> None:
        super().__init__()
        self.first = first
        self.args: list[Any] = []

    def bind(self, value: Any) -> str:
        self.args.append(value)
        return f"${self.first + len(self.args) - 1}"


def _args(sql: SqlBuilder) -> builtins.list[Any]:
    assert isinstance(sql, _Positional)
    return sql.args


class PgVectorIndex(VectorIndex):
    """``VectorIndex`` on PostgreSQL with pgvector."""

    name = "pgvector"
    dialect = "postgresql"
    filter_sql = PgFilter
    payload_text = "CAST({} AS text)"
    payload_column = payload_text.format("payload")

    def __init__(
        self, version: str, *, exact_threshold: int = 5000, ef_search: int = 100, calibrated: bool = True
    ) -> None:
        self.default_ef = ef_search
        self.calibrated = calibrated  # False: recall calibrations kept by an earlier run are not used
        self._gucs: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()
        self._forced: weakref.WeakSet[Any] = weakref.WeakSet()  # connections inside ``_walk_only``
        self.version = version
        self._v = parse_version(version)
        self.iterative_scan = self._v >= (0, 8)
        self.halfvec = self._v >= (0, 7)
        self.exact_threshold = exact_threshold
        self._stat_cache: dict[int, tuple[float, int, bool, recall.Calibration | None]] = {}
        self._sel_cache: dict[tuple[int, bytes], tuple[float, float]] = {}
        self._kw_cache: dict[int, tuple[float, dict[str, FieldStats]]] = {}
        self.feedback = feedback.Feedback()
        self._subgraph_cache: dict[int, frozenset[str]] = {}  # valid subgraphs, with ``_stat_cache``
        self._written: dict[int, float] = {}  # when this process last wrote points, with ``_stat_cache``

    def forget(self, coll_id: int, learned: bool = False) -> None:
        """Read the collection's size, index state and statistics again on its next search (an
        index built or dropped); ``learned``: its costs and corrections go too (reset, drop)."""
        self._stat_cache.pop(coll_id, None)
        self._subgraph_cache.pop(coll_id, None)
        self._kw_cache.pop(coll_id, None)
        self._written.pop(coll_id, None)
        if learned:
            self.feedback.forget(coll_id)

    def _wrote(self, coll_id: int) -> None:
        """Points were written: the collection's size is read again within ``STATS_TTL`` (``_stats``)."""
        now = time.monotonic()
        if len(self._written) > CACHE_ENTRIES:
            self._written.clear()
        self._written[coll_id] = now
        cached = self._stat_cache.get(coll_id)
        if cached is not None and cached[0] > now + STATS_TTL:
            self._stat_cache[coll_id] = (now + STATS_TTL, *cached[1:])

    # --- shape -----------------------------------------------------------------------------

    def index_kind(self, vector_size: int, requested: str) -> IndexKind:
        if requested == "exact":
            return "exact"
        if vector_size <= HNSW_MAX_DIMS:
            return "hnsw"
        if self.halfvec and vector_size <= HALFVEC_MAX_DIMS:
            return "hnsw_halfvec"
        return "exact"

    def _distance_expr(self, coll: CollectionInfo) -> str:
        return f"(embedding {_OPERATOR[coll.distance]} CAST(:q AS vector))"

    def _query_params(self, vector: array[float]) -> dict[str, Any]:
        return {"q": encode_vector(vector)}

    def _payload_out(self, stored: Any) -> str:
        return unescape_json(stored)

    def _vector_out(self, stored: Any) -> array[float]:
        vector: array[float] = stored  # decoded by the connection's codec
        return vector

    def _ids_in(self, ids: builtins.list[str]) -> tuple[str, Any]:
        return "id = ANY(CAST(:ids AS text[]))", ids

    def _ids_ordered(self, ids: builtins.list[str]) -> tuple[str, Any]:
        return "unnest(CAST(:ids AS text[])) WITH ORDINALITY AS x(id, n)", ids

    # --- collections -------------------------------------------------------------------------

    async def create(self, session: AsyncConnection, coll: CollectionInfo) -> None:
        t = coll.data_table
        n = int(coll.vector_size)
        terms = ", tf jsonb, dl integer" if coll.text_field is not None else ""
        await session.execute(
            text(
                f'CREATE TABLE {t} (id text COLLATE "C" PRIMARY KEY, embedding vector({n}) NOT NULL, '
                f"payload jsonb NOT NULL DEFAULT '{{}}'::jsonb{terms}){f' WITH ({TEXT_STORAGE})' if terms else ''}"
            )
        )
        # No HNSW index yet (see the module's docstring): the builder adds it in the background.
        await session.execute(text(f"CREATE INDEX {t}_payload ON {t} USING gin (payload jsonb_path_ops)"))
        if coll.text_field is not None:
            for stmt in text_statements(t, coll.text_table):
                await session.execute(text(stmt))

    async def drop(self, session: AsyncConnection, coll: CollectionInfo) -> None:
        await self._exclusive(session, coll, f"DROP TABLE IF EXISTS {coll.data_table}")
        await session.execute(text(f"DROP TABLE IF EXISTS {coll.text_table}"))

    async def reset(self, session: AsyncConnection, coll: CollectionInfo) -> None:
        # The index goes too: an empty collection is below index_min_rows, and a reload is then
        # bulk-inserted and indexed once instead of going into the graph row by row. TRUNCATE
        # fires no trigger: the text statistics are emptied with the points.
        tables = f"{coll.data_table}, {coll.text_table}" if coll.text_field is not None else coll.data_table
        await self._exclusive(session, coll, f"TRUNCATE {tables}")
        await session.execute(text(f"DROP INDEX IF EXISTS {hnsw_index_name(coll)}"))
        # Likewise the payload subgraphs: the builder chooses them again from the new points.
        for name, _, _ in await _subgraph_indexes(session, coll):
            await session.execute(text(f"DROP INDEX IF EXISTS {name}"))

    async def _exclusive(self, session: AsyncConnection, coll: CollectionInfo, stmt: str) -> None:
        """Run ``stmt`` (which needs the table's exclusive lock) without waiting for an index
        build: cancel builds on the table, then try with a bounded lock wait, and again."""
        params = {"t": coll.data_table, "app": BUILDER_APPLICATION_NAME}
        for _ in range(EXCLUSIVE_ATTEMPTS):
            await session.execute(text(_CANCEL_BUILDS), params)
            try:
                async with session.begin_nested():
                    await session.execute(text(f"SET LOCAL lock_timeout = {EXCLUSIVE_LOCK_TIMEOUT_MS}"))
                    await session.execute(text(stmt))
                    await session.execute(text("SET LOCAL lock_timeout TO DEFAULT"))
                break
            except DBAPIError as exc:
                if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                    raise
        else:
            await session.execute(text(_CANCEL_BUILDS), params)
            await session.execute(text(stmt))
        # A build that started between the cancel and our lock now waits for it: cancel it
        # too, or it would index the emptied table after our commit.
        await session.execute(text(_CANCEL_BUILDS), params)

    async def index_states(self, session: AsyncConnection, colls: list[CollectionInfo]) -> dict[int, IndexState]:
        states: dict[int, IndexState] = {c.id: "exact" for c in colls if c.index.get("kind") not in HNSW_KINDS}
        ids = [c.id for c in colls if c.id not in states]
        if not ids:
            return states
        rows = await session.execute(
            text(
                "SELECT x.id, i.indisvalid, "
                "EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.relid = to_regclass('vec_' || x.id) "
                "AND p.datid = (SELECT oid FROM pg_database WHERE datname = current_database())) "
                "OR EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid = CAST(:lock_class AS oid) AND l.objid = CAST(x.id AS oid) AND l.objsubid = 2 "
                "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())) "
                "FROM unnest(CAST(:ids AS integer[])) AS x(id) "
                "LEFT JOIN pg_index i ON i.indexrelid = to_regclass('vec_' || x.id || '_hnsw')"
            ),
            {"ids": ids, "lock_class": BUILD_LOCK_CLASS},
        )
        # An invalid index nobody is building (a crash left it) is pending: the sweep redoes it.
        for cid, valid, in_progress in rows:
            states[cid] = "ready" if valid else "building" if in_progress else "pending"
        return states

    async def payload_index_states(
        self, session: AsyncConnection, colls: list[CollectionInfo]
    ) -> dict[int, list[PayloadIndexState]]:
        declared = [(c, p) for c in colls for p in c.payload_indexes]
        out: dict[int, list[PayloadIndexState]] = {c.id: [] for c in colls}
        if not declared:
            return out
        rows = await session.execute(
            text(
                "SELECT n.name, i.indisvalid, p.phase, p.tuples_done, p.tuples_total, "
                "obj_description(to_regclass(n.t || '_payload'), 'pg_class'), obj_description(i.indexrelid, 'pg_class') "
                "FROM unnest(CAST(:names AS text[]), CAST(:tables AS text[])) AS n(name, t) "
                "LEFT JOIN pg_index i ON i.indexrelid = to_regclass(n.name) "
                "LEFT JOIN pg_stat_progress_create_index p ON p.index_relid = i.indexrelid"
            ),
            {"names": [sql_index_name(c.data_table, p) for c, p in declared], "tables": [c.data_table for c, _ in declared]},
        )
        found = {r[0]: r[1:] for r in rows}
        for c, p in declared:
            valid, phase, done, total, failures, comment = found.get(
                sql_index_name(c.data_table, p), (None, None, None, None, None, None)
            )
            failure = parse_payload_failures(failures).get(p.position)
            running = phase is not None
            if valid or running or failure is None:
                build = (parse_build_record(comment) if valid else
                         {"phase": phase, "tuples_done": int(done or 0), "tuples_total": int(total or 0)} if running else None)
                out[c.id].append(PayloadIndexState("ready" if valid else "building" if running else "pending", build=build))
            else:
                out[c.id].append(PayloadIndexState("failed", failure.error))
        return out

    async def subgraph_states(
        self, session: AsyncConnection, colls: builtins.list[CollectionInfo]
    ) -> dict[int, dict[int, tuple[int, int]]]:
        out: dict[int, dict[int, tuple[int, int]]] = {}
        for c in colls:
            keyword = [p.position for p in c.payload_indexes]
            if c.index.get("kind") not in HNSW_KINDS or not keyword:
                continue
            counts = {position: [0, 0] for position in keyword}
            for name, valid, running in await _subgraph_indexes(session, c):
                position = subgraphs.position_of(c.data_table, name)
                if position in counts and (valid or running):
                    counts[position][0 if valid else 1] += 1
            out[c.id] = {position: (built, building) for position, (built, building) in counts.items()}
        return out

    async def calibration(self, session: AsyncConnection, coll: CollectionInfo) -> recall.Calibration | None:
        if coll.index.get("kind") not in HNSW_KINDS or not self.calibrated:
            return None
        found = (await session.execute(text(_INDEX_COMMENT_NAMED), {"i": hnsw_index_name(coll)})).scalar()
        return recall.parse(found)

    async def build_progress(self, session: AsyncConnection, coll: CollectionInfo) -> dict[str, Any] | None:
        row = (
            await session.execute(
                text(
                    "SELECT CAST(p.index_relid AS regclass)::text, p.phase, p.tuples_done, p.tuples_total, "
                    "p.blocks_done, p.blocks_total FROM pg_stat_progress_create_index p "
                    "WHERE p.relid = to_regclass(:t) "
                    "AND p.datid = (SELECT oid FROM pg_database WHERE datname = current_database()) LIMIT 1"
                ),
                {"t": coll.data_table},
            )
        ).first()
        if row is None:
            return None
        return {
            "index": row[0], "phase": row[1], "tuples_done": int(row[2] or 0), "tuples_total": int(row[3] or 0),
            "blocks_done": int(row[4] or 0), "blocks_total": int(row[5] or 0),
        }

    # --- points --------------------------------------------------------------------------------

    async def upsert(self, session: AsyncConnection, coll: CollectionInfo, points: builtins.list[PointIn]) -> None:
        await super().upsert(session, coll, points)
        self._wrote(coll.id)

    async def delete(
        self, session: AsyncConnection, coll: CollectionInfo, ids: builtins.list[str] | None, flt: Node | None
    ) -> int:
        deleted = await super().delete(session, coll, ids, flt)
        if deleted:
            self._wrote(coll.id)
        return deleted

    async def _insert(self, session: AsyncConnection, coll: CollectionInfo, points: builtins.list[PointIn]) -> None:
        t = coll.data_table
        params: dict[str, Any] = {
            "ids": [p.id for p in points],
            "embs": [encode_vector(p.vector) for p in points],
            "payloads": [escape_json(p.payload_json) for p in points],
        }
        if coll.text_field is not None:
            params["tfs"] = [_tf_json(p.terms) for p in points]
            params["dls"] = [len(p.terms) if p.terms else None for p in points]
            stmt = (
                f"INSERT INTO {t} (id, embedding, payload, tf, dl) "
                "SELECT i, e, CAST(p AS jsonb), CAST(f AS jsonb), l "
                "FROM unnest(CAST(:ids AS text[]), CAST(:embs AS vector[]), CAST(:payloads AS text[]), "
                "CAST(:tfs AS text[]), CAST(:dls AS integer[])) AS u(i, e, p, f, l) "
                "ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding, "
                "payload = EXCLUDED.payload, tf = EXCLUDED.tf, dl = EXCLUDED.dl"
            )
        else:
            stmt = (
                f"INSERT INTO {t} (id, embedding, payload) "
                "SELECT i, e, CAST(p AS jsonb) "
                "FROM unnest(CAST(:ids AS text[]), CAST(:embs AS vector[]), CAST(:payloads AS text[])) "
                "AS u(i, e, p) "
                "ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding, payload = EXCLUDED.payload"
            )
        await session.execute(text(stmt), params)

    def _set_vector(self, vector: PointIn, params: dict[str, Any]) -> builtins.list[str]:
        params["emb"] = encode_vector(vector.vector)
        return ["embedding = CAST(:emb AS vector)"]

    def _set_payload(
        self, coll: CollectionInfo, payload_json: str, terms: builtins.list[str] | None, params: dict[str, Any]
    ) -> builtins.list[str]:
        params["payload"] = escape_json(payload_json)
        if coll.text_field is None:
            return ["payload = CAST(:payload AS jsonb)"]
        params["tf"] = _tf_json(terms)
        params["dl"] = len(terms) if terms else None
        return ["payload = CAST(:payload AS jsonb)", "tf = CAST(:tf AS jsonb)", "dl = CAST(:dl AS integer)"]

    async def _text_written(
        self, session: AsyncConnection, coll: CollectionInfo, pairs: builtins.list[tuple[str, builtins.list[str] | None]]
    ) -> None:
        pass  # the terms are columns of the row, written with it; the statistics by its triggers

    async def _text_deleting(self, session: AsyncConnection, coll: CollectionInfo, where: str, params: dict[str, Any]) -> None:
        pass  # likewise deleted with the row

    async def _text_rank(
        self, session: AsyncConnection, coll: CollectionInfo, terms: builtins.list[str], limit: int,
        flt: Node | None, also: builtins.list[str],
    ) -> TextRanking:
        """BM25 as FTS5 computes it, with MaxScore's bound, in one statement (``text_rank_sql``)
        on the search's driver connection, as the vector half runs: the terms sorted rarest
        first, the points holding the rarest ones (``essential``: as many as keep their postings
        within ``TEXT_CANDIDATES``, at least one) are scored on every term of the query and
        ranked; a point holding none of them scores at most the sum of the other terms' upper
        bounds (``app.vectors.text.upper_bound``), so every leading hit scoring above that sum
        is BM25's exact answer (``exact``). With the essential terms all the query's, they all are."""
        sql = _Positional(1)
        where = self.filter_sql(sql, coll.declared).compile(flt)
        args = list(sql.args)
        values: dict[str, Any] = {
            "terms": ["", *terms], "budget": float(TEXT_CANDIDATES), "floor": bm25.IDF_FLOOR, "k1p1": bm25.K1 + 1,
            "k1": bm25.K1, "omb": 1 - bm25.B, "b": bm25.B, "limit": int(limit), **{f"t{i}": t for i, t in enumerate(terms)},
        }
        if also:
            values["also"] = also
        placeholders = {}
        for name, value in values.items():
            args.append(value)
            placeholders[name] = f"${len(args)}"
        async with self._search_connection(session) as conn:
            rows = await conn.fetch(text_rank_sql(coll, len(terms), where, bool(also), placeholders), *args)
        hits = [(r[0], float(r[1])) for r in rows if not r[2]]
        hits.sort(key=lambda h: (-h[1], h[0]))  # UNION ALL keeps no order
        scores = {r[0]: float(r[1]) for r in rows if r[2]}
        bound = float(rows[0][3]) if rows else 0.0
        exact = next((i for i, (_, score) in enumerate(hits) if score <= bound), len(hits)) if bound > 0 else len(hits)
        return TextRanking(hits, {pid: scores.get(pid, 0.0) for pid in also}, exact)

    # --- search --------------------------------------------------------------------------------
    #
    # Searches run on the asyncpg connection under the request's SQLAlchemy connection, one
    # statement each: no ORM or statement compilation, and no BEGIN (SQLAlchemy begins lazily,
    # on its own first statement). ``hnsw.ef_search`` is a session setting of each connection,
    # set at connect time to the default and changed (one extra statement) only when a request
    # needs another value; ``_gucs`` remembers it.

    @asynccontextmanager
    async def _search_connection(self, session: Any) -> AsyncIterator[Any]:
        # The request's connection is checked out already: its pooled connection is at hand
        # without a trip through SQLAlchemy's greenlet (``get_raw_connection``), which only an
        # invalidated connection needs (to reconnect).
        sync = session.sync_connection
        pooled = sync.connection if sync is not None and not sync.invalidated else await session.get_raw_connection()
        conn = pooled.driver_connection
        try:
            yield conn
        except asyncpg.UndefinedTableError:
            self._forget(conn, pooled)  # a rolled-back transaction may take a SET with it
            raise MissingTable() from None
        except Exception as exc:
            # SQLAlchemy did not see the failure: raise what it would have (an unreachable or hung
            # database is a 503), and never pool a connection that may be broken.
            error = translate_driver_error(pooled, exc)
            self._forget(conn, pooled)
            raise error from exc
        except BaseException:
            self._forget(conn, pooled)
            raise

    def _forget(self, conn: Any, pooled: Any) -> None:
        """After a failed or interrupted search: the connection's settings are unknown, and one
        left with the planner's switches off (``_walk_only``) is never pooled again. Unknown is
        not the connect-time default: a SET made outside a transaction outlives the failure, so
        the next search on the connection sets what it needs whatever that is."""
        self._gucs[conn] = (-1, -1)
        if conn in self._forced:
            self._forced.discard(conn)
            if pooled.is_valid:
                pooled.invalidate()

    async def _settings(self, conn: Any, ef: int, scan_tuples: int) -> None:
        """``hnsw.ef_search``, and the iterative walk with ``scan_tuples`` as its bound (0: off)."""
        wanted = (ef, scan_tuples)
        if self._gucs.get(conn, (self.default_ef, 0)) == wanted:
            return
        stmt = f"SET hnsw.ef_search = {int(ef)}"
        if self.iterative_scan:
            # relaxed_order: pgvector's better recall; the statement re-sorts the walk's rows.
            stmt += "; SET hnsw.iterative_scan = " + ("relaxed_order" if scan_tuples else "off")
            if scan_tuples:  # the planner's bound on the walk, whatever the server's configuration says
                stmt += f"; SET hnsw.max_scan_tuples = {int(scan_tuples)}"
        self._gucs[conn] = (-1, -1)  # unknown until the SET is through
        await conn.execute(stmt)
        # Inside the request's transaction (its first look at a collection's registry row begins
        # one) the SET goes with the transaction's ROLLBACK: set it again next time. Seen on a
        # restarted gateway: every later search of the connection ran at the default ef_search.
        self._gucs[conn] = (-1, -1) if conn.is_in_transaction() else wanted

    @asynccontextmanager
    async def _walk_only(self, conn: Any) -> AsyncIterator[None]:
        """Sequential and bitmap scans off for one statement: the iterative walk as planned.

        PostgreSQL estimates a payload condition with a fixed guess (0.5% for a jsonb test) and
        would sort every match of a filter the gateway's planner sampled as common (a full scan
        of the table) instead of walking the graph. Turned on again after the statement (a
        payload GIN index is read only by bitmap scans, and the pooled connection serves other
        statements); a connection interrupted in between is not pooled again."""
        self._forced.add(conn)
        await conn.execute("; ".join(f"SET {name} = off" for name in WALK_ONLY))
        yield
        await conn.execute("; ".join(f"RESET {name}" for name in WALK_ONLY))
        self._forced.discard(conn)

    def _search_builder(self) -> SqlBuilder:
        return _Positional(2)  # $1 is the query vector

    async def _plan(self, conn: Any, search: Search) -> Plan:
        coll, flt = search.coll, search.flt
        hnsw = coll.index.get("kind") in HNSW_KINDS
        rows, ready, calibration = await self._stats(conn, coll) if hnsw else (0, False, None)
        selectivity = source = subgraph = None
        correction = feedback.Correction()
        if ready and flt is not None:
            selectivity, source = await self._selectivity(conn, coll, search, rows)
            correction = self.feedback.correction(coll.id, feedback.shape(flt))
            subgraph = await self._subgraph(conn, coll, flt, rows, min(1.0, selectivity * correction.matches))
        plan = choose(
            rows=rows, limit=search.limit, base_ef=self.default_ef, index_ready=ready, filtered=flt is not None,
            narrowed=search.narrowed, selectivity=selectivity, exact_threshold=self.exact_threshold,
            iterative=self.iterative_scan, fixed_ef=search.ef_search, subgraph=subgraph, calibration=calibration,
            costs=self.feedback.costs(coll.id), correction=correction.matches, local=correction.local,
        )
        plan.estimate = source
        return plan

    def _observe(self, search: Search, plan: Plan) -> None:
        """Teach the collection's costs and corrections (``app.vectors.feedback``) what the plan found."""
        coll, flt = search.coll, search.flt
        key = feedback.shape(flt) if flt is not None and plan.estimate is not None else None
        if plan.kind in GRAPH_PLANS:
            if plan.kind == "hnsw_iterative":
                # The walk's visits are not counted; one that ended short of limit matches at its
                # bound saw that few matches among max_scan_tuples points.
                candidates = int(plan.max_scan_tuples or 0) if plan.fallback else 0
                walked = int(plan.ef_search or 0) if not plan.fallback else int(plan.max_scan_tuples or 0)
                matched = search.matched
            else:
                candidates, walked, matched = int(plan.candidates or 0), int(plan.ef_search or 0), search.matched
            if plan.kind == "hnsw_subgraph":
                # A smaller graph, whose candidates are the equality's: neither the main graph's
                # cost nor the filter's share among its candidates.
                candidates = walked = 0
            self.feedback.graph(coll.id, key, plan.graph_share, candidates, matched, walked, search.graph_s * 1000)
        if search.matches is not None:
            raw = plan.estimated_matches / (plan.correction or 1.0) if plan.estimated_matches is not None else None
            scanned = 0 if search.narrowed or plan.rows is None else plan.rows
            self.feedback.exact(coll.id, key, raw, search.matches, search.exact_s * 1000, scanned)

    def _subgraph_conditions(
        self, coll: CollectionInfo, flt: Node, stats: Mapping[str, FieldStats]
    ) -> builtins.list[tuple[PayloadIndex, Eq, str, str]]:
        """The equalities on declared fields that ``flt`` requires (itself, or the conditions of
        its top AND), as (declaration, condition, stored value, the name their subgraph would
        have): a keyword field's string, another kind's value as its statistics spell it (a value
        they do not list as common has no subgraph)."""
        nodes = flt.nodes if isinstance(flt, And) else [flt]
        declared = {p.field: p for p in coll.payload_indexes}
        out = []
        for n in nodes:
            index = declared.get(n.key) if isinstance(n, Eq) else None
            if index is None or not isinstance(n, Eq):
                continue
            if index.kind == "keyword":
                if not isinstance(n.value, str):
                    continue
                stored = escape_text(n.value)
            else:
                field = stats.get(n.key)
                key = field.key(n.value) if field is not None else None
                literal = field.literal.get(key) if field is not None and key is not None else None
                if literal is None:
                    continue
                stored = literal
            out.append((index, n, stored, subgraphs.index_name(coll.data_table, index, stored)))
        return out

    async def _subgraph(
        self, conn: Any, coll: CollectionInfo, flt: Node, rows: int, selectivity: float
    ) -> Subgraph | None:
        """The smallest valid payload subgraph of an equality ``flt`` requires, or None."""
        valid = self._subgraph_cache.get(coll.id)
        if not valid:
            return None
        stats = await self._field_stats(conn, coll, rows)
        best = None
        for index, node, _, name in self._subgraph_conditions(coll, flt, stats):
            if name not in valid:
                continue
            field = stats.get(index.field)
            share = field.eq(node.value) if field is not None else None
            share = selectivity if share is None else share
            if best is None or share < best.share:
                best = Subgraph(name, max(share, selectivity))
        return best

    async def _graph(self, conn: Any, search: Search, plan: Plan) -> builtins.list[Hit]:
        ef = int(plan.ef_search or self.default_ef)
        iterative = plan.kind == "hnsw_iterative"
        await self._settings(conn, ef, int(plan.max_scan_tuples or ITERATIVE_SCAN_MAX) if iterative else 0)
        if plan.kind == "hnsw_subgraph":
            stmt = await self._subgraph_statement(conn, search, plan)
            if stmt is not None:
                return await self._fetch_hits(conn, search, stmt, counted=bool(plan.candidates))
        # Before pgvector 0.8 a filter is applied to the graph's ef_search candidates.
        candidates = ef if search.flt is not None and plan.kind == "hnsw" else 0
        stmt = graph_statement(search.coll, search.where, search.limit, candidates)
        if iterative:
            async with self._walk_only(conn):
                hits = await self._fetch_hits(conn, search, stmt)
            search.matched = len(hits)  # of at most max_scan_tuples walked
            return hits
        return await self._fetch_hits(conn, search, stmt, counted=bool(candidates))

    async def _subgraph_statement(self, conn: Any, search: Search, plan: Plan) -> str | None:
        """The search of ``plan``'s payload subgraph: the subgraph's predicate spelled as its
        index has it (a literal: PostgreSQL uses a partial index only for a query whose WHERE
        implies the index's, which a parameter cannot), the nearest ``candidates`` (or
        ``limit``) from it, and the whole filter on them."""
        coll = search.coll
        if search.flt is None:
            return None
        stats = await self._field_stats(conn, coll, int(plan.rows or 0))
        for index, _, stored, name in self._subgraph_conditions(coll, search.flt, stats):
            if name == plan.subgraph:
                take = max(search.limit, int(plan.candidates or 0))
                return subgraph_statement(coll, index, stored, search.where, search.limit, take, bool(plan.candidates))
        return None

    async def _stats(self, conn: Any, coll: CollectionInfo) -> tuple[int, bool, recall.Calibration | None]:
        """(estimated rows, HNSW index valid, the index's recall calibration) of a collection,
        cached (``STATS_TTL``, ``STABLE_STATS_TTL``) with its valid payload subgraphs
        (``_subgraph_cache``)."""
        now = time.monotonic()
        cached = self._stat_cache.get(coll.id)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2], cached[3]
        row = await conn.fetchrow(_STATS, coll.data_table, hnsw_index_name(coll), subgraph_like(coll.data_table))
        rows, ready = (int(row[0] or 0), bool(row[1])) if row is not None else (0, False)
        names = frozenset(row[2] or ()) if row is not None else frozenset()
        calibration = recall.parse(row[3]) if row is not None and ready and self.calibrated else None
        if len(self._stat_cache) > CACHE_ENTRIES:
            self._stat_cache.clear()
            self._subgraph_cache.clear()
            self._written.clear()
        written = now - self._written.get(coll.id, -STABLE_STATS_TTL) < STABLE_STATS_TTL
        ttl = STATS_TTL if written or (not ready and rows >= SMALL_ROWS) else STABLE_STATS_TTL
        self._stat_cache[coll.id] = (now + ttl, rows, ready, calibration)
        if self._subgraph_cache.get(coll.id, names) != names:
            # The builder chose subgraphs from newer statistics than the cached ones: read them
            # again, or a new subgraph's value would be estimated as rare for up to 30 s.
            self._kw_cache.pop(coll.id, None)
        self._subgraph_cache[coll.id] = names
        return rows, ready, calibration

    async def _selectivity(self, conn: Any, coll: CollectionInfo, search: Search, rows: int) -> tuple[float, str]:
        """The share of points the search's filter keeps, and how it was estimated: from the
        statistics of the declared fields when it only tests equalities on those
        (``app.vectors.estimate``), otherwise from a block sample of about ``SAMPLE_ROWS`` points
        (``TABLESAMPLE SYSTEM``: reads only the sampled pages, never the whole table), cached for
        ``SELECTIVITY_TTL`` seconds per collection and filter."""
        fields = await self._field_stats(conn, coll, rows)
        share = estimate(search.flt, fields) if fields else None
        if share is not None:
            return share, "statistics"
        args = _args(search.sql)
        # A digest, not the filter's values: those are the client's (up to a body's size each),
        # and the cache holds CACHE_ENTRIES of them.
        key = (coll.id, hashlib.blake2b(repr((search.where, args)).encode(), digest_size=16).digest())
        now = time.monotonic()
        cached = self._sel_cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1], "sample"
        pct = 100.0 if rows <= SAMPLE_ROWS else max(0.01, 100.0 * SAMPLE_ROWS / rows)
        # ``where`` is numbered from $2 (the search's $1 is the query vector; here the percentage).
        row = await conn.fetchrow(
            f"SELECT count(*) FILTER (WHERE {search.where}), count(*) FROM {coll.data_table} "
            "TABLESAMPLE SYSTEM (CAST($1 AS real)) REPEATABLE (0)",
            pct, *args,
        )
        hits, seen = int(row[0]), int(row[1])
        # Half a hit when none was seen: an upper-ish estimate for a rare filter.
        selectivity = (hits if hits else 0.5) / seen if seen else 1.0
        if len(self._sel_cache) > CACHE_ENTRIES:
            self._sel_cache.clear()
        self._sel_cache[key] = (now + SELECTIVITY_TTL, selectivity)
        return selectivity, "sample"

    async def _field_stats(self, conn: Any, coll: CollectionInfo, rows: int) -> dict[str, FieldStats]:
        """``ANALYZE``'s statistics of each declared field's index expression (none before the
        table is analyzed with the index), cached for ``SELECTIVITY_TTL`` seconds."""
        names = {sql_index_name(coll.data_table, p): p for p in coll.payload_indexes}
        if not names:
            return {}
        now = time.monotonic()
        cached = self._kw_cache.get(coll.id)
        if cached is not None and cached[0] > now:
            return cached[1]
        found = {
            names[r[0]].field: declared_stats(r, rows, names[r[0]].kind, unescape_text)
            for r in await conn.fetch(FIELD_STATS, list(names))
        }
        if len(self._kw_cache) > CACHE_ENTRIES:
            self._kw_cache.clear()
        self._kw_cache[coll.id] = (now + SELECTIVITY_TTL, found)
        return found

    async def _exact(self, conn: Any, search: Search) -> builtins.list[Hit]:
        # OFFSET 0 keeps the ORDER BY away from the HNSW index (exact), while the payload
        # indexes still narrow the rows of a filter; only the k answers' payloads become text.
        # A filtered search counts the matches it compared (the plan's ``found_matches``, and
        # what the planner learns from): over ids and distances only, the k answers' rows read
        # again by their key for the payloads.
        coll = search.coll
        t = coll.data_table
        distance = f"(embedding {_OPERATOR[coll.distance]} $1)"
        if search.flt is None:
            stmt = (f"SELECT id, p, d FROM (SELECT id, payload AS p, {distance} AS d FROM {t} OFFSET 0) s "
                    f"ORDER BY d, id LIMIT {search.limit}")
            return await self._fetch_hits(conn, search, stmt)
        stmt = (
            f"SELECT k.id, t.payload AS p, k.d, k.n FROM (SELECT id, d, count(*) OVER () AS n FROM "
            f"(SELECT id, {distance} AS d FROM {t} WHERE {search.where} OFFSET 0) s ORDER BY d, id "
            f"LIMIT {search.limit}) k JOIN {t} t ON t.id = k.id"
        )
        return await self._fetch_hits(conn, search, stmt, counted=True, exact=True)

    async def _fetch_hits(
        self, conn: Any, search: Search, stmt: str, counted: bool = False, exact: bool = False
    ) -> builtins.list[Hit]:
        """The hits of one of the plans' statements (``id``, raw payload ``p``, distance ``d``
        against ``$1``, the filter's arguments from ``$2``), with their payloads within the
        search's byte budget (``budgeted_hits``); ``counted``: the statement's column ``n`` is
        the matches it saw (an ``exact`` plan's, or among a graph plan's candidates)."""
        rows = await conn.fetch(self.budgeted_hits(stmt, search.budget, counted), search.q["q"], *_args(search.sql))
        if counted:
            n = int(rows[0][3]) if rows else 0
            if exact:
                search.matches = n
            else:
                search.matched = n
        return self._hits(rows)


def graph_statement(coll: CollectionInfo, where: str, limit: int, candidates: int) -> str:
    """A graph search against ``$1``. With a filter and ``candidates`` > 0: the ``candidates``
    nearest from the graph, then the filter on them, counted (``n``) (what pgvector before 0.8
    does with a WHERE anyway, but spelled out so that PostgreSQL cannot pick a payload index and
    sort every match instead); otherwise the filter in the index scan's WHERE (pgvector 0.8's
    iterative scan walks on until ``limit`` rows pass it; its rows, in relaxed order, are sorted
    again by ``budgeted_hits``)."""
    op = _OPERATOR[coll.distance]
    t = coll.data_table
    order = _graph_order(coll)
    if candidates:
        return (
            f"SELECT id, payload AS p, d, count(*) OVER () AS n FROM (SELECT id, payload, (embedding {op} $1) AS d "
            f"FROM {t} ORDER BY {order} LIMIT {int(candidates)}) c WHERE {where} ORDER BY d, id LIMIT {limit}"
        )
    # A subquery: the index's order is not the answer's (half precision for hnsw_halfvec, whose
    # candidates are re-ranked by the exact distance; the iterative walk's relaxed order).
    return (
        f"SELECT * FROM (SELECT id, payload AS p, (embedding {op} $1) AS d "
        f"FROM {t} WHERE {where} ORDER BY {order} LIMIT {limit}) c"
    )


def _graph_order(coll: CollectionInfo) -> str:
    """The ORDER BY expression that the collection's HNSW index (and its subgraphs) serve, against
    ``$1``: half precision for ``hnsw_halfvec``, which is then re-ranked by the exact distance."""
    op = _OPERATOR[coll.distance]
    if coll.index.get("kind") == "hnsw_halfvec":
        n = int(coll.vector_size)
        return f"(CAST(embedding AS halfvec({n})) {op} CAST($1 AS halfvec({n})))"
    return f"(embedding {op} $1)"


async def _subgraph_indexes(session: AsyncConnection, coll: CollectionInfo) -> builtins.list[tuple[str, bool, bool]]:
    """The collection's payload subgraph indexes: (name, valid, being built)."""
    t = coll.data_table
    rows = await session.execute(text(_SUBGRAPH_INDEXES_NAMED), {"t": t, "like": subgraph_like(t)})
    return [(r[0], r[1], r[2]) for r in rows if subgraphs.is_subgraph_name(t, r[0])]


def subgraph_statement(
    coll: CollectionInfo, index: PayloadIndex, stored_value: str, where: str, limit: int, take: int, counted: bool = False
) -> str:
    """A search of the payload subgraph of ``index``'s field = ``stored_value``: its ``take``
    nearest points (``$1``: the query vector), then ``where`` (the search's whole filter,
    numbered from ``$2``) on them, nearest first; ``counted``: with how many passed it (``n``)."""
    op = _OPERATOR[coll.distance]
    order = _graph_order(coll)
    n = ", count(*) OVER () AS n" if counted else ""
    return (
        f"SELECT id, payload AS p, d{n} FROM (SELECT id, payload, (embedding {op} $1) AS d "
        f"FROM {coll.data_table} WHERE {subgraph_predicate(index, stored_value)} ORDER BY {order} "
        f"LIMIT {int(take)}) c WHERE {where} ORDER BY d, id LIMIT {int(limit)}"
    )


async def detect_version(session_or_conn: Any) -> str | None:
    """The installed pgvector version, or None when the extension is missing."""
    result = await session_or_conn.execute(
        text("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
    )
    version: str | None = result.scalar_one_or_none()
    return version


def calibration_statements(coll: CollectionInfo, k: int) -> tuple[str, str, str]:
    """The statements of a recall calibration (``app.vectors.recall``): a uniform sample of
    ``$2`` points as (id, vector) (``$1``: the percentage of rows Bernoulli keeps first), and the
    ids of the ``k`` nearest of ``$1`` compared exactly (``OFFSET 0`` keeps the ORDER BY away
    from the graph) and through the graph (what an unfiltered search runs)."""
    op = _OPERATOR[coll.distance]
    t = coll.data_table
    sample = f"SELECT id, embedding FROM {t} TABLESAMPLE BERNOULLI (CAST($1 AS real)) ORDER BY random() LIMIT $2"
    exact = f"SELECT id FROM (SELECT id, (embedding {op} $1) AS d FROM {t} OFFSET 0) s ORDER BY d, id LIMIT {int(k)}"
    if coll.index.get("kind") == "hnsw_halfvec":
        graph = (
            f"SELECT id FROM (SELECT id, (embedding {op} $1) AS d FROM {t} ORDER BY {_graph_order(coll)} "
            f"LIMIT {int(k)}) c ORDER BY d, id"
        )
    else:
        graph = f"SELECT id FROM {t} ORDER BY {_graph_order(coll)} LIMIT {int(k)}"
    return sample, exact, graph
