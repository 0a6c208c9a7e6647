"""What a backend needs of the events, beyond the OpenLineage spec, judged on a sample of a
pipeline's events that ``outbox check --events FILE`` reads (and never sends): DataHub takes only
RunEvents naming an orchestrator; OpenMetadata draws lineage only from COMPLETE events with inputs
and outputs.  The rules are those the sink's flavours answer by (``_sink_rules``)."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from .. import _toolkit as toolkit
from ..transports import HttpTransport
from ._sink_rules import datahub_orchestrator, validate_event

__all__ = ["datahub_refusal", "judged", "openmetadata_verdict", "read_sample"]

# What DataHub and OpenMetadata need: the rules the sink's flavours answer by (_sink_rules).
_DATAHUB_NEEDS = (
    "DataHub takes only RunEvents naming an orchestrator: a processing_engine run facet, or a producer "
    "https://github.com/OpenLineage/OpenLineage/<path>/<name> or under https://github.com/apache/airflow/ "
    "(others get 500 and never arrive)"
)
_OPENMETADATA_NEEDS = (
    "OpenMetadata draws lineage only from COMPLETE RunEvents with inputs and outputs, between datasets "
    "it knows as tables (START, RUNNING and FAIL are taken and draw nothing)"
)


def _backend(transport: HttpTransport) -> str | None:
    """The backend an HTTP transport's endpoint belongs to, when it has needs of its own."""
    path = urlsplit(transport.single_url).path.rstrip("/")
    if path.endswith("/openapi/openlineage/api/v1/lineage"):
        return "datahub"
    if path.endswith("/api/v1/openlineage/lineage") or transport.batch_format == "openmetadata":
        return "openmetadata"
    return None


def _named(event: Any, index: int, count: int) -> str:
    """``event 2 of 5 (COMPLETE of namespace/name)``, for a line naming one event."""
    where = f"event {index + 1} of {count}"
    if not isinstance(event, dict):
        return where
    job = event.get("job")
    job = job if isinstance(job, dict) else {}
    kind = event.get("eventType", "no eventType")
    return f"{where} ({kind} of {job.get('namespace', '?')}/{job.get('name', '?')})"


def datahub_refusal(event: Any) -> str | None:
    """Why released DataHub refuses ``event`` (it answers 500), or None when it takes it."""
    if not isinstance(event, dict):
        return "is not a JSON object"
    if not isinstance(event.get("run"), dict) or not isinstance(event.get("job"), dict):
        return "is not a RunEvent (DataHub takes no JobEvent or DatasetEvent)"
    if event.get("eventType") is None:
        return "has no eventType"
    if datahub_orchestrator(event) is not None:
        return None
    producer = event.get("producer")
    return (
        f"names no orchestrator (producer {producer!r}, no processing_engine run facet): add the facet, "
        "as LineageJob(run_facets=...) does"
    )


def openmetadata_verdict(events: Sequence[Any]) -> tuple[bool, str]:
    """(whether OpenMetadata would draw lineage from these events, why): every COMPLETE RunEvent
    (a missing eventType counts as COMPLETE there) needs inputs and outputs, and one at least
    must be there; JobEvents and DatasetEvents are refused (400)."""
    count, drawing = len(events), 0
    for index, event in enumerate(events):
        if not isinstance(event, dict) or not isinstance(event.get("run"), dict):
            return False, f"{_named(event, index, count)} is not a RunEvent: OpenMetadata refuses it (400)"
        if event.get("eventType") not in (None, "COMPLETE"):  # missing or null: COMPLETE there
            continue
        missing = [part for part in ("inputs", "outputs") if not event.get(part)]
        if missing:
            return False, (
                f"{_named(event, index, count)} has no {' and no '.join(missing)}: OpenMetadata draws "
                "no lineage for its run"
            )
        drawing += 1
    if not drawing:
        return False, f"none of the {count} events is a COMPLETE: OpenMetadata draws no lineage from them"
    events_word = "event" if count == 1 else "events"
    return True, f"{drawing} of {count} {events_word} draw{'s' if drawing == 1 else ''} lineage"


def _count(count: int) -> str:
    return f"{count:,} event{'' if count == 1 else 's'}"


def judged(transport: HttpTransport, events: Sequence[Any] | str | None) -> tuple[bool, str] | None:
    """A sample of events judged by what the backend needs: (passed, why); None when there is
    nothing to judge (no sample, and a backend with no needs beyond the spec's).  ``events``
    as :func:`read_sample` gives them (text: why they could not be read)."""
    backend = _backend(transport)
    needs = {"datahub": _DATAHUB_NEEDS, "openmetadata": _OPENMETADATA_NEEDS}.get(backend or "")
    if isinstance(events, str):  # the sample could not be read
        return False, events
    if events is None:
        return (
            None
            if needs is None
            else (False, f"{needs}; judge yours: --events FILE, a sample (read, never sent)")
        )
    count = len(events)
    if backend == "openmetadata":
        ok, why = openmetadata_verdict(events)
        return ok, why + (
            " (where their datasets are tables OpenMetadata knows)" if ok else f"; {_OPENMETADATA_NEEDS}"
        )
    if backend == "datahub":
        for index, event in enumerate(events):
            refused = datahub_refusal(event)
            if refused:
                return False, f"{_named(event, index, count)} {refused}; {_DATAHUB_NEEDS}"
        return True, f"{_count(count)}, each a RunEvent naming an orchestrator: DataHub takes them"
    for index, event in enumerate(events):
        errors = validate_event(event) if isinstance(event, dict) else ["not a JSON object"]
        if errors:
            return False, f"{_named(event, index, count)} misses what the spec requires: {errors[0]}"
    return True, f"{_count(count)}, each with what the OpenLineage spec requires"


def read_sample(path: str) -> list[Any] | str:
    """The events of ``path``: one JSON event, a JSON array of them, or JSON lines (a dead-letter
    file's records give the event each holds, read as ``outbox replay`` reads them); or why they
    cannot be read."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        return f"cannot read the events in {path}: {exc}"
    try:
        whole = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        whole = None
    if isinstance(whole, (list, dict)):
        events = whole if isinstance(whole, list) else [whole]
    else:
        events = []
        for item in toolkit.scan(io.BytesIO(data)):
            if isinstance(item, toolkit.Torn):
                return f"{path} line {item.line} is not JSON (nor a sound record); give JSON lines of events"
            # (A record that holds only event_repr, or text that is not a JSON object: no sample.)
            if item.event is not None:
                events.append(json.loads(item.event))
    return events or f"{path} holds no event"
