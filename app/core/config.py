"""Settings: environment variables (``GATEWAY_``, nested with ``__``) over an optional YAML file.

The seed's ``persistence:`` block is accepted as written; each database may also be given a full
URL under ``databases.<name>.url``. Resolution of the three database URLs lives here and nowhere
else, so the rest of the service only ever sees ``Settings.database_url(Database.X)``. A
capability's own section lives in its package (``app/files/settings.py``, ...); ``Settings`` composes them.
"""

from __future__ import annotations

import os
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from app.auth.settings import AuthSettings
from app.checkpoints.settings import CheckpointsSettings
from app.fairness.settings import FairnessSettings
from app.files.settings import S3_MAX_PARTS, FilesBackendName, FilesSettings
from app.kv.settings import KvSettings
from app.quotas.settings import QuotasSettings
from app.store.settings import StoreSettings
from app.vectors.settings import VectorsSettings

CONFIG_ENV = "GATEWAY_CONFIG"


class Database(StrEnum):
    """The three databases of the seed's multi-database layout, and what each holds.

    - ``metadata``: kv values, files (their rows, and their bytes when ``files.backend`` is
      ``database``) and API keys;
    - ``vectors``: vector collections, one table of points each, and Idempotency-Key answers;
    - ``checkpoints``: LangGraph checkpoints (threads, checkpoints, channel values, pending
      writes) and records.

    Records live in the checkpoints database because the product contract puts them there
    (CONTRACT.md section 1, after the seed's layout), so an operator's three databases stay the
    ones the seed names; a capability's ``database`` says where it lives
    (``app.core.capability``).
    """

    metadata = "metadata"
    vectors = "vectors"
    checkpoints = "checkpoints"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatabaseSettings(_Strict):
    """One database: an optional full URL and its pool."""

    url: str | None = Field(
        default=None,
        description="Full SQLAlchemy or libpq URL; overrides the persistence block for this database.",
    )
    pool_size: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="Connections kept open in the pool; keep it at or above the requests served at once.",
    )
    max_overflow: int = Field(
        default=10,
        ge=0,
        le=1000,
        description="Extra connections for short peaks (each is closed again after one use).",
    )
    pool_timeout: float = Field(default=5.0, gt=0, description="Seconds to wait for a pooled connection.")
    connect_timeout: float = Field(default=5.0, gt=0, description="Seconds to wait for a new connection.")
    statement_timeout: float = Field(
        default=30.0, gt=0, description="Seconds a single statement may run (PostgreSQL)."
    )
    inline_budget_ms: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description="SQLite: a request's one statement (a read, or a write that finds the lock free) runs "
        "on the event loop's thread for at most this long, else it is sent through the pool; 0: never.",
    )


class FastPathSettings(_Strict):
    """The pieces of ``app.core.fast``, each serving ``@fast`` routes faster than the plain path
    (off: the same routes answer the same, served plainly)."""

    plans: bool = Field(
        default=True, description="`@fast` routes solve their dependencies from a plan built once at start-up."
    )
    one_statement: bool = Field(
        default=True,
        description="`@fast(one_statement=...)` routes run their statement on a pooled driver connection "
        "in autocommit, without BEGIN/COMMIT.",
    )
    inline_sqlite: bool = Field(
        default=True,
        description="SQLite: those statements (and a file's version swap) run on the event loop's thread "
        "within `databases.*.inline_budget_ms` (needs `one_statement`).",
    )


class DatabasesSettings(_Strict):
    metadata: DatabaseSettings = DatabaseSettings()
    vectors: DatabaseSettings = DatabaseSettings()
    checkpoints: DatabaseSettings = DatabaseSettings()

    def get(self, db: Database) -> DatabaseSettings:
        settings: DatabaseSettings = getattr(self, db.value)
        return settings


class PostgresDatabases(_Strict):
    metadata: str = Field(default="soothe_metadata", description="Database name on the base DSN's server.")
    vectors: str = Field(default="soothe_vectors", description="Database name on the base DSN's server.")
    checkpoints: str = Field(default="soothe_checkpoints", description="Database name on the base DSN's server.")


