"""Configuration from the environment.

The transport is chosen exactly as openlineage-python chooses it, so the same
pipeline variables and ``openlineage.yml`` work unchanged:

0. ``OPENLINEAGE_DISABLED=true`` (trimmed, any case) turns lineage off.
1. A merged config with ``transport.type``: the YAML file (the first of
   ``$OPENLINEAGE_CONFIG``, ``./openlineage.yml``, ``~/.openlineage/openlineage.yml``)
   over ``OPENLINEAGE__*`` variables (``OPENLINEAGE__A__B=v`` sets ``a.b``; names
   split on ``__`` and lower-cased; values parsed as JSON when they parse; a
   whole-object variable such as ``OPENLINEAGE__TRANSPORT='{...}'`` wins).
2. ``OPENLINEAGE_URL`` (with ``OPENLINEAGE_ENDPOINT`` and ``OPENLINEAGE_API_KEY``) gives HTTP.
3. Otherwise the console, with a warning.

The outbox's own knobs come from ``OUTBOX_*`` variables (see :data:`OUTBOX_VARIABLES`).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigError
from .._observability._log import never_silent

__all__ = [
    "OUTBOX_VARIABLES",
    "ResolvedTransport",
    "Sources",
    "outbox_settings",
    "parse_bool",
    "parse_size",
    "resolve_transport_config",
    "tls_context",
]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "k": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
}


def openlineage_flag(name: str, value: Any) -> bool:
    """A transport's boolean setting read as openlineage-python reads it: its attrs fields have
    no converter, so a string is true unless empty (``'false'`` in YAML quotes is true).  Such
    a string is named once in a warning."""
    if isinstance(value, str):
        meaning = bool(value)
        if value.strip().lower() not in _TRUE:
            warn_once(
                f"{name}={value!r} is a string, which openlineage-python reads as {str(meaning).lower()} "
                f"(so does lineage-outbox): write {value.strip().lower() or 'false'} without quotes if "
                "you meant the boolean"
            )
        return meaning
    if isinstance(value, int) and not isinstance(value, bool):
        return bool(value)  # JSON 0 and 1, read as Python reads them
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a boolean; use true or false")
    return value


def parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean; use true or false")


def parse_size(name: str, raw: str) -> int:
    """``"65536"``, ``"64KiB"``, ``"64MiB"``, ``"1GB"`` (KiB/MiB/GiB: powers of 1024; KB/MB/GB: of 1000)."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", raw)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(f"{name}={raw!r} is not a size; use a whole number of bytes, or e.g. 512KiB, 64MiB")
    return int(match.group(1)) * _UNITS[unit]


def tls_context(
    cafile: str | None,
    cert: str | None,
    key: str | None,
    *,
    described: str,
    verify: bool = True,
    password: str | None = None,
) -> ssl.SSLContext:
    """A client TLS context (a CA bundle, a client certificate); ConfigError naming the
    settings (``described``) when a file cannot be loaded."""
    try:
        if cafile is not None and os.path.isdir(cafile):  # a folder of CA certificates, as requests takes
            context = ssl.create_default_context(capath=cafile)
        else:
            context = ssl.create_default_context(cafile=cafile)
        if not verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cert:
            context.load_cert_chain(cert, key, password)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS files ({described}): {exc}") from exc
    return context


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None


