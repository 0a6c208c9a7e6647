"""The one place the tests look inside an outbox: its buffer, its sidecar and worker, its
resolved settings, its spill and dead-letter file.  A test that must see a part goes through
these, never ``box._buffer``, so that when the facade's parts move or are renamed, this file
changes and the tests do not.  (A part's own interface, once reached, is the part's: a test of
the buffer calls the buffer's methods.)"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from outbox import Outbox, Transport


def buffer(box: Outbox) -> Any:
    """The bounded buffer ``emit`` puts into (admission, bounds, the policy)."""
    return box._buffer


def held(box: Outbox) -> int:
    """The events the buffer holds: queued, and taken by the worker but not yet settled."""
    buf = box._buffer
    return len(buf.holdings.queue) + buf.holdings.in_flight


def in_window(box: Outbox) -> int:
    """With a spill: the events the buffer's memory window holds."""
    return len(box._buffer.holdings.overflow.events)


def sidecar(box: Outbox) -> Any:
    """The sidecar that runs the worker (its thread, its loop, its tasks)."""
    return box._sidecar


@contextlib.contextmanager
def sidecar_held(box: Outbox) -> Iterator[None]:
    """The sidecar's loop held by a call that waits (a sidecar starved of the GIL): until the
    block ends it takes nothing from the queue and looks at nothing in it, so a test can see
    what ``emit`` left there however busy the machine."""
    running, release = threading.Event(), threading.Event()

    def hold() -> None:
        running.set()
        release.wait(60)

    box._sidecar.loop.call_soon_threadsafe(hold)
    assert running.wait(30), "the sidecar's loop never ran the hold"
    try:
        yield
    finally:
        release.set()


def worker(box: Outbox) -> Any:
    """The worker: intake, backlog, lanes, sender."""
    return box._sidecar.worker


def settings(box: Outbox) -> Any:
    """The worker's resolved settings (batching, lanes, retries)."""
    return box._assembly.settings


def effective_settings(box: Outbox) -> Any:
    """Every setting as the outbox resolved it (what ``outbox check`` prints)."""
    return box._effective_settings()


def limits(box: Outbox) -> Any:
    """The buffer's resolved bounds and policy."""
    return box._assembly.limits


def name(box: Outbox) -> str | None:
    return box._assembly.name


def shutdown_timeout(box: Outbox) -> float:
    return box._assembly.shutdown_timeout


def spill(box: Outbox) -> Any:
    """The spill (``spill_dir``), or None."""
    return box._spill


def dead_letter(box: Outbox) -> Any:
    """The dead-letter file's writer, or None."""
    return box._assembly.dead_letter


def set_transport(box: Outbox, transport: Transport) -> None:
    """Where the outbox ships from now on (a forked child's own transport, in a test)."""
    box._assembly.transport = transport


def http_headers(transport: Any) -> Any:
    """The headers an HTTP transport sends with every request (authorization included)."""
    return transport._headers


def http_verify(transport: Any) -> Any:
    """What an HTTP transport verifies TLS with (a bool, a CA path or an SSL context)."""
    return transport._verify


def http_forcelist(transport: Any) -> Any:
    """The HTTP statuses an HTTP transport retries (openlineage-python's status_forcelist)."""
    return transport._forcelist


def wire_connections(client: Any) -> Any:
    """The connections an HTTP transport's own client holds open (``_http/_wire.py``)."""
    return client._open
