"""OpenTelemetry traces and metrics for novaque (``pip install 'novaque[otel]'``).

::

    from novaque.otel import NovaqueInstrumentor

    NovaqueInstrumentor().instrument()      # the global tracer and meter providers
    ...
    NovaqueInstrumentor().uninstrument()

Once instrumented, every :class:`novaque.Client` and
:class:`novaque.aio.AsyncClient` of the process emits, after the OpenTelemetry
messaging semantic conventions (schema 1.28):

- a ``publish {topic}`` span (kind ``PRODUCER``, ``messaging.operation.type``
  ``"send"``) around each ``publish`` call and each ``publish_many`` batch
  (one span, with ``messaging.batch.message_count``), covering the write;
  ``messaging.message.id`` holds the id of a ``publish`` and
  ``messaging.novaque.message.ids`` the ids of a batch. Its W3C trace context
  (``traceparent``, ``tracestate``, and ``baggage`` when there is some, as
  the global propagator writes them) is added to every message's headers,
  unless the caller's headers already carry a ``traceparent`` (then they are
  stored as given);
- a ``process {topic}`` span (kind ``CONSUMER``, ``"process"``) around each
  handler call of a consumer (both twins) or of :func:`novaque.testing.drain`,
  parented on the trace context in the message's headers (a message without
  one starts a trace of its own), with ``messaging.consumer.group.name`` (the
  channel), ``messaging.message.id``, ``messaging.message.body.size`` and
  ``messaging.novaque.message.delivery_attempt`` (``Message.attempts``). A
  handler that raises fails its span: status ``ERROR``, the exception recorded
  and ``error.type`` its qualified type name (``myapp.PaymentDeclined``,
  ``ValueError``). :class:`~novaque.Reject`, :class:`~novaque.Defer` and
  :class:`~novaque.Snooze` are the handler's decisions, not failures: the
  span ends OK, and ``messaging.novaque.outcome`` says which it was
  (``"ack"``, ``"reject"``, ``"defer"``, ``"snooze"``, or ``"error"``);
- the metrics ``messaging.client.sent.messages`` (counter, ``{message}``, per
  publish call), ``messaging.client.operation.duration`` (histogram, ``s``,
  per publish call), ``messaging.client.consumed.messages`` (counter,
  ``{message}``, one per message handed to a handler) and
  ``messaging.process.duration`` (histogram, ``s``, per handler call), with
  ``messaging.system``, ``messaging.operation.name``,
  ``messaging.destination.name``, ``messaging.consumer.group.name`` (consuming
  metrics) and ``error.type`` (failed calls).

All attributes have ``messaging.system = "novaque"`` and
``messaging.destination.name`` = the topic. Nothing of this runs, and
:mod:`novaque` does not import OpenTelemetry, until
:meth:`NovaqueInstrumentor.instrument` is
called: the core holds two hooks (``novaque._hooks``) that stay ``None``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, MutableMapping
from timeit import default_timer
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from novaque import __version__, _hooks
from novaque.errors import Defer, Reject, Snooze
from novaque.models import Message

__all__ = ["SCHEMA_URL", "NovaqueInstrumentor"]

#: The version of the semantic conventions the spans and metrics follow.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.28.0"

SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
CONSUMER_GROUP = "messaging.consumer.group.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
BODY_SIZE = "messaging.message.body.size"
ERROR_TYPE = "error.type"
#: novaque's own attributes, in the ``messaging.{system}`` namespace.
MESSAGE_IDS = "messaging.novaque.message.ids"
DELIVERY_ATTEMPT = "messaging.novaque.message.delivery_attempt"
OUTCOME = "messaging.novaque.outcome"

#: What the conventions advise for the messaging duration histograms (seconds).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)

#: What a handler's signal exception means (they are not failures).
_SIGNALS: tuple[tuple[type[BaseException], str], ...] = (
    (Reject, "reject"),
    (Defer, "defer"),
    (Snooze, "snooze"),
)


def error_type(exc: BaseException) -> str:
    """The ``error.type`` of an exception: its qualified type name (builtins bare)."""
    cls = type(exc)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


class _NewKeys(Setter[MutableMapping[str, str]]):
    """Writes a propagator's fields into headers, never over one already there."""

    def set(self, carrier: MutableMapping[str, str], key: str, value: str) -> None:
        carrier.setdefault(key, value)


_NEW_KEYS = _NewKeys()


class _AnyCase(Getter[Mapping[str, str]]):
    """Reads a propagator's fields from headers in any spelling (``TraceParent``
    as copied from an HTTP request): headers are case-sensitive, W3C fields not."""

    def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            value = next((v for k, v in carrier.items() if k.lower() == key), None)
        return None if value is None else [value]

    def keys(self, carrier: Mapping[str, str]) -> list[str]:
        return list(carrier)


_ANY_CASE = _AnyCase()


def _carries_trace(headers: Mapping[str, str]) -> bool:
    return any(isinstance(key, str) and key.lower() == "traceparent" for key in headers)


