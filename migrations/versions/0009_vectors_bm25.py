"""Hybrid search ranks text by BM25 alike on both backends: the gateway's terms, a language each

Revision ID: 0009
Revises: 0008

The registry gets ``text_language`` (``english`` for the collections that have a text field,
which were stemmed as English before). Each such collection is indexed again with the gateway's
tokenizer (``app.vectors.text``), its points read in pages of ``PAGE`` by id:

- PostgreSQL: the ``tsv`` column becomes ``tf`` (term counts) and ``dl`` (length), with their
  GIN index, the term statistics table ``fts_<id>`` (filled here) and the statement triggers
  that keep it, running ``gateway_text_stats()`` (made here);
- SQLite: the FTS5 table ``fts_<id>`` is made again over the terms (``ascii`` tokenizer).

Downgrade goes back to ``to_tsvector('english', ...)`` and FTS5's ``porter unicode61``.
"""

from __future__ import annotations

import json
from typing import Any

from alembic import op
import sqlalchemy as sa

from app.vectors.pgvector import TEXT_STATS_FUNCTION, TEXT_STORAGE, text_statements
from app.vectors.sqlite_vec import fts_body, fts_table_sql
from app.vectors.text import document_terms, text_of

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

PAGE = 1000


def upgrade(engine_name: str) -> None:
    globals()[f"upgrade_{engine_name}"]()


def downgrade(engine_name: str) -> None:
    globals()[f"downgrade_{engine_name}"]()


def upgrade_metadata() -> None:
    pass


def downgrade_metadata() -> None:
    pass


def _text_collections(bind: sa.Connection) -> list[tuple[int, str]]:
    rows = bind.execute(sa.text("SELECT id, text_field FROM vector_collections WHERE text_field IS NOT NULL ORDER BY id"))
    return [(int(r[0]), str(r[1])) for r in rows]


def _pages(bind: sa.Connection, stmt: str, params: dict[str, Any]) -> Any:
    """The rows of ``stmt`` (``:after`` the last key, ``LIMIT :page``; first column the key), a
    page at a time."""
    after: Any = None
    while True:
        rows = bind.execute(sa.text(stmt), {**params, "after": after, "page": PAGE}).all()
        if not rows:
            return
        yield rows
        after = rows[-1][0]


def upgrade_vectors() -> None:
    with op.batch_alter_table("vector_collections") as batch:
        batch.add_column(sa.Column("text_language", sa.String(32), nullable=True,
                                   comment="Stemmer of the text field's terms (app.vectors.text)."))
    bind = op.get_bind()
    bind.execute(sa.text("UPDATE vector_collections SET text_language = 'english' WHERE text_field IS NOT NULL"))
    if bind.dialect.name == "postgresql":
        op.execute(TEXT_STATS_FUNCTION)
        for cid, field in _text_collections(bind):
            _upgrade_postgres(bind, cid, field)
    else:
        for cid, field in _text_collections(bind):
            _upgrade_sqlite(bind, cid, field)


def _upgrade_postgres(bind: sa.Connection, cid: int, field: str) -> None:
    t, s = f"vec_{cid}", f"fts_{cid}"
    op.execute(f"ALTER TABLE {t} ADD COLUMN tf jsonb, ADD COLUMN dl integer")
    op.execute(f"ALTER TABLE {t} SET ({TEXT_STORAGE})")
    stmt = (f"SELECT id, CAST(payload -> CAST(:field AS text) AS text) FROM {t} "
            "WHERE CAST(:after AS text) IS NULL OR id > :after ORDER BY id LIMIT :page")
    for rows in _pages(bind, stmt, {"field": field}):
        ids, tfs, dls = [], [], []
        for pid, value in rows:
            terms = document_terms(text_of({"f": json.loads(value)} if value else None, "f"), "english")
            if terms:
                counts: dict[str, int] = {}
                for term in terms:
                    counts[term] = counts.get(term, 0) + 1
                ids.append(pid)
                tfs.append(json.dumps(counts, ensure_ascii=False))
                dls.append(len(terms))
        if ids:
            bind.execute(sa.text(
                f"UPDATE {t} SET tf = CAST(u.f AS jsonb), dl = u.l FROM unnest(CAST(:ids AS text[]), "
                "CAST(:tfs AS text[]), CAST(:dls AS integer[])) AS u(i, f, l) WHERE id = u.i"
            ), {"ids": ids, "tfs": tfs, "dls": dls})
    op.execute(f"ALTER TABLE {t} DROP COLUMN IF EXISTS tsv")
    for ddl in text_statements(t, s):
        op.execute(ddl)
    op.execute(
        f"INSERT INTO {s} (term, shard, df, len) "
        f"SELECT k.term, 0, count(*), 0 FROM {t}, jsonb_object_keys(tf) AS k(term) GROUP BY k.term "
        f"UNION ALL SELECT '', 0, count(*), coalesce(sum(dl), 0) FROM {t} WHERE tf IS NOT NULL"
    )


