"""Conformance: an event as the OpenLineage 2.0.2 JSON Schema and its facet schemas define it.

The schemas are the OpenLineage project's, kept in ``tests/openlineage_spec`` (see its README).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

SPEC = Path(__file__).parent.parent / "openlineage_spec"

# Facet key -> the schema file that defines it (the facets our events carry).
FACETS = {
    "errorMessage": "ErrorMessageRunFacet",
    "processing_engine": "ProcessingEngineRunFacet",
    "parent": "ParentRunFacet",
    "jobType": "JobTypeJobFacet",
}


def _load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


@functools.cache
def _registry() -> tuple[Registry, dict[str, Any], dict[str, dict[str, Any]]]:
    core = _load(SPEC / "OpenLineage.json")
    facets = {key: _load(SPEC / "facets" / f"{name}.json") for key, name in FACETS.items()}
    registry = Registry().with_resources(
        (doc["$id"], Resource.from_contents(doc)) for doc in (core, *facets.values())
    )
    return registry, core, facets


def validate(event: dict[str, Any], kind: str = "RunEvent") -> None:
    """Raise ``jsonschema.ValidationError`` unless ``event`` is a valid ``kind`` (RunEvent,
    DatasetEvent, JobEvent) and each facet it carries that we know is valid by its own schema."""
    registry, core, facets = _registry()
    formats = jsonschema.Draft202012Validator.FORMAT_CHECKER  # uuid, uri, ... are checked too
    jsonschema.Draft202012Validator(
        {"$ref": f"{core['$id']}#/$defs/{kind}"}, registry=registry, format_checker=formats
    ).validate(event)
    carried = {**(event.get("run") or {}).get("facets", {}), **(event.get("job") or {}).get("facets", {})}
    for key, facet in carried.items():
        if key in facets:
            schema = facets[key]
            jsonschema.Draft202012Validator(schema, registry=registry, format_checker=formats).validate(
                {key: facet}
            )
