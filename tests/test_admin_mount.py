"""The mounting recipes of docs/admin.md, run with the real frameworks.

Each recipe is checked the same way: the dashboard's links carry the mount
point, the JSON API answers, and a POST with the CSRF cookie and header
works (and without them is refused). Skipped when the framework is missing.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest

import novaque
from novaque.admin import create_app, serve
from tests.wsgi import WSGIClient


def check_mounted(get: Any, post: Any, cookies: Any, root: str) -> None:
    page = get(root + "/")
    assert page.status_code == 200
    assert f'href="{root}/static/admin.css"' in page.text
    token = re.search(r'name="novaque-csrf" content="([^"]+)"', page.text)
    assert token is not None
    assert get(root + "/api/topics").json() == {"topics": []}
    assert post(root + "/api/topics", {"name": "t"}, None).status_code == 403
    created = post(root + "/api/topics", {"name": "t"}, token.group(1))
    assert created.status_code == 201, created.text
    assert created.json()["url"] == f"{root}/topics/t"
    assert get(root + "/api/topics").json() == {"topics": ["t"]}


def test_flask_with_dispatcher_middleware(client: novaque.Client) -> None:
    flask = pytest.importorskip("flask")
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    app = flask.Flask("host")

    @app.get("/")
    def home() -> str:
        return "the host app"

    # --- recipe (docs/admin.md) ---
    app.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, {"/queues": create_app(client, prefix="")}
    )
    # ---
    web = app.test_client()

    def post(path: str, body: object, token: str | None) -> Any:
        headers = {"Origin": "http://localhost"}
        if token:
            headers["X-CSRF-Token"] = token
        return web.post(path, json=body, headers=headers)

    class Reply:
        def __init__(self, r: Any) -> None:
            self.status_code, self.text, self._r = r.status_code, r.get_data(as_text=True), r

        def json(self) -> Any:
            return self._r.get_json()

    check_mounted(
        lambda p: Reply(web.get(p)),
        lambda p, b, t: Reply(post(p, b, t)),
        None,
        "/queues",
    )
    assert web.get("/").get_data(as_text=True) == "the host app"


def test_django_wsgi_dispatch(client: novaque.Client) -> None:
    pytest.importorskip("django")
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="test",
            ROOT_URLCONF=__name__,
            ALLOWED_HOSTS=["testserver"],
            MIDDLEWARE=[],
            INSTALLED_APPS=[],
        )
    from django.core.wsgi import get_wsgi_application

    django_app = get_wsgi_application()
    # --- recipe (docs/admin.md): wsgi.py ---
    queues = create_app(client, prefix="/queues")

    def application(environ: dict[str, Any], start_response: Any) -> Any:
        path = environ.get("PATH_INFO", "")
        if path == "/queues" or path.startswith("/queues/"):
            return queues(environ, start_response)
        return django_app(environ, start_response)

    # ---
    web = WSGIClient(application)
    assert web.get("/queues").status == 308
    page = web.get("/queues/")
    assert page.status == 200
    assert 'href="/queues/static/admin.css"' in page.text
    assert web.post("/queues/api/topics", {"name": "t"}).status == 201
    assert web.get("/queues/api/topics").json() == {"topics": ["t"]}
    assert web.get("/hello").text == "hello from django"


def django_hello(request: Any) -> Any:
    from django.http import HttpResponse

    return HttpResponse("hello from django")


def _urlpatterns() -> list[Any]:
    try:
        from django.urls import path
    except ImportError:
        return []
    return [path("hello", django_hello)]


urlpatterns = _urlpatterns()


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_starlette_mount_through_a2wsgi(client: novaque.Client) -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("a2wsgi")
    pytest.importorskip("httpx")
    from a2wsgi import WSGIMiddleware
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.testclient import TestClient

    # --- recipe (docs/admin.md); FastAPI: app.mount("/queues", WSGIMiddleware(...)) ---
    app = Starlette(routes=[Mount("/queues", app=WSGIMiddleware(create_app(client, prefix="")))])
    # ---
    with TestClient(app, base_url="http://testserver") as web:

        def post(path: str, body: object, token: str | None) -> Any:
            headers = {"Origin": "http://testserver"}
            if token:
                headers["X-CSRF-Token"] = token
            return web.post(path, json=body, headers=headers)

        check_mounted(web.get, post, web.cookies, "/queues")


def test_serve_closes_its_socket_when_interrupted_as_it_starts(tmp_path: Path) -> None:
    """Ctrl-C while ``on_ready`` runs (``novaque admin`` printing its address)
    leaves no socket listening."""
    client = novaque.connect(f"sqlite:///{tmp_path / 'serve.db'}")
    ports = []

    def ready(base_url: str, server: str) -> None:
        ports.append(int(base_url.rsplit(":", 1)[1]))
        raise KeyboardInterrupt

    try:
        with pytest.raises(KeyboardInterrupt):
            serve(create_app(client), "127.0.0.1", 0, on_ready=ready)
    finally:
        client.shutdown()
    with socket.socket() as again:  # refused while the server's socket listens
        again.bind(("127.0.0.1", ports[0]))