def _upgrade_sqlite(bind: sa.Connection, cid: int, field: str) -> None:
    t, s = f"vec_{cid}", f"fts_{cid}"
    op.execute(f"DROP TABLE IF EXISTS {s}")
    op.execute(fts_table_sql(s))
    stmt = f"SELECT rid, payload FROM {t} WHERE :after IS NULL OR rid > :after ORDER BY rid LIMIT :page"
    for rows in _pages(bind, stmt, {}):
        bodies = []
        for rid, payload in rows:
            terms = document_terms(text_of(json.loads(payload), field), "english")
            if terms:
                bodies.append({"rid": rid, "body": fts_body(terms)})
        if bodies:
            bind.execute(sa.text(f"INSERT INTO {s} (rowid, body) VALUES (:rid, :body)"), bodies)


def downgrade_vectors() -> None:
    bind = op.get_bind()
    collections = _text_collections(bind)
    if bind.dialect.name == "postgresql":
        for cid, field in collections:
            t = f"vec_{cid}"
            for event in ("insert", "update", "delete"):
                op.execute(f"DROP TRIGGER IF EXISTS {t}_text_{event} ON {t}")
            op.execute(f"DROP TABLE IF EXISTS fts_{cid}")
            op.execute(f"ALTER TABLE {t} DROP COLUMN IF EXISTS tf, DROP COLUMN IF EXISTS dl, ADD COLUMN tsv tsvector")
            op.execute(f"ALTER TABLE {t} RESET (toast_tuple_target)")
            value = "payload -> CAST(:field AS text)"
            bind.execute(sa.text(
                f"UPDATE {t} SET tsv = to_tsvector('english', CASE jsonb_typeof({value}) "
                f"WHEN 'string' THEN payload ->> CAST(:field AS text) WHEN 'array' THEN (SELECT string_agg(e, ' ') FROM "
                f"jsonb_array_elements_text({value}) AS e) END) WHERE {value} IS NOT NULL"
            ).bindparams(field=field))
            op.execute(f"CREATE INDEX {t}_tsv ON {t} USING gin (tsv)")
        op.execute("DROP FUNCTION IF EXISTS gateway_text_stats()")
    else:
        for cid, field in collections:
            t, s = f"vec_{cid}", f"fts_{cid}"
            op.execute(f"DROP TABLE IF EXISTS {s}")
            op.execute(f"CREATE VIRTUAL TABLE {s} USING fts5(body, tokenize='porter unicode61')")
            rows = bind.execute(sa.text(f"SELECT rid, payload FROM {t}")).all()
            bodies = [{"rid": rid, "body": text} for rid, payload in rows if (text := text_of(json.loads(payload), field))]
            if bodies:
                bind.execute(sa.text(f"INSERT INTO {s} (rowid, body) VALUES (:rid, :body)"), bodies)
    with op.batch_alter_table("vector_collections") as batch:
        batch.drop_column("text_language")


def upgrade_checkpoints() -> None:
    pass


def downgrade_checkpoints() -> None:
    pass
