"""The broker's ASGI application: Starlette routes over :class:`novaque.aio.AsyncClient`.

Each endpoint maps onto one call (or one transaction) of the asyncio twin.
A long poll (``receive`` with ``wait``) is the client's own: it waits,
holding no connection and no thread, for the wake-ups that wake novaque's
consumers (a publish in this process, PostgreSQL's ``NOTIFY``, the change
watcher of SQLite and MySQL/MariaDB). A caller that goes away mid-poll has
its wait ended at once; deliveries a claim leased as it went away are
released (given back, their attempt not counted).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive

from novaque._bridge import bridged
from novaque._core import parts_of
from novaque.aio import AsyncClient, core_of
from novaque.broker import _wire
from novaque.broker._openapi import document
from novaque.broker._tokens import Token, Tokens
from novaque.broker._wire import ApiError, invalid
from novaque.client import Client, runtime_of
from novaque.errors import (
    ChannelNotFound,
    DatabaseUnavailable,
    DedupConflict,
    InvalidFilter,
    InvalidName,
    InvalidOption,
    LeaseLost,
    MessageNotFound,
    MessageTooLarge,
    NovaqueError,
    SchemaOutOfDate,
    TopicNotFound,
)
from novaque.models import Message

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "BrokerApp"]

log = logging.getLogger("novaque.broker")

#: The largest request body read (a bigger one is refused with 413).
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
#: How long the health check waits for the database.
HEALTH_TIMEOUT_S = 5.0

Endpoint = Callable[[Request], Awaitable[Response]]


class _Gone(Exception):
    """The caller went away during its long poll."""


@dataclass
class _Poll:
    """Where a long poll is, as the disconnect watcher needs to know."""

    gone: bool = False
    fetching: bool = False
    got: list[Message] | None = None


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": {"code": code, "message": message}}, status, headers=headers)


class BrokerApp:
    """The endpoints over one client; :attr:`app` is the ASGI application."""

    def __init__(self, client: AsyncClient, tokens: Tokens, max_request_bytes: int) -> None:
        self.client = client
        self.tokens = tokens
        self.max_request_bytes = max_request_bytes
        self._core: Client = core_of(client)
        #: The server stops (:meth:`close`): receives no longer wait.
        self.closing = False
        self._closers: set[asyncio.Future[None]] = set()
        publish_params = inspect.signature(Client.publish_many).parameters
        self.supports_priority = "priority" in publish_params or "priorities" in publish_params
        self.setting_names = tuple(
            name
            for name, p in inspect.signature(Client.ensure_channel).parameters.items()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "reset"
        )
        channel = "/v1/topics/{topic}/channels/{channel}"
        routes = [
            Route("/v1/health", self._plain(self.health), methods=["GET"]),
            Route("/v1/openapi.json", self._guarded(self.openapi), methods=["GET"]),
            Route("/v1/topics/{topic}/messages", self._guarded(self.publish), methods=["POST"]),
            Route("/v1/topics/{topic}", self._guarded(self.delete_topic), methods=["DELETE"]),
            Route(channel, self._guarded(self.get_channel), methods=["GET"]),
            Route(channel, self._guarded(self.put_channel), methods=["PUT"]),
            Route(channel, self._guarded(self.delete_channel), methods=["DELETE"]),
            Route(f"{channel}/receive", self._guarded(self.receive), methods=["POST"]),
            Route(f"{channel}/settle", self._guarded(self.settle), methods=["POST"]),
            Route(f"{channel}/renew", self._guarded(self.renew), methods=["POST"]),
            Route(f"{channel}/deferred", self._guarded(self.deferred), methods=["POST"]),
            Route(f"{channel}/dead/requeue", self._guarded(self.requeue_dead), methods=["POST"]),
            Route(f"{channel}/dead/delete", self._guarded(self.delete_dead), methods=["POST"]),
            Route("/v1/messages/{id}/cancel", self._guarded(self.cancel), methods=["POST"]),
        ]
        self.app = Starlette(routes=routes, exception_handlers={HTTPException: self._http_error})
        self.app.state.broker = self

    # -- plumbing ---------------------------------------------------------------------

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            return _error(
                405,
                "invalid",
                f"{request.method} is not allowed on {request.url.path}; use {allowed}",
                {"Allow": allowed},
            )
        if exc.status_code == 404:
            return _error(
                404,
                "not_found",
                f"no endpoint {request.method} {request.url.path} (see GET /v1/openapi.json)",
            )
        return _error(exc.status_code, "invalid", str(exc.detail))

    def _plain(self, endpoint: Endpoint) -> Endpoint:
        return endpoint

    def _guarded(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint`` with the errors of novaque mapped to their answers."""

        async def guarded(request: Request) -> Response:
            try:
                return await endpoint(request)
            except ApiError as exc:
                headers = (
                    {"WWW-Authenticate": 'Bearer realm="novaque"'} if exc.status == 401 else None
                )
                return _error(exc.status, exc.code, exc.message, headers)
            except (InvalidName, InvalidOption, InvalidFilter) as exc:
                return _error(400, "invalid", str(exc))
            except MessageTooLarge as exc:
                return _error(413, "too_large", str(exc))
            except (TopicNotFound, ChannelNotFound, MessageNotFound) as exc:
                return _error(404, "not_found", str(exc))
            except DedupConflict as exc:
                return _error(409, "dedup_conflict", str(exc))
            except (DatabaseUnavailable, SchemaOutOfDate) as exc:
                log.warning(
                    "broker: %s %s: database unavailable: %s", request.method, request.url.path, exc
                )
                return _error(503, "unavailable", "the database cannot be reached; try again later")
            except (NovaqueError, sa.exc.DBAPIError, OSError) as exc:
                log.exception("broker: %s %s failed", request.method, request.url.path)
                if isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError, OSError)):
                    return _error(
                        503, "unavailable", "the database cannot be reached; try again later"
                    )
                return _error(500, "internal", "internal error (see the server's log)")
            except Exception:
                log.exception("broker: %s %s failed", request.method, request.url.path)
                return _error(500, "internal", "internal error (see the server's log)")

        return guarded

    def _token(self, request: Request) -> Token:
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>")
        found = self.tokens.find(value.strip())
        if found is None:
            raise ApiError(401, "unauthorized", "unknown token")
        return found

    def _allow(
        self, request: Request, kind: str, topic: str | None = None, channel: str | None = None
    ) -> Token:
        """The request's token, if its scopes allow ``kind`` on the names (401/403)."""
        token = self._token(request)
        if not token.allows(kind, topic, channel):
            target = (
                "" if topic is None else f" on {topic}" + ("" if channel is None else f"/{channel}")
            )
            raise ApiError(403, "forbidden", f"this token's scopes do not allow {kind}{target}")
        return token

    async def _json(self, request: Request, *, empty_ok: bool = False) -> dict[str, Any]:
        """The request body: a JSON object (``{}`` for an empty body when ``empty_ok``)."""
        limit = self.max_request_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise ApiError(413, "too_large", f"the request body is over {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, "too_large", f"the request body is over {limit} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            if empty_ok:
                return {}
            raise invalid("send a JSON object in the request body")
        try:
            data = json.loads(raw)
        except RecursionError:
            raise invalid("the request body is not valid JSON: nested too deeply") from None
        except ValueError as exc:
            raise invalid(f"the request body is not valid JSON: {exc}") from None
        return _wire.obj(data, "the request body")

    @staticmethod
    def _names(request: Request) -> tuple[str, str]:
        return request.path_params["topic"], request.path_params["channel"]

    def _today(self) -> date:
        clock = self.client.options.clock
        moment = clock() if clock is not None else datetime.now(timezone.utc)
        return moment.astimezone(timezone.utc).date()

    # -- open endpoints ---------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        """200 when the database answers, else 503; no token needed."""
        try:
            await asyncio.wait_for(self._ping(), HEALTH_TIMEOUT_S)
        except Exception as exc:
            log.warning("broker: health check failed: %s", exc)
            return JSONResponse({"status": "down"}, 503)
        return JSONResponse({"status": "up"})

    async def _ping(self) -> None:
        async with self.client.own_engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))

    async def openapi(self, request: Request) -> Response:
        self._token(request)
        return JSONResponse(document(self.setting_names, self.supports_priority))

    # -- publishing -------------------------------------------------------------------

    async def publish(self, request: Request) -> Response:
        topic = request.path_params["topic"]
        self._allow(request, "publish", topic)
        data = await self._json(request)
        _wire.check_fields(data, ("messages",), "the request")
        given = _wire.items(data, "messages", _wire.MAX_PUBLISH)
        messages = [_wire.outgoing(m, n, self.supports_priority) for n, m in enumerate(given, 1)]
        # Consecutive messages that share their options go in one publish_many.
        runs: list[list[_wire.Outgoing]] = []
        for msg in messages:
            if runs and runs[-1][0].shared == msg.shared:
                runs[-1].append(msg)
            else:
                runs.append([msg])
        client = self.client
        try:
            if len(runs) == 1:
                ids = await self._publish_run(topic, runs[0], None)
            else:
                ids = []
                # novaque's own engine (on SQLite one that takes the write
                # lock up front), as the client's own publishes use.
                async with client.own_engine.begin() as conn:
                    for run in runs:
                        ids += await self._publish_run(topic, run, conn)
        except TypeError as exc:  # headers the core refuses by type
            raise invalid(str(exc)) from None
        return JSONResponse({"ids": ids}, 201)

    async def _publish_run(self, topic: str, run: list[_wire.Outgoing], conn: Any) -> list[int]:
        kwargs = _wire.publish_kwargs(run[0].shared)
        if any(m.dedup_key is not None for m in run):
            kwargs["dedup_keys"] = [m.dedup_key for m in run]
        if any(m.group is not None for m in run):
            kwargs["groups"] = [m.group for m in run]
        return await self.client.publish_many(
            topic, [m.body for m in run], connection=conn, **kwargs
        )

    # -- consuming --------------------------------------------------------------------

    async def receive(self, request: Request) -> Response:
        topic, channel = self._names(request)
        self._allow(request, "consume", topic, channel)
        spec = _wire.receive(await self._json(request, empty_ok=True))
        core = self._core
        if spec.mode == "peek_lock":

            def fetch_once() -> list[Message]:
                return core.claim(
                    topic,
                    channel,
                    max_messages=spec.max_messages,
                    lease=spec.lease,
                    attempt_id=spec.attempt_id,
                )

        else:

            def fetch_once() -> list[Message]:
                return core.pop(topic, channel, max_messages=spec.max_messages)

        if spec.wait <= 0:
            got = await bridged(fetch_once)
        else:
            try:
                got = await self._long_poll(request.receive, topic, channel, fetch_once, spec)
            except _Gone:
                return Response(status_code=499)  # nobody reads it
        return JSONResponse({"messages": [_wire.message_json(m) for m in got]})

    async def _long_poll(
        self,
        receive: Receive,
        topic: str,
        channel: str,
        fetch_once: Callable[[], list[Message]],
        spec: _wire.Receive,
    ) -> list[Message]:
        """The client's long poll, ended at once if the caller goes away.

        The wait runs as a task; a second task waits for the caller's
        disconnect. If the caller goes away while the poll waits, the task is
        cancelled there (nothing was claimed); if it goes away during a claim,
        or after one that got messages, the claim finishes and what it leased
        is released.
        """
        poll = _Poll()

        def fetch() -> list[Message]:
            if poll.gone:
                raise _Gone
            poll.fetching = True
            try:
                got = fetch_once()
            finally:
                poll.fetching = False
            if got:
                poll.got = got
            return got

        if self.closing:
            return await bridged(fetch_once)
        runtime = runtime_of(self._core)
        task = asyncio.ensure_future(bridged(runtime.long_poll, topic, channel, fetch, spec.wait))
        watcher = asyncio.ensure_future(_disconnected(receive))
        closing = asyncio.get_running_loop().create_future()
        self._closers.add(closing)
        try:
            await asyncio.wait({task, watcher, closing}, return_when=asyncio.FIRST_COMPLETED)
            gone = watcher.done() and not watcher.cancelled()
        except asyncio.CancelledError:
            await self._abandon(task, poll, spec)
            raise
        finally:
            watcher.cancel()
            self._closers.discard(closing)
        if gone:  # even if the poll has just got messages: nobody would read them
            await self._abandon(task, poll, spec)
            raise _Gone
        if task.done():
            return task.result()
        await self._abandon(task, poll, spec)
        return []  # the server stops: an empty answer, nothing left leased

    def close(self) -> None:
        """The server stops: waiting receives answer at once (``[]``), and
        receives from now on do not wait. Call it on the server's event loop."""
        self.closing = True
        for closer in list(self._closers):
            if not closer.done():
                closer.set_result(None)

    async def _abandon(
        self, task: asyncio.Future[list[Message]], poll: _Poll, spec: _wire.Receive
    ) -> None:
        """End the poll of a caller that went away; release what it leased."""
        poll.gone = True
        if not task.done() and not poll.fetching and poll.got is None:
            task.cancel()  # it waits: nothing is claimed
        await asyncio.wait({task})
        got = poll.got
        if not task.cancelled() and task.exception() is None:
            got = task.result() or got
        if got and spec.mode == "peek_lock":
            released = await self.client.release(got)
            log.debug("broker: caller gone mid-poll, released %d deliveries", released)
        elif got:
            log.warning(
                "broker: caller gone mid-poll after %d messages were received and deleted",
                len(got),
            )

    async def _leased(
        self, topic: str, channel: str, pairs: list[tuple[int, str]]
    ) -> dict[int, Message]:
        consuming = parts_of(self._core).consuming
        found = await bridged(consuming.leased, topic, channel, pairs)
        return {msg.delivery_id: msg for msg in found}

    async def settle(self, request: Request) -> Response:
        topic, channel = self._names(request)
        self._allow(request, "consume", topic, channel)
        data = await self._json(request)
        _wire.check_fields(data, ("items",), "the request")
        given = _wire.items(data, "items", _wire.MAX_ITEMS)
        todo = [_wire.settle_item(item, n) for n, item in enumerate(given, 1)]
        _wire.no_repeats([item.delivery_id for item in todo])
        outcome: dict[int, dict[str, Any]] = {}
        # The completes: read and acked in one transaction.
        completes = [(i.delivery_id, i.lease_token) for i in todo if i.action == "complete"]
        if completes:
            consuming = parts_of(self._core).consuming
            acked = await bridged(consuming.ack_named, topic, channel, completes)
            for delivery, _ in completes:
                ok = {"delivery_id": delivery, "ok": True}
                outcome[delivery] = ok if delivery in acked else _lost(delivery)
        others = [i for i in todo if i.action != "complete"]
        held = (
            await self._leased(topic, channel, [(i.delivery_id, i.lease_token) for i in others])
            if others
            else {}
        )
        client = self.client
        for item in others:
            msg = held.get(item.delivery_id)
            if msg is None:
                outcome[item.delivery_id] = _lost(item.delivery_id)
                continue
            try:
                if item.action == "abandon":
                    await client.requeue(msg, delay=item.delay, error=item.error)
                elif item.action == "snooze":
                    assert item.delay is not None
                    await client.snooze(msg, item.delay)
                elif item.action == "defer":
                    await client.defer(msg)
                else:
                    await client.reject(msg, item.reason)
            except LeaseLost:
                outcome[item.delivery_id] = _lost(item.delivery_id)
            except InvalidOption as exc:
                outcome[item.delivery_id] = {
                    "delivery_id": item.delivery_id,
                    "ok": False,
                    "error": "invalid",
                    "message": str(exc),
                }
            else:
                outcome[item.delivery_id] = {"delivery_id": item.delivery_id, "ok": True}
        return JSONResponse({"results": [outcome[i.delivery_id] for i in todo]})

    async def renew(self, request: Request) -> Response:
        topic, channel = self._names(request)
        self._allow(request, "consume", topic, channel)
        data = await self._json(request)
        _wire.check_fields(data, ("items", "lease"), "the request")
        given = _wire.items(data, "items", _wire.MAX_ITEMS)
        lease = None if data.get("lease") is None else _wire.lease(data["lease"])
        pairs = [
            _wire.lease_pair(item, f"item {n}", ("delivery_id", "lease_token"))
            for n, item in enumerate(given, 1)
        ]
        ids = [p["delivery_id"] for p in pairs]
        _wire.no_repeats(ids)
        held = await self._leased(
            topic, channel, [(p["delivery_id"], p["lease_token"]) for p in pairs]
        )
        results = []
        for delivery in ids:
            msg = held.get(delivery)
            if msg is None:
                results.append(_lost(delivery))
                continue
            try:
                until = await self.client.renew(msg, lease=lease)
            except LeaseLost:
                results.append(_lost(delivery))
            else:
                results.append(
                    {"delivery_id": delivery, "ok": True, "lease_expires_at": _wire.iso(until)}
                )
        return JSONResponse({"results": results})

    async def deferred(self, request: Request) -> Response:
        topic, channel = self._names(request)
        self._allow(request, "consume", topic, channel)
        data = await self._json(request)
        _wire.check_fields(data, ("delivery_ids", "lease"), "the request")
        given = _wire.items(data, "delivery_ids", _wire.MAX_DEFERRED)
        ids = [_wire.delivery_id(v, "each of delivery_ids") for v in given]
        lease = None if data.get("lease") is None else _wire.lease(data["lease"])
        got = await self.client.claim_deferred(topic, channel, ids, lease=lease)
        return JSONResponse({"messages": [_wire.message_json(m) for m in got]})

    # -- channels and topics ----------------------------------------------------------

    async def get_channel(self, request: Request) -> Response:
        topic, channel = self._names(request)
        self._allow(request, "consume", topic, channel)
        day = self._today()
        backlog, settings, today = await bridged(self._channel_state, topic, channel, day)
        return JSONResponse(
            {
                "topic": topic,
                "channel": channel,
                "settings": _wire.settings_json(settings),
                "backlog": {
                    "pending": backlog.pending,
                    "ready": backlog.ready,
                    "in_flight": backlog.in_flight,
                    "deferred": backlog.deferred,
                    "dead": backlog.dead,
                    "oldest_ready_at": _wire.iso(backlog.oldest_ready_at),
                },
                "today": {"day": day.isoformat(), **_wire.plain(today)},
            }
        )

    def _channel_state(self, topic: str, channel: str, day: date) -> tuple[Any, Any, Any]:
        core = self._core
        settings = core.channel_settings(topic, channel)
        # Today's counters include what this process counted and has not
        # written yet.
        core.flush_stats()
        backlog = core.channel_backlog(topic, channel)
        today = core.channel_counters(topic, channel, since=day, until=day)
        return backlog, settings, today

    async def put_channel(self, request: Request) -> Response:
        topic, channel = self._names(request)
        self._allow(request, "admin", topic, channel)
        data = await self._json(request, empty_ok=True)
        allowed = (*self.setting_names, "paused")
        _wire.check_fields(data, allowed, "the settings")
        given: dict[str, Any] = {}
        reset: list[str] = []
        for key, value in data.items():
            if key == "paused":
                continue
            if value is None:
                reset.append(key)
            elif key == "rate_limit" and not (isinstance(value, list) and len(value) == 2):
                raise invalid(
                    "rate_limit must be [count, period in seconds], such as [100, 60], "
                    f"or null for none; got {_wire.shown(value)}"
                )
            else:
                given[key] = tuple(value) if isinstance(value, list) else value
        paused = data.get("paused")
        if paused is not None and not isinstance(paused, bool):
            raise invalid(f"paused must be true or false, got {_wire.shown(paused)}")
        try:
            await self.client.ensure_channel(topic, channel, reset=tuple(reset), **given)
        except TypeError as exc:
            raise invalid(str(exc)) from None
        if paused is True:
            await self.client.pause_channel(topic, channel)
        elif paused is False:
            await self.client.resume_channel(topic, channel)
        log.info("broker: ensured channel %s/%s", topic, channel)
        settings = await self.client.channel_settings(topic, channel)
        return JSONResponse(_wire.settings_json(settings))

    async def delete_channel(self, request: Request) -> Response:
        topic, channel = self._names(request)
        self._allow(request, "admin", topic, channel)
        await self.client.delete_channel(topic, channel)
        return Response(status_code=204)

    async def delete_topic(self, request: Request) -> Response:
        topic = request.path_params["topic"]
        self._allow(request, "admin", topic)
        await self.client.delete_topic(topic)
        return Response(status_code=204)

    # -- operating --------------------------------------------------------------------

    async def _dead_options(self, request: Request, requeue: bool) -> dict[str, Any]:
        data = await self._json(request, empty_ok=True)
        fields = (
            ("ids", "to_channel", "limit", "died_before")
            if requeue
            else ("ids", "limit", "died_before")
        )
        _wire.check_fields(data, fields, "the request")
        options: dict[str, Any] = {}
        if data.get("ids") is not None:
            ids = _wire.items(data, "ids", 1000)
            options["ids"] = [_wire.delivery_id(v, "each of ids") for v in ids]
        if data.get("limit") is not None:
            options["limit"] = _wire.integer(data["limit"], "limit", 1, 2**31 - 1)
        if data.get("died_before") is not None:
            options["died_before"] = _wire.moment(data["died_before"], "died_before")
        if data.get("to_channel") is not None:
            options["to_channel"] = _wire.string(data["to_channel"], "to_channel")
        return options

    async def requeue_dead(self, request: Request) -> Response:
        topic, channel = self._names(request)
        self._allow(request, "admin", topic, channel)
        options = await self._dead_options(request, True)
        count = await self.client.requeue_dead(topic, channel, **options)
        log.info("broker: requeued %d dead letters of %s/%s", count, topic, channel)
        return JSONResponse({"count": count})

    async def delete_dead(self, request: Request) -> Response:
        topic, channel = self._names(request)
        self._allow(request, "admin", topic, channel)
        options = await self._dead_options(request, False)
        count = await self.client.delete_dead(topic, channel, **options)
        log.info("broker: deleted %d dead letters of %s/%s", count, topic, channel)
        return JSONResponse({"count": count})

    async def cancel(self, request: Request) -> Response:
        self._allow(request, "admin")
        text = request.path_params["id"]
        if not text.isdigit() or len(text) > 19:
            raise invalid(f"the message id must be a positive integer, got {_wire.shown(text)}")
        message_id = _wire.delivery_id(int(text), "the message id")
        count = await self.client.cancel(message_id)
        return JSONResponse({"count": count})


def _lost(delivery_id: int) -> dict[str, Any]:
    return {"delivery_id": delivery_id, "ok": False, "error": "lease_lost"}


async def _disconnected(receive: Receive) -> None:
    """Return once the caller has gone away (``http.disconnect``)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
