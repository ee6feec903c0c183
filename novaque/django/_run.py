"""``manage.py novaque run``: the consumers of ``settings.NOVAQUE["CONSUMERS"]``."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO

from django.db import close_old_connections
from django.utils.module_loading import import_string

import novaque
from novaque.django._connect import novaque_settings
from novaque.errors import InvalidOption

__all__ = ["Planned", "consumer_names", "planned_consumers", "run_consumers"]

#: The options of a consumer's dict form, besides ``handler``.
SUBSCRIBE_OPTIONS = ("max_in_flight", "lease", "backoff", "poll_interval")
DEFAULT_SHUTDOWN_TIMEOUT = 10.0


@dataclass(frozen=True)
class Planned:
    """One consumer to run: where, which handler (by dotted path) and its options."""

    topic: str
    channel: str
    path: str
    handler: Callable[[novaque.Message], None]
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.channel}"


def consumer_names() -> list[tuple[str, str]]:
    """The (topic, channel) of every consumer of ``settings.NOVAQUE["CONSUMERS"]``
    (their handlers not imported)."""
    return [(p.topic, p.channel) for p in _configured_plans(load=False)]


def planned_consumers(only: Sequence[str] = ()) -> list[Planned]:
    """The consumers of ``settings.NOVAQUE["CONSUMERS"]`` (those named in ``only``, if any),
    their handlers imported; :class:`~novaque.InvalidOption` names what is wrong."""
    configured = _configured()
    if not configured:
        raise InvalidOption(
            'no consumers to run: settings.NOVAQUE["CONSUMERS"] is empty or unset '
            '(e.g. {"orders/mailer": "shop.handlers.send_mail"})'
        )
    missing = [name for name in only if name not in configured]
    if missing:
        raise InvalidOption(
            f'{", ".join(map(repr, missing))} not in settings.NOVAQUE["CONSUMERS"] '
            f"(configured: {', '.join(map(repr, configured))})"
        )
    return [_plan(name, configured[name]) for name in (only or list(configured))]


def _configured() -> Mapping[str, Any]:
    configured = novaque_settings().get("CONSUMERS") or {}
    if not isinstance(configured, Mapping):
        raise InvalidOption(
            'settings.NOVAQUE["CONSUMERS"] must be a dict of "topic/channel": handler, '
            f"got {type(configured).__name__}"
        )
    return configured


def _configured_plans(*, load: bool) -> list[Planned]:
    return [_plan(name, spec, load=load) for name, spec in _configured().items()]


def _plan(name: Any, spec: Any, *, load: bool = True) -> Planned:
    where = f'settings.NOVAQUE["CONSUMERS"][{name!r}]'
    if not isinstance(name, str) or name.count("/") != 1:
        raise InvalidOption(f'{where}: a consumer is named "topic/channel"')
    topic, channel = name.split("/")
    if isinstance(spec, str):
        path, options = spec, {}
    elif isinstance(spec, Mapping) and isinstance(spec.get("handler"), str):
        path = spec["handler"]
        options = {k: v for k, v in spec.items() if k != "handler"}
        unknown = sorted(set(options) - set(SUBSCRIBE_OPTIONS))
        if unknown:
            raise InvalidOption(
                f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; besides "
                f"'handler' the keys are {', '.join(map(repr, SUBSCRIBE_OPTIONS))}"
            )
    else:
        raise InvalidOption(
            f"{where} must be the dotted path of a handler, or a dict with 'handler' "
            f"(a dotted path) and subscribe options, got {spec!r}"
        )
    if not load:
        return Planned(topic, channel, path, _not_loaded, options)
    try:
        handler = import_string(path)
    except ImportError as exc:
        raise InvalidOption(f"{where}: cannot import handler {path!r}: {exc}") from None
    if not callable(handler):
        raise InvalidOption(f"{where}: {path!r} is not callable")
    return Planned(topic, channel, path, handler, options)


def _not_loaded(msg: novaque.Message) -> None:
    raise RuntimeError("handler not imported")


def in_django(handler: Callable[[novaque.Message], None]) -> Callable[[novaque.Message], None]:
    """``handler`` with Django's connection hygiene around each call, as a request
    has: connections past ``CONN_MAX_AGE`` or broken are closed before and after."""

    def run(msg: novaque.Message) -> None:
        close_old_connections()
        try:
            handler(msg)
        finally:
            close_old_connections()

    return run


def run_consumers(
    client: novaque.Client,
    consumers: Sequence[Planned],
    *,
    out: TextIO,
    stop: threading.Event | None = None,
) -> None:
    """Run ``consumers`` and the client's maintenance until SIGINT or SIGTERM
    (or ``stop``), then shut the client down: running handlers finish within
    ``NOVAQUE["SHUTDOWN_TIMEOUT"]`` seconds, claimed messages not started are
    released, counters are flushed."""
    timeout = float(novaque_settings().get("SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT))
    stop = stop or threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        client.start()  # lease reaper, TTL purge, stats flush
        for planned in consumers:
            client.subscribe_and_start(
                planned.topic, planned.channel, in_django(planned.handler), **planned.options
            )
        names = ", ".join(f"{p.name} ({p.path})" for p in consumers)
        print(f"novaque: consuming {names}; SIGINT or SIGTERM stops", file=out, flush=True)
        while not stop.wait(0.5):
            pass
        print("novaque: stopping", file=out, flush=True)
    finally:
        try:
            client.shutdown(timeout=timeout)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    print("novaque: stopped", file=out, flush=True)
