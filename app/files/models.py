"""Tables of the files capability (metadata database).

A file is a row in ``files`` that points at a blob: the blob's bytes live either in
``file_chunks`` as fixed-size chunks (``chunk_bytes``, recorded per file so a changed setting
never misreads old blobs) or, when ``object_key`` is set, in the S3 bucket under that key, or in
a file of the local directory when the key starts with ``/`` (``app.files.local``). An upload writes a new blob beside the old one and swaps the pointer in one transaction;
``file_uploads`` lists blobs still being written, so chunks of a crashed upload can be swept.
Invariant: every chunk's blob is either pointed at by exactly one ``files`` row or listed in
``file_uploads``.
"""

from sqlalchemy import BigInteger, Column, Integer, LargeBinary, String, Table

from app.core.db.tables import KeyColumn, NameColumn, UtcDateTime, metadata_db

BLOB_ID_LENGTH = 32

files = Table(
    "files",
    metadata_db,
    Column("namespace", NameColumn, primary_key=True),
    Column("collection", NameColumn, primary_key=True),
    Column("file_id", KeyColumn, primary_key=True),
    Column("blob_id", String(BLOB_ID_LENGTH), nullable=False, unique=True),
    Column("size", BigInteger, nullable=False),
    Column("chunk_bytes", Integer, nullable=False),
    Column("object_key", String(1024), nullable=True),
    Column("content_type", String(255), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
)

file_chunks = Table(
    "file_chunks",
    metadata_db,
    Column("blob_id", String(BLOB_ID_LENGTH), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("data", LargeBinary, nullable=False),
)

# Blobs being written; touched_at is refreshed with every chunk (a heartbeat for the sweeper).
file_uploads = Table(
    "file_uploads",
    metadata_db,
    Column("blob_id", String(BLOB_ID_LENGTH), primary_key=True),
    Column("started_at", UtcDateTime, nullable=False),
    Column("touched_at", UtcDateTime, nullable=False, index=True),
)
