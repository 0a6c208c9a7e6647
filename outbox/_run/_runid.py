"""Run ids: the current OpenTelemetry trace's id as a UUID, so a lineage run maps to one
trace, or a new UUIDv7 (openlineage-python's ``generate_new_uuid``) outside any valid span.

Everything here is on the run helpers' path (one call per run): written for few Python calls.
"""

from __future__ import annotations

import random
import sys
import time
from collections import deque
from typing import Any
from uuid import UUID

from opentelemetry import trace

from .._observability._log import logger

__all__ = ["current_run_id", "given_run_id", "run_id_of_span", "uuid7", "uuid_text"]


def current_run_id() -> str:
    """The current OpenTelemetry span's trace id as a UUID (trace
    ``00005015000000162e048a6dbdde4eb9`` is run ``00005015-0000-0016-2e04-8a6dbdde4eb9``),
    so a lineage run maps to one trace; a new UUIDv7 (openlineage-python's
    ``generate_new_uuid``) when there is no valid span."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        return uuid_text(context.trace_id)
    return uuid_text(uuid7())


# Trace ids already taken by a run (the newest _TAKEN_MAX, oldest first in _taken_order): a
# later run in the same trace gets a fresh id, so two runs never share one.
# A set and a deque: each operation is one call into C that allocates nothing (an OrderedDict
# cost twice as much a run: a node for each key, and popitem's keyword; a dict emptied from the
# front made each next(iter(...)) scan past every key deleted before it).
_taken: set[int] = set()
_taken_order: deque[int] = deque()
_TAKEN_MAX = 4096
_shared_trace_said = False


def _current_span_api() -> Any:
    return trace.get_current_span()


def _span_lookup() -> Any:
    """``trace.get_current_span``, or a lookup of the same span that skips the API's three
    layers of calls (a third of a run's instructions went to them): the span under the API's
    key in the context variable of the default runtime context.  Used only where it gives the
    same answer as the API (checked here); any other runtime context (``OTEL_PYTHON_CONTEXT``)
    or a later opentelemetry-api without these names gets the API's own call."""
    try:
        from opentelemetry.context import _RUNTIME_CONTEXT
        from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
        from opentelemetry.trace.propagation import _SPAN_KEY

        if _RUNTIME_CONTEXT.__class__ is not ContextVarsRuntimeContext:
            return _current_span_api
        variable = _RUNTIME_CONTEXT._current_context
        invalid = trace.INVALID_SPAN
        probe = trace.NonRecordingSpan(trace.SpanContext(1, 1, is_remote=False))

        def lookup() -> Any:
            span = variable.get().get(_SPAN_KEY)
            return invalid if span is None else span

        with trace.use_span(probe):  # the same span as the API's, inside a span and outside
            inside = lookup() is probe is trace.get_current_span()
        if inside and lookup() is trace.get_current_span():
            return lookup
    except Exception:  # any surprise in private names: the API's own call
        pass
    return _current_span_api


_current_span = _span_lookup()
# The same lookup inlined where it is the default runtime context's (a Python call less):
# the context variable, and the API's key in it.
_span_variable: Any = None
_span_key: Any = None
if _current_span is not _current_span_api:
    from opentelemetry.context import _RUNTIME_CONTEXT
    from opentelemetry.trace.propagation import _SPAN_KEY

    _span_variable, _span_key = _RUNTIME_CONTEXT._current_context, _SPAN_KEY  # type: ignore[attr-defined]
_INVALID_SPAN = trace.INVALID_SPAN
_SpanContext = trace.SpanContext


def _span_context_is_tuple() -> bool:
    """Whether a ``SpanContext`` is the tuple opentelemetry-api has made it since 1.0:
    ``(trace_id, span_id, is_remote, trace_flags, trace_state, is_valid)``, read by index
    on the run's path (each property is a Python call).  Checked once, here."""
    try:
        valid = trace.SpanContext(0x1234, 0x5678, is_remote=False)
        invalid = trace.SpanContext(0, 0, is_remote=False)
        return (
            isinstance(valid, tuple)
            and valid[0] == valid.trace_id == 0x1234
            and valid[5] is valid.is_valid is True
            and invalid[5] is invalid.is_valid is False
        )
    except Exception:  # a layout of a later opentelemetry-api: its properties, then
        return False


_SPAN_CONTEXT_IS_TUPLE = _span_context_is_tuple()

# Span class -> whether its get_span_context() is one known to return ``self._context`` (read
# directly on the run's path, as a Python call less), learnt at its first span.
_READS_CONTEXT: dict[type, bool] = {}


def _learn_reader(span: Any, context: Any) -> None:
    """Whether ``span``'s class reads its context as opentelemetry-api's ``NonRecordingSpan``
    and the SDK's ``Span`` do (their own function, ``return self._context``): that function
    itself, and this span's ``_context`` the one it returned."""
    known: list[Any] = [trace.NonRecordingSpan.get_span_context]
    sdk = sys.modules.get("opentelemetry.sdk.trace")
    if sdk is not None:
        known.append(getattr(getattr(sdk, "Span", None), "get_span_context", None))
    cls = span.__class__
    method = getattr(cls, "get_span_context", None)
    _READS_CONTEXT[cls] = any(method is f for f in known) and getattr(span, "_context", None) is context


_probe = trace.NonRecordingSpan(trace.SpanContext(1, 1, is_remote=False))
_learn_reader(_probe, _probe.get_span_context())  # the API's own span class, learnt at once
del _probe


def run_id_of_span() -> int:
    """:func:`current_run_id` for a new run, as the UUID's 128-bit value (written as text in
    the sidecar, or when ``Run.run_id`` is read: never on the handler's path): the trace id
    for the first run of a trace, a fresh UUIDv7 for any later one (said once per process)."""
    global _shared_trace_said
    if _span_variable is not None:
        span = _span_variable.get().get(_span_key)
        if span is None:
            return uuid7()
    else:
        span = _current_span()
        if span is _INVALID_SPAN:
            return uuid7()
    direct = _READS_CONTEXT.get(span.__class__)
    if direct:  # get_span_context() is ``return self._context``: read it (a Python call less)
        context = span._context
    else:
        context = span.get_span_context()
        if direct is None:
            _learn_reader(span, context)
    if context.__class__ is _SpanContext and _SPAN_CONTEXT_IS_TUPLE:
        if not context[5]:  # is_valid, read as its property reads it (a Python call less)
            return uuid7()
        trace_id: int = context[0]  # trace_id, likewise
    else:
        if not context.is_valid:
            return uuid7()
        trace_id = context.trace_id
    if trace_id in _taken:
        fresh = uuid7()
        if not _shared_trace_said:
            _shared_trace_said = True
            logger.warning(
                "a second outbox.run() in trace %032x gets its own run id %s (the first run of a trace "
                "takes the trace id); pass run_id= to choose. Said once.",
                trace_id,
                uuid_text(fresh),
            )
        return fresh
    _taken.add(trace_id)
    order = _taken_order
    order.append(trace_id)
    if len(order) > _TAKEN_MAX:
        # (Two threads at this line each forget one: never more than the newest are kept.)
        _taken.discard(order.popleft())
    return trace_id


def given_run_id(run_id: Any) -> str:
    """A ``run_id`` a caller gives, checked as openlineage-python's ``Run`` checks it when
    made: a run id that is no UUID's text, shipped, is an event every backend refuses (the
    spec's ``runId`` is a UUID), its run's whole lineage lost in the sidecar.

    Raises:
        TypeError: not text (a ``uuid.UUID``: give ``str(it)``).
        ValueError: text that is not a UUID.
    """
    if not isinstance(run_id, str):
        what = type(run_id).__name__
        raise TypeError(f"run_id must be a UUID's text, such as str(uuid.uuid4()), not {what}")
    try:
        UUID(run_id)
    except ValueError:
        raise ValueError(f"run_id {run_id[:100]!r} is not a UUID (OpenLineage's runId is one)") from None
    return run_id


def uuid_text(value: int) -> str:
    """``str(uuid.UUID(int=value))``, without building the UUID object."""
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid7() -> int:
    """A UUIDv7 as openlineage-python's ``generate_new_uuid`` builds it (48 bits of Unix
    milliseconds, version 7, RFC 4122 variant), its 74 random bits from ``random`` rather
    than ``secrets``: a run id must be unique, not secret, and ``random`` is reseeded in a
    forked child.  The millisecond's part (with the version and variant bits) is made once
    per millisecond: two big-integer operations per id instead of seven."""
    global _uuid7_ms, _uuid7_high
    ms = _time_ns() // 1_000_000
    if ms != _uuid7_ms:
        # The high part first: a thread that sees the new millisecond sees its high part
        # (one that races this by a millisecond gets the neighbouring one: still unique).
        _uuid7_high = (ms & 0xFFFF_FFFF_FFFF) << 80 | _UUID7_SET
        _uuid7_ms = ms
    return _getrandbits(76) & _UUID7_RANDOM | _uuid7_high


_UUID7_SET = 7 << 76 | 0x8000 << 48  # the version and variant bits
_UUID7_RANDOM = (1 << 76) - 1 & ~(0xC000 << 48)  # 12 + 62 random bits, around the variant's two
_uuid7_ms = -1
_uuid7_high = 0
_time_ns = time.time_ns
_getrandbits = random.getrandbits
