"""Access: the optional API key, and which browser origins may use the API.

The key (`--api-key` / `CHORUS_API_KEY`, and any of `--api-keys-file`'s) is
`Authorization: Bearer KEY` or `?api_key=KEY`, compared in constant time. The key a request
presents is also who it is (`owner_of`): a kept voice belongs to the key that kept it. It
guards the WebSocket and every `/v1` HTTP route; `/healthz`, `/readyz`, `/metrics`, the demo
page and its static files stay open (probes, scrapers, and
a page that asks for the key).

Origins: a browser names the page that opened a WebSocket or sent a request in its
`Origin` header. By default only the server's own origin may (the Origin's host and port
equal the `Host` header); `--allowed-origins` adds others, `*` allows any. Requests without
an `Origin` (every non-browser client) are not affected.

Hosts: a page that rebinds its own DNS name to this server's address (DNS rebinding) is
"same origin" by that test, so the `Host` header is checked first, on every route and the
WebSocket: `localhost` (and `*.localhost`), any IP address (a rebinding page always has a
name) and the name `--host` binds are allowed; `--allowed-hosts` adds names (`*.example.com`,
or `*` for any) for deployments reached by name.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from urllib.parse import urlsplit

from litestar import Request, Response
from litestar.connection import ASGIConnection
from litestar.exceptions import NotFoundException
from litestar.handlers.base import BaseRouteHandler

from server.api.errors import ApiError, api_error_handler, http_exception_handler
from server.voices.store import Owner

_DEFAULT_PORTS = {"http": "80", "https": "443", "ws": "80", "wss": "443"}


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def presented_key(connection: ASGIConnection) -> bytes | None:
    """The key's bytes as sent: a header's own bytes (headers arrive decoded as Latin-1),
    or the UTF-8 of the percent-decoded `api_key` parameter."""
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip().encode("latin-1", "replace")
    query = connection.query_params.get("api_key")
    return _utf8(query) if query is not None else None


def keys_match(given: str | bytes, expected: str | bytes) -> bool:
    """Constant time, whatever the lengths: the digests are compared, not the keys."""
    a = hashlib.sha256(given if isinstance(given, bytes) else _utf8(given)).digest()
    b = hashlib.sha256(expected if isinstance(expected, bytes) else _utf8(expected)).digest()
    return hmac.compare_digest(a, b)


def matching_key(connection: ASGIConnection, keys: tuple[str, ...]) -> str | None:
    """The accepted key this connection presents, or None (every key is compared)."""
    given = presented_key(connection)
    if given is None:
        return None
    found = None
    for key in keys:  # no early exit: the time does not say which key matched
        if keys_match(given, key):
            found = key
    return found


def is_authorized(connection: ASGIConnection, keys: tuple[str, ...]) -> bool:
    return not keys or matching_key(connection, keys) is not None


def owner_of(connection: ASGIConnection, keys: tuple[str, ...]) -> Owner:
    """Who this (authorized) connection is for kept voices: its key's digest where keys are
    set, else its client address (which only counts against the per-owner cap)."""
    if keys and (key := matching_key(connection, keys)) is not None:
        return Owner("key:" + hashlib.sha256(_utf8(key)).hexdigest()[:32], by_key=True)
    client = connection.client
    return Owner(f"addr:{client.host if client else 'unknown'}", by_key=False)


def _host_port(netloc: str, scheme: str) -> str:
    """`Example.com` / `example.com:80` -> `example.com:80` (default port filled in)."""
    netloc = netloc.strip().lower().rsplit("@", 1)[-1]
    if netloc.startswith("["):  # [ipv6]:port
        host, _, rest = netloc.partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        host += "]"
    else:
        host, _, port = netloc.partition(":")
    return f"{host}:{port or _DEFAULT_PORTS.get(scheme, '')}"


_HOST = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[^\s\[\]:/@]+))(?::(?P<port>[0-9]{1,5}))?\Z")


def _host_name(header: str) -> str | None:
    """`Example.COM:8000` -> `example.com`; `[::1]:80` -> `::1` (no port, no trailing dot);
    None when the header is no `host[:port]` (a port that is not a number, a stray bracket)."""
    found = _HOST.match(header.strip().lower())
    if found is None or (found.group("port") is not None and int(found.group("port")) > 65535):
        return None
    return found.group("v6") or found.group("name").rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def host_verdict(header: str | None, allowed: tuple[str, ...] | list[str] = ()) -> str:
    """`ok`, `malformed` (no `host[:port]`: 400) or `unknown` (a name this server does not serve: 403)."""
    if header is None:
        return "ok"  # HTTP/1.0 without a Host: not a browser
    name = _host_name(header)
    if not name:
        return "malformed"
    if "*" in allowed or _is_ip(name) or name == "localhost" or name.endswith(".localhost"):
        return "ok"
    known = any(name == host or (host.startswith("*.") and name.endswith(host[1:])) for host in allowed)
    return "ok" if known else "unknown"


def host_allowed(connection: ASGIConnection, allowed: tuple[str, ...] | list[str] = ()) -> bool:
    """The `Host` names this server: localhost, an IP address, or a name in `allowed`."""
    return host_verdict(connection.headers.get("host"), allowed) == "ok"


def origin_allowed(connection: ASGIConnection, allowed: tuple[str, ...] | list[str] = ()) -> bool:
    origin = connection.headers.get("origin")
    if origin is None:
        return True  # not a browser
    origin = origin.strip().rstrip("/").lower()
    if "*" in allowed or origin in allowed:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False  # e.g. "null" (a sandboxed page or a file)
    host = connection.headers.get("host")
    return bool(host) and _host_port(parts.netloc, parts.scheme) == _host_port(host, parts.scheme)


HOST_REFUSED = "this server does not serve the host this request names (see --allowed-hosts)"
HOST_MALFORMED = "Host: must be a host name or address, with an optional numeric port"


def check_host(connection: ASGIConnection) -> None:
    """The `Host` must be well formed (else 400) and one this server serves (else 403). Every
    HTTP route's guard, and the unknown-route handler (an evil Host learns no route)."""
    verdict = host_verdict(connection.headers.get("host"), connection.app.state.config.served_hosts)
    if verdict == "malformed":
        raise ApiError("bad_message", HOST_MALFORMED, status=400)
    if verdict == "unknown":
        raise ApiError("unauthorized", HOST_REFUSED, status=403)


def require_known_host(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Litestar guard for every HTTP route (the WebSocket checks for itself, to answer with a
    frame)."""
    if connection.scope["type"] == "http":
        check_host(connection)


def unknown_route_handler(request: Request, exc: NotFoundException) -> Response:
    """404, but only for a Host this server serves (route guards never run for an unknown
    route): an evil or malformed Host learns nothing of the routes."""
    try:
        check_host(request)
    except ApiError as refused:
        return api_error_handler(request, refused)
    return http_exception_handler(request, exc)


def require_api_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Litestar guard for the `/v1` HTTP routes: an allowed origin, and the key when one is set.
    (The WebSocket checks both itself, after accepting, to answer with a frame.)"""
    if connection.scope["type"] != "http":
        return
    config = connection.app.state.config
    if not origin_allowed(connection, config.allowed_origins):
        raise ApiError("unauthorized", "this page's origin may not use this server (see --allowed-origins)",
                       status=403)
    if not is_authorized(connection, config.api_keys):
        raise ApiError("unauthorized", "a valid API key is required (Authorization: Bearer KEY)")
