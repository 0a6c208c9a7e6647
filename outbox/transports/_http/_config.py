"""openlineage-python's ``http`` and ``async_http`` transport configuration, read as it reads
it, turned into :class:`~outbox.transports.HttpTransport` keyword arguments (see
``HttpTransport.from_config``)."""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Callable
from typing import Any

from ..._config._config import ResolvedTransport, warn_once
from ..._errors import ConfigError
from ..._observability._log import limit_library_logs
from ._settings import (
    BOOLEAN_WORDS,
    OPENLINEAGE_FILTER,
    RedactingFilter,
    check_ca,
    check_headers,
    checked_url,
    provider_secrets,
    redact_url,
    redact_userinfo,
    secret_text,
)

_OPENLINEAGE_KEYS = {
    "type",
    "url",
    "endpoint",
    "auth",
    "compression",
    "custom_headers",
    "timeout",
    "verify",
    "retry",
    "sslcontext",
    "sslContext",
    "ssl_context",
    "max_concurrent_requests",
    "max_queue_size",
}
_OUR_KEYS = {"mode", "batch_endpoint", "batch_format", "connect_timeout", "read_timeout"}
#: async_http's max_concurrent_requests when none is given, as in openlineage-python.
_ASYNC_HTTP_CONCURRENCY = 100


