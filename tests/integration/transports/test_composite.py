"""The composite transport: several backends behind one outbox (real sinks on loopback)."""

import logging
import os
import re
import time
import uuid
from collections import Counter

import pytest

from outbox import ConfigError, Outbox
from outbox.tools.sink import Sink, SinkBehaviour
from outbox.transports import (
    DELIVERED,
    CompositeTransport,
    HttpTransport,
    Outcome,
    OutcomeKind,
    SerializedEvent,
)
from outbox.transports import composite as composite_module

from support.helpers import refused_port, run_event, wait_until

FAST = {"backoff_base": 0.02, "backoff_cap": 0.2, "linger": 0.01, "close_at_exit": False}


def keys(sink: Sink) -> Counter:
    return Counter((e["run"]["runId"], e["n"]) for e in sink.events)


def test_every_member_gets_every_event_once_and_a_member_that_was_down_catches_up():
    with Sink() as up, Sink(behaviour=SinkBehaviour(fail_status=503)) as down:
        transport = CompositeTransport(
            {"up": HttpTransport(up.url, mode="batch"), "down": HttpTransport(down.url, mode="batch")}
        )
        outbox = Outbox(transport, **FAST)
        run_id = str(uuid.uuid4())
        for n in range(20):
            outbox.emit(run_event(run_id=run_id, n=n))
        assert wait_until(lambda: len(up.events) == 20, 10)
        # Held by the member that is down, in its own buffer; the other one is done with them.
        assert wait_until(lambda: outbox.stats().members["down"]["retried"] >= 20, 10)
        assert wait_until(lambda: outbox.stats().members["up"]["delivered"] == 20, 10)
        down.behaviour = SinkBehaviour()
        report = outbox.close(10)
        stats = outbox.stats()
    assert report.delivered == 20  # handed to every member
    assert report.complete, report
    assert keys(up) == Counter({(run_id, n): 1 for n in range(20)})  # never sent twice
    assert keys(down) == Counter({(run_id, n): 1 for n in range(20)})
    assert [e["n"] for e in down.events] == list(range(20))  # in order
    up_counts = stats.members["up"]
    assert up_counts == {"emitted": 20, "delivered": 20, "retried": 0, "queued_events": 0, "in_flight": 0}
    assert stats.members["down"]["delivered"] == 20
    assert stats.members["down"]["retried"] >= 20
    assert report.members == stats.members


@pytest.mark.parametrize("continue_on_failure", [True, False])
def test_an_event_one_member_rejects_and_another_takes(continue_on_failure):
    """A run id that is not a UUID: the spec sink rejects it, Marquez takes it (as the real
    one does).  Each member accounts for its own: the rejection is the spec member's loss
    only, whatever continue_on_failure says (a member's trouble never stops the others)."""
    with Sink() as spec, Sink(behaviour=SinkBehaviour(flavor="marquez")) as marquez:
        members = {
            "spec": HttpTransport(spec.url, mode="batch"),
            "marquez": HttpTransport(marquez.url, mode="single"),
        }
        outbox = Outbox(CompositeTransport(members, continue_on_failure=continue_on_failure), **FAST)
        odd = run_event(n=1)
        odd["run"]["runId"] = "42"
        outbox.emit(run_event(n=0))
        outbox.emit(odd)
        report = outbox.close(10)
        stats = outbox.stats()
    assert sorted(e["n"] for e in marquez.events) == [0, 1]
    assert [e["n"] for e in spec.events] == [0]
    assert stats.members["spec"]["delivered"] == 1
    assert stats.members["spec"]["rejected_by_backend"] == 1
    assert stats.members["marquez"]["delivered"] == 2
    assert report.delivered == 2
    assert not report.complete  # one member lost one
    assert report.members["spec"]["rejected_by_backend"] == 1


