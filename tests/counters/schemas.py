"""Request and answer models of the counters capability."""

from pydantic import BaseModel, ConfigDict, Field

from app.core.numbers import StrictInt

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Increment(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: StrictInt = Field(default=1, ge=INT64_MIN, le=INT64_MAX, description="Added to the counter (may be negative).")


class Counter(BaseModel):
    name: str
    value: int = Field(description="A 64-bit integer.")
