"""What an HTTP backend's answer means for the events sent: ``Retry-After``, a batch's
``partial_success`` body, and a status's verdict (delivered, retry and about what, rejected).

Pure functions of the answer and the transport's retry settings; :class:`HttpTransport` logs.
"""

from __future__ import annotations

import email.utils
from collections.abc import Set
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson

from .._base import DELIVERED, About, Outcome
from ._settings import redact_url
from ._wire import MAX_ANSWER_BYTES, Answer

#: An answer: httpx's (``read_capped``), or the transport's own client's.
HttpAnswer = httpx.Response | Answer

__all__ = [
    "BATCH_UNSUPPORTED",
    "MAX_ANSWER_BYTES",
    "HttpAnswer",
    "has_failed_events",
    "parse_retry_after",
    "read_batch_answer",
    "read_capped",
    "snippet",
    "status_outcome",
]
BATCH_UNSUPPORTED = frozenset({404, 405, 501})
# Answers that say the configuration is wrong, not the events: keep them, back off, say so.
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MISCONFIGURED = frozenset({401, 403, 404, 405, 407}) | _REDIRECTS
# RETRY reasons that mean every request would fail alike (unreachable, misconfigured).
STOP_REASONS = frozenset({"network", "timeout", "token"} | {f"http_{status}" for status in _MISCONFIGURED})


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date.

    Returns None for a missing or unreadable value, and never less than 0.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = datetime.now(UTC).timestamp() if now is None else now
    return max(0.0, when.timestamp() - current)


def snippet(response: HttpAnswer, limit: int = 200) -> str:
    text = response.text.strip().replace("\n", " ")
    return text[:limit] + ("..." if len(text) > limit else "") if text else "(no body)"


def failed_events(body: Any) -> list[Any] | None:
    if not isinstance(body, dict):
        return None
    failed = body.get("failed_events", body.get("failedEvents"))
    return failed if isinstance(failed, list) else None


def has_failed_events(response: HttpAnswer) -> bool:
    try:
        return failed_events(orjson.loads(response.content)) is not None
    except orjson.JSONDecodeError:
        return False


def read_batch_answer(response: HttpAnswer, size: int) -> list[Outcome]:
    """Per-event outcomes from a batch answer: the spec's ``failed_events`` (or
    OpenMetadata's ``failedEvents``); events not listed there were received."""
    try:
        body = orjson.loads(response.content) if response.content else None
    except orjson.JSONDecodeError:
        body = None
    failed = failed_events(body)
    if response.status_code >= 400 and failed is None:
        return [Outcome.rejected("rejected_by_backend", snippet(response))] * size
    outcomes: list[Outcome] = [DELIVERED] * size
    for entry in failed or ():
        if not isinstance(entry, dict):
            continue
        index = entry.get("index")
        if not isinstance(index, int) or not 0 <= index < size:
            continue
        reason = str(entry.get("reason") or "failed")
        if entry.get("retriable") is True:
            outcomes[index] = Outcome.retry(
                "partial_success", f"batch event {index}: {reason}", about=About.EVENT
            )
        else:
            outcomes[index] = Outcome.rejected("rejected_by_backend", f"batch event {index}: {reason}")
    return outcomes


async def read_capped(response: httpx.Response) -> httpx.Response:
    """``response`` (a stream) with at most ``MAX_ANSWER_BYTES`` of its body read (plenty for a
    batch's ``partial_success`` body and an error's text; a backend, or something in front of
    it, can answer gigabytes)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_ANSWER_BYTES:
            break
    content = b"".join(chunks)[:MAX_ANSWER_BYTES]
    # The body is decoded and maybe cut: the framing headers no longer describe it.
    # Repeated ones joined; encoded back as they came (a value that is not ASCII, such as
    # "café", cannot be given to httpx.Response as text).
    framing = ("content-encoding", "content-length", "transfer-encoding")
    code = response.headers.encoding
    headers = [
        (k.encode(code), v.encode(code)) for k, v in response.headers.items() if k.lower() not in framing
    ]
    return httpx.Response(response.status_code, headers=headers, content=content, request=response.request)


def status_outcome(
    response: HttpAnswer,
    url: str,
    answer: str,
    *,
    events: int,
    forcelist: Set[int] | None,
    retry_statuses: Set[int],
) -> tuple[Outcome, str | None]:
    """What a non-2xx answer (whose body reads ``answer``) means for one event (or each of a
    batch's ``events``), and for a misconfiguration the line to log."""
    status = response.status_code
    detail = f"POST {redact_url(url)} answered {status} {response.reason_phrase}: {answer}"
    if forcelist is None:
        retriable = status in (408, 429) or status >= 500
    else:  # urllib3's Retry.is_retry: the list, or a Retry-After on 413, 429 and 503
        retriable = status in forcelist or (status in (413, 429, 503) and "Retry-After" in response.headers)
    if retriable or status in retry_statuses:
        # A 500 (any 5xx but 502, 503 and 504, which say the backend or the way to it is
        # down) may be about the event: Marquez, OpenMetadata and DataHub answer 500 to an
        # event they cannot map.  The rest is about the backend.
        about = About.BACKEND
        if status >= 500 and status not in (502, 503, 504):
            about = About.EVENT if events == 1 else About.REQUEST
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        return Outcome.retry(f"http_{status}", detail, retry_after, about=about), None
    if status == 413:
        return Outcome.rejected("too_large", detail), None
    if status in _MISCONFIGURED:
        if status in (401, 403):
            hint = "check the API key (OPENLINEAGE_API_KEY or auth)"
        elif status == 407:
            hint = "the proxy wants credentials: check HTTPS_PROXY/HTTP_PROXY"
        elif status in _REDIRECTS:
            location = response.headers.get("Location", "(none)")[:200]
            hint = f"it redirects to {redact_url(location)}: set OPENLINEAGE_URL to where it points"
        else:
            hint = "check the URL and endpoint (OPENLINEAGE_URL, OPENLINEAGE_ENDPOINT)"
        return Outcome.retry(f"http_{status}", f"{detail} ({hint})"), f"{detail}; {hint}"
    return Outcome.rejected("rejected_by_backend", detail), None