def http_kwargs(resolved: ResolvedTransport) -> dict[str, Any]:
    """``HttpTransport`` keyword arguments from an openlineage-python style config."""
    config = dict(resolved.config or {})
    origin = resolved.origin
    for key in ("name", "priority"):  # openlineage-python's factory drops them too
        config.pop(key, None)
    _drop_unknown(config, origin)
    url = config.get("url")
    if not isinstance(url, str) or not url.strip():
        where = resolved.origin("url")  # (where it would go beside the transport's other settings)
        raise ConfigError(
            f"the {config.get('type', 'http')} transport needs a url: set {where} (e.g. http://marquez:5000)"
        )
    # (its problems named where it was set: a composite member's own url, a file's)
    checked_url(url, origin("url"))
    kwargs: dict[str, Any] = {"url": url}
    for key in ("endpoint", "batch_endpoint", "mode", "batch_format", "compression"):
        if key in config:
            value = config[key]
            if key == "compression" and value in ("", None):
                continue  # openlineage-python sends an empty compression uncompressed
            if not isinstance(value, str):
                raise ConfigError(f"{origin(key)}={value!r} must be a string")
            kwargs[key] = value
    for key in ("timeout", "connect_timeout", "read_timeout"):
        if key in config:
            kwargs[key] = _number(origin(key), config[key])
    if "max_concurrent_requests" in config:
        value = config["max_concurrent_requests"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{origin('max_concurrent_requests')}={value!r} is not an integer >= 1")
        kwargs["max_concurrent_requests"] = value
    elif config.get("type") == "async_http":
        kwargs["max_concurrent_requests"] = _ASYNC_HTTP_CONCURRENCY  # openlineage-python's default
    kwargs.update(_tls_kwargs(config, origin, url))
    kwargs.update(_header_and_auth_kwargs(config, resolved.named))
    kwargs.update(_retry_kwargs(config, origin))
    return kwargs


def _drop_unknown(config: dict[str, Any], origin: Callable[[str], str]) -> None:
    """Take out the keys that are no setting, each with a warning (openlineage-python ignores
    keys it does not know: a warning, not a failed init)."""
    known = _OPENLINEAGE_KEYS - {"sslcontext", "ssl_context"} | _OUR_KEYS
    for key in sorted(set(config) - _OPENLINEAGE_KEYS - _OUR_KEYS):
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = (
            f"did you mean {close[0]}?"
            if close
            else f"the settings are {', '.join(sorted(known - {'type'}))}"
        )
        warn_once(f"{origin(key)}: {key!r} is not an HTTP transport setting (ignored); {hint}")
        config.pop(key)


#: The keys of openlineage-python's TLS settings.
TLS_KEYS = ("verify", "sslContext", "ssl_context", "sslcontext")


def _tls_kwargs(config: dict[str, Any], origin: Callable[[str], str], url: str) -> dict[str, Any]:
    """``verify``, ``client_cert`` and ``client_key`` from ``verify`` and ``sslContext``, read as
    openlineage-python's ``http`` transport (requests) reads them; what would fail its every
    event is a ConfigError naming the setting."""
    kwargs: dict[str, Any] = {}
    plain_http = url.strip().lower().startswith("http://")
    if "verify" in config:
        verify = config["verify"]
        if isinstance(verify, int) and not isinstance(verify, bool):
            verify = bool(verify)  # JSON 0 and 1: requests reads them by their truth
        if not isinstance(verify, (bool, str)):
            raise ConfigError(f"{origin('verify')}={verify!r} must be true, false or the path of a CA bundle")
        if plain_http and isinstance(verify, str):
            # requests never reads verify for an http:// URL, so openlineage-python delivers.
            warn_once(
                f"{origin('verify')}={verify!r} has no effect on the http:// URL {redact_url(url.strip())} "
                f"(ignored); it matters for https:// only{_text_hint(verify)}"
            )
        else:
            if isinstance(verify, str):
                check_ca(origin("verify"), verify, _UNQUOTED)
            kwargs["verify"] = verify
    key = next((k for k in TLS_KEYS[1:] if k in config), None)
    if key is not None and config[key] is not None:
        kwargs.update(_ssl_context_kwargs(config[key], origin(key), plain_http, config.get("type")))
    return kwargs


# How to write the boolean, for check_ca's message.
_UNQUOTED = (
    "{b} without quotes (OPENLINEAGE__TRANSPORT__VERIFY={b} in lower case, which reads as JSON; "
    "verify: {b} in YAML)"
)


def _text_hint(verify: str) -> str:
    """For verify given as text that reads as a boolean: what requests makes of it."""
    meant = BOOLEAN_WORDS.get(verify.strip().lower())
    if meant is None:
        return ""
    return (
        f"; on https:// it would be read as the path of a CA bundle, not as {meant}: write {meant} "
        "without quotes"
    )


def _ssl_context_kwargs(ssl_config: Any, name: str, plain_http: bool, kind: Any) -> dict[str, Any]:
    """openlineage-python's ``sslContext``: ``caCertPath`` (the CA bundle), ``clientCertPath``
    and ``clientKeyPath`` (mutual TLS)."""
    if not isinstance(ssl_config, dict):
        raise ConfigError(f'{name} must be a mapping such as {{"caCertPath": ...}}')
    ca = ssl_config.get("caCertPath", ssl_config.get("ca_cert_path", ssl_config.get("cacertpath")))
    cert = ssl_config.get(
        "clientCertPath", ssl_config.get("client_cert_path", ssl_config.get("clientcertpath"))
    )
    client_key = ssl_config.get(
        "clientKeyPath", ssl_config.get("client_key_path", ssl_config.get("clientkeypath"))
    )
    if client_key and not cert:
        raise ConfigError(f"{name}: clientKeyPath needs clientCertPath")
    # requests checks a client certificate's files before every request, http:// too.
    for field, path in (("clientCertPath", cert), ("clientKeyPath", client_key)):
        if path and not os.path.exists(path):
            if kind == "async_http":  # whose config has no sslContext: it delivers without
                warn_once(
                    f"{name}: {field}={path!r} does not exist: sslContext ignored, as "
                    "openlineage-python's async_http transport ignores it"
                )
                return {}
            raise ConfigError(
                f"{name}: {field}={path!r} does not exist; openlineage-python (requests) checks "
                "a client certificate's files before every request, to an http:// URL too, and "
                f"would fail every event; give the path of the file (PEM), or leave {field} out"
            )
    if plain_http:
        if ca or cert:
            warn_once(f"{name} has no effect on an http:// URL (ignored): TLS files matter for https:// only")
        return {}
    kwargs = {"client_cert": cert, "client_key": client_key}
    if ca:  # it takes precedence over verify, as in openlineage-python
        check_ca(f"{name}: caCertPath", ca, _UNQUOTED)
        kwargs["verify"] = ca
    return kwargs


def _header_and_auth_kwargs(config: dict[str, Any], origin: Callable[..., str]) -> dict[str, Any]:
    """``custom_headers``, and ``api_key`` or ``token_provider`` from ``auth``."""
    kwargs: dict[str, Any] = {}
    if "custom_headers" in config:
        headers = config["custom_headers"]
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ConfigError(f"{origin('custom_headers')} must map header names to strings")
        check_headers(headers, origin("custom_headers"))
        kwargs["custom_headers"] = headers
    if "auth" in config:
        auth = config["auth"]
        kind = auth.get("type") if isinstance(auth, dict) else None
        if kind in (None, "api_key"):
            keys = auth if isinstance(auth, dict) else {}
            used = next((k for k in ("apiKey", "apikey", "api_key") if k in keys), "apiKey")
            kwargs["api_key"] = _api_key(origin("auth"), auth, origin("auth", used))
        else:
            kwargs["token_provider"] = _token_provider(origin("auth"), auth, origin("auth", "type"))
    return kwargs


def _retry_kwargs(config: dict[str, Any], origin: Callable[[str], str]) -> dict[str, Any]:
    """``status_forcelist`` from ``retry``, read as urllib3's ``Retry`` reads it for
    openlineage-python: looked up with ``in``, by number."""
    if "retry" not in config:
        return {}
    retry = config["retry"]
    if not isinstance(retry, dict):
        raise ConfigError(f"{origin('retry')}={retry!r} must be a mapping of urllib3 Retry keywords")
    # Any urllib3 Retry keyword is accepted, as openlineage-python passes them all on; only
    # status_forcelist changes anything here (the outbox retries until delivered or dropped).
    if "status_forcelist" not in retry:
        return {}
    statuses = retry["status_forcelist"]
    name = f"{origin('retry')}: status_forcelist"
    if not statuses:  # None, [], 0, "": urllib3 makes them an empty list
        warn_once(
            f"{name}={statuses!r} retries no status, as in openlineage-python (urllib3 reads it as "
            "an empty list): an event answered 5xx is rejected, unless the answer is a 413, 429 or "
            "503 with a Retry-After; leave status_forcelist out to retry every 5xx, 408 and 429"
        )
        return {"status_forcelist": []}
    if not isinstance(statuses, (list, tuple, dict)):
        numbers = [int(n) for n in re.findall(r"\d{3}", str(statuses))] or [503]
        raise ConfigError(
            f"{name}={statuses!r} is not a list: openlineage-python (urllib3) looks each answer's "
            f"status up in it, and fails every event with a TypeError; write a list, such as {numbers}"
        )
    codes: list[int] = []
    ignored: list[Any] = []
    for item in statuses:
        number = isinstance(item, (int, float)) and not isinstance(item, bool)
        if number and float(item).is_integer():
            codes.append(int(item))  # 502.0 matches 502, as in urllib3
        else:
            ignored.append(item)
    if ignored:
        warn_once(
            f"{name} holds {', '.join(map(repr, ignored))}, which no status matches (urllib3 "
            "compares each answer's status, a number, with each item, so openlineage-python "
            "never retries on them either): ignored; write the status codes as numbers, without quotes"
        )
    return {"status_forcelist": codes}


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        hint = ""
        if isinstance(value, str):
            try:
                float(value)
                # (YAML reads 1e-9 as text: a float needs its dot, 1.0e-9)
                hint = "; it is text, not a number: write it without quotes (an exponent needs a dot: 1.0e-3)"
            except ValueError:
                pass
        raise ConfigError(f"{name}={value!r} is not a positive number of seconds{hint}")
    return float(value)


_OPENLINEAGE_LOGGER = "openlineage.client.transport.http"


#: The token providers openlineage-python names (any other is a ``module.Class``).
_TOKEN_PROVIDERS = ("api_key", "jwt", "oauth2")


def _token_provider(name: str, auth: dict[str, Any], type_name: str) -> Any:
    """openlineage-python's own token provider for ``auth`` (``jwt``, ``oauth2`` or a
    ``module.Class``); a ConfigError naming the setting (``name``, its type ``type_name``) when
    it cannot be built."""
    from openlineage.client.transport.http import create_token_provider

    kind = auth.get("type")
    if isinstance(kind, str) and "." not in kind and kind not in _TOKEN_PROVIDERS:
        # (else openlineage-python logs a stray warning and fails to import it as a module)
        close = difflib.get_close_matches(kind.lower().replace("-", "_"), _TOKEN_PROVIDERS, n=1)
        raise ConfigError(
            f"{type_name}={kind!r} is not a token provider: use "
            + (f"{close[0]!r} (did you mean it?)" if close else "api_key, jwt or oauth2")
            + ", or the module.Class of your own TokenProvider"
        )
    try:
        provider = create_token_provider(dict(auth))
    except Exception as exc:  # KeyError for a missing field, TypeError, ImportError, ...
        text = redact_userinfo(f"{type(exc).__name__}: {exc}")
        for key, value in auth.items():  # a provider of one's own may quote its settings
            if (
                isinstance(value, str)
                and len(value) >= 4
                and re.search(r"key|secret|passw|^token$", key, re.I)
            ):
                text = text.replace(value, "***")
        raise ConfigError(
            f"{name}: openlineage-python cannot build the {auth.get('type')!r} token provider: "
            f"{text} (the credentials are never logged)"
        ) from None
    RedactingFilter.secrets.update(provider_secrets(provider))
    # The provider logs an ERROR for every failed fetch, and the transport asks it for a token
    # before every attempt: with its endpoint down, one per retry.  The rate limit goes first,
    # so that it keys on the message template: the redacting filter replaces the template
    # with the text, which quotes the endpoint's error (a request id, say: new every time).
    limit_library_logs(_OPENLINEAGE_LOGGER)
    ol_logger = logging.getLogger(_OPENLINEAGE_LOGGER)
    if OPENLINEAGE_FILTER not in ol_logger.filters:
        ol_logger.addFilter(OPENLINEAGE_FILTER)
    return provider


def _api_key(name: str, auth: Any, key_name: str) -> str | None:
    if not isinstance(auth, dict):
        raise ConfigError(f'{name} must be a mapping such as {{"type": "api_key", "apiKey": "..."}}')
    kind = auth.get("type")
    if kind is None:
        return None
    if kind != "api_key":
        raise ConfigError(
            f"{name}: auth type {kind!r} is not supported by lineage-outbox; use api_key "
            "(or custom_headers for another scheme)"
        )
    key = auth.get("apiKey") or auth.get("apikey") or auth.get("api_key")
    if not isinstance(key, str) or not key:
        raise ConfigError(f"{name}: auth type api_key needs apiKey (the value is never logged)")
    # Checked here to name where it came from (the constructor knows only its keyword).
    secret_text(name if name == "OPENLINEAGE_API_KEY" else key_name, key, header=True)
    return key
