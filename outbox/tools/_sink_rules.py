"""The answer rules of ``outbox sink``'s flavours, apart from its server: the OpenLineage
spec's structure (:func:`validate_event`), Marquez 0.51.1's ``LineageResource``
(:func:`marquez_answer`), released DataHub's converter and released OpenMetadata's
``/openlineage`` routes.  Pure functions of a request's body; each is proven faithful to the
backend it plays by a test that sends the same requests to the real one (or its own code)."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

EVENT_TYPES = frozenset({"START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER"})


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and value != ""


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _plainly_valid(event: Any) -> bool:
    """The common case, checked fast (the sink validates tens of thousands of events a
    second); anything this does not vouch for goes through the full checks."""
    try:
        when = event["eventTime"]
        if "T" not in when or datetime.fromisoformat(when).tzinfo is None:
            return False
        if not (event["producer"] and event["schemaURL"]):
            return False
        run = event.get("run")
        job = event.get("job")
        if run is not None:
            if not _UUID.fullmatch(run["runId"]) or not (job["namespace"] and job["name"]):
                return False
            kind = event.get("eventType")
            if kind is not None and kind not in EVENT_TYPES:
                return False
        elif "dataset" in event or job is None or not (job["namespace"] and job["name"]):
            return False
        for key in ("inputs", "outputs"):
            for dataset in event.get(key) or ():
                if not (dataset["namespace"] and dataset["name"]):
                    return False
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    return True


def validate_event(event: Any) -> list[str]:
    """Structural checks of one OpenLineage event; the list of problems (empty if fine)."""
    if isinstance(event, dict) and _plainly_valid(event):
        return []
    if not isinstance(event, dict):
        return [f"an event must be a JSON object, not {type(event).__name__}"]
    errors: list[str] = []
    when = event.get("eventTime")
    if when is None:
        errors.append("eventTime must not be null")
    else:
        try:
            parsed = datetime.fromisoformat(when) if isinstance(when, str) else None
        except ValueError:
            parsed = None
        if parsed is None or "t" not in when.lower():
            errors.append(f"eventTime {when!r} must be an ISO-8601 date-time")
        elif parsed.tzinfo is None:
            errors.append(f"eventTime {when!r} must carry a UTC offset (Z or +hh:mm)")
    for key in ("producer", "schemaURL"):
        if not _is_name(event.get(key)):
            errors.append(f"{key} must not be null")
    if "run" in event:
        run = event.get("run")
        run_id = run.get("runId") if isinstance(run, dict) else None
        if run_id is None:
            errors.append("run.runId must not be null")
        else:
            try:
                uuid.UUID(str(run_id))
            except ValueError:
                errors.append(f"run.runId {run_id!r} must be a UUID")
        errors += _job_errors(event.get("job"))
        kind = event.get("eventType")
        if kind is not None and kind not in EVENT_TYPES:
            errors.append(f"eventType {kind!r} must be one of {', '.join(sorted(EVENT_TYPES))}")
    elif "dataset" in event:
        errors += _dataset_errors("dataset", event.get("dataset"))
    elif "job" in event:
        errors += _job_errors(event.get("job"))
    else:
        errors.append("the event is not a RunEvent, DatasetEvent or JobEvent (no run, job or dataset)")
    for key in ("inputs", "outputs"):
        datasets = event.get(key)
        if datasets is None:
            continue
        if not isinstance(datasets, list):
            errors.append(f"{key} must be an array")
            continue
        for i, dataset in enumerate(datasets):
            errors += _dataset_errors(f"{key}[{i}]", dataset)
    return errors


def _job_errors(job: Any) -> list[str]:
    if not isinstance(job, dict):
        return ["job must not be null"]
    return [f"job.{key} must not be null" for key in ("namespace", "name") if not _is_name(job.get(key))]


def _dataset_errors(where: str, dataset: Any) -> list[str]:
    if not isinstance(dataset, dict):
        return [f"{where} must be an object"]
    return [
        f"{where}.{key} must not be null" for key in ("namespace", "name") if not _is_name(dataset.get(key))
    ]


# -- Marquez 0.51.1, as its LineageResource answers ---------------------------------------------
# (marquez.service.models.{LineageEvent,DatasetEvent,JobEvent}, EventTypeResolver and
# JsonProcessingExceptionMapper; pinned against the real server by tests/e2e/test_marquez.py).


class _Unmappable(Exception):
    """What Jackson cannot map: Marquez answers 500 with a ``{"code": 400, ...}`` body."""


def _marquez_kind(event: dict[str, Any]) -> str:
    """EventTypeResolver: the schemaURL's last path segment picks the class, RunEvent by default."""
    url = event.get("schemaURL")
    if isinstance(url, str) and "/" in url:
        tail = url[url.rindex("/") :]
        if tail == "/DatasetEvent":
            return "dataset"
        if tail == "/JobEvent":
            return "job"
    return "run"


