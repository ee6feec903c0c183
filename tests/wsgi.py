"""A tiny WSGI test client: calls the app in-process, keeps cookies."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlsplit
from wsgiref.util import setup_testing_defaults


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    set_cookies: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        assert self.headers["Content-Type"].startswith("application/json"), self.headers
        return json.loads(self.body)


class WSGIClient:
    """Drives a WSGI app like a same-origin browser would (unless told otherwise)."""

    def __init__(self, app: Any, *, host: str = "testserver", script_name: str = "") -> None:
        self.app = app
        self.host = host
        self.script_name = script_name
        self.cookies: dict[str, str] = {}
        self.auth: tuple[str, str] | None = None

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: object = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        csrf: bool = True,
        origin: str | None = "same",
    ) -> Reply:
        parts = urlsplit(path)
        body = raw if raw is not None else b""
        if json_body is not None:
            body = json.dumps(json_body).encode()
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": self.script_name,
            "PATH_INFO": parts.path.encode("utf-8").decode("latin-1"),
            "QUERY_STRING": parts.query,
            "HTTP_HOST": self.host,
            "CONTENT_LENGTH": str(len(body)),
            "CONTENT_TYPE": "application/json",
            "wsgi.input": io.BytesIO(body),
        }
        setup_testing_defaults(environ)
        if self.cookies:
            environ["HTTP_COOKIE"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if self.auth is not None:
            token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            environ["HTTP_AUTHORIZATION"] = f"Basic {token}"
        if method == "POST":
            if origin == "same":
                environ["HTTP_ORIGIN"] = f"http://{self.host}"
            elif origin is not None:
                environ["HTTP_ORIGIN"] = origin
            if csrf and "novaque_csrf" in self.cookies:
                environ["HTTP_X_CSRF_TOKEN"] = self.cookies["novaque_csrf"]
        for key, value in (headers or {}).items():
            environ["HTTP_" + key.upper().replace("-", "_")] = value
        captured: dict[str, Any] = {}

        def start_response(status: str, header_list: list[tuple[str, str]], exc: Any = None) -> Any:
            captured["status"] = int(status.split()[0])
            captured["headers"] = header_list
            return lambda data: None

        chunks = self.app(environ, start_response)
        data = b"".join(chunks)
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
        header_map: dict[str, str] = {}
        cookies: list[str] = []
        for key, value in captured["headers"]:
            if key.lower() == "set-cookie":
                cookies.append(value)
                jar: SimpleCookie = SimpleCookie()
                jar.load(value)
                for name, morsel in jar.items():
                    self.cookies[name] = morsel.value
            header_map[key] = value
        return Reply(captured["status"], header_map, data, cookies)

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, json_body: object = None, **kwargs: Any) -> Reply:
        return self.request("POST", path, json_body=json_body, **kwargs)

    def login(self, root: str = "/admin") -> str:
        """Fetch the CSRF token (cookie plus body) as a script would."""
        reply = self.get(root + "/api/csrf")
        assert reply.status == 200, reply.text
        token: str = reply.json()["token"]
        assert token == self.cookies["novaque_csrf"]
        return token
