"""The admin WSGI application: routing, pages, the JSON API and its guards."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import quote

from novaque.admin import _data
from novaque.admin._http import (
    HTTPError,
    Request,
    Response,
    StartResponse,
    check_basic_auth,
    check_csrf,
    csrf_cookie,
    csrf_token,
)
from novaque.admin._metrics import Metrics
from novaque.admin._pages import Pages
from novaque.client import Client
from novaque.errors import (
    ChannelNotFound,
    InvalidName,
    InvalidOption,
    MessageNotFound,
    MessageTooLarge,
    NovaqueError,
    ScheduleNotFound,
    SchemaOutOfDate,
    TopicNotFound,
)

__all__ = ["AdminApp"]

log = logging.getLogger("novaque.admin")

_NAME = r"(?P<{}>[^/]+)"
Handler = Callable[["Call"], Response]

_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}


@dataclass
class Call:
    """One request as a handler sees it."""

    request: Request
    params: dict[str, str]
    pages: Pages
    new_token: bool

    def name(self, key: str) -> str:
        return self.params[key]


def _route(pattern: str) -> re.Pattern[str]:
    expanded = re.sub(r"\{(\w+)\}", lambda m: _NAME.format(m.group(1)), pattern)
    return re.compile(expanded + r"\Z")


class AdminApp:
    """The admin UI and its JSON API as one WSGI application.

    Build it with :func:`novaque.admin.create_app`. It serves every path under
    ``prefix`` (matched against ``PATH_INFO``) and answers 404 elsewhere; links
    it renders start with ``SCRIPT_NAME + prefix``.
    """

    def __init__(
        self,
        client: Client,
        *,
        prefix: str = "/admin",
        basic_auth: tuple[str, str] | None = None,
        metrics: bool = False,
    ) -> None:
        if not isinstance(metrics, bool):
            raise InvalidOption(f"metrics must be True or False, got {type(metrics).__name__}")
        if not isinstance(prefix, str) or (prefix and not prefix.startswith("/")):
            raise InvalidOption(f"prefix must be '' or start with '/', got {prefix!r}")
        if basic_auth is not None and not (
            isinstance(basic_auth, tuple)
            and len(basic_auth) == 2
            and all(isinstance(part, str) for part in basic_auth)
            and basic_auth[0]
            and ":" not in basic_auth[0]
        ):
            raise InvalidOption(
                "basic_auth must be a (user, password) pair of strings, with a non-empty user "
                "name without ':'"
            )
        #: The client whose database the app shows and changes.
        self.client = client
        #: Where the app lives in ``PATH_INFO`` (no trailing ``/``; ``""``: the root).
        self.prefix = prefix.rstrip("/")
        #: The ``(user, password)`` every request must send, or None: no auth.
        self.basic_auth = basic_auth
        self._pages: list[tuple[str, re.Pattern[str], Handler]] = []
        self._api: list[tuple[str, re.Pattern[str], Handler]] = []
        #: The Prometheus endpoint's collector (``metrics=True``), else None.
        self.metrics = Metrics(client) if metrics else None
        self._register()

    # -- WSGI entry point -------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        request = Request(environ)
        path = request.path
        if self.prefix:
            if path != self.prefix and not path.startswith(self.prefix + "/"):
                return self._plain_404(request, start_response)
            path = path[len(self.prefix) :]
        root = request.script_name + self.prefix
        token, new_token = csrf_token(request)
        pages = Pages(root, token)
        is_api = path == "/api" or path.startswith("/api/")
        try:
            check_basic_auth(request, self.basic_auth)
            if path == "":
                raise _Redirect(root + "/")
            if path.startswith("/static/"):
                return self._static(path[len("/static/") :]).send(start_response, cache=True)
            routes = self._api if is_api else self._pages
            handler, params = self._match(routes, request.method, path[4:] if is_api else path)
            if request.method == "POST":
                check_csrf(request)
            response = handler(Call(request, params, pages, new_token))
        except _Redirect as redirect:
            response = Response(b"", 308, headers=[("Location", redirect.location)])
        except HTTPError as exc:
            response = self._error(exc.status, exc.message, is_api, pages)
            response.headers.extend(exc.headers)
        except (InvalidName, InvalidOption, MessageTooLarge) as exc:
            response = self._error(400, str(exc), is_api, pages)
        except (TopicNotFound, ChannelNotFound, MessageNotFound, ScheduleNotFound) as exc:
            response = self._error(404, str(exc), is_api, pages)
        except SchemaOutOfDate as exc:
            response = self._error(503, str(exc), is_api, pages)
        except NovaqueError as exc:
            response = self._error(409, str(exc), is_api, pages)
        except Exception:
            # The traceback goes to the log; never the request body.
            log.exception("admin: %s %s failed", request.method, request.path)
            response = self._error(500, "internal error (see the server log)", is_api, pages)
        if new_token and response.content_type.startswith("text/html"):
            response.headers.append(csrf_cookie(token, root + "/", request.scheme == "https"))
        sent = response.send(start_response)
        return [] if request.method == "HEAD" else sent

    def _match(
        self, routes: list[tuple[str, re.Pattern[str], Handler]], method: str, path: str
    ) -> tuple[Handler, dict[str, str]]:
        allowed: list[str] = []
        for route_method, pattern, handler in routes:
            found = pattern.match(path)
            if found is None:
                continue
            if route_method == method or (route_method == "GET" and method == "HEAD"):
                return handler, found.groupdict()
            allowed.append(route_method)
        if allowed:
            raise HTTPError(
                405,
                f"{method} is not allowed here; use {' or '.join(sorted(set(allowed)))}",
                [("Allow", ", ".join(sorted(set(allowed))))],
            )
        raise HTTPError(404, f"no such page: {path}")

    def _error(self, status: int, message: str, is_api: bool, pages: Pages) -> Response:
        if is_api:
            return Response.json({"error": message, "status": status}, status)
        return Response(pages.error(status, message).encode("utf-8"), status)

    def _plain_404(self, request: Request, start_response: StartResponse) -> list[bytes]:
        return Response(b"not found", 404, "text/plain; charset=utf-8").send(start_response)

    def _static(self, name: str) -> Response:
        suffix = name[name.rfind(".") :] if "." in name else ""
        if "/" in name or suffix not in _STATIC_TYPES:
            raise HTTPError(404, f"no such asset: {name}")
        asset = resources.files("novaque.admin").joinpath("static").joinpath(name)
        if not asset.is_file():
            raise HTTPError(404, f"no such asset: {name}")
        return Response(asset.read_bytes(), 200, _STATIC_TYPES[suffix])

    # -- routes ---------------------------------------------------------------------

    def _register(self) -> None:
        page = self._pages
        page.append(("GET", _route("/"), self.page_dashboard))
        page.append(("GET", _route("/topics/{topic}"), self.page_topic))
        page.append(("GET", _route("/topics/{topic}/messages"), self.page_messages))
        page.append(("GET", _route("/topics/{topic}/channels/{channel}"), self.page_channel))
        page.append(("GET", _route("/topics/{topic}/channels/{channel}/dead"), self.page_dead))
        page.append(("GET", _route("/messages/{id}"), self.page_message))
        page.append(("GET", _route("/schedules"), self.page_schedules))
        if self.metrics is not None:
            page.append(("GET", _route("/metrics"), self.page_metrics))

        api = self._api
        api.append(("GET", _route("/csrf"), self.api_csrf))
        api.append(("GET", _route("/overview"), self.api_overview))
        api.append(("GET", _route("/topics"), self.api_topics))
        api.append(("POST", _route("/topics"), self.api_create_topic))
        api.append(("GET", _route("/topics/{topic}"), self.api_topic))
        api.append(("POST", _route("/topics/{topic}/delete"), self.api_delete_topic))
        api.append(("POST", _route("/topics/{topic}/channels"), self.api_create_channel))
        api.append(("POST", _route("/topics/{topic}/publish"), self.api_publish))
        api.append(("GET", _route("/topics/{topic}/messages"), self.api_messages))
        api.append(("POST", _route("/topics/{topic}/replay"), self.api_replay_range))
        api.append(("GET", _route("/topics/{topic}/channels/{channel}"), self.api_channel))
        api.append(
            ("POST", _route("/topics/{topic}/channels/{channel}/delete"), self.api_delete_channel)
        )
        api.append(
            ("POST", _route("/topics/{topic}/channels/{channel}/pause"), self.api_pause_channel)
        )
        api.append(
            ("POST", _route("/topics/{topic}/channels/{channel}/resume"), self.api_resume_channel)
        )
        api.append(("GET", _route("/topics/{topic}/channels/{channel}/daily"), self.api_daily))
        api.append(("GET", _route("/topics/{topic}/channels/{channel}/minutes"), self.api_minutes))
        api.append(("GET", _route("/minutes"), self.api_all_minutes))
        api.append(("GET", _route("/consumers"), self.api_consumers))
        api.append(("GET", _route("/topics/{topic}/channels/{channel}/dead"), self.api_dead))
        api.append(
            (
                "POST",
                _route("/topics/{topic}/channels/{channel}/dead/requeue"),
                self.api_requeue_dead,
            )
        )
        api.append(
            ("POST", _route("/topics/{topic}/channels/{channel}/dead/delete"), self.api_delete_dead)
        )
        api.append(("GET", _route("/messages/{id}"), self.api_message))
        api.append(("POST", _route("/messages/{id}/replay"), self.api_replay))
        api.append(("POST", _route("/messages/{id}/cancel"), self.api_cancel))
        api.append(("GET", _route("/schedules"), self.api_schedules))
        api.append(("POST", _route("/schedules/{name}/pause"), self.api_pause_schedule))
        api.append(("POST", _route("/schedules/{name}/resume"), self.api_resume_schedule))

    # -- pages ------------------------------------------------------------------------

    def _html(self, text: str) -> Response:
        return Response(text.encode("utf-8"))

    def page_dashboard(self, call: Call) -> Response:
        return self._html(call.pages.dashboard(_data.overview(self.client)))

    def page_topic(self, call: Call) -> Response:
        day = _data.today(self.client)
        summary = _data.topic_summary(self.client, call.name("topic"), day)
        return self._html(call.pages.topic(summary, day.isoformat()))

    def page_channel(self, call: Call) -> Response:
        topic, channel = call.name("topic"), call.name("channel")
        detail = _data.channel_detail(self.client, topic, channel)
        days = _data.daily(self.client, topic, channel, None, None)
        return self._html(call.pages.channel(detail, days))

    def page_dead(self, call: Call) -> Response:
        after = call.request.query.get("after_id")
        after_id = _data.parse_id(after, "after_id") if after else None
        data = _data.dead_page(
            self.client,
            call.name("topic"),
            call.name("channel"),
            limit=_data.parse_limit(call.request.query.get("limit")),
            after_id=after_id,
        )
        return self._html(call.pages.dead(data, after_id))

    def page_schedules(self, call: Call) -> Response:
        return self._html(call.pages.schedules(_data.schedules(self.client)))

    def page_metrics(self, call: Call) -> Response:
        assert self.metrics is not None
        return Response(self.metrics.render(), 200, self.metrics.content_type)

    def page_messages(self, call: Call) -> Response:
        data = self._messages(call)
        shown = {k: v for k, v in call.request.query.items() if k in ("since", "until", "after_id")}
        return self._html(call.pages.messages(data, shown))

    def page_message(self, call: Call) -> Response:
        message_id = _data.parse_id(call.name("id"), "message id")
        return self._html(call.pages.message(_data.message_detail(self.client, message_id)))

    # -- API: reads -----------------------------------------------------------------------

    def api_csrf(self, call: Call) -> Response:
        """The CSRF token for scripts: repeat it in X-CSRF-Token along with the cookie."""
        response = Response.json({"token": call.pages.csrf, "header": "X-CSRF-Token"})
        if call.new_token:
            secure = call.request.scheme == "https"
            response.headers.append(csrf_cookie(call.pages.csrf, call.pages.root + "/", secure))
        return response

    def api_overview(self, call: Call) -> Response:
        return Response.json(_data.overview(self.client))

    def api_topics(self, call: Call) -> Response:
        return Response.json({"topics": self.client.list_topics()})

    def api_topic(self, call: Call) -> Response:
        day = _data.today(self.client)
        return Response.json(
            {"day": day.isoformat(), **_data.topic_summary(self.client, call.name("topic"), day)}
        )

    def api_channel(self, call: Call) -> Response:
        return Response.json(
            _data.channel_detail(self.client, call.name("topic"), call.name("channel"))
        )

    def api_daily(self, call: Call) -> Response:
        query = call.request.query
        return Response.json(
            _data.daily(
                self.client,
                call.name("topic"),
                call.name("channel"),
                _data.parse_date(query.get("since"), "since"),
                _data.parse_date(query.get("until"), "until"),
            )
        )

    def api_minutes(self, call: Call) -> Response:
        """The channel's last hour, per minute (every minute listed, zeros too)."""
        return Response.json(_data.minutes(self.client, call.name("topic"), call.name("channel")))

    def api_all_minutes(self, call: Call) -> Response:
        """Every channel's last hour added up, per minute."""
        return Response.json(_data.all_minutes(self.client))

    def api_consumers(self, call: Call) -> Response:
        """The consumers online; ``?topic=`` and ``?channel=`` narrow it."""
        query = call.request.query
        return Response.json(
            _data.consumers(self.client, query.get("topic") or None, query.get("channel") or None)
        )

    def api_dead(self, call: Call) -> Response:
        query = call.request.query
        after = query.get("after_id")
        return Response.json(
            _data.dead_page(
                self.client,
                call.name("topic"),
                call.name("channel"),
                limit=_data.parse_limit(query.get("limit")),
                after_id=_data.parse_id(after, "after_id") if after else None,
            )
        )

    def _messages(self, call: Call) -> dict[str, Any]:
        query = call.request.query
        after = query.get("after_id")
        since = _data.parse_datetime(query.get("since"), "since")
        until = _data.parse_datetime(query.get("until"), "until")
        if since is not None and until is not None and since > until:
            raise HTTPError(
                400, f"since ({since.isoformat()}) is after until ({until.isoformat()})"
            )
        return _data.message_page(
            self.client,
            call.name("topic"),
            since=since,
            until=until,
            limit=_data.parse_limit(query.get("limit")),
            after_id=_data.parse_id(after, "after_id") if after else None,
        )

    def api_messages(self, call: Call) -> Response:
        return Response.json(self._messages(call))

    def api_message(self, call: Call) -> Response:
        message_id = _data.parse_id(call.name("id"), "message id")
        return Response.json(_data.message_detail(self.client, message_id))

    # -- API: mutations (POST only, CSRF-checked before they run) -----------------------

    def _after_change(self) -> None:
        """Make the counters of an admin action visible at once."""
        try:
            self.client.flush_stats()
        except Exception:
            log.exception("admin: flushing stats failed (the counters are kept for later)")

    def api_create_topic(self, call: Call) -> Response:
        name = _required_name(call.request.read_json(), "topic")
        self.client.ensure_topic(name)
        log.info("admin: ensured topic %s", name)
        return Response.json({"topic": name, "url": call.pages.topic_url(name)}, 201)

    def api_delete_topic(self, call: Call) -> Response:
        topic = call.name("topic")
        self.client.delete_topic(topic)
        return Response.json({"deleted": {"topic": topic}})

    def api_create_channel(self, call: Call) -> Response:
        topic = call.name("topic")
        name = _required_name(call.request.read_json(), "channel")
        self.client.ensure_channel(topic, name)
        log.info("admin: ensured channel %s/%s", topic, name)
        url = call.pages.channel_url(topic, name)
        return Response.json({"topic": topic, "channel": name, "url": url}, 201)

    def api_schedules(self, call: Call) -> Response:
        return Response.json(_data.schedules(self.client))

    def api_pause_schedule(self, call: Call) -> Response:
        name = call.name("name")
        self.client.pause_schedule(name)
        log.info("admin: paused schedule %s", name)
        return Response.json({"paused": {"schedule": name}})

    def api_resume_schedule(self, call: Call) -> Response:
        name = call.name("name")
        self.client.resume_schedule(name)
        log.info("admin: resumed schedule %s", name)
        return Response.json({"resumed": {"schedule": name}})

    def api_pause_channel(self, call: Call) -> Response:
        topic, channel = call.name("topic"), call.name("channel")
        self.client.pause_channel(topic, channel)
        log.info("admin: paused channel %s/%s", topic, channel)
        return Response.json({"paused": {"topic": topic, "channel": channel}})

    def api_resume_channel(self, call: Call) -> Response:
        topic, channel = call.name("topic"), call.name("channel")
        self.client.resume_channel(topic, channel)
        log.info("admin: resumed channel %s/%s", topic, channel)
        return Response.json({"resumed": {"topic": topic, "channel": channel}})

    def api_delete_channel(self, call: Call) -> Response:
        topic, channel = call.name("topic"), call.name("channel")
        self.client.delete_channel(topic, channel)
        return Response.json({"deleted": {"topic": topic, "channel": channel}})

    def api_publish(self, call: Call) -> Response:
        data = call.request.read_json()
        body = data.get("body")
        if not isinstance(body, str):
            raise HTTPError(400, "body must be a string (it is stored UTF-8 encoded)")
        options: dict[str, Any] = {}
        for key in ("delay", "ttl"):
            value = data.get(key)
            if value not in (None, ""):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise HTTPError(400, f"{key} must be a number of seconds, got {value!r}")
                options[key] = value
        if data.get("max_attempts") not in (None, ""):
            options["max_attempts"] = data["max_attempts"]
        headers = data.get("headers")
        if headers is not None:
            options["headers"] = headers
        try:
            message_id = self.client.publish(call.name("topic"), body, **options)
        except TypeError as exc:  # headers that are not a dict of str to str
            raise HTTPError(400, str(exc)) from None
        self._after_change()
        return Response.json(
            {"id": message_id, "url": call.pages.url(f"/messages/{message_id}")}, 201
        )

    def _dead_action(self, call: Call, method: str, verb: str) -> Response:
        data = call.request.read_json()
        options: dict[str, Any] = {}
        if data.get("limit") not in (None, ""):
            options["limit"] = _data.parse_id(data["limit"], "limit")
        if data.get("died_before") not in (None, ""):
            options["died_before"] = _data.parse_datetime(data["died_before"], "died_before")
        if data.get("to_channel") not in (None, ""):
            if method != "requeue_dead":
                raise HTTPError(400, "to_channel is for requeue: deleted letters go nowhere")
            if not isinstance(data["to_channel"], str):
                raise HTTPError(400, "to_channel must be a channel name of the topic")
            options["to_channel"] = data["to_channel"]
        if data.get("all") is True:
            if "ids" in data:
                raise HTTPError(400, 'send either "ids" or "all": true, not both')
            ids = None
        elif "ids" in data:
            ids = _data.parse_ids(data["ids"])
        elif "limit" in options or "died_before" in options:
            ids = None  # the letters chosen by limit / died_before
        else:
            raise HTTPError(
                400, 'send "ids": [delivery ids], "all": true, or "limit" / "died_before"'
            )
        topic, channel = call.name("topic"), call.name("channel")
        result = getattr(self.client, method)(topic, channel, ids=ids, **options)
        self._after_change()
        count = _data.count_of(result)
        where = f" to {topic}/{options['to_channel']}" if "to_channel" in options else ""
        log.info("admin: %s %s dead letters of %s/%s%s", verb, count, topic, channel, where)
        return Response.json({verb: count})

    def api_requeue_dead(self, call: Call) -> Response:
        return self._dead_action(call, "requeue_dead", "requeued")

    def api_delete_dead(self, call: Call) -> Response:
        return self._dead_action(call, "delete_dead", "deleted")

    def api_replay(self, call: Call) -> Response:
        message_id = _data.parse_id(call.name("id"), "message id")
        channels = _data.parse_channels(call.request.read_json().get("channels"))
        result = self.client.replay(message_id, channels=channels)
        self._after_change()
        return Response.json({"replayed": _data.count_of(result)})

    def api_cancel(self, call: Call) -> Response:
        message_id = _data.parse_id(call.name("id"), "message id")
        cancelled = self.client.cancel(message_id)
        self._after_change()
        log.info("admin: cancelled %d deliveries of message %d", cancelled, message_id)
        return Response.json({"cancelled": cancelled})

    def api_replay_range(self, call: Call) -> Response:
        data = call.request.read_json()
        since = _data.parse_datetime(data.get("since"), "since")
        until = _data.parse_datetime(data.get("until"), "until")
        if since is None or until is None:
            raise HTTPError(400, "since and until are required (ISO 8601 times)")
        if since > until:
            raise HTTPError(
                400, f"since ({since.isoformat()}) is after until ({until.isoformat()})"
            )
        channels = _data.parse_channels(data.get("channels"))
        result = self.client.replay_range(call.name("topic"), since, until, channels=channels)
        self._after_change()
        return Response.json({"replayed": _data.count_of(result)})


class _Redirect(Exception):
    def __init__(self, location: str) -> None:
        super().__init__(location)
        self.location = quote(location, safe="/:%")


def _required_name(data: dict[str, Any], kind: str) -> str:
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise HTTPError(400, f'send {{"name": "..."}} with the new {kind}\'s name')
    return name
