"""What released DataHub's OpenLineage converter cannot make a usable dataset of: the HTTP
transport warns once when an event names one (DataHub accepts the event, and the dataset is
lost in it)."""

from __future__ import annotations

import re
from collections.abc import Iterable

import orjson

from ..._observability._log import logger

# What DataHub's dataset URNs cannot hold (its docs: "URN restrictions"), and what java.net.URI
# refuses in the URI DataHub makes of a namespace with a scheme (it then leaves the dataset out).
_URN_RESERVED = frozenset(",()\u241f")
_URI_ILLEGAL = re.compile(r'[\x00-\x20"<>\\^`{|}\x7f]|%(?![0-9A-Fa-f]{2})')


def datahub_unsafe_dataset(body: bytes) -> str | None:
    """What is wrong, for released DataHub, with the first dataset of this event that its
    converter cannot turn into a usable URN, or None.  The name checked is the one DataHub
    uses: a TABLE symlink's name when there is one, else the dataset's own name."""
    try:
        event = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(event, dict):
        return None
    for key in ("inputs", "outputs"):
        datasets = event.get(key)
        for dataset in datasets if isinstance(datasets, list) else ():
            if not isinstance(dataset, dict):
                continue
            namespace, name = dataset.get("namespace"), dataset.get("name")
            if not isinstance(namespace, str) or not isinstance(name, str):
                continue
            facets = dataset.get("facets")
            symlinks = facets.get("symlinks") if isinstance(facets, dict) else None
            identifiers = symlinks.get("identifiers") if isinstance(symlinks, dict) else None
            for identifier in identifiers if isinstance(identifiers, list) else ():
                table = identifier.get("name") if isinstance(identifier, dict) else None
                if isinstance(table, str) and identifier.get("type") == "TABLE":
                    namespace, name = "hive", table  # DataHub's hive platform, the symlink's name
            reserved = sorted(_URN_RESERVED.intersection(name))
            if reserved:
                return (
                    f"the dataset {namespace}/{name} holds {' '.join(repr(c) for c in reserved)}, which "
                    "DataHub's dataset URNs cannot hold"
                )
            if "://" in namespace and _URI_ILLEGAL.search(f"{namespace}/{name}"):
                return (
                    f"the dataset {namespace}/{name} holds a character a URI cannot (a space, a quote, "
                    "a bare %, ...), so DataHub cannot make a URI of it and leaves the dataset out"
                )
    return None


def warned_unsafe_dataset(bodies: Iterable[bytes]) -> bool:
    """Warn about the first dataset among these events that DataHub cannot hold (see
    :func:`datahub_unsafe_dataset`); whether there was one."""
    for body in bodies:
        problem = datahub_unsafe_dataset(body)
        if problem is not None:
            logger.warning(
                "%s: DataHub accepts such events but cannot use the dataset: rename the object, or "
                "name the table it belongs to (s3_dataset(..., table=...), the function's "
                "LINEAGE_INPUT_TABLE), which DataHub then names the dataset by. Said once.",
                problem,
            )
            return True
    return False