class _Instruments:
    """The tracer and the four instruments of one :meth:`NovaqueInstrumentor.instrument`,
    and the two hooks that use them."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        self.tracer = trace.get_tracer(
            "novaque", __version__, tracer_provider, schema_url=SCHEMA_URL
        )
        meter = metrics.get_meter("novaque", __version__, meter_provider, schema_url=SCHEMA_URL)
        self.sent = meter.create_counter(
            "messaging.client.sent.messages",
            unit="{message}",
            description="Number of messages producer attempted to send to the broker.",
        )
        self.operation_duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="Duration of messaging operation initiated by a producer or consumer "
            "client.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.consumed = meter.create_counter(
            "messaging.client.consumed.messages",
            unit="{message}",
            description="Number of messages that were delivered to the application.",
        )
        self.process_duration = meter.create_histogram(
            "messaging.process.duration",
            unit="s",
            description="Duration of processing operation.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )

    # -- publishing ---------------------------------------------------------------------

    def publish(
        self,
        topic: str,
        count: int,
        batch: bool,
        headers: Mapping[str, str] | None,
        write: Callable[[Mapping[str, str] | None], list[int]],
        /,
    ) -> list[int]:
        common: dict[str, AttributeValue] = {
            SYSTEM: "novaque",
            OPERATION_NAME: "publish",
            DESTINATION: topic,
        }
        attributes = {**common, OPERATION_TYPE: "send"}
        if batch:
            attributes[BATCH_COUNT] = count
        started = default_timer()
        with self.tracer.start_as_current_span(
            f"publish {topic}",
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                ids = write(_traced(headers))
            except BaseException as exc:
                common[ERROR_TYPE] = error_type(exc)
                _fail(span, exc)
                raise
            finally:
                self.sent.add(count, common)
                self.operation_duration.record(default_timer() - started, common)
            if batch:
                span.set_attribute(MESSAGE_IDS, [str(i) for i in ids])
            else:
                span.set_attribute(MESSAGE_ID, str(ids[0]))
            return ids

    # -- processing ---------------------------------------------------------------------

    def process(self, msg: Message, run: Callable[[], object], /) -> None:
        common: dict[str, AttributeValue] = {
            SYSTEM: "novaque",
            OPERATION_NAME: "process",
            DESTINATION: msg.topic,
            CONSUMER_GROUP: msg.channel,
        }
        self.consumed.add(1, common)
        attributes = {
            **common,
            OPERATION_TYPE: "process",
            MESSAGE_ID: str(msg.id),
            BODY_SIZE: len(msg.body),
            DELIVERY_ATTEMPT: msg.attempts,
        }
        # The message's context (its publisher's span, its baggage) becomes the
        # handler's: over an empty one, so that a consumer's own surroundings
        # (the span current when its loop started) never adopt the message.
        token = otel_context.attach(
            propagate.extract(msg.headers, context=Context(), getter=_ANY_CASE)
        )
        started = default_timer()
        try:
            with self.tracer.start_as_current_span(
                f"process {msg.topic}",
                kind=SpanKind.CONSUMER,
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    run()
                except BaseException as exc:
                    for signal, outcome in _SIGNALS:
                        if isinstance(exc, signal):
                            span.set_attribute(OUTCOME, outcome)
                            break
                    else:
                        span.set_attribute(OUTCOME, "error")
                        common[ERROR_TYPE] = error_type(exc)
                        _fail(span, exc)
                    raise
                else:
                    span.set_attribute(OUTCOME, "ack")
                finally:
                    self.process_duration.record(default_timer() - started, common)
        finally:
            otel_context.detach(token)


def _traced(headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """The headers to store: the caller's plus the current trace context, or
    the caller's as given when they carry one (or are not a mapping: the
    publish refuses them)."""
    if headers is None:
        carrier: dict[str, str] = {}
    elif isinstance(headers, Mapping) and not _carries_trace(headers):
        carrier = dict(headers)
    else:
        return headers
    propagate.inject(carrier, setter=_NEW_KEYS)
    return carrier or headers


def _fail(span: trace.Span, exc: BaseException) -> None:
    span.set_attribute(ERROR_TYPE, error_type(exc))
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


class NovaqueInstrumentor:
    """Traces and metrics of every novaque client of the process.

    After the opentelemetry-instrumentation conventions (a ``BaseInstrumentor``
    without its package: novaque needs the OpenTelemetry API only): one
    instance per process (``NovaqueInstrumentor()`` returns it), and
    :meth:`instrument` and :meth:`uninstrument` are idempotent.
    """

    _instance: NovaqueInstrumentor | None = None
    _lock = threading.Lock()
    _instruments: _Instruments | None = None

    def __new__(cls) -> NovaqueInstrumentor:
        with cls._lock:
            if cls._instance is None:
                cls._instance = super().__new__(cls)
            return cls._instance

    @property
    def is_instrumented_by_opentelemetry(self) -> bool:
        """Whether :meth:`instrument` is in force."""
        return self._instruments is not None

    def instrumentation_dependencies(self) -> Collection[str]:
        """The packages this instruments, as pip requirements: none but novaque
        itself, which is always there."""
        return ()

    def instrument(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        **kwargs: Any,
    ) -> None:
        """Start tracing and measuring every novaque client of the process.

        ``tracer_provider`` and ``meter_provider`` default to the global ones
        (``opentelemetry.trace.set_tracer_provider`` and its metrics twin; if
        none is set when a span starts, the API's no-op ones). Trace context is
        written and read by the global propagator (W3C Trace Context and
        Baggage unless configured otherwise). Calling it again while
        instrumented changes nothing (call :meth:`uninstrument` first to
        change providers). Other keyword arguments (as
        ``opentelemetry-instrument`` passes) are ignored.
        """
        with self._lock:
            if self._instruments is not None:
                return
            instruments = _Instruments(tracer_provider, meter_provider)
            type(self)._instruments = instruments
            _hooks.publish = instruments.publish
            _hooks.process = instruments.process

    def uninstrument(self, **kwargs: Any) -> None:
        """Stop: no span or measurement after this returns (spans already
        started end as usual). Calling it when not instrumented does nothing."""
        with self._lock:
            _hooks.publish = None
            _hooks.process = None
            type(self)._instruments = None