class PersistenceSettings(_Strict):
    """The seed's ``persistence:`` block, accepted exactly as written."""

    vector_store_backend: Literal["pgvector", "sqlite_vec"] | None = Field(
        default=None,
        description="pgvector or sqlite_vec; defaults to pgvector when postgres_base_dsn is set.",
    )
    postgres_base_dsn: str | None = Field(
        default=None, description="postgresql://user:pass@host:port; the three databases live on it."
    )
    postgres_databases: PostgresDatabases = PostgresDatabases()
    vector_sqlite_path: Path | None = Field(default=None, description="SQLite file of vectors (default DATA_DIR/vectors.db).")
    metadata_sqlite_path: Path | None = Field(default=None, description="SQLite file of metadata (default DATA_DIR/metadata.db).")
    checkpoints_sqlite_path: Path | None = Field(
        default=None, description="SQLite file of records and checkpoints (default DATA_DIR/checkpoints.db)."
    )

    @field_validator("vector_sqlite_path", "metadata_sqlite_path", "checkpoints_sqlite_path")
    @classmethod
    def _expand_user(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @field_validator("postgres_base_dsn")
    @classmethod
    def _postgres_scheme(cls, value: str | None) -> str | None:
        if value and not value.split("://", 1)[0].startswith("postgres"):
            raise ValueError("must be a postgresql:// URL")
        return value


class LimitsSettings(_Strict):
    """Sizes and counts that bound every request."""

    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, description="Largest JSON request body.")
    max_value_bytes: int = Field(
        default=1024 * 1024, ge=1,
        description="Largest kv value, record value or point payload (a payload with its numbers written out in full too).",
    )
    max_file_bytes: int = Field(default=1024**3, ge=1, description="Largest file upload.")
    file_chunk_bytes: int = Field(default=1024 * 1024, ge=4096, description="Size of stored file chunks.")
    max_page_size: int = Field(default=1000, ge=1, description="Largest `limit` on a list.")
    max_page_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1, le=2**61,
        description="A list of records, kv entries or points ends before the item that would make the values "
        "(payloads and vectors) it answers weigh more than this many bytes (at least one item; `next_cursor` goes on). "
        "A vector search answers every hit, and the payloads of the nearest up to this many bytes (`payload_omitted` past it).",
    )
    default_page_size: int = Field(default=100, ge=1, description="`limit` of a list when none is given.")
    max_batch_items: int = Field(default=1000, ge=1, description="Most items in one batch write.")
    max_vector_dimensions: int = Field(default=16000, ge=1, description="Largest vector_size of a collection.")
    max_json_containers: int = Field(
        default=100_000, ge=100, description="Most objects and arrays in one JSON request body (opening brackets); more is 413. A kv or record value sent as the body is bounded by `max_value_bytes` instead."
    )
    max_json_values: int = Field(
        default=2_000_000, ge=1000, description="Most values in one JSON request body (commas); more is 413. A kv or record value sent as the body is bounded by `max_value_bytes` instead."
    )
    max_filter_depth: int = Field(default=8, ge=1, description="Deepest nesting of $and/$or in a filter.")
    max_filter_terms: int = Field(default=128, ge=1, description="Most conditions in one filter.")
    max_connections: int = Field(
        default=1000,
        ge=1,
        description="Open connections per process; past it an idle one is closed, or the new one is answered 503.",
    )
    keep_alive_seconds: float = Field(default=5.0, gt=0, description="How long an idle keep-alive connection stays open.")
    max_header_bytes: int = Field(
        default=32 * 1024, ge=1024, le=1024 * 1024,
        description="Largest request head (request line and headers); larger is answered 431.",
    )
    max_headers: int = Field(default=100, ge=8, le=10000, description="Most header lines in a request; more is answered 431.")
    header_timeout_seconds: float = Field(
        default=10.0, gt=0, description="A request head must arrive within this long of the connection (or the last answer)."
    )
    body_idle_timeout_seconds: float = Field(
        default=30.0, gt=0, description="A request body that sends nothing for this long is answered 408."
    )
    send_idle_timeout_seconds: float = Field(
        default=30.0, gt=0, description="A streamed answer (a download) whose client takes no byte for this long is cut off."
    )
    body_timeout_seconds: float = Field(
        default=20.0, gt=0,
        description="A request body must arrive within this long, plus one second per `min_body_rate_bytes`; else 408.",
    )
    min_body_rate_bytes: int = Field(
        default=500, ge=1, description="Bytes a second that extend the body deadline (see `body_timeout_seconds`)."
    )

    @model_validator(mode="after")
    def _default_fits(self) -> LimitsSettings:
        if self.default_page_size > self.max_page_size:
            raise ValueError("default_page_size must not exceed max_page_size")
        return self


