"""The README's configuration table, generated from the settings model so the two cannot drift.

``python -m tests.settings_doc`` prints it; a test checks the README holds every row.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from app.core.config import Settings


def _rows(model: type[BaseModel], yaml_prefix: str, env_prefix: str) -> Iterator[tuple[str, str, str, str]]:
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _rows(annotation, f"{yaml_prefix}{name}.", f"{env_prefix}{name.upper()}__")
            continue
        yield (f"{yaml_prefix}{name}", f"{env_prefix}{name.upper()}", _default(field), field.description or "")


def _default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "—"
    if hasattr(value, "value") and not isinstance(value, (int, float, str)):
        value = value.value
    return f"`{value}`"


def rows() -> list[tuple[str, str, str, str]]:
    return list(_rows(Settings, "", "GATEWAY_"))


def markdown() -> str:
    lines = ["| setting (YAML) | environment variable | default | meaning |", "|---|---|---|---|"]
    for yaml_key, env, default, description in rows():
        lines.append(f"| `{yaml_key}` | `{env}` | {default} | {description} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
