"""Our S3 and Trino dataset naming (``outbox._run._naming``, behind ``s3_dataset`` and
``trino_dataset``) is openlineage-python's (``openlineage.client.naming.dataset``): the same
namespace and name for every part, the same exception with the same message for a bad one."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from openlineage.client.naming.dataset import S3, Trino

from outbox import s3_dataset, trino_dataset
from outbox._run._naming import s3_naming, trino_naming

# Good parts, and every way a part can be bad: empty, blank, None, not text at all.
PARTS: list[Any] = [
    "a",
    "orders",
    " padded ",
    "lineage-src/orders 1.csv",
    "dir/",
    "/leading",
    "a.b",
    "ünïcødé ✓",
    "tab\there",
    "",
    " ",
    "\t\n",
    "\u3000",  # an ideographic space: str.strip() removes it
    None,
    0,
    8080,
    b"bytes",
    b"",
    ["list"],
]


def _theirs(make: Any, **parts: Any) -> tuple[Any, ...]:
    try:
        naming = make(**parts)
    except Exception as exc:  # what we must raise too
        return type(exc), str(exc)
    return naming.get_namespace(), naming.get_name()


def _ours(call: Any, *parts: Any) -> tuple[Any, ...]:
    try:
        return tuple(call(*parts))[:2]
    except Exception as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize("key", PARTS)
@pytest.mark.parametrize("bucket", PARTS)
def test_s3_naming_is_openlineage_pythons(bucket: Any, key: Any) -> None:
    theirs = _theirs(S3, bucket_name=bucket, object_key=key)
    assert _ours(s3_naming, bucket, key) == theirs
    for _ in range(2):  # s3_dataset; the second time for a bucket it may know already
        assert _ours(s3_dataset, bucket, key) == theirs


# Trino: each part bad in turn, among good ones.
TRINO_GOOD = {
    "host": "trino.example",
    "port": "8080",
    "catalog": "vast",
    "schema": "lineage",
    "table": "orders",
}


@pytest.mark.parametrize("part", list(TRINO_GOOD))
@pytest.mark.parametrize("value", PARTS)
def test_trino_naming_is_openlineage_pythons(part: str, value: Any) -> None:
    parts = {**TRINO_GOOD, part: value}
    theirs = _theirs(Trino, **parts)
    assert _ours(trino_naming, *parts.values()) == theirs
    if part != "port":
        assert _ours(trino_dataset, *parts.values()) == theirs


# trino_dataset takes the port as a number too, and hands str(port) to the naming.
@pytest.mark.parametrize("port", [8080, "8080", 0, None, "", " "])
def test_trino_dataset_names_the_port_as_text(port: Any) -> None:
    parts = {**TRINO_GOOD, "port": str(port)}
    assert _ours(trino_dataset, *{**parts, "port": port}.values()) == _theirs(Trino, **parts)


def test_the_first_bad_part_is_the_one_named() -> None:
    # attrs checks the fields in declaration order; so do we.
    assert (
        _ours(s3_naming, None, "")
        == _theirs(S3, bucket_name=None, object_key="")
        == (
            ValueError,
            "bucket_name cannot be None",
        )
    )
    bad = dict.fromkeys(TRINO_GOOD, " ")
    assert _ours(trino_naming, *bad.values()) == _theirs(Trino, **bad) == (ValueError, "host cannot be empty")


@given(st.text(max_size=12), st.text(max_size=12))
def test_s3_naming_is_openlineage_pythons_for_any_text(bucket: str, key: str) -> None:
    assert _ours(s3_naming, bucket, key) == _theirs(S3, bucket_name=bucket, object_key=key)


@given(st.lists(st.text(max_size=8), min_size=5, max_size=5))
def test_trino_naming_is_openlineage_pythons_for_any_text(values: list[str]) -> None:
    parts = dict(zip(TRINO_GOOD, values, strict=True))
    assert _ours(trino_naming, *values) == _theirs(Trino, **parts)