class Settings(BaseSettings):
    """Everything the gateway reads at start-up."""

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
    )

    host: str = Field(default="127.0.0.1", description="Address to listen on (`serve --host`).")
    port: int = Field(default=8000, ge=0, le=65535, description="Port to listen on (`serve --port`).")
    data_dir: Path = Field(default=Path("./data"), description="Where the embedded SQLite files live.")
    root_path: str = Field(default="", description="Sub-path the gateway is served under behind a proxy.")
    auto_migrate: bool | None = Field(
        default=None,
        description="Run migrations at start-up; default: on for SQLite databases, off for PostgreSQL.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Least severe level logged.")
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto", description="`json` lines, `text` for people; `auto`: text on a terminal, else json."
    )
    forwarded_allow_ips: str = Field(
        default="127.0.0.1",
        description="Comma-separated proxy addresses (or `*`) whose X-Forwarded-For/-Proto are trusted.",
    )
    shutdown_grace_seconds: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long in-flight requests may take to finish."
    )
    extra_capabilities: list[str] = Field(
        default_factory=list,
        description="Capabilities to serve besides the built-in ones, as `module:attribute` import paths "
        "of `app.core.capability.Capability` objects.",
    )
    persistence: PersistenceSettings = PersistenceSettings()
    databases: DatabasesSettings = DatabasesSettings()
    limits: LimitsSettings = LimitsSettings()
    vectors: VectorsSettings = VectorsSettings()
    files: FilesSettings = FilesSettings()
    kv: KvSettings = KvSettings()
    checkpoints: CheckpointsSettings = CheckpointsSettings()
    store: StoreSettings = StoreSettings()
    fairness: FairnessSettings = FairnessSettings()
    quotas: QuotasSettings = QuotasSettings()
    auth: AuthSettings = AuthSettings()
    fast_paths: FastPathSettings = FastPathSettings()

    @field_validator("data_dir")
    @classmethod
    def _expand_data_dir(cls, value: Path) -> Path:
        return value.expanduser()

    @model_validator(mode="after")
    def _auth_off_only_on_loopback(self) -> Settings:
        if (
            self.auth.mode == "disabled"
            and not is_loopback(self.host)
            and not self.auth.force_disabled_on_public_address
        ):
            raise ValueError(
                f"auth.mode: disabled is only allowed on a loopback host, not {self.host!r} "
                "(set auth.force_disabled_on_public_address=true to override)"
            )
        return self

    @model_validator(mode="after")
    def _backends_resolve(self) -> Settings:
        if self.persistence.vector_store_backend == "pgvector" and not (
            self.persistence.postgres_base_dsn or self.databases.vectors.url
        ):
            raise ValueError(
                "persistence.vector_store_backend is pgvector but neither "
                "persistence.postgres_base_dsn nor databases.vectors.url is set"
            )
        for db in Database:
            url = self.database_url(db)
            if not url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
                raise ValueError(f"databases.{db.value}.url: unsupported URL scheme in {url.split('://')[0]!r}")
        parts = -(-self.limits.max_file_bytes // self.files.s3.part_bytes)
        if self.files.backend == "s3" and parts > S3_MAX_PARTS:
            # the upload of a file that large would fail at part 10,001, on every retry
            raise ValueError(
                f"limits.max_file_bytes ({self.limits.max_file_bytes}) needs {parts} parts of files.s3.part_bytes "
                f"({self.files.s3.part_bytes}); S3 takes at most {S3_MAX_PARTS}"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, _YamlSource(settings_cls)

    # --- database URLs -------------------------------------------------------------------

    def database_url(self, db: Database) -> str:
        """The SQLAlchemy async URL of one database, from the most specific setting given."""
        explicit = self.databases.get(db).url
        if explicit:
            return normalize_url(explicit)
        p = self.persistence
        backend_is_pg = p.postgres_base_dsn is not None and (
            db is not Database.vectors or p.vector_store_backend != "sqlite_vec"
        )
        if backend_is_pg:
            base = p.postgres_base_dsn.rstrip("/")  # type: ignore[union-attr]
            return normalize_url(f"{base}/{getattr(p.postgres_databases, db.value)}")
        path = {
            Database.metadata: p.metadata_sqlite_path,
            Database.vectors: p.vector_sqlite_path,
            Database.checkpoints: p.checkpoints_sqlite_path,
        }[db] or self.data_dir / f"{db.value}.db"
        return f"sqlite+aiosqlite:///{path}"

    def is_sqlite(self, db: Database) -> bool:
        return self.database_url(db).startswith("sqlite")

    def files_backend(self) -> FilesBackendName:
        """Where new file bytes go: ``files.backend``, or by the metadata database when unset."""
        if self.files.backend is not None:
            return self.files.backend
        return "directory" if self.is_sqlite(Database.metadata) else "database"

    def files_directory(self) -> Path:
        """The directory of ``files.backend: directory`` (and of files written there before)."""
        return self.files.directory.path or self.data_dir / "files"

    def migrates_at_startup(self, db: Database) -> bool:
        return self.auto_migrate if self.auto_migrate is not None else self.is_sqlite(db)


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def normalize_url(url: str) -> str:
    """Accept libpq-style and plain SQLite URLs and give them the async driver."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a URL: {url!r}")
    if scheme in ("postgres", "postgresql", "postgresql+asyncpg"):
        return f"postgresql+asyncpg://{rest}"
    if scheme in ("sqlite", "sqlite+aiosqlite"):
        return f"sqlite+aiosqlite://{rest}"
    return url


class _YamlSource(PydanticBaseSettingsSource):
    """The YAML file named by ``GATEWAY_CONFIG``; unknown top-level sections are ignored."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get(CONFIG_ENV)
        if not path:
            return {}
        file = Path(path).expanduser()
        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise ValueError(f"{CONFIG_ENV}: cannot read {file}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ValueError(f"{CONFIG_ENV}: {file} is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{CONFIG_ENV}: {file} must hold a mapping at the top level")
        known = set(self.settings_cls.model_fields)
        return {k: v for k, v in data.items() if k in known}


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings; tests build their own ``Settings`` and pass them to the app."""
    return Settings()


def describe_settings_error(exc: Exception) -> str:
    """One line naming what is wrong, for start-up failures."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "settings"
            parts.append(f"{loc}: {err['msg']}")
        return "invalid setting: " + "; ".join(parts)
    return f"invalid setting: {exc}"