def _marquez_time(where: str, value: Any) -> None:
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return  # null is a validation error; a number is epoch time to Jackson
    if isinstance(value, str) and "T" in value:
        with contextlib.suppress(ValueError):
            datetime.fromisoformat(value)
            return
    raise _Unmappable(f"Cannot deserialize value of type `java.time.ZonedDateTime` from String {value!r}")


def _marquez_object(where: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Unmappable(f"Cannot deserialize {where} from {type(value).__name__}")
    return value


def _marquez_null(errors: list[str], where: str, obj: dict[str, Any], *keys: str) -> None:
    errors.extend(f"{where}{key} must not be null" for key in keys if obj.get(key) is None)


def _marquez_job(errors: list[str], where: str, value: Any, required: bool = True) -> None:
    job = _marquez_object(where, value)
    if job is None:
        if required:
            errors.append(f"{where} must not be null")
        return
    _marquez_null(errors, f"{where}.", job, "namespace", "name")


def _marquez_datasets(errors: list[str], where: str, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, list):
        raise _Unmappable(f"Cannot deserialize {where} from {type(value).__name__}")
    for index, item in enumerate(value):
        dataset = _marquez_object(f"{where}[{index}]", item)
        if dataset is not None:
            _marquez_null(errors, f"{where}[{index}].", dataset, "namespace", "name")


def _marquez_errors(event: dict[str, Any]) -> list[str]:
    """Bean-validation messages Marquez gives (422); raises _Unmappable where it answers 500."""
    errors: list[str] = []
    kind = _marquez_kind(event)
    _marquez_time("eventTime", event.get("eventTime"))
    _marquez_null(errors, "", event, "eventTime", "producer")
    if kind != "run":
        _marquez_null(errors, "", event, "schemaURL")
    if kind == "dataset":
        dataset = _marquez_object("dataset", event.get("dataset"))
        if dataset is not None:
            _marquez_null(errors, "dataset.", dataset, "namespace", "name")
        return errors
    _marquez_job(errors, "job", event.get("job"))
    _marquez_datasets(errors, "inputs", event.get("inputs"))
    _marquez_datasets(errors, "outputs", event.get("outputs"))
    if kind == "job":
        return errors
    run = _marquez_object("run", event.get("run"))
    if run is None:
        errors.append("run must not be null")
        return errors
    _marquez_null(errors, "run.", run, "runId")
    facets = _marquez_object("run.facets", run.get("facets")) or {}
    parent = _marquez_object("run.facets.parent", facets.get("parent"))
    if parent is not None:
        where = "run.facets.parent."
        _marquez_null(errors, where, parent, "_producer", "_schemaURL", "run", "job")
        link = _marquez_object(f"{where}run", parent.get("run"))
        if link is not None:
            _marquez_null(errors, f"{where}run.", link, "runId")
        if parent.get("job") is not None:
            _marquez_job(errors, f"{where}job", parent.get("job"))
    nominal = _marquez_object("run.facets.nominalTime", facets.get("nominalTime"))
    if nominal is not None:
        _marquez_time("nominalStartTime", nominal.get("nominalStartTime"))
        _marquez_time("nominalEndTime", nominal.get("nominalEndTime"))
        where = "run.facets.nominalTime."
        _marquez_null(errors, where, nominal, "_producer", "_schemaURL", "nominalStartTime")
    return errors


def marquez_answer(raw: bytes, content_type: str | None) -> tuple[int, Any, dict[str, Any] | None]:
    """How Marquez 0.51.1 answers ``POST /api/v1/lineage`` with this body: (status, body,
    the event when accepted).  201 with no body; 415 for a body that is not declared JSON;
    422 ``{"errors": [...]}`` when a required field is null; 500 with ``{"code": 400, ...}``
    for JSON it cannot parse or map (not an object, an ``eventTime`` with no time part)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        return 415, {"code": 415, "message": "HTTP 415 Unsupported Media Type"}, None
    if not raw.strip():
        return 422, {"errors": ["The request body must not be null"]}, None
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return 500, {"code": 400, "message": f"Unexpected input: {exc}"}, None
    if event is None:
        return 422, {"errors": ["The request body must not be null"]}, None
    try:
        if not isinstance(event, dict):
            raise _Unmappable(f"Cannot deserialize value of type `LineageEvent` from {type(event).__name__}")
        errors = _marquez_errors(event)
    except _Unmappable as exc:
        return 500, {"code": 400, "message": str(exc)}, None
    if errors:
        return 422, {"errors": errors}, None
    return 201, None, event


# -- DataHub and OpenMetadata, released ------------------------------------------------------

# DataHub's own pattern (OpenLineageToDataHub.getOrchestrator), matched against the whole
# producer as Java's Matcher.matches() does: its unescaped dots match any character, and a
# segment after OpenLineage/OpenLineage/ is needed (".../OpenLineage/OpenLineage/client" fails).
_DATAHUB_PRODUCER = re.compile("https://github.com/OpenLineage/OpenLineage/.*/(.*)$", re.MULTILINE)


def datahub_orchestrator(event: dict[str, Any]) -> str | None:
    """The orchestrator DataHub's converter names for an event (``OpenLineageToDataHub``): the
    ``processing_engine`` run facet's name (lower-cased), else the last path segment of an
    OpenLineage-repository producer URL (DataHub's regex), else ``airflow`` for an Airflow
    producer URL; None, where released DataHub answers 500 "Unable to determine orchestrator"."""
    run = event.get("run")
    facets = run.get("facets") if isinstance(run, dict) else None
    engine = facets.get("processing_engine") if isinstance(facets, dict) else None
    if isinstance(engine, dict) and isinstance(engine.get("name"), str):
        return str(engine["name"]).lower()
    producer = event.get("producer")
    if isinstance(producer, str):
        match = _DATAHUB_PRODUCER.fullmatch(producer)
        if match is not None:
            return match.group(1)
        if producer.startswith("https://github.com/apache/airflow/"):
            return "airflow"
    return None


def datahub_failure(body: Any) -> str | None:
    """Why released DataHub's ``LineageApiImpl`` answers 500 to this body (it reads every body
    as a RunEvent, then its converter dereferences the run, its facets and the event type),
    or None when it takes it."""
    if not isinstance(body, dict):
        return f"Cannot deserialize a RunEvent from a JSON {type(body).__name__}"
    if not isinstance(body.get("run"), dict):
        kind = "a DatasetEvent" if "dataset" in body else "a JobEvent" if "job" in body else "an event"
        return f"NullPointerException: {kind} has no run (DataHub reads every event as a RunEvent)"
    if not isinstance(body.get("job"), dict):
        return "NullPointerException: the event has no job"
    if datahub_orchestrator(body) is None:
        return "Unable to determine orchestrator"
    if body.get("eventType") is None:
        return "NullPointerException: the event has no eventType"
    return None


_STORAGE_SCHEMES = ("gs://", "s3://", "s3a://", "abfss://", "abfs://", "wasbs://", "adl://")


def _openmetadata_name(name: Any, short_slash: bool) -> str | None:
    """A dataset or symlink name in the dot form OpenMetadata's resolver matches tables by
    (``[db.]schema.table``): Glue's ``table/<db>/<table>``, a Hive warehouse path
    ``.../<db>.db/<table>``, ``db/table`` (where allowed), or a dotted name; None otherwise."""
    if not isinstance(name, str) or not name.strip():
        return None
    text = name.strip()
    segments = [part for part in text.split("/") if part]
    if text.startswith("table/") and len(text.split("/")) == 3 and all(text.split("/")):
        return f"{segments[1]}.{segments[2]}"
    if "/" in text:
        for i in range(len(segments) - 2, -1, -1):
            if segments[i].endswith(".db") and len(segments[i]) > 3:
                return f"{segments[i][:-3]}.{segments[i + 1]}"
        if short_slash and "." not in text and 2 <= len(segments) <= 3:
            return ".".join(segments)
        return None
    parts = text.split(".")
    return text if len(parts) >= 2 and all(parts) else None


def openmetadata_table(dataset: Any, tables: Sequence[str]) -> str | None:
    """The table of ``tables`` (fully qualified names, ``service.db.schema.table``) that
    OpenMetadata's server resolves this dataset to, or None.  The candidates are every
    symlink identifier's name, then the dataset's own name (an object-store path is never a
    table); each is matched by its ``db.schema.table``, then its ``schema.table``, as the
    server's resolver searches by FQN suffix."""
    if not isinstance(dataset, dict) or not tables:
        return None
    candidates: list[str] = []
    facets = dataset.get("facets")
    symlinks = facets.get("symlinks") if isinstance(facets, dict) else None
    identifiers = symlinks.get("identifiers") if isinstance(symlinks, dict) else None
    for identifier in identifiers if isinstance(identifiers, list) else ():
        if isinstance(identifier, dict):
            candidates.append(_openmetadata_name(identifier.get("name"), True) or "")
    namespace = dataset.get("namespace")
    storage = isinstance(namespace, str) and namespace.lower().startswith(_STORAGE_SCHEMES)
    candidates.append(_openmetadata_name(dataset.get("name"), not storage) or "")
    for candidate in dict.fromkeys(c for c in candidates if c):
        parts = candidate.split(".")
        suffixes = [".".join(parts[-2:])]
        if len(parts) >= 3:
            suffixes.insert(0, ".".join(parts[-3:]))
        for suffix in suffixes:
            for fqn in tables:
                if fqn == suffix or fqn.endswith("." + suffix):
                    return fqn
    return None


def openmetadata_single_answer(event: dict[str, Any], tables: Sequence[str] = ()) -> dict[str, Any]:
    """Released OpenMetadata's answer to one RunEvent: it draws lineage only from a COMPLETE
    event (a missing ``eventType`` counts as COMPLETE) with inputs and outputs, one edge per
    output x input where both resolve to tables it has (:func:`openmetadata_table`)."""
    kind = event.get("eventType")
    inputs, outputs = event.get("inputs") or [], event.get("outputs") or []
    if kind not in (None, "COMPLETE"):
        return {"status": "success", "message": f"Event skipped: type {kind}", "lineageEdgesCreated": 0}
    if not inputs or not outputs:
        message = "Event skipped: lineage needs inputs and outputs"
        return {"status": "success", "message": message, "lineageEdgesCreated": 0}
    resolved_in = sum(1 for d in inputs if openmetadata_table(d, tables))
    resolved_out = sum(1 for d in outputs if openmetadata_table(d, tables))
    edges = resolved_in * resolved_out
    return {"status": "success", "message": "Event processed", "lineageEdgesCreated": edges}
