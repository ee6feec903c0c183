"""novaque's admin UI: a mountable WSGI application (standard library only).

::

    from novaque.admin import create_app

    app = create_app(client, prefix="/admin", basic_auth=("ops", "s3cret"))

Pages: a dashboard of topics and channels (backlog per state, today's
counters, consumers online, refreshed live), a channel page with a trend
chart of the daily counters and one of the last hour per minute, a
dead-letter browser (requeue/delete), a message browser with replay, and
create/delete of topics and channels. A JSON API lives under
``{prefix}/api/``; with ``metrics=True``, Prometheus metrics under
``{prefix}/metrics``. See ``docs/admin.md`` for the endpoints, mounting recipes
(Flask, Django, Starlette/FastAPI) and the security model.
"""

from __future__ import annotations

from novaque.admin._app import AdminApp
from novaque.admin._serve import serve
from novaque.client import Client

__all__ = ["AdminApp", "create_app", "serve"]


def create_app(
    client: Client,
    *,
    prefix: str = "/admin",
    basic_auth: tuple[str, str] | None = None,
    metrics: bool = False,
) -> AdminApp:
    """The admin UI for ``client`` as a WSGI application.

    ``prefix`` is where the app lives in ``PATH_INFO`` (``""`` when a host
    framework strips its mount point into ``SCRIPT_NAME``); links honour
    ``SCRIPT_NAME``. ``basic_auth``, a ``(user, password)`` pair, makes every
    request need those credentials (401 with ``WWW-Authenticate`` otherwise).

    Mutations are POST only and need the CSRF token (double-submit cookie,
    repeated in the ``X-CSRF-Token`` header) and a same-origin ``Origin`` or
    ``Referer`` when the browser sends one; otherwise they answer 403.

    ``metrics=True`` serves ``{prefix}/metrics`` in the Prometheus text format
    (``novaque_backlog``, ``novaque_oldest_ready_age_seconds``,
    ``novaque_today_total``, ``novaque_consumers``; see
    docs/how-to/monitoring.md), behind the same basic auth; it needs the
    ``prometheus`` extra (``pip install 'novaque[prometheus]'``). Without it
    the path answers 404.
    """
    return AdminApp(client, prefix=prefix, basic_auth=basic_auth, metrics=metrics)
