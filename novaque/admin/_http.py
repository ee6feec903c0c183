"""The small slice of HTTP the admin app needs, on bare WSGI (standard library only).

Requests, responses, errors that map to a status code, basic auth and the
CSRF checks (double-submit cookie plus an ``Origin``/``Referer`` check).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "CSRF_COOKIE",
    "CSRF_HEADER",
    "HTTPError",
    "Request",
    "Response",
    "StartResponse",
]

StartResponse = Callable[..., Any]

#: Name of the cookie that carries the CSRF token (double-submit pattern).
CSRF_COOKIE = "novaque_csrf"
#: Header that must repeat the cookie's token on every POST.
CSRF_HEADER = "X-CSRF-Token"
#: Largest request body the API reads (a 1 MiB message body, JSON-escaped, fits).
MAX_REQUEST_BYTES = 8 * 1024 * 1024

_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")

SECURITY_HEADERS = [
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "same-origin"),
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
]


class HTTPError(Exception):
    """An answer other than success: status code, message and extra headers."""

    def __init__(self, status: int, message: str, headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = list(headers)


@dataclass
class Response:
    """A complete response; ``body`` is sent as is."""

    body: bytes = b""
    status: int = 200
    content_type: str = "text/html; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(cls, data: object, status: int = 200) -> Response:
        """A JSON response (``application/json``, UTF-8)."""
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return cls(text.encode("utf-8"), status, "application/json; charset=utf-8")

    def send(self, start_response: StartResponse, *, cache: bool = False) -> list[bytes]:
        status = HTTPStatus(self.status)
        headers = [
            ("Content-Type", self.content_type),
            ("Content-Length", str(len(self.body))),
            ("Cache-Control", "public, max-age=300" if cache else "no-store"),
            *SECURITY_HEADERS,
            *self.headers,
        ]
        start_response(f"{status.value} {status.phrase}", headers)
        return [self.body]


class Request:
    """A read-only view of a WSGI ``environ``."""

    def __init__(self, environ: Mapping[str, Any]) -> None:
        self.environ = environ
        self.method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        # WSGI hands paths over as latin-1 decoded bytes: get the UTF-8 text back.
        self.script_name = _wsgi_text(environ.get("SCRIPT_NAME", "")).rstrip("/")
        self.path = _wsgi_text(environ.get("PATH_INFO", "")) or "/"
        self.query = {
            key: values[-1]
            for key, values in parse_qs(
                str(environ.get("QUERY_STRING", "")), keep_blank_values=True
            ).items()
        }
        self.cookies = _parse_cookies(str(environ.get("HTTP_COOKIE", "")))

    @property
    def host(self) -> str:
        """The ``Host`` the client used (``SERVER_NAME:PORT`` when absent)."""
        host = self.environ.get("HTTP_HOST")
        if host:
            return str(host).lower()
        name = str(self.environ.get("SERVER_NAME", "")).lower()
        port = str(self.environ.get("SERVER_PORT", ""))
        default = "443" if self.scheme == "https" else "80"
        return name if port in ("", default) else f"{name}:{port}"

    @property
    def scheme(self) -> str:
        return str(self.environ.get("wsgi.url_scheme", "http"))

    def header(self, name: str) -> str | None:
        value = self.environ.get("HTTP_" + name.upper().replace("-", "_"))
        return None if value is None else str(value)

    def read_json(self) -> dict[str, Any]:
        """The request body as a JSON object (``{}`` when empty); 400/413 otherwise."""
        try:
            length = int(self.environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            raise HTTPError(400, "Content-Length is not a number") from None
        if length > MAX_REQUEST_BYTES:
            raise HTTPError(413, f"request body is larger than {MAX_REQUEST_BYTES} bytes")
        raw = self.environ["wsgi.input"].read(length) if length > 0 else b""
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw)
        except RecursionError:
            raise HTTPError(400, "request body is not valid JSON: nested too deeply") from None
        except ValueError as exc:  # bad JSON or UTF-8, or an integer of too many digits
            raise HTTPError(400, f"request body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise HTTPError(400, "request body must be a JSON object")
        return data


def _wsgi_text(value: object) -> str:
    text = str(value or "")
    try:
        return text.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return text


def _parse_cookies(header: str) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return {}
    return {key: morsel.value for key, morsel in jar.items()}


# -- basic auth -----------------------------------------------------------------------


def check_basic_auth(request: Request, credentials: tuple[str, str] | None) -> None:
    """Raise 401 (with ``WWW-Authenticate``) unless the request carries ``credentials``."""
    if credentials is None:
        return
    challenge = [("WWW-Authenticate", 'Basic realm="novaque admin", charset="UTF-8"')]
    header = request.header("Authorization") or ""
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        raise HTTPError(401, "authentication required", challenge)
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise HTTPError(401, "malformed basic credentials", challenge) from None
    user, sep, password = decoded.partition(":")
    want_user, want_password = credentials
    # Compare both parts, always, so timing says nothing about which was wrong.
    user_ok = hmac.compare_digest(user.encode(), want_user.encode())
    password_ok = hmac.compare_digest(password.encode(), want_password.encode())
    if not (sep and user_ok and password_ok):
        raise HTTPError(401, "wrong user name or password", challenge)


# -- CSRF -----------------------------------------------------------------------------


def csrf_token(request: Request) -> tuple[str, bool]:
    """The client's CSRF token, and whether it is new (so the cookie must be set)."""
    token = request.cookies.get(CSRF_COOKIE, "")
    if _well_formed(token):
        return token, False
    return secrets.token_urlsafe(32), True


def csrf_cookie(token: str, path: str, secure: bool) -> tuple[str, str]:
    """The ``Set-Cookie`` header that hands ``token`` to the browser."""
    attributes = f"{CSRF_COOKIE}={token}; Path={path or '/'}; SameSite=Strict; HttpOnly"
    return ("Set-Cookie", attributes + ("; Secure" if secure else ""))


def check_csrf(request: Request) -> None:
    """Refuse (403) a cross-origin request, or one without the double-submitted token.

    ``Origin`` (or, when a browser sends none, ``Referer``) must name the host
    the request was sent to. The ``X-CSRF-Token`` header must equal the token
    in the ``novaque_csrf`` cookie: a page from another site can make the
    browser send the cookie but can neither read it nor set the header.
    """
    origin = request.header("Origin")
    referer = request.header("Referer")
    if origin is not None:
        if not _same_host(origin, request.host):
            raise HTTPError(403, f"cross-origin request refused (Origin {origin[:200]})")
    elif referer is not None and not _same_host(referer, request.host):
        raise HTTPError(403, "cross-origin request refused (Referer names another site)")
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = request.header(CSRF_HEADER) or ""
    if not _well_formed(cookie) or not sent:
        raise HTTPError(
            403,
            f"CSRF token missing: send the {CSRF_COOKIE} cookie and repeat it in {CSRF_HEADER}",
        )
    if not hmac.compare_digest(sent.encode(), cookie.encode()):
        raise HTTPError(403, f"CSRF token mismatch: {CSRF_HEADER} differs from the cookie")


def _same_host(url: str, host: str) -> bool:
    try:
        netloc = urlsplit(url).netloc.lower()
    except ValueError:
        return False
    return bool(netloc) and netloc == host


def _well_formed(token: str) -> bool:
    return 32 <= len(token) <= 128 and set(token) <= _TOKEN_CHARS
