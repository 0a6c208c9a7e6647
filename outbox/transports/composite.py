"""The composite transport: one outbox, several backends (openlineage-python's ``composite``).

Sending to every member (``continue_on_success``, the default), an :class:`~outbox.Outbox`
does not call this transport's ``send``: it gives each member a buffer, worker, retry list,
circuit and lanes of its own (``outbox/_worker/_fanout.py``), so that a member that is down or slow
never delays or drops another's events, and ``Outbox.stats().members`` shows each member's
own accounts.  Here the composite is the description of its members and flags.

``send`` is what runs a composite that is not given its own runtime: a failover chain
(``continue_on_success=False``: an event goes to the next member only if the previous ones
did not deliver it, and is delivered once one did), or a composite called directly, or nested
in a failover chain.  There each batch goes to every member concurrently; an event is
delivered when every member has delivered it; a member that has delivered it is not sent it
again while another member needs a retry.  With ``continue_on_failure`` (the default, as in
openlineage-python), an event a member rejects for good still counts as delivered when another
member delivered it; without it, the event is rejected.  Those per-member outcomes are counted
in :meth:`member_stats`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from .._observability._log import RateLimitedLog, described
from ._base import DELIVERED, Outcome, OutcomeKind, SerializedEvent, Transport

__all__ = ["CompositeTransport"]

# Events that some member delivered and another must retry, remembered by identity (the
# worker sends the same object again).  Bounded: past this many, the oldest are forgotten
# (they would be sent again to a member that already has them: at least once, never lost).
_MAX_REMEMBERED = 100_000
# Seconds between two lines about the same member's trouble (as the other transports): a
# member that raises in every round is one line per interval, with the count held back.
_LOG_INTERVAL = 30.0


class CompositeTransport:
    """Fan events out to several transports.

    Example::

        CompositeTransport({"marquez": HttpTransport("http://marquez:5000"),
                            "broker": KafkaTransport("lineage", {"bootstrap.servers": "b:9092"})})

    Args:
        members: name -> transport, in order (the failover order without
            ``continue_on_success``).
        continue_on_failure: an event one member rejects for good still counts as delivered
            if another member delivered it.
        continue_on_success: send every event to every member (default); False makes the
            members a failover chain.
    """

    def __init__(
        self,
        members: Mapping[str, Transport],
        *,
        continue_on_failure: bool = True,
        continue_on_success: bool = True,
    ) -> None:
        if not members:
            raise ValueError("a composite transport needs at least one member")
        self.members = dict(members)
        self.continue_on_failure = continue_on_failure
        self.continue_on_success = continue_on_success
        # id(event) -> (event, members that delivered it, members that rejected it)
        self._partial: dict[int, tuple[SerializedEvent, set[str], dict[str, Outcome]]] = {}
        self._stats: dict[str, dict[str, int]] = {name: {} for name in self.members}
        self._log = RateLimitedLog(_LOG_INTERVAL)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={member!r}" for name, member in self.members.items())
        return f"CompositeTransport({inner})"

    def member_stats(self) -> dict[str, dict[str, int]]:
        """Per member: ``delivered``, ``retried`` and one count per rejection reason."""
        return {name: dict(counts) for name, counts in self._stats.items()}

    def clone(self) -> CompositeTransport:
        twin = CompositeTransport(
            {name: _clone(member) for name, member in self.members.items()},
            continue_on_failure=self.continue_on_failure,
            continue_on_success=self.continue_on_success,
        )
        return twin

    async def aclose(self) -> None:
        for name, member in self.members.items():
            try:
                await member.aclose()
            except Exception as exc:  # one member's trouble must not keep the others open
                self._log.error(f"close:{name}", "closing the composite member %s failed: %r", name, exc)

    async def send(self, batch: Sequence[SerializedEvent], deadline: float) -> Sequence[Outcome]:
        if self.continue_on_success:
            return await self._send_to_all(batch, deadline)
        return await self._send_in_turn(batch, deadline)

    # -- every member ---------------------------------------------------------------------

    async def _send_to_all(self, batch: Sequence[SerializedEvent], deadline: float) -> list[Outcome]:
        partial = self._partial
        history = [partial.get(id(event)) for event in batch]
        delivered: list[set[str]] = []
        rejected: list[dict[str, Outcome]] = []
        for event, known in zip(batch, history, strict=True):
            if known is not None and known[0] is event:
                delivered.append(known[1])
                rejected.append(known[2])
            else:
                delivered.append(set())
                rejected.append({})
        wanted = {
            name: [i for i in range(len(batch)) if name not in delivered[i] and name not in rejected[i]]
            for name in self.members
        }
        answers = await asyncio.gather(
            *(
                self._member_send(name, [batch[i] for i in indexes], deadline)
                for name, indexes in wanted.items()
            )
        )
        retry: list[Outcome | None] = [None] * len(batch)
        for (name, indexes), outcomes in zip(wanted.items(), answers, strict=True):
            for i, outcome in zip(indexes, outcomes, strict=True):
                if outcome.kind is OutcomeKind.DELIVERED:
                    delivered[i].add(name)
                elif outcome.kind is OutcomeKind.REJECTED:
                    rejected[i][name] = outcome
                elif retry[i] is None or outcome.kind is OutcomeKind.RETRY:
                    retry[i] = _named(name, outcome)
        results: list[Outcome] = []
        for i, event in enumerate(batch):
            again = retry[i]
            if again is not None:
                self._remember(event, delivered[i], rejected[i])
                results.append(again)
                continue
            partial.pop(id(event), None)
            if not rejected[i] or (self.continue_on_failure and delivered[i]):
                results.append(DELIVERED)
            else:
                name, outcome = next(iter(rejected[i].items()))
                results.append(_named(name, outcome))
        return results

    def _remember(self, event: SerializedEvent, delivered: set[str], rejected: dict[str, Outcome]) -> None:
        partial = self._partial
        if not delivered and not rejected:
            partial.pop(id(event), None)
            return
        if id(event) not in partial and len(partial) >= _MAX_REMEMBERED:
            partial.pop(next(iter(partial)))
        partial[id(event)] = (event, delivered, rejected)

    # -- a failover chain -----------------------------------------------------------------

    async def _send_in_turn(self, batch: Sequence[SerializedEvent], deadline: float) -> list[Outcome]:
        results: list[Outcome | None] = [None] * len(batch)
        first_failure: list[Outcome | None] = [None] * len(batch)
        left = list(range(len(batch)))
        for name in self.members:
            if not left:
                break
            outcomes = await self._member_send(name, [batch[i] for i in left], deadline)
            still: list[int] = []
            for i, outcome in zip(left, outcomes, strict=True):
                if outcome.kind is OutcomeKind.DELIVERED:
                    results[i] = DELIVERED
                    continue
                known = first_failure[i]
                if known is None or (
                    outcome.kind is OutcomeKind.RETRY and known.kind is not OutcomeKind.RETRY
                ):
                    first_failure[i] = _named(name, outcome)  # a retry wins over a rejection
                if outcome.kind is OutcomeKind.REJECTED and not self.continue_on_failure:
                    results[i] = _named(name, outcome)
                    continue
                still.append(i)
            left = still
        return [r if r is not None else (first_failure[i] or DELIVERED) for i, r in enumerate(results)]

    # -- one member -----------------------------------------------------------------------

    async def _member_send(self, name: str, events: list[SerializedEvent], deadline: float) -> list[Outcome]:
        if not events:
            return []
        member = self.members[name]
        try:
            outcomes = list(await member.send(events, deadline))
            if len(outcomes) != len(events) or not all(type(o) is Outcome for o in outcomes):
                raise TypeError(f"returned {len(outcomes)} outcomes for {len(events)} events")
        except Exception as exc:  # a member's bug is a retry for its events, not the others'
            self._log.error(f"send:{name}", "the composite member %s (%r) failed: %r", name, member, exc)
            said = f"{type(exc).__name__}: {described(exc)}"  # (its __str__ may raise)
            outcomes = [Outcome.retry("transport_error", said)] * len(events)
        counts = self._stats[name]
        for outcome in outcomes:
            if outcome.kind is OutcomeKind.DEFERRED:
                continue  # no time to try: not a failure, as the outbox counts it
            key = (
                "delivered"
                if outcome.kind is OutcomeKind.DELIVERED
                else "retried"
                if outcome.kind is not OutcomeKind.REJECTED
                else outcome.reason or "rejected_by_backend"
            )
            counts[key] = counts.get(key, 0) + 1
        return outcomes


def _named(name: str, outcome: Outcome) -> Outcome:
    detail = f"{name}: {outcome.detail or outcome.reason}"
    return Outcome(outcome.kind, outcome.reason, detail, outcome.retry_after)


def _clone(member: Any) -> Any:
    clone = getattr(member, "clone", None)
    return clone() if callable(clone) else member
