"""The engines' own API specifications, as the contract tests check bodies against them: strict JSON Schemas cut from
Elasticsearch's and OpenSearch's official specifications (tests/specs/; scripts/cut_engine_specs.py)."""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

pytest.importorskip("jsonschema")

from jsonschema import Draft202012Validator  # noqa: E402

SPECS = Path(__file__).resolve().parents[1] / "specs"
SCHEMA_FILES = {
    "elasticsearch": SPECS / "elasticsearch-9.5-requests.strict.schema.json",
    "opensearch": SPECS / "opensearch-3.5-requests.strict.schema.json",
}


def _schema_doc(engine: str) -> dict:
    return json.loads(SCHEMA_FILES[engine].read_text(encoding="utf-8"))


@cache
def validator(engine: str, key: str) -> Draft202012Validator:
    doc = _schema_doc(engine)
    return Draft202012Validator({"$schema": doc["$schema"], "$defs": doc["$defs"], **doc[key]})


def _leaves(errors):
    return [leaf for e in errors for leaf in (_leaves(e.context) if e.context else [e])]


def schema_errors(engine: str, key: str, body) -> list[str]:
    errors = sorted(_leaves(validator(engine, key).iter_errors(body)), key=lambda e: (-len(e.absolute_path), e.validator == "type"))
    return [f"{e.json_path}: {e.message[:200]}" for e in errors[:3]]


def assert_valid(engine: str, key: str, body) -> None:
    errors = schema_errors(engine, key, body)
    assert not errors, f"{engine} {key} body rejected by the spec: {errors}\n{json.dumps(body)[:600]}"
