"""Who may do what with the web view: the access token and the rules, as Jupyter does it.

``elsewhere web`` makes a random token and prints the page's URL with it
(``http://127.0.0.1:8765/?token=...``). The rules, for every request:

=============================  ===============================================================
bound to loopback (default)    looking needs no token, but the request's Host must be a
                               loopback name (``localhost``, ``127.x.y.z``, ``[::1]``): a web
                               page elsewhere that renames itself to 127.0.0.1 (DNS
                               rebinding) is refused
bound to another address       every request needs the token (the page, its files, its data)
an action (POST)               needs the token, sent in the ``X-Elsewhere-Token`` header (or
                               ``Authorization: token ...``): never from a cookie, so another
                               site cannot make a browser act (no cross-site request forgery)
started with ``--read-only``   every action is refused, token or not
=============================  ===============================================================

A token is accepted from the header, the ``token`` query parameter, or the cookie the page
sets once opened with it (so its scripts, styles and event stream need not carry it). Tokens
are compared in constant time. Refusals are 403 with a line that says why.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

Scope = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]

HEADER = "x-elsewhere-token"


def new_token() -> str:
    """A fresh access token: 48 hex digits (192 random bits)."""
    return secrets.token_hex(24)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name, perhaps with a port or in brackets) is this
    machine's loopback."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8765
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:  # 127.0.0.1:8765, localhost:8765
        host = host.split(":", 1)[0]
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Rules:
    """The access rules of one server: its token, whether it is bound to loopback only, and
    whether it is read-only."""

    token: str
    loopback: bool
    read_only: bool = False

    def __post_init__(self) -> None:
        if len(self.token) < 16:
            raise ValueError("an access token needs at least 16 characters")

    @property
    def cookie(self) -> str:
        """The cookie's name (one per token: cookies are shared by every port of a host)."""
        return f"elsewhere-web-{self.token[:8]}"

    def holds(self, given: str | None) -> bool:
        """Whether ``given`` is the token (constant time)."""
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def refusal(self, method: str, host: str, *, header: str | None, query: str | None,
                cookie: str | None) -> str | None:  # fmt: skip
        """Why the request is refused (a line for the 403), or None if it may go on."""
        if self.loopback and not is_loopback(host):
            return (f"refused: this server answers only at a loopback address (the request named host "
                    f"{host[:100]!r})")  # fmt: skip
        if method not in ("GET", "HEAD"):
            if self.read_only:
                return "refused: this view is read-only (elsewhere web --read-only): no actions"
            if not self.holds(header):
                return ("refused: an action needs the access token that `elsewhere web` printed in its "
                        "URL (open the page with ?token=...)")  # fmt: skip
            return None
        if not self.loopback and not any(self.holds(t) for t in (header, query, cookie)):
            return ("refused: this server is reachable from other machines, so every request needs the "
                    "access token that `elsewhere web` printed in its URL (?token=...)")  # fmt: skip
        return None


def request_parts(scope: Scope) -> tuple[str, str | None, str | None, str | None]:
    """(Host, token header, token query parameter, cookie value by name) of an HTTP scope;
    the cookie comes back as the raw Cookie header, for :func:`cookie_value`."""
    host = header = cookies = None
    for name, value in scope.get("headers", []):
        if name == b"host":
            host = value.decode("latin-1")
        elif name == HEADER.encode():
            header = value.decode("latin-1")
        elif name == b"authorization" and header is None:
            text = value.decode("latin-1")
            if text.lower().startswith("token "):
                header = text[6:].strip()
        elif name == b"cookie":
            cookies = value.decode("latin-1")
    query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [None])[0]
    return host or "", header, query, cookies


def cookie_value(cookies: str | None, name: str) -> str | None:
    """The value of cookie ``name`` in a Cookie header."""
    for part in (cookies or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


class AccessMiddleware:
    """ASGI middleware that applies :class:`Rules` to every HTTP request, and puts whether
    the request carried the token in ``scope["state"]["token_ok"]``."""

    def __init__(self, app: ASGIApp, rules: Rules) -> None:
        self.app = app
        self.rules = rules

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:  # fmt: skip
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host, header, query, cookies = request_parts(scope)
        cookie = cookie_value(cookies, self.rules.cookie)
        why = self.rules.refusal(scope["method"], host, header=header, query=query, cookie=cookie)
        if why is not None:
            body = why.encode() + b"\n"
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                    (b"content-length", str(len(body)).encode())]})  # fmt: skip
            await send({"type": "http.response.body", "body": body})
            return
        ok = any(self.rules.holds(t) for t in (header, query, cookie))
        scope.setdefault("state", {})["token_ok"] = ok
        scope["state"]["token_in_query"] = self.rules.holds(query)
        await self.app(scope, receive, send)
