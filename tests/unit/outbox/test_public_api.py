from pathlib import Path

import outbox


def test_all_is_pinned_and_sorted():
    assert outbox.__all__ == [
        "About",
        "CloseReport",
        "ConfigError",
        "DatasetRef",
        "Event",
        "LineageJob",
        "Outbox",
        "OutboxError",
        "OutboxTransport",
        "Outcome",
        "OutcomeKind",
        "Policy",
        "Reason",
        "Run",
        "SerializedEvent",
        "Stats",
        "Transport",
        "current_run_id",
        "s3_dataset",
        "trino_dataset",
    ]
    assert outbox.__all__ == sorted(outbox.__all__)


def test_public_names_report_the_public_module():
    for name in outbox.__all__:
        if name == "Event":  # a type alias (a Union), not a class
            continue
        assert getattr(outbox, name).__module__ == "outbox", name


def test_package_is_typed():
    assert (Path(outbox.__file__).parent / "py.typed").exists()


def test_transports_all_is_pinned():
    from outbox import transports

    assert set(transports.__all__) == {
        "About",
        "DELIVERED",
        "CompositeTransport",
        "ConsoleTransport",
        "FileTransport",
        "HttpTransport",
        "KafkaTransport",
        "MemoryTransport",
        "OpenLineageTransportAdapter",
        "Outcome",
        "OutcomeKind",
        "SerializedEvent",
        "Transport",
        "transport_from_config",
    }
    for name in transports.__all__:
        assert hasattr(transports, name)


def test_an_outbox_shows_its_transport_read_only():
    import pytest

    from outbox import Outbox
    from outbox.transports import MemoryTransport

    transport = MemoryTransport()
    outbox = Outbox(transport, close_at_exit=False)
    try:
        assert outbox.transport is transport
        with pytest.raises(AttributeError):
            outbox.transport = MemoryTransport()  # type: ignore[misc]
    finally:
        outbox.close(1)