def test_a_member_settles_its_own_poison_while_the_other_takes_everything():
    with Sink() as spec, Sink(behaviour=SinkBehaviour(flavor="datahub")) as datahub:
        transport = CompositeTransport(
            {
                "spec": HttpTransport(spec.url, mode="batch"),
                "datahub": HttpTransport(f"{datahub.url}/openapi/openlineage/", mode="single"),
            },
        )
        outbox = Outbox(transport, poison_attempts=2, **FAST)
        outbox.emit(run_event(n=0))  # no processing_engine: DataHub answers 500, as poison
        engine = run_event(n=1)
        engine["run"]["facets"]["processing_engine"] = {
            "_producer": "p",
            "_schemaURL": "s",
            "version": "1",
            "name": "x",
        }
        outbox.emit(engine)
        assert wait_until(lambda: sorted(e["n"] for e in spec.events) == [0, 1], 10), spec.events
        assert wait_until(lambda: outbox.stats().members["datahub"].get("poison") == 1, 15), outbox.stats()
        report = outbox.close(2)
    assert report.members["datahub"]["delivered"] == 1
    assert report.members["spec"]["delivered"] == 2
    assert [e["n"] for e in datahub.events] == [1]


def test_without_continue_on_success_the_members_are_a_failover_chain():
    with Sink() as backup:
        transport = CompositeTransport(
            {
                "primary": HttpTransport(f"http://127.0.0.1:{refused_port()}"),
                "backup": HttpTransport(backup.url),
            },
            continue_on_success=False,
        )
        outbox = Outbox(transport, **FAST)
        for n in range(5):
            outbox.emit(run_event(n=n))
        report = outbox.close(10)
        stats = outbox.stats()
    assert report.delivered == 5
    assert sorted(e["n"] for e in backup.events) == list(range(5))
    assert stats.members["primary"]["retried"] >= 5
    assert stats.members["backup"]["delivered"] == 5


# -- configuration, as openlineage-python reads it ---------------------------------------------


