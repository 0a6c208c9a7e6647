"""The HTTP transport's settings: its constructor's arguments checked, the credentials it
sends (and redacts), its headers, TLS and proxy, and the httpx client made of them.

Everything here runs once, when a transport is built (or its client first made), never per
event; the checks raise :class:`ConfigError` naming the argument and what is accepted.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import socket
import ssl
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

import httpx

from ..._config._config import tls_context, warn_once
from ..._config._settings import MAX_SECONDS
from ..._errors import ConfigError
from ..._observability._log import described
from ._wire import WireClient

MODES = ("single", "batch", "auto")
FORMATS = ("array", "openmetadata")
_USER_AGENT = "lineage-outbox/0.1.0"
_SEND_BUFFER = 4 * 1024 * 1024
#: The context of a client that never speaks TLS (an http:// URL): verifying, trusting no CA.
_NO_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
# RFC 9110's token: what a header name may hold.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Custom headers whose values are credentials (redacted wherever a backend may echo them).
_CREDENTIAL_HEADER = re.compile(r"auth|key|token|secret|passw|cookie|credential|session", re.I)
# The user information of any URL in a text (a token endpoint's, in its provider's error).
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/\s:@]*):[^/\s@]*@")


def redact_url(url: str) -> str:
    """The URL without a password (``http://user:***@host/``), for logs and errors."""
    try:
        parts = urlsplit(url)
    except ValueError:  # (not a URL urlsplit can read: its passwords, if any, by the regex)
        return redact_userinfo(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def redact_userinfo(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def header_problem(value: str, *, tabs: bool = True) -> str | None:
    """What keeps ``value`` out of an HTTP header as httpx sends it (ASCII only, no control
    character), or None.  Never quotes the value."""
    if any((ord(c) < 32 and not (tabs and c == "\t")) or ord(c) == 127 for c in value):
        return "a control character (a line break inside the value?)"
    if not value.isascii():
        return (
            "a character an HTTP header cannot carry (a letter outside ASCII, such as é, or a "
            "non-breaking space)"
        )
    return None


def secret_text(name: str, value: str | None, *, header: bool = False) -> str | None:
    """A credential as it will be sent: surrounding whitespace stripped (mounted secrets often
    end in a newline), control characters refused, and with ``header`` (sent as it is in a
    header) anything outside ASCII too.  The value itself is never quoted."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{name} is of type {type(value).__name__}, not text; pass the secret as a string")
    value = value.strip()
    problem = header_problem(value, tabs=False)
    if problem is not None and (header or problem.startswith("a control")):
        raise ConfigError(
            f"{name} contains {problem}; fix the secret it is read from (the value is not shown)"
        )
    return value or None


def check_headers(headers: Mapping[str, str], named: str) -> None:
    """Every custom header's name and value as HTTP can carry them; a ConfigError naming the
    setting (``named``) and the header, never the value."""
    for name, value in headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise ConfigError(
                f"{named}: {name!r} is not an HTTP header name; use letters, digits and '-' "
                "(such as X-Api-Key)"
            )
        if not isinstance(value, str):
            raise ConfigError(f"{named}: the value of the header {name!r} must be a string")
        problem = header_problem(value)
        if problem is not None:
            raise ConfigError(
                f"{named}: the value of the header {name!r} contains {problem}; fix it "
                "(the value is not shown)"
            )


def provider_secrets(provider: Any) -> list[str]:
    """The credentials a token provider holds (openlineage-python's keep them as attributes),
    so that its errors reach the log without them."""
    found = []
    for attribute in ("api_key", "client_secret", "password", "secret", "token"):
        value = getattr(provider, attribute, None)
        if isinstance(value, str) and len(value) >= 4:
            found.append(value)
    endpoint = getattr(provider, "token_endpoint", None)
    if isinstance(endpoint, str):
        password = urlsplit(endpoint).password
        if password:
            found += [password, unquote(password)]
    return found


# In an openlineage-python transport config: keys whose value goes into a header as it is,
# keys holding a header dict, and keys whose value is a credential (redacted from errors).
_HEADER_SECRET_KEY = re.compile(r"api_?key|token", re.I)
_HEADER_DICT_KEY = re.compile(r"(custom_)?headers", re.I)
_SECRET_KEY = re.compile(r"api_?key|token|secret|passw|credential|cookie", re.I)
_NOT_SECRET_KEY = re.compile(r"endpoint|url|type|class|path|file|provider", re.I)


def config_secrets(config: dict[str, Any], origin: Callable[..., str]) -> list[str]:
    """The credentials of an openlineage-python transport ``config`` (every string under a key
    naming one, every custom header's value), for redaction; an API key's, a token's and a
    header value's surrounding whitespace is stripped in ``config`` (mounted secrets often end
    in a newline).  A ``ConfigError`` naming the setting (``origin`` of its path of keys, as
    ``ResolvedTransport.named``), never the value, for an API key, a token or a header value that no
    HTTP header can carry."""
    found: list[str] = []

    def name(path: list[str]) -> str:
        return origin(*path)

    def walk(node: Any, path: list[str], header_value: bool) -> Any:
        # header_value: node is a value of a header dict (custom_headers).
        if isinstance(node, Mapping):
            headers = bool(path) and bool(_HEADER_DICT_KEY.fullmatch(path[-1]))
            return {key: walk(value, [*path, str(key)], headers) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(value, [*path, str(i)], False) for i, value in enumerate(node)]
        if not isinstance(node, str) or not path:
            return node
        key = path[-1]
        secret = header_value or (bool(_SECRET_KEY.search(key)) and not _NOT_SECRET_KEY.search(key))
        in_header = header_value or bool(_HEADER_SECRET_KEY.fullmatch(key))
        if not secret:
            return node
        if in_header:  # as HttpTransport takes an API key: a mounted secret's newline dropped
            node = node.strip()
        problem = header_problem(node, tabs=False) if in_header else None
        if problem is not None:
            raise ConfigError(
                f"{name(path)} contains {problem}; an HTTP header cannot carry it: fix the secret "
                "it is read from (the value is not shown)"
            )
        if len(node) >= 4:
            found.append(node)
        return node

    config.update(walk(dict(config), [], False))
    return found


#: Words in an exception's text that say it may quote a header (requests' InvalidHeader,
#: http.client's "Invalid header value", h11's "Illegal header value").
_QUOTES_A_HEADER = re.compile(r"header", re.I)


def safe_failure(exc: BaseException, secrets: Sequence[str]) -> str:
    """``Type: text`` of an exception raised while sending, fit for a log: without URL
    passwords or ``secrets``, and without its text at all when it may quote a header value
    (an encoding error of a header, an invalid header), which may be a credential."""
    kind = type(exc).__name__
    text = described(exc)
    quoting = isinstance(exc, UnicodeError) or "LocalProtocolError" in kind
    if quoting or _QUOTES_A_HEADER.search(f"{kind} {text}"):
        return f"{kind} (a header value HTTP cannot carry?; its text is not shown, it may quote a credential)"
    text = redact_userinfo(text)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return f"{kind}: {text}"


class RedactingFilter(logging.Filter):
    """On openlineage-python's HTTP logger, whose token providers log their failures quoting
    the token endpoint's URL as configured: each record's text without URL passwords or the
    credentials of the providers built here."""

    secrets: ClassVar[set[str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        redacted = redact_userinfo(text)
        for secret in sorted(self.secrets, key=len, reverse=True):
            redacted = redacted.replace(secret, "***")
        if redacted != text:
            record.msg, record.args = redacted, None
        return True


OPENLINEAGE_FILTER = RedactingFilter()


class NoBearer(Exception):
    """The token provider failed, or gave a token no header can carry; the message names the
    provider and holds no credential (safe to log)."""


async def provider_bearer(provider: Any, redact: Callable[[str], str]) -> str | None:
    """The token provider's ``Authorization`` value (its blocking ``get_bearer()`` on the
    loop's executor); :class:`NoBearer`, never the provider's own exception, when it fails or
    gives something else than a str.  ``redact`` takes the transport's credentials out of the
    provider's error."""
    kind = type(provider).__name__
    try:
        bearer = await asyncio.get_running_loop().run_in_executor(None, provider.get_bearer)
    except Exception as exc:  # requests' errors, RuntimeError, a custom provider's anything
        text = redact(redact_userinfo(f"{type(exc).__name__}: {described(exc)}"))
        raise NoBearer(f"the {kind} token provider failed: {text}") from None
    if not bearer:
        return None
    if not isinstance(bearer, str):
        raise NoBearer(f"the {kind} token provider gave {type(bearer).__name__}, not a str")
    return bearer


def check_bearer(provider: Any, bearer: str) -> None:
    """:class:`NoBearer` if the provider's ``bearer`` cannot be sent in a header."""
    problem = header_problem(bearer, tabs=False)
    if problem is not None:
        raise NoBearer(
            f"the token the {type(provider).__name__} token provider gave cannot be sent in an HTTP "
            f"header: it contains {problem}; check its token endpoint (the token is not shown)"
        )


# -- the constructor's arguments ---------------------------------------------------------------


def checked_url(url: Any, source: str | None = None) -> SplitResult:
    """``url`` split, once it is known to be an HTTP URL with a host name (or address) and a
    numeric port: a placeholder left in (``http://<lineage host>:5000``), a space or a bracket
    not closed is a ConfigError here (naming ``source``, where it was given), not a lookup that
    fails at every send."""
    source = source or "OPENLINEAGE_URL or OPENLINEAGE__TRANSPORT__URL"
    try:
        parts = urlsplit(url.strip()) if isinstance(url, str) else None
    except ValueError:  # (an IPv6 address whose bracket is not closed)
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"url={redact_url(str(url))!r} is not an HTTP URL; use e.g. http://marquez:5000 ({source})"
        )
    shown = redact_url(url.strip())
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise ConfigError(
            f"url={shown!r} has a port that is not a number from 0 to 65535; "
            f"use e.g. http://marquez:5000 ({source})"
        ) from None
    host = parts.hostname or ""
    if not (host and (":" in host or all(c.isalnum() or c in "-._~" for c in host))):
        raise ConfigError(
            f"url={shown!r} has no host name there ({host or 'none'!r}); put the backend's host "
            f"name or address, e.g. http://marquez:5000 ({source})"
        )
    if any(c.isspace() for c in url.strip()):
        raise ConfigError(f"url={shown!r} holds a space; write it as %20 (or remove it)")
    return parts


def split_credentials(url: str, parts: SplitResult) -> tuple[str, str | None, list[str]]:
    """The URL without user information, the Basic credentials made of it (or None), and the
    secrets among them.  httpx gets the URL without them (its own log prints the URL of every
    request)."""
    if parts.username is None and parts.password is None:
        return url, None, []
    user = secret_text("the url's user name", unquote(parts.username or ""))
    password = secret_text("the url's password", unquote(parts.password or ""))
    basic = base64.b64encode(f"{user or ''}:{password or ''}".encode()).decode()
    bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return bare, basic, [s for s in (password, basic) if s]


def sent_secrets(
    api_key: str | None, custom_headers: Mapping[str, str] | None, token_provider: Any
) -> list[str]:
    """The credentials, besides the URL's, that requests carry or a token provider holds."""
    secrets = [api_key] if api_key else []
    for header, text in (custom_headers or {}).items():
        if _CREDENTIAL_HEADER.search(header):  # "Authorization: Basic xyz": the value, and xyz
            secrets += [part for part in {text, text.rsplit(" ", 1)[-1]} if len(part) >= 4]
    if token_provider is not None:
        secrets += provider_secrets(token_provider)
    return secrets


def check_arguments(
    mode: Any,
    batch_format: Any,
    compression: Any,
    timeouts: Mapping[str, Any],
    max_concurrent_requests: Any,
    verify: Any,
) -> None:
    """A ConfigError for the first of these arguments that is not one accepted."""
    if mode not in MODES:
        raise ConfigError(f"mode={mode!r} is not a mode; use one of {', '.join(MODES)}")
    if batch_format not in FORMATS:
        raise ConfigError(f"batch_format={batch_format!r} is not a format; use one of {', '.join(FORMATS)}")
    if compression not in (None, "gzip"):
        raise ConfigError(f"compression={compression!r} is not supported; use gzip, or leave it unset")
    for name, value in timeouts.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_SECONDS
        ):
            raise ConfigError(f"{name}={value!r} is not a positive number of seconds (at most {MAX_SECONDS})")
    if (
        isinstance(max_concurrent_requests, bool)
        or not isinstance(max_concurrent_requests, int)
        or (max_concurrent_requests < 1)
    ):
        raise ConfigError(f"max_concurrent_requests={max_concurrent_requests!r} is not an integer >= 1")
    if not isinstance(verify, (bool, str)):
        raise ConfigError(f"verify={verify!r} must be true, false or the path of a CA bundle")


def request_headers(
    compression: str | None,
    api_key: str | None,
    basic: str | None,
    custom_headers: Mapping[str, str] | None,
) -> tuple[dict[str, str], set[str]]:
    """The headers of every request, and the (lower-case) names the custom headers set.
    Custom headers come last and override the auth header, as in openlineage-python."""
    headers = {"Content-Type": "application/json", "User-Agent": _USER_AGENT}
    if compression == "gzip":
        headers["Content-Encoding"] = "gzip"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    elif basic:
        headers["Authorization"] = f"Basic {basic}"
    overrides = {name.lower() for name in (custom_headers or {})}
    headers = {k: v for k, v in headers.items() if k.lower() not in overrides}
    headers.update(custom_headers or {})
    return headers, overrides


def new_client(
    url: str,
    timeouts: httpx.Timeout,
    headers: Mapping[str, str],
    verify: ssl.SSLContext | bool,
    max_concurrent_requests: int,
    posts_to: Sequence[str] = (),
) -> httpx.AsyncClient | WireClient:
    """The client a transport sends with: its own HTTP/1.1 one if ``url`` and every URL it
    ``posts_to`` are plain ``http://`` of one origin with no proxy, else httpx's."""
    origins = {httpx.URL(each).copy_with(path="/", query=None, fragment=None) for each in (url, *posts_to)}
    if len(origins) == 1 and not any(environment_proxy(each) for each in (url, *posts_to)):
        (origin,) = origins
        if origin.scheme == "http":
            connect, read = timeouts.connect, timeouts.read
            assert connect is not None
            assert read is not None
            return WireClient(origin, headers, connect, read, max_concurrent_requests, _SEND_BUFFER)
    return httpx_client(url, timeouts, headers, verify, max_concurrent_requests)


def httpx_client(
    url: str,
    timeouts: httpx.Timeout,
    headers: Mapping[str, str],
    verify: ssl.SSLContext | bool,
    max_concurrent_requests: int,
) -> httpx.AsyncClient:
    """httpx's client, for TLS and proxies."""
    # The transport lets at most max_concurrent_requests requests out at once (whatever the
    # worker's lanes), so the pool never needs more connections than that.
    limits = httpx.Limits(
        max_connections=max_concurrent_requests, max_keepalive_connections=max_concurrent_requests
    )
    proxy = environment_proxy(url)
    if (
        verify is True
        and urlsplit(url).scheme == "http"
        and (proxy is None or urlsplit(proxy).scheme == "http")
    ):
        # No TLS can happen (no redirects are followed): httpx's default context would load
        # the CA bundle for nothing, 30-50 ms per outbox at a function's cold start.  This one
        # costs nothing, and still verifies (fails, trusting no CA) should TLS ever be tried.
        verify = _NO_TLS
    return httpx.AsyncClient(
        timeout=timeouts,
        headers=dict(headers),
        transport=httpx.AsyncHTTPTransport(
            verify=verify,
            limits=limits,
            proxy=proxy,
            # A send buffer that holds a whole batch: the request leaves at once, and the
            # worker can serialize the next batch while the backend reads this one.
            socket_options=[(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)],
        ),
    )


class Places:
    """The ``max_concurrent_requests`` places a transport's requests hold while in flight,
    whatever the worker's lanes: the bound on requests and connections at once.  Made in the
    loop that first uses them (another loop, a rerun's, gets places of its own)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._gate: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def take(self, until: float) -> bool:
        """Take a place, waiting for one until ``until`` (``time.monotonic()``); False if
        none came by then (the caller then has none to release)."""
        gate, loop = self._gate, asyncio.get_running_loop()
        if gate is None or self._loop is not loop:
            gate, self._loop = asyncio.Semaphore(self.count), loop
            self._gate = gate
        if not gate.locked():
            await gate.acquire()  # free: at once
            return True
        try:
            await asyncio.wait_for(gate.acquire(), max(0.0, until - time.monotonic()))
        except TimeoutError:
            return False
        return True

    def give_back(self) -> None:
        assert self._gate is not None
        self._gate.release()


#: Text that reads as a boolean, and the boolean it reads as.
BOOLEAN_WORDS = {"false": "false", "0": "false", "no": "false", "off": "false"} | dict.fromkeys(
    ("true", "1", "yes", "on"), "true"
)


def check_ca(name: str, path: str, unquoted: str = "verify={B} (a bool, not text)") -> None:
    """A ConfigError when the CA bundle ``path`` (``name``'s value) does not exist: requests
    fails every request to an https:// URL on it (``Could not find a suitable TLS CA
    certificate bundle``).  ``unquoted`` says how to write the boolean (``{b}``: false,
    ``{B}``: False), for text that reads as one."""
    if os.path.exists(path):
        return
    meant = BOOLEAN_WORDS.get(path.strip().lower())
    if meant is not None:
        raise ConfigError(
            f"{name}={path!r} is text, not the boolean {meant}: openlineage-python (requests) reads "
            f"text as the path of a CA bundle, and there is no file {path!r}, so every event would "
            f"fail; write {unquoted.format(b=meant, B=meant.capitalize())}"
            + (" to turn certificate checks off" if meant == "false" else "")
            + ", or give the path of a CA bundle that exists"
        )
    raise ConfigError(
        f"{name}={path!r}: there is no such CA bundle (file or folder), on which openlineage-python "
        "(requests) would fail every event; give the path of a CA bundle (PEM) that exists, or true "
        "for the system's CAs"
    )


def ssl_context(
    verify: bool | str, cert: str | None, key: str | None, *, plain_http: bool = False
) -> ssl.SSLContext | bool:
    """What the client verifies with: httpx's default (True), no verification (False), or a
    context with the CA bundle and client certificate given.  For an ``http://`` URL nothing
    is loaded, as requests loads nothing there (openlineage-python delivers); but requests
    checks that a client certificate's files exist before every request, http:// included,
    and fails every event without them: a ConfigError here."""
    if plain_http:
        for keyword, path in (("client_cert", cert), ("client_key", key)):
            if path and not os.path.exists(path):
                raise ConfigError(
                    f"{keyword}={path!r} does not exist; openlineage-python (requests) checks a "
                    "client certificate's files before every request, to an http:// URL too, and "
                    f"would fail every event; give the path of the file (PEM), or leave {keyword} out"
                )
        if isinstance(verify, str) or cert:
            warn_once(
                f"verify={verify!r}, client_cert={cert!r} have no effect on an http:// URL "
                "(not loaded); they matter for https:// only"
            )
        return verify if isinstance(verify, bool) else True
    if not cert and isinstance(verify, bool):
        return verify  # httpx's own default context, or no verification
    if isinstance(verify, str):
        check_ca("verify", verify)
    return tls_context(
        verify if isinstance(verify, str) else None,
        cert,
        key,
        verify=verify is not False,
        described=f"verify={verify!r}, client_cert={cert!r}",
    )


def environment_proxy(url: str) -> str | None:
    """The proxy HTTP(S)_PROXY/NO_PROXY give for ``url``, as httpx would pick it (an explicit
    httpx transport does not read the environment by itself)."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy
