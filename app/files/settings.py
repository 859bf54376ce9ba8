"""Settings of the files capability (``files:`` in the gateway's settings): where file bytes
live (database chunks, an S3 bucket or a local directory) and housekeeping of uploads."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

S3_MAX_PARTS = 10_000  # parts of one S3 multipart upload


class S3Settings(BaseModel):
    """The bucket of ``files.backend: s3``; credentials come from the standard AWS chain."""

    model_config = ConfigDict(extra="forbid")

    endpoint_url: str | None = Field(
        default=None, description="S3 API URL (MinIO, SeaweedFS, R2, ...); unset: AWS S3 of `region`."
    )
    region: str = Field(default="us-east-1", description="Region of the bucket (signs requests).")
    bucket: str | None = Field(default=None, description="Bucket holding file bytes (required for s3).")
    prefix: str = Field(default="files/", max_length=512, description="Key prefix of every object the gateway writes.")
    addressing: Literal["auto", "path", "virtual"] = Field(
        default="auto",
        description="`path` (bucket in the URL path) or `virtual` (bucket in the host name); "
        "`auto`: path with an `endpoint_url`, virtual on AWS.",
    )
    server_side_encryption: Literal["AES256", "aws:kms"] | None = Field(
        default=None, description="SSE of new objects: `AES256` (SSE-S3) or `aws:kms`."
    )
    kms_key_id: str | None = Field(default=None, description="KMS key of `aws:kms` (default: the bucket's).")
    part_bytes: int = Field(
        default=8 * 1024 * 1024, ge=5 * 1024 * 1024, le=1024**3,
        description="Multipart upload part size (each upload buffers at most two parts); S3 takes at most "
        "10,000 parts, so `limits.max_file_bytes` may be at most 10,000 times this.",
    )
    max_connections: int = Field(
        default=100, ge=1,
        description="HTTP connections kept to the S3 endpoint, per pool: one for downloads, one for every other "
        "call. Downloads from the bucket in progress at once are at most this many, and one namespace's at most "
        "`files.max_downloads_per_namespace` (default: half); more are 503 with Retry-After.",
    )
    connect_timeout: float = Field(default=5.0, gt=0, description="Seconds to wait for a connection to S3.")
    read_timeout: float = Field(default=30.0, gt=0, description="Seconds an S3 response may stay silent.")
    presign_downloads: bool = Field(
        default=False, description="Answer downloads with a redirect to a short-lived presigned URL."
    )
    presign_seconds: int = Field(default=300, ge=1, le=7 * 24 * 3600, description="Lifetime of a presigned URL.")
    splice_downloads: bool = Field(
        default=True,
        description="Move a download of 4 MiB or more from the S3 connection to the client's in the kernel "
        "(Linux `splice`; plain-HTTP endpoint without a proxy, client without TLS to the gateway).",
    )

    @field_validator("prefix")
    @classmethod
    def _prefix_shape(cls, value: str) -> str:
        if value.startswith("/") or ".." in value.split("/"):
            raise ValueError("must not start with / or contain .. segments")
        return value if value == "" or value.endswith("/") else value + "/"

    def path_style(self) -> bool:
        return self.addressing == "path" or (self.addressing == "auto" and self.endpoint_url is not None)


FilesBackendName = Literal["database", "s3", "directory"]


class DirectorySettings(BaseModel):
    """The local directory of ``files.backend: directory`` (one machine: every worker shares it)."""

    model_config = ConfigDict(extra="forbid")

    path: Path | None = Field(default=None, description="Where file bytes are written (default: `files` in `data_dir`).")
    fsync: bool = Field(
        default=True,
        description="Flush each new file to disk before its row is committed (off: a power cut may "
        "lose recent files' bytes while their rows survive).",
    )


class FilesSettings(BaseModel):
    """Where file bytes live, and housekeeping of uploads in progress."""

    model_config = ConfigDict(extra="forbid")

    backend: FilesBackendName | None = Field(
        default=None,
        description="Where new file bytes go: `database` chunks, an `s3` bucket or a local `directory`; unset: "
        "`directory` when the metadata database is SQLite (the embedded default), else `database`.",
    )
    s3: S3Settings = S3Settings()
    directory: DirectorySettings = DirectorySettings()
    upload_stale_seconds: float = Field(
        default=600.0, gt=0, description="An upload whose body stopped arriving for this long is abandoned and swept (its "
        "heartbeat is touched with every stored chunk, and a few times per this while bytes still arrive)."
    )
    sweep_interval_seconds: float = Field(default=60.0, gt=0, description="How often abandoned uploads are swept.")
    max_downloads: int | None = Field(
        default=None, ge=1,
        description="Downloads in progress per process, each holding a metadata connection while its client reads "
        "(database chunks: for at most download_snapshot_seconds) (default: half of the metadata pool_size + "
        "max_overflow); more are 503 with Retry-After.",
    )
    download_snapshot_seconds: float = Field(
        default=60.0, gt=0,
        description="A download of a file stored as several database chunks reads them in one snapshot (a replace or "
        "delete meanwhile does not change what it sends) for at most this long; a download still running then reads "
        "each further chunk on its own, and is cut off short if the file was replaced or deleted meanwhile. Bounds how "
        "long a slow client holds back PostgreSQL's VACUUM or SQLite's WAL checkpoints, and a pooled connection.",
    )
    max_downloads_per_namespace: int | None = Field(
        default=None, ge=1, description="Of those, how many one namespace may hold (default: half of max_downloads); "
        "also how many downloads from the bucket one namespace may hold (default: half of files.s3.max_connections).",
    )
    inline_types: list[str] = Field(
        default_factory=list,
        description="Media types served inline besides images, audio, video, text/plain and JSON (e.g. `text/html`): "
        "all others are downloads (`Content-Disposition: attachment`), since they could run as pages of the gateway.",
    )
    inline_types_by_namespace: dict[str, list[str]] = Field(
        default_factory=dict,
        description="More media types served inline in one namespace only, by namespace (e.g. "
        "`{\"site\": [\"text/html\"]}` for a plugin that serves pages on purpose).",
    )

    @model_validator(mode="after")
    def _s3_has_bucket(self) -> FilesSettings:
        if self.backend == "s3" and not self.s3.bucket:
            raise ValueError("files.backend is s3 but files.s3.bucket is not set")
        return self
