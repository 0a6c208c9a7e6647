"""Dataset names as openlineage-python's naming helpers write them (``S3`` and ``Trino`` in
``openlineage.client.naming.dataset``), without importing them: any ``openlineage.client``
import runs that package's ``__init__`` (about 300 ms), on the first handler call if not at
``import outbox``.  ``tests/test_naming.py`` compares the two over good and bad parts."""

from __future__ import annotations

from typing import Any

__all__ = ["s3_naming", "trino_naming"]


def _check_not_empty(field: str, value: Any) -> None:
    """Refuse a part as openlineage-python's ``_check_not_empty`` validator does: the same
    errors, in the same order (its attrs classes check their fields in declaration order)."""
    if value is None:
        raise ValueError(f"{field} cannot be None")
    if not value.strip():  # a part that is no text fails here as it fails there
        raise ValueError(f"{field} cannot be empty")


def s3_naming(bucket_name: str, object_key: str) -> tuple[str, str]:
    """``(namespace, name)`` of an S3 object: ``s3://<bucket>``, ``<key>``.

    Raises:
        ValueError: an empty or None part, named as openlineage-python names it.
    """
    _check_not_empty("bucket_name", bucket_name)
    _check_not_empty("object_key", object_key)
    return f"s3://{bucket_name}", object_key


def trino_naming(host: str, port: str, catalog: str, schema: str, table: str) -> tuple[str, str]:
    """``(namespace, name)`` of a Trino table: ``trino://<host>:<port>``,
    ``<catalog>.<schema>.<table>``.

    Raises:
        ValueError: an empty or None part, named as openlineage-python names it.
    """
    for field, value in (
        ("host", host),
        ("port", port),
        ("catalog", catalog),
        ("schema", schema),
        ("table", table),
    ):
        _check_not_empty(field, value)
    return f"trino://{host}:{port}", f"{catalog}.{schema}.{table}"