def test_composite_from_env_with_the_openlineage_url_alias(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with Sink() as a, Sink() as b:
        env = {
            "OPENLINEAGE_URL": b.url,
            "OPENLINEAGE__TRANSPORT__TYPE": "composite",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__LOCAL__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__LOCAL__URL": a.url,
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__LOCAL__PRIORITY": "3",
        }
        outbox = Outbox.from_env(env, **FAST)
        assert isinstance(outbox.transport, CompositeTransport)
        assert list(outbox.transport.members) == ["local", "default_http"]
        outbox.emit(run_event())
        assert outbox.close(10).delivered == 1
        assert len(a.events) == len(b.events) == 1


def test_composite_as_a_list_in_yaml_sorted_by_priority(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "openlineage.yml").write_text(
        "transport:\n"
        "  type: composite\n"
        "  sort_transports: true\n"
        "  continue_on_success: false\n"
        "  transports:\n"
        "    - {type: console, name: low, priority: 1}\n"
        "    - {type: http, url: 'http://marquez:5000', name: high, priority: 5}\n"
    )
    outbox = Outbox.from_env({}, close_at_exit=False)
    assert list(outbox.transport.members) == ["high", "low"]
    assert outbox.transport.continue_on_success is False
    outbox.close(0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "a composite transport needs transports"),
        (
            {"OPENLINEAGE__TRANSPORT__TRANSPORTS__A__URL": "http://m"},
            "the member 'a' needs a transport config",
        ),
        (  # a member may be composite itself, but needs members of its own
            {"OPENLINEAGE__TRANSPORT__TRANSPORTS__A__TYPE": "composite"},
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__A__TRANSPORTS: a composite transport needs transports",
        ),
        (  # helper-37: it named OPENLINEAGE_URL, the top level's, which a member does not read
            {"OPENLINEAGE__TRANSPORT__TRANSPORTS__A__TYPE": "http"},
            "the http transport needs a url: set OPENLINEAGE__TRANSPORT__TRANSPORTS__A__URL ",
        ),
        (
            {
                "OPENLINEAGE__TRANSPORT__TRANSPORTS__A__TYPE": "http",
                "OPENLINEAGE__TRANSPORT__TRANSPORTS__A__URL": "http://<host>:5000",
            },
            r"has no host name there \('<host>'\); put the backend's host name or address, e.g. "
            r"http://marquez:5000 \(OPENLINEAGE__TRANSPORT__TRANSPORTS__A__URL\)",
        ),
        (
            {"OPENLINEAGE__TRANSPORT__TRANSPORTS__A__TYPE": "kafka"},
            "the kafka transport needs a topic: set OPENLINEAGE__TRANSPORT__TRANSPORTS__A__TOPIC$",
        ),
        (
            {
                "OPENLINEAGE__TRANSPORT__TRANSPORTS__A__TYPE": "console",
                "OPENLINEAGE__TRANSPORT__CONTINUE_ON_FAILURE": '["maybe"]',
            },
            r"OPENLINEAGE__TRANSPORT__CONTINUE_ON_FAILURE=\['maybe'\] is not a boolean",
        ),
    ],
)
def test_composite_configuration_errors_name_the_setting(monkeypatch, tmp_path, env, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        Outbox.from_env({"OPENLINEAGE__TRANSPORT__TYPE": "composite", **env}, close_at_exit=False)


def test_a_members_missing_url_is_named_in_the_file_that_configures_it(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "openlineage.yml"
    config.write_text("transport:\n  type: composite\n  transports:\n    a:\n      type: http\n")
    with pytest.raises(ConfigError) as raised:
        Outbox.from_env({"OPENLINEAGE_CONFIG": str(config)}, close_at_exit=False)
    assert str(raised.value) == (
        f"the http transport needs a url: set transport.transports.a.url in {config} (e.g. http://marquez:5000)"
    )


@pytest.mark.parametrize(
    ("env", "yml", "message"),
    [
        (  # a member of a member, by variables: its own variable, not "X, or Y" glued
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "composite",
                "OPENLINEAGE__TRANSPORT__TRANSPORTS__OUTER__TYPE": "composite",
                "OPENLINEAGE__TRANSPORT__TRANSPORTS__OUTER__TRANSPORTS__B__TYPE": "http",
            },
            None,
            "the http transport needs a url: set "
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__OUTER__TRANSPORTS__B__URL (e.g. http://marquez:5000)",
        ),
        (  # the whole transport as one variable's JSON: the key in it
            {
                "OPENLINEAGE__TRANSPORT": '{"type": "composite", "transports": {"a": {"type": "http", '
                '"url": "ftp://x"}}}'
            },
            None,
            "url='ftp://x' is not an HTTP URL; use e.g. http://marquez:5000 "
            "(OPENLINEAGE__TRANSPORT: transports.a.url)",
        ),
        (
            {"OPENLINEAGE__TRANSPORT": '{"type": "composite", "transports": {"a": {"type": "http"}}}'},
            None,
            "the http transport needs a url: set transports.a.url in OPENLINEAGE__TRANSPORT "
            "(e.g. http://marquez:5000)",
        ),
        (  # a list's member, unnamed: by its place in the list, not by a name the file never had
            {},
            "transport:\n  type: composite\n  transports:\n    - type: http\n",
            "the http transport needs a url: set transport.transports[0].url in {config} "
            "(e.g. http://marquez:5000)",
        ),
        (  # a file member without its path: its own variable, not the top level's
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "composite",
                "OPENLINEAGE__TRANSPORT__TRANSPORTS__F__TYPE": "file",
            },
            None,
            "the file transport needs a log_file_path; set "
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__F__LOG_FILE_PATH (got None)",
        ),
        (  # a value in a file: the file first, then the setting and its value
            {},
            "transport:\n  type: kafka\n  topic: 123\n  config:\n    bootstrap.servers: x:9092\n",
            '{config}: transport.topic=123 is read as a number, not a topic name; quote it ("123")',
        ),
        (  # the hint names the member's variable, not the top level's
            {
                "OPENLINEAGE__TRANSPORT__TYPE": "composite",
                "OPENLINEAGE__TRANSPORT__TRANSPORTS__K__TYPE": "kafka",
                "OPENLINEAGE__TRANSPORT__TRANSPORTS__K__TOPIC": "123",
                "OPENLINEAGE__TRANSPORT__TRANSPORTS__K__CONFIG": '{"bootstrap.servers": "x:9092"}',
            },
            None,
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__K__TOPIC=123 is read as a number, not a topic name; quote "
            "it (OPENLINEAGE__TRANSPORT__TRANSPORTS__K__TOPIC='\"123\"')",
        ),
    ],
)
def test_a_setting_at_any_depth_is_named_as_it_was_set(monkeypatch, tmp_path, env, yml, message):
    """helper-41: a member's member named "transport.transports.outer.transports, or
    OPENLINEAGE__TRANSPORT__TRANSPORTS__OUTER__TRANSPORTS.b.url", a variable no one can set; an
    unnamed list member was "http-0"; a file member without its path named the top level's
    variable; a value was glued after the file's name ("... in FILE=123").  Each setting is now
    named by where it was set (a variable, a key of a variable's JSON, a key of the file), at
    any depth, and a missing one by where it would go beside its siblings."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "openlineage.yml"
    if yml is not None:
        config.write_text(yml)
        env = {**env, "OPENLINEAGE_CONFIG": str(config)}
    with pytest.raises(ConfigError) as raised:
        Outbox.from_env(env, close_at_exit=False)
    assert str(raised.value) == message.format(config=config)


def test_from_env_after_openlineage_client_ran(monkeypatch, tmp_path):
    """OpenLineageClient() writes OPENLINEAGE__TRANSPORT__TRANSPORTS__DEFAULT_HTTP__* into
    os.environ; every later from_env must still work, with the same members."""
    from openlineage.client import OpenLineageClient

    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("OPENLINEAGE"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OPENLINEAGE_URL", "http://marquez:5000")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TYPE", "composite")
    monkeypatch.setenv("OPENLINEAGE__TRANSPORT__TRANSPORTS__CONSOLE__TYPE", "console")
    client = OpenLineageClient()
    assert any(k.startswith("OPENLINEAGE__TRANSPORT__TRANSPORTS__DEFAULT_HTTP") for k in os.environ)
    theirs = sorted(t.name for t in client.transport.transports)
    outbox = Outbox.from_env(close_at_exit=False)
    assert sorted(outbox.transport.members) == theirs == ["console", "default_http"]
    outbox.close(0)


def test_a_composite_nested_in_a_composite_delivers_to_every_member(monkeypatch, tmp_path):
    """As openlineage-python's factory builds it: the inner composite is one member."""
    monkeypatch.chdir(tmp_path)
    with Sink() as a, Sink() as b, Sink() as c:
        env = {
            "OPENLINEAGE__TRANSPORT__TYPE": "composite",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__A__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__A__URL": a.url,
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TYPE": "composite",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TRANSPORTS__B__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TRANSPORTS__B__URL": b.url,
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TRANSPORTS__C__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TRANSPORTS__C__URL": c.url,
        }
        outbox = Outbox.from_env(env, **FAST)
        assert isinstance(outbox.transport.members["inner"], CompositeTransport)
        for i in range(3):
            outbox.emit(run_event(n=i))
        report = outbox.close(10)
    assert report.delivered == 3
    for sink in (a, b, c):
        assert sorted(e["n"] for e in sink.events) == [0, 1, 2]


def test_a_nested_composites_members_drain_before_the_close_reports(monkeypatch, tmp_path):
    """The inner composite's own worker ends as soon as it has handed its events to its members;
    the close must wait for those members too.  With member B answering after 0.5 s, the close
    used to settle the outbox when the inner worker ended, counting B's events dropped_shutdown
    (CI saw it by chance: a loaded machine made B slow)."""
    monkeypatch.chdir(tmp_path)
    with Sink() as a, Sink(behaviour=SinkBehaviour(delay=0.5)) as b, Sink() as c:
        env = {
            "OPENLINEAGE__TRANSPORT__TYPE": "composite",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__A__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__A__URL": a.url,
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TYPE": "composite",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TRANSPORTS__B__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TRANSPORTS__B__URL": b.url,
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TRANSPORTS__C__TYPE": "http",
            "OPENLINEAGE__TRANSPORT__TRANSPORTS__INNER__TRANSPORTS__C__URL": c.url,
        }
        outbox = Outbox.from_env(env, **FAST)
        for i in range(3):
            outbox.emit(run_event(n=i))
        report = outbox.close(10)
        assert sorted(e["n"] for e in b.events) == [0, 1, 2], report
    # The report was made once B had answered: it shows the nested members' own accounts.
    assert report.members["inner.b"]["delivered"] == 3, report
    assert report.members["inner.c"]["delivered"] == 3, report
    assert report.duration >= 0.5, report
    assert not report.timed_out, report
    assert report.complete, report


class DefersOnce:
    def __init__(self) -> None:
        self.calls = 0

    async def send(self, batch, deadline):
        self.calls += 1
        return [Outcome.deferred() if self.calls == 1 else DELIVERED for _ in batch]

    async def aclose(self) -> None:
        pass


def test_a_member_that_defers_is_not_counted_as_retried():
    """A member that had no time to send (a deferral: the single mode's one-second slice ended,
    as it does on a loaded machine) has not failed: the outbox does not count it as a retry,
    and neither do the member's stats."""
    with Sink() as up:
        transport = CompositeTransport({"up": HttpTransport(up.url, mode="batch"), "slow": DefersOnce()})
        outbox = Outbox(transport, **FAST)
        outbox.emit(run_event(n=0))
        report = outbox.close(10)
        stats = outbox.stats()
    assert report.delivered == 1
    assert stats.retried == 0
    assert stats.members["slow"]["delivered"] == 1
    assert stats.members["slow"]["retried"] == 0


async def test_a_composite_called_directly_does_not_count_a_deferral_as_a_retry():
    """The same through ``send`` (a failover chain, a composite called directly): its
    ``member_stats`` counted the deferral as a retry before."""
    transport = CompositeTransport({"slow": DefersOnce()})
    batch = [SerializedEvent(b"{}", None, None)]
    assert [o.kind for o in await transport.send(batch, time.monotonic() + 5)] == [OutcomeKind.DEFERRED]
    assert [o.kind for o in await transport.send(batch, time.monotonic() + 5)] == [OutcomeKind.DELIVERED]
    assert transport.member_stats() == {"slow": {"delivered": 1}}


# -- the composite's own log, at a bounded rate ---------------------------------------------


class RaisingMember:
    """A member whose send raises every time (a bug in it, or in its client library)."""

    def __init__(self) -> None:
        self.calls = 0

    async def send(self, batch, deadline):
        self.calls += 1
        raise ConnectionError("the client library broke")

    async def aclose(self) -> None:
        pass


def member_failures(caplog) -> list[str]:
    said = [r.getMessage() for r in caplog.records if r.name == "outbox"]
    return [text for text in said if text.startswith("the composite member broken ")]


def failing_chain(member: RaisingMember) -> Outbox:
    """A failover chain (the outbox calls the composite's send, which calls the member's),
    retrying as fast as the settings allow."""
    transport = CompositeTransport({"broken": member}, continue_on_success=False)
    return Outbox(transport, backoff_base=0.001, backoff_cap=0.002, linger=0, close_at_exit=False)


def test_a_member_whose_send_raises_every_round_is_logged_at_a_bounded_rate(caplog):
    """Backend trouble is logged at a bounded rate: a member that raises in every round gave
    one ERROR per round before (the composite's own line, beside the worker's limited one)."""
    caplog.set_level(logging.ERROR, logger="outbox")
    member = RaisingMember()
    outbox = failing_chain(member)
    for n in range(5):
        outbox.emit(run_event(n=n))
    assert wait_until(lambda: member.calls >= 50, 10), member.calls
    outbox.close(0.1)
    failures = member_failures(caplog)
    assert member.calls >= 50
    assert len(failures) == 1, (len(failures), failures[:3])
    assert (
        failures[0]
        == f"the composite member broken ({member!r}) failed: ConnectionError('the client library broke')"
    )


def test_the_next_line_about_a_raising_member_says_how_many_were_held_back(caplog, monkeypatch):
    monkeypatch.setattr(composite_module, "_LOG_INTERVAL", 0.1)
    caplog.set_level(logging.ERROR, logger="outbox")
    member = RaisingMember()
    outbox = failing_chain(member)
    outbox.emit(run_event(n=0))
    held_back = re.compile(r" \((\d+) similar messages held back in the last 0.1 s\)$")
    assert wait_until(lambda: any(held_back.search(t) for t in member_failures(caplog)), 10)
    outbox.close(0.1)
    failures = member_failures(caplog)
    first, later = failures[0], next(t for t in failures if held_back.search(t))
    assert not held_back.search(first)
    assert int(held_back.search(later).group(1)) >= 1
    assert held_back.sub("", later) == first  # the same text, with the count after it
    assert len(failures) < member.calls