def _parse_float(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds, such as 0.5") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"{name}={raw!r} is not a finite number of seconds")
    return value


def _parse_str(name: str, raw: str) -> str:
    return raw.strip()


#: ``OUTBOX_*`` variable -> (``Outbox`` keyword, parser).
OUTBOX_VARIABLES: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "OUTBOX_MAX_EVENTS": ("max_events", _parse_int),
    "OUTBOX_MAX_BYTES": ("max_bytes", parse_size),
    "OUTBOX_POLICY": ("policy", _parse_str),
    "OUTBOX_BLOCK_TIMEOUT": ("block_timeout", _parse_float),
    "OUTBOX_MAX_BATCH_EVENTS": ("max_batch_events", _parse_int),
    "OUTBOX_MAX_BATCH_BYTES": ("max_batch_bytes", parse_size),
    "OUTBOX_LINGER": ("linger", _parse_float),
    "OUTBOX_SHUTDOWN_TIMEOUT": ("shutdown_timeout", _parse_float),
    "OUTBOX_SEND_TIMEOUT": ("send_timeout", _parse_float),
    "OUTBOX_BACKOFF_BASE": ("backoff_base", _parse_float),
    "OUTBOX_BACKOFF_CAP": ("backoff_cap", _parse_float),
    "OUTBOX_MAX_RETRY_AFTER": ("max_retry_after", _parse_float),
    "OUTBOX_POISON_ATTEMPTS": ("poison_attempts", _parse_int),
    "OUTBOX_MAX_CONCURRENCY": ("max_concurrency", _parse_int),
    "OUTBOX_DEAD_LETTER": ("dead_letter", _parse_str),
    "OUTBOX_DEAD_LETTER_MAX_BYTES": ("dead_letter_max_bytes", parse_size),
    "OUTBOX_SPILL_DIR": ("spill_dir", _parse_str),
    "OUTBOX_MAX_SPILL_BYTES": ("max_spill_bytes", parse_size),
    "OUTBOX_SPILL_INTERVAL": ("spill_interval", _parse_float),
    "OUTBOX_CIRCUIT_THRESHOLD": ("circuit_threshold", _parse_int),
    "OUTBOX_LOG_INTERVAL": ("log_interval", _parse_float),
    "OUTBOX_CLOSE_AT_EXIT": ("close_at_exit", parse_bool),
    "OUTBOX_NAME": ("name", _parse_str),
}


_warned_unknown: set[str] = set()


def warn_once(message: str) -> None:
    """A configuration warning, logged once per process (from_env may run many times), and
    never silent: on stderr when the application configured no logging."""
    if message not in _warned_unknown:
        _warned_unknown.add(message)
        never_silent(logging.WARNING, "%s", message)


