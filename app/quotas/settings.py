"""Settings of quotas (``quotas:`` in the gateway's settings; the rules are ``app.quotas.usage``'s)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class QuotaLimits(BaseModel):
    """A namespace's quota in one capability; unset: unlimited (or, per capability, the `default`)."""

    model_config = ConfigDict(extra="forbid")

    max_bytes: int | None = Field(
        default=None, ge=0, description="Most bytes stored: kv, record and store values (UTF-8 JSON), "
        "file sizes, checkpoint threads' checkpoints, blobs and pending writes.",
    )
    max_items: int | None = Field(
        default=None, ge=0, description="Most items: kv entries, records, files, store items, checkpoint threads."
    )


class QuotasSettings(BaseModel):
    """Quotas per namespace: defaults here, a namespace's own through `/v1/admin/quotas` or `storage-gateway quotas`."""

    model_config = ConfigDict(extra="forbid")

    accounting: bool = Field(
        default=True,
        description="Keep usage in the writing transaction (database triggers) and enforce quotas; off drops "
        "the triggers at start-up (every process on the databases should agree; on again recounts).",
    )
    default: QuotaLimits = Field(default_factory=QuotaLimits, description="Every capability's default quota.")
    capabilities: dict[str, QuotaLimits] = Field(
        default_factory=dict, description="A capability's default quota (`kv`, `files`, ...), over `default`."
    )
    reconcile_interval_seconds: float = Field(
        default=600.0, gt=0, description="How often a background round recounts some namespaces' usage."
    )
    reconcile_namespaces: int = Field(default=50, ge=1, description="Most namespaces one reconciliation round recounts.")
