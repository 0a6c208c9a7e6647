"""The conformance checker itself: it takes a valid event and refuses broken ones, so a test that
passes through it says something."""

import copy

import jsonschema
import pytest

import support.spec as spec

VALID = {
    "eventType": "FAIL",
    "eventTime": "2026-12-03T10:00:00.000000+00:00",
    "producer": "https://example.com/tests",
    "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
    "run": {
        "runId": "0192f6b4-6c58-7cc5-b2a4-4f6b8e4b8a11",
        "facets": {
            "errorMessage": {
                "_producer": "https://example.com/tests",
                "_schemaURL": "https://openlineage.io/spec/facets/1-0-1/ErrorMessageRunFacet.json#/$defs/ErrorMessageRunFacet",
                "message": "boom",
                "programmingLanguage": "python",
            }
        },
    },
    "job": {"namespace": "vast-dataengine://t", "name": "p.f"},
    "inputs": [],
    "outputs": [],
}


def test_a_valid_event_passes():
    spec.validate(VALID)


@pytest.mark.parametrize(
    "breaks",
    [
        lambda e: e.pop("eventTime"),  # the core schema: a required field
        lambda e: e["run"].update(runId="not-a-uuid"),  # the core schema: a format
        lambda e: e["run"]["facets"]["errorMessage"].pop("programmingLanguage"),  # the facet's schema
        lambda e: e["run"]["facets"]["errorMessage"].update(message=3),
    ],
)
def test_a_broken_event_or_facet_is_refused(breaks):
    event = copy.deepcopy(VALID)
    breaks(event)
    with pytest.raises(jsonschema.ValidationError):
        spec.validate(event)