def outbox_settings(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The ``Outbox`` keywords set by ``OUTBOX_*`` variables, and for each keyword the
    variable it came from (so errors can name it)."""
    settings: dict[str, Any] = {}
    origins: dict[str, str] = {}
    known = set(OUTBOX_VARIABLES)
    for var in sorted(environ):
        if not var.startswith("OUTBOX_"):
            continue
        if var not in known:
            # OUTBOX_ is a generic prefix (transactional-outbox libraries use it too): not ours
            # to refuse.  Say so once, in case it is a typo of one of ours.
            if var not in _warned_unknown:
                _warned_unknown.add(var)
                close = difflib.get_close_matches(var, sorted(known), n=1)
                hint = (
                    f"did you mean {close[0]}?" if close else f"the settings are {', '.join(sorted(known))}"
                )
                never_silent(logging.WARNING, "%s is not a lineage-outbox setting (ignored); %s", var, hint)
            continue
        keyword, parse = OUTBOX_VARIABLES[var]
        settings[keyword] = parse(var, environ[var])
        origins[keyword] = var
    return settings, origins


#: Where a setting sits below ``transport``: keys, and the index of a list's member.
Path = tuple[str | int, ...]


def _dotted(path: Path) -> str:
    """``transports.a.url``, ``transports[0].url``."""
    text = ""
    for key in path:
        if isinstance(key, int) or not key or not key.replace("_", "").replace("-", "").isalnum():
            text += f"[{key!r}]"  # (a list's member, or a name such as 'my.a')
        else:
            text += f".{key}" if text else key
    return text


def _variable(path: Path) -> str | None:
    """The variable that sets ``path`` alone (``OPENLINEAGE__TRANSPORT__TRANSPORTS__A__URL``);
    None for a list's member, which only JSON can set."""
    if all(isinstance(key, str) for key in path):
        return "OPENLINEAGE__TRANSPORT" + "".join(f"__{str(key).upper()}" for key in path)
    return None


@dataclass
class Sources:
    """Where each setting of a transport came from, by its path below ``transport`` (a composite's
    members' too, at any depth): to name it in an error as it was set, and one that is missing
    where it would go."""

    #: Each ``OPENLINEAGE__TRANSPORT*`` variable still in force, by the path it sets (whole:
    #: what its JSON holds is below it), and the transport they make together.
    variables: dict[Path, str] = field(default_factory=dict)
    env_transport: Any = None
    #: The openlineage.yml read, and its ``transport`` mapping (it wins over the variables).
    file: str | None = None
    file_transport: dict[str, Any] | None = None
    #: Settings made of other variables (``OPENLINEAGE_URL`` as the url), or a default.
    fixed: dict[Path, str] = field(default_factory=dict)

    def name(self, path: Path) -> str:
        """The setting at ``path`` as it was set: ``OPENLINEAGE__TRANSPORT__TOPIC``,
        ``OPENLINEAGE__TRANSPORT: transports.a.url`` (a key of its JSON), ``FILE:
        transport.topic``, ``OPENLINEAGE_URL``; one not set, where it would go (:meth:`missing`)."""
        for n in range(len(path), -1, -1):
            if path[:n] in self.fixed:
                return self.fixed[path[:n]]
        if self.file and _holds(self.file_transport, path):
            return f"{self.file}: transport.{_dotted(path)}"
        if _holds(self.env_transport, path):
            for n in range(len(path), -1, -1):
                if (var := self.variables.get(path[:n])) is not None:
                    return var if n == len(path) else f"{var}: {_dotted(path[n:])}"
        return self.missing(path)

    def missing(self, path: Path) -> str:
        """Where the setting at ``path``, not set, would go: beside its siblings (in the file, in
        the JSON of the variable that holds them, or a variable of its own), else either way."""
        parent = path[:-1]
        if self.file and _holds(self.file_transport, parent):
            return f"transport.{_dotted(path)} in {self.file}"
        for n in range(len(parent), -1, -1):
            if (var := self.variables.get(parent[:n])) is not None:
                return f"{_dotted(path[n:])} in {var}"
        variable = _variable(path)
        if variable and any(len(p) > len(parent) and p[: len(parent)] == parent for p in self.variables):
            return variable
        return f"transport.{_dotted(path)} in openlineage.yml" + (f", or {variable}" if variable else "")


def _holds(tree: Any, path: Path) -> bool:
    """Whether ``tree`` (a transport's mapping, None for none) has a setting at ``path``."""
    if tree is None:
        return False
    for key in path:
        listed = isinstance(tree, list) and isinstance(key, int) and 0 <= key < len(tree)
        if not (listed or (isinstance(tree, dict) and key in tree)):
            return False
        tree = tree[key]
    return True


@dataclass
class ResolvedTransport:
    """What the environment asks for: a transport config dict, or disabled."""

    #: ``{"type": "http", "url": ..., ...}`` as openlineage-python would see it; None when disabled.
    config: dict[str, Any] | None
    #: Where each setting came from, for error messages.
    sources: Sources = field(default_factory=Sources)
    #: True when ``OPENLINEAGE_DISABLED`` is set.
    disabled: bool = False
    #: Where this config sits below ``transport`` (a composite's member: ``("transports", "a")``).
    path: Path = ()

    def origin(self, key: str) -> str:
        """Names the setting behind ``key`` as it was set (``OPENLINEAGE__TRANSPORT__URL``,
        ``/etc/openlineage.yml: transport.transports.a.url``), or where it would go
        (``transport.transports.a.url in /etc/openlineage.yml``)."""
        return self.sources.name((*self.path, key))

    def named(self, *keys: str | int) -> str:
        """:meth:`origin` of a setting below one of this config's keys (``auth``, ``apiKey``)."""
        return self.sources.name((*self.path, *keys))

    @property
    def origins(self) -> dict[str, str]:
        """Where each of this config's own keys came from (:meth:`origin`)."""
        return {key: self.origin(key) for key in self.config or {}}

    @property
    def member(self) -> bool:
        """Whether this is a composite's member (its settings named by their own path)."""
        return bool(self.path)


def _find_yaml(environ: Mapping[str, str]) -> str | None:
    """The first readable of ``$OPENLINEAGE_CONFIG``, ``./openlineage.yml`` and
    ``~/.openlineage/openlineage.yml``.  A missing ``OPENLINEAGE_CONFIG`` file is logged
    and the next candidate applies, as openlineage-python does (a lineage misconfiguration
    must not fail a function's ``init``)."""
    named = environ.get("OPENLINEAGE_CONFIG")
    candidates = (
        named,
        os.path.join(os.getcwd(), "openlineage.yml"),
        os.path.join(os.path.expanduser("~/.openlineage"), "openlineage.yml"),
    )
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.R_OK):
            return path
        if path and path is named:
            never_silent(
                logging.ERROR,
                "OPENLINEAGE_CONFIG=%r is not a readable file; ignored (the next configuration "
                "rule applies): point it at an openlineage.yml or unset it",
                named,
            )
    return None


