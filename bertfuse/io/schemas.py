"""The JSON Schemas (draft 2020-12) of what bertfuse writes as JSON: each command's --json
report (`convert.json`, `diff.json`, ... on `report.json`, the fields every report has) and
the model summary (`summary.json`, which `diff` checks a summary file against before it reads
it). They are package data (bertfuse/schemas/, published in docs/json-reports.md); jsonschema
checks against them, with the files registered under their names so that one refers to
another as `report.json`."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from referencing import Registry, Resource

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


def schema_names() -> list[str]:
    """Every schema file's name, e.g. 'convert.json'."""
    return sorted(p.name for p in SCHEMA_DIR.glob("*.json"))


def load_schema(name: str) -> dict:
    return json.loads((SCHEMA_DIR / name).read_text())


@lru_cache(maxsize=None)
def _registry():
    return Registry().with_resources(
        (n, Resource.from_contents(load_schema(n))) for n in schema_names())


@lru_cache(maxsize=None)
def validator(name: str):
    """A jsonschema validator for the schema `name` (its references resolved by name)."""
    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=_registry())


def first_error(data: Any, name: str) -> str | None:
    """Where `data` first fails schema `name` ('encoder.layers[0].gelu: ...'), or None."""
    error = best_match(validator(name).iter_errors(data))
    if error is None:
        return None
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    message = error.message if len(error.message) <= 200 else error.message[:200] + "..."
    return f"{where.lstrip('.') or 'top level'}: {message}"  # the value quoted, cut short