def _load_yaml(path: str) -> dict[str, Any]:
    """The file's mapping; a file that cannot be read or parsed, or holds something else, is
    logged and counts as empty (openlineage-python's rule), so the next rule applies."""
    import yaml  # openlineage-python depends on PyYAML

    try:
        with open(path, encoding="utf-8") as f:
            content = yaml.safe_load(f)
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        never_silent(logging.ERROR, "cannot read the OpenLineage config file %s (ignored): %s", path, exc)
        return {}
    if content is None:
        never_silent(logging.ERROR, "the OpenLineage config file %s is empty (ignored)", path)
        return {}
    if not isinstance(content, dict):
        never_silent(
            logging.ERROR,
            "the OpenLineage config file %s must hold a mapping, not %s (ignored)",
            path,
            type(content).__name__,
        )
        return {}
    return content


def _env_config(environ: Mapping[str, str]) -> tuple[dict[str, Any], Sources]:
    config: dict[str, Any] = {}
    sources = Sources()
    prefix = "OPENLINEAGE__"
    # Reverse order, as openlineage-python does: longer names first, so that a
    # whole-object variable (OPENLINEAGE__TRANSPORT) is applied last and wins.
    for var, raw in sorted(((k, v) for k, v in environ.items() if k.startswith(prefix)), reverse=True):
        keys = [k.lower() for k in var[len(prefix) :].split("__")]
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = config
        for key in keys[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = node[key] = {}
            node = child
        node[keys[-1]] = value
        if keys[0] == "transport":
            path = tuple(keys[1:])
            for replaced in [p for p in sources.variables if p[: len(path)] == path]:
                del sources.variables[replaced]  # (what it was set to is gone with it)
            sources.variables[path] = var
    sources.env_transport = config.get("transport")
    return config, sources


def _merge(low: dict[str, Any], high: dict[str, Any]) -> dict[str, Any]:
    merged = dict(low)
    for key, value in high.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _api_key_auth(environ: Mapping[str, str]) -> dict[str, str] | None:
    key = environ.get("OPENLINEAGE_API_KEY")
    return {"type": "api_key", "apiKey": key} if key else None


def resolve_transport_config(environ: Mapping[str, str], *, read_files: bool = True) -> ResolvedTransport:
    """Apply openlineage-python's rules to ``environ`` (see the module's docstring);
    ``read_files=False`` skips the YAML file."""
    if environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return ResolvedTransport(None, disabled=True)
    config, sources = _env_config(environ)
    path = _find_yaml(environ) if read_files else None
    file_config: dict[str, Any] = {}
    if path is not None:
        file_config = _load_yaml(path)
        config = _merge(config, file_config)
        file_transport = file_config.get("transport")
        if isinstance(file_transport, dict):
            sources.file, sources.file_transport = path, file_transport
    transport = config.get("transport")
    _refuse_plain_transport_string(environ, transport)
    url = environ.get("OPENLINEAGE_URL")
    if isinstance(transport, dict) and transport.get("type"):
        transport = dict(transport)
        _add_url_aliases(transport, environ, url, sources.fixed)
        return ResolvedTransport(transport, sources)
    if url:
        http: dict[str, Any] = {
            "type": "http",
            "url": url,
            "endpoint": environ.get("OPENLINEAGE_ENDPOINT", "api/v1/lineage"),
        }
        fixed: dict[Path, str] = {("url",): "OPENLINEAGE_URL", ("endpoint",): "OPENLINEAGE_ENDPOINT"}
        if environ.get("OPENLINEAGE_API_KEY"):
            http["auth"] = _api_key_auth(environ)
            fixed[("auth",)] = "OPENLINEAGE_API_KEY"
        fixed[("type",)] = "OPENLINEAGE_URL"
        return ResolvedTransport(http, Sources(fixed=fixed))
    never_silent(
        logging.WARNING,
        "no OpenLineage transport is configured (OPENLINEAGE_URL, OPENLINEAGE__TRANSPORT__TYPE, "
        "openlineage.yml)%s; lineage events will be printed to the console",
        _unused_config(environ, path, file_config, config.get("transport")),
    )
    return ResolvedTransport({"type": "console"}, Sources(fixed={("type",): "the default"}))


#: The variables that configure a transport, for a hint when a name near one did not.
_TRANSPORT_VARIABLES = ("OPENLINEAGE_URL", "OPENLINEAGE_CONFIG", "OPENLINEAGE__TRANSPORT__TYPE")


def _unused_config(environ: Mapping[str, str], path: str | None, found: Any, transport: Any) -> str:
    """What was there and configured no transport, as ``: ...`` (or nothing): a YAML file
    without a ``transport`` mapping with a ``type``, transport settings without a type, a
    variable whose name is near one that configures a transport."""
    said = []
    if path is not None and found:  # (an empty or unreadable file was said as it was read)
        shape = found.get("transport")
        if not isinstance(shape, dict):
            has = (
                f"a transport that is a {type(shape).__name__}"
                if shape is not None
                else f"keys {', '.join(found)}"
            )
            said.append(f"{path} has no transport mapping ({has}; write transport: then type: http, ...)")
        elif not shape.get("type"):
            said.append(f"{path}'s transport has no type (its keys: {', '.join(map(str, shape))})")
    elif isinstance(transport, dict) and not transport.get("type"):
        said.append("OPENLINEAGE__TRANSPORT__* settings are set without OPENLINEAGE__TRANSPORT__TYPE")
    others = (n for n in environ if n.upper().startswith("OPENLINEAGE") and n not in _TRANSPORT_VARIABLES)
    for name in sorted(n for n in others if not n.startswith("OPENLINEAGE__TRANSPORT__")):
        near = difflib.get_close_matches(name.upper(), _TRANSPORT_VARIABLES, n=1, cutoff=0.8)
        if near:
            said.append(f"{name} is set: did you mean {near[0]}?")
    return (": " + "; ".join(said)) if said else ""


def _refuse_plain_transport_string(environ: Mapping[str, str], transport: Any) -> None:
    """A ConfigError when OPENLINEAGE__TRANSPORT is a plain string beside
    OPENLINEAGE__TRANSPORT__* variables it would replace."""
    whole = environ.get("OPENLINEAGE__TRANSPORT")
    if whole is not None and not isinstance(transport, dict):
        keys = sorted(var for var in environ if var.startswith("OPENLINEAGE__TRANSPORT__"))
        if keys:
            # openlineage-python lets the plain string replace the keys, and falls back to the
            # console: lineage nobody asked to print, and none delivered.
            raise ConfigError(
                f"OPENLINEAGE__TRANSPORT={whole!r} is not a JSON object, so it would replace {keys[0]}"
                f"{' and the other OPENLINEAGE__TRANSPORT__* variables' if len(keys) > 1 else ''}: set "
                f"OPENLINEAGE__TRANSPORT__TYPE={whole.strip() or 'http'} instead, "
                "or unset OPENLINEAGE__TRANSPORT"
            )


def _add_url_aliases(
    transport: dict[str, Any], environ: Mapping[str, str], url: str | None, fixed: dict[Path, str]
) -> None:
    """openlineage-python's uses of OPENLINEAGE_URL beside a configured transport type: the
    url, endpoint and key of async_http, and a composite's default_http member."""
    if transport["type"] == "async_http" and url:
        # openlineage-python's special case, for a seamless switch to async_http.
        for key, var, value in (
            ("url", "OPENLINEAGE_URL", url),
            ("endpoint", "OPENLINEAGE_ENDPOINT", environ.get("OPENLINEAGE_ENDPOINT")),
            ("auth", "OPENLINEAGE_API_KEY", _api_key_auth(environ)),
        ):
            if value and key not in transport:
                transport[key] = value
                fixed[(key,)] = var
    if transport["type"] == "composite" and url:
        # openlineage-python's OpenLineageClient() aliases OPENLINEAGE_URL as a member
        # named default_http of a composite transport (unless one is configured).
        members = transport.get("transports")
        if members is None or (isinstance(members, dict) and "default_http" not in members):
            default: dict[str, Any] = {"type": "http", "url": url}
            if environ.get("OPENLINEAGE_API_KEY"):
                default["auth"] = _api_key_auth(environ)
            if environ.get("OPENLINEAGE_ENDPOINT"):
                default["endpoint"] = environ["OPENLINEAGE_ENDPOINT"]
            transport["transports"] = {**(members or {}), "default_http": default}
            fixed[("transports", "default_http")] = "OPENLINEAGE_URL"
