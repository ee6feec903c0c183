"""novaque.otel: spans and metrics after the OpenTelemetry messaging conventions.

Checked with the SDK's in-memory span exporter and metric reader, on every
backend and both twins (the ``twin`` fixture; consumers of the asyncio twin
run as tasks), plus asyncio applications written as such (tasks publishing
at once, an async consumer): the trace context goes across SQLAlchemy's
greenlet bridge.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import novaque
import novaque.aio
from novaque import _hooks
from novaque.otel import SCHEMA_URL, NovaqueInstrumentor
from novaque.testing import FakeClock, drain
from tests._twin import async_url
from tests.conftest import Backend

pytestmark = pytest.mark.usefixtures("twin")

WAIT = 30.0
#: A caller's own W3C trace context (the example of the W3C recommendation).
THEIR_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
THEIR_SPAN = 0xB7AD6B7169203331
THEIR_TRACEPARENT = f"00-{THEIR_TRACE:032x}-{THEIR_SPAN:016x}-01"


class PaymentDeclined(Exception):
    """A handler's own failure (its error.type is its qualified name)."""


DECLINED = f"{__name__}.PaymentDeclined"


@dataclass
class Telemetry:
    """What novaque reported to the test's providers."""

    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider

    @property
    def app(self) -> trace.Tracer:
        """A tracer of the application's own (its spans are novaque's parents)."""
        return self.tracer_provider.get_tracer("app")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def points(self, name: str) -> list[Any]:
        """The data points of metric ``name`` (with the unit checked below)."""
        return [point for metric in self.metrics(name) for point in metric.data.data_points]

    def metrics(self, name: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [
            metric
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
        ]


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    """novaque instrumented with an SDK of the test's own (uninstrumented after)."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    NovaqueInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        yield Telemetry(exporter, reader, tracer_provider)
    finally:
        NovaqueInstrumentor().uninstrument()
        meter_provider.shutdown()
        tracer_provider.shutdown()


def waited(ok: bool, what: str) -> None:
    assert ok, f"timed out waiting for {what}"


def parent_of(span: ReadableSpan) -> tuple[int, int] | None:
    """(trace id, span id) of a span's parent, None for a root."""
    if span.parent is None:
        return None
    return span.parent.trace_id, span.parent.span_id


def ids_of(span: ReadableSpan) -> tuple[int, int]:
    return span.context.trace_id, span.context.span_id


def traceparent_of(span: ReadableSpan) -> str:
    trace_id, span_id = ids_of(span)
    return f"00-{trace_id:032x}-{span_id:016x}-{int(span.context.trace_flags):02x}"


# -- off until instrument() ---------------------------------------------------------------


@pytest.mark.sync_only
def test_importing_novaque_does_not_import_opentelemetry() -> None:
    code = (
        "import sys, novaque, novaque.aio, novaque.testing\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'opentelemetry'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_nothing_is_traced_or_measured_before_instrument(client: novaque.Client) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    MeterProvider(metric_readers=[reader])
    assert _hooks.publish is None
    assert _hooks.process is None
    assert not NovaqueInstrumentor().is_instrumented_by_opentelemetry

    client.ensure_channel("orders", "mailer")
    client.publish("orders", b"one", headers={"k": "v"})
    client.publish_many("orders", [b"two", b"three"])
    [msg] = client.claim("orders", "mailer")
    assert msg.headers == {"k": "v"}  # no trace context was added
    assert exporter.get_finished_spans() == ()
    assert reader.get_metrics_data() is None or not reader.get_metrics_data().resource_metrics


def test_uninstrument_stops_everything_and_both_calls_are_idempotent(
    client: novaque.Client, otel: Telemetry
) -> None:
    client.ensure_channel("orders", "mailer")
    other = TracerProvider()  # a second instrument() changes nothing
    NovaqueInstrumentor().instrument(tracer_provider=other)
    assert NovaqueInstrumentor() is NovaqueInstrumentor()
    client.publish("orders", b"traced")
    assert [s.name for s in otel.spans()] == ["publish orders"]

    NovaqueInstrumentor().uninstrument()
    NovaqueInstrumentor().uninstrument()
    assert not NovaqueInstrumentor().is_instrumented_by_opentelemetry
    client.publish("orders", b"not traced")
    client.publish_many("orders", [b"nor", b"these"])
    handled = drain_all(client, "orders", "mailer")
    assert [m.body for m in handled] == [b"traced", b"not traced", b"nor", b"these"]
    assert "traceparent" in handled[0].headers
    assert all(m.headers == {} for m in handled[1:])
    assert [s.name for s in otel.spans()] == ["publish orders"]  # no process span either
    [sent] = otel.points("messaging.client.sent.messages")
    assert sent.value == 1


def drain_all(client: novaque.Client, topic: str, channel: str) -> list[novaque.Message]:
    """Claim and ack everything due (a low-level loop: no process spans)."""
    got: list[novaque.Message] = []
    while batch := client.claim(topic, channel, max_messages=10):
        client.ack_many(batch)
        got.extend(batch)
    return got


# -- publish spans ------------------------------------------------------------------------


def test_a_publish_is_one_producer_span_whose_context_goes_into_the_headers(
    client: novaque.Client, otel: Telemetry
) -> None:
    client.ensure_channel("orders", "mailer")
    with otel.app.start_as_current_span("checkout") as checkout:
        msg_id = client.publish("orders", b"{}", headers={"tenant": "acme"})
    [span] = otel.spans("publish orders")
    assert span.kind is SpanKind.PRODUCER
    assert span.status.status_code is StatusCode.UNSET
    assert dict(span.attributes or {}) == {
        "messaging.system": "novaque",
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.destination.name": "orders",
        "messaging.message.id": str(msg_id),
    }
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "novaque"
    assert span.instrumentation_scope.schema_url == SCHEMA_URL
    assert parent_of(span) == (
        checkout.get_span_context().trace_id,
        checkout.get_span_context().span_id,
    )

    [msg] = client.claim("orders", "mailer")
    assert msg.headers == {"tenant": "acme", "traceparent": traceparent_of(span)}


def test_publish_many_is_one_span_for_the_batch_and_every_message_carries_it(
    client: novaque.Client, otel: Telemetry
) -> None:
    client.ensure_channel("orders", "mailer")
    ids = client.publish_many("orders", [b"a", b"b", b"c"], headers={"k": "v"})
    [span] = otel.spans()
    assert span.name == "publish orders"
    assert span.kind is SpanKind.PRODUCER
    attributes = dict(span.attributes or {})
    assert attributes["messaging.batch.message_count"] == 3
    assert attributes["messaging.novaque.message.ids"] == tuple(str(i) for i in ids)
    assert "messaging.message.id" not in attributes
    got = client.claim("orders", "mailer", max_messages=3)
    assert [m.headers for m in got] == [{"k": "v", "traceparent": traceparent_of(span)}] * 3
    assert client.publish_many("orders", []) == []
    assert len(otel.spans()) == 1  # an empty batch publishes nothing: no span


def test_a_callers_own_trace_context_is_kept_and_the_process_span_joins_it(
    client: novaque.Client, otel: Telemetry
) -> None:
    client.ensure_channel("orders", "mailer")
    theirs = {"traceparent": THEIR_TRACEPARENT, "tracestate": "vendor=1", "x": "y"}
    client.publish("orders", b"{}", headers=theirs)
    client.publish("orders", b"{}", headers={"TraceParent": THEIR_TRACEPARENT})
    stored: list[dict[str, str]] = []
    consume(client, "orders", "mailer", lambda msg: stored.append(msg.headers), 2)
    assert stored == [theirs, {"TraceParent": THEIR_TRACEPARENT}]  # as given, any spelling
    assert [parent_of(s) for s in otel.spans("process orders")] == [(THEIR_TRACE, THEIR_SPAN)] * 2


def consume(
    client: novaque.Client,
    topic: str,
    channel: str,
    handler: Callable[[novaque.Message], object],
    count: int,
) -> None:
    """Run a consumer until it handled ``count`` messages, then shut it down."""
    consumer = client.subscribe_and_start(topic, channel, handler, poll_interval=0.05)
    waited(consumer._signals.wait("handled", count, WAIT), f"{count} handled")
    consumer.shutdown(timeout=10)


def test_a_failed_publish_records_its_error_type(client: novaque.Client, otel: Telemetry) -> None:
    client.ensure_channel("orders", "mailer")
    with pytest.raises(novaque.MessageTooLarge):
        client.publish("orders", b"x" * (client.options.max_body_bytes + 1))
    with pytest.raises(TypeError):
        client.publish("orders", b"x", headers={"n": 1})  # type: ignore[dict-item]
    too_large, bad_headers = otel.spans("publish orders")
    assert too_large.status.status_code is StatusCode.ERROR
    assert dict(too_large.attributes or {})["error.type"] == "novaque.errors.MessageTooLarge"
    assert [e.name for e in too_large.events] == ["exception"]
    assert dict(bad_headers.attributes or {})["error.type"] == "TypeError"
    sent = otel.points("messaging.client.sent.messages")
    assert sorted(dict(p.attributes)["error.type"] for p in sent) == [
        "TypeError",
        "novaque.errors.MessageTooLarge",
    ]


def test_a_dedup_key_published_again_from_another_trace_is_the_same_message(
    client: novaque.Client, otel: Telemetry
) -> None:
    client.ensure_channel("orders", "mailer")
    with otel.app.start_as_current_span("first request"):
        first = client.publish("orders", b"{}", headers={"k": "v"}, dedup_key="order-7")
    with otel.app.start_as_current_span("retried request"):
        again = client.publish("orders", b"{}", headers={"k": "v"}, dedup_key="order-7")
    assert again == first  # not a DedupConflict for the other traceparent
    with pytest.raises(novaque.DedupConflict):
        client.publish("orders", b"{}", headers={"k": "other"}, dedup_key="order-7")


@pytest.mark.sync_only
def test_in_a_callers_transaction_the_span_covers_the_write_and_ends_before_the_commit(
    backend: Backend, otel: Telemetry
) -> None:
    client = backend.client()
    client.ensure_channel("orders", "mailer")
    engine = backend.engine()
    with engine.begin() as conn:
        msg_id = client.publish("orders", b"{}", connection=conn)
        [span] = otel.spans("publish orders")  # ended: the caller has not committed yet
        assert dict(span.attributes or {})["messaging.message.id"] == str(msg_id)
    [msg] = client.claim("orders", "mailer")
    assert msg.headers == {"traceparent": traceparent_of(span)}
    with engine.connect() as conn, conn.begin() as tx:
        client.publish("orders", b"rolled back", connection=conn)
        tx.rollback()
    assert len(otel.spans("publish orders")) == 2  # the span says what was attempted
    assert client.claim("orders", "mailer") == []


# -- process spans ------------------------------------------------------------------------


def test_a_consumers_process_span_is_a_child_of_the_publish_span(
    client: novaque.Client, otel: Telemetry
) -> None:
    client.ensure_channel("orders", "mailer")
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def handler(msg: novaque.Message) -> None:
        current = trace.get_current_span().get_span_context()
        with lock:
            seen.append((current.trace_id, current.span_id))

    msg_id = client.publish("orders", b"{}")
    consumer = client.subscribe_and_start("orders", "mailer", handler, poll_interval=0.05)
    waited(consumer._signals.wait("acked", 1, WAIT), "the ack")
    consumer.shutdown(timeout=10)

    [publish] = otel.spans("publish orders")
    [process] = otel.spans("process orders")
    assert process.kind is SpanKind.CONSUMER
    assert process.status.status_code is StatusCode.UNSET
    assert parent_of(process) == ids_of(publish)  # one trace, publisher to handler
    assert process.parent is not None
    assert process.parent.is_remote  # read from the message's headers
    assert seen == [ids_of(process)]  # the handler runs inside its span
    assert dict(process.attributes or {}) == {
        "messaging.system": "novaque",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "orders",
        "messaging.consumer.group.name": "mailer",
        "messaging.message.id": str(msg_id),
        "messaging.message.body.size": 2,
        "messaging.novaque.message.delivery_attempt": 1,
        "messaging.novaque.outcome": "ack",
    }


def test_a_failing_handlers_span_has_its_error_type_and_a_retry_is_a_new_span(
    client: novaque.Client, otel: Telemetry
) -> None:
    client.ensure_channel("orders", "mailer")
    calls: list[int] = []

    def handler(msg: novaque.Message) -> None:
        calls.append(msg.attempts)
        if msg.attempts == 1:
            raise PaymentDeclined("card 42")

    client.publish("orders", b"{}")
    consumer = client.subscribe_and_start(
        "orders",
        "mailer",
        handler,
        poll_interval=0.05,
        backoff=novaque.Backoff(base=0, jitter=False),
    )
    waited(consumer._signals.wait("acked", 1, WAIT), "the retry's ack")
    consumer.shutdown(timeout=10)

    [publish] = otel.spans("publish orders")
    failed, retried = otel.spans("process orders")
    assert failed.status.status_code is StatusCode.ERROR
    attributes = dict(failed.attributes or {})
    assert attributes["error.type"] == DECLINED
    assert attributes["messaging.novaque.outcome"] == "error"
    assert attributes["messaging.novaque.message.delivery_attempt"] == 1
    [event] = failed.events
    assert event.name == "exception"
    assert dict(event.attributes or {})["exception.message"] == "card 42"
    assert retried.status.status_code is StatusCode.UNSET
    assert dict(retried.attributes or {})["messaging.novaque.message.delivery_attempt"] == 2
    assert "error.type" not in dict(retried.attributes or {})
    assert parent_of(failed) == parent_of(retried) == ids_of(publish)


@pytest.mark.sync_only
@pytest.mark.parametrize(
    ("signal", "outcome"),
    [
        (novaque.Reject("bad order"), "reject"),
        (novaque.Defer(), "defer"),
        (novaque.Snooze(60), "snooze"),
    ],
)
def test_reject_defer_and_snooze_are_decisions_not_errors(
    client: novaque.Client, otel: Telemetry, signal: Exception, outcome: str
) -> None:
    client.ensure_channel("orders", "mailer")
    client.publish("orders", b"{}")

    def handler(msg: novaque.Message) -> None:
        raise signal

    assert drain(client, "orders", "mailer", handler, limit=1) == 1
    [span] = otel.spans("process orders")
    assert span.status.status_code is StatusCode.UNSET
    assert span.events == ()
    attributes = dict(span.attributes or {})
    assert attributes["messaging.novaque.outcome"] == outcome
    assert "error.type" not in attributes
    [duration] = otel.points("messaging.process.duration")
    assert "error.type" not in dict(duration.attributes)


@pytest.mark.sync_only
def test_a_message_without_trace_context_starts_a_trace_with_its_baggage_absent(
    backend: Backend, otel: Telemetry
) -> None:
    client = backend.client()
    client.ensure_channel("orders", "mailer")
    NovaqueInstrumentor().uninstrument()
    client.publish("orders", b"untraced")
    NovaqueInstrumentor().instrument(tracer_provider=otel.tracer_provider)
    token = otel_context.attach(baggage.set_baggage("user", "ann"))
    try:
        with otel.app.start_as_current_span("test"):
            client.publish("orders", b"traced")  # carries the span and the baggage
            seen: list[object] = []
            drain(client, "orders", "mailer", lambda m: seen.append(baggage.get_baggage("user")))
    finally:
        otel_context.detach(token)
    untraced, traced = otel.spans("process orders")
    assert untraced.parent is None  # not adopted by the test's span: a trace of its own
    [publish] = otel.spans("publish orders")
    assert parent_of(traced) == ids_of(publish)
    assert seen == [None, "ann"]  # the baggage came with the message, not from around drain


# -- metrics ------------------------------------------------------------------------------


def test_the_four_metrics_with_their_units_and_attributes(
    client: novaque.Client, otel: Telemetry
) -> None:
    client.ensure_channel("orders", "mailer")
    client.publish("orders", b"one")
    client.publish_many("orders", [b"two", b"three", b"four"])
    failed = threading.Event()

    def handler(msg: novaque.Message) -> None:
        if msg.body == b"three" and not failed.is_set():
            failed.set()
            raise ValueError("once")

    consumer = client.subscribe_and_start(
        "orders",
        "mailer",
        handler,
        poll_interval=0.05,
        backoff=novaque.Backoff(base=0, jitter=False),
    )
    waited(consumer._signals.wait("acked", 4, WAIT), "four acks")
    consumer.shutdown(timeout=10)

    units = {
        name: {m.unit for m in otel.metrics(name)}
        for name in (
            "messaging.client.sent.messages",
            "messaging.client.operation.duration",
            "messaging.client.consumed.messages",
            "messaging.process.duration",
        )
    }
    assert units == {
        "messaging.client.sent.messages": {"{message}"},
        "messaging.client.operation.duration": {"s"},
        "messaging.client.consumed.messages": {"{message}"},
        "messaging.process.duration": {"s"},
    }
    publishing = {
        "messaging.system": "novaque",
        "messaging.operation.name": "publish",
        "messaging.destination.name": "orders",
    }
    [sent] = otel.points("messaging.client.sent.messages")
    assert (dict(sent.attributes), sent.value) == (publishing, 4)
    [operation] = otel.points("messaging.client.operation.duration")
    assert (dict(operation.attributes), operation.count) == (publishing, 2)
    assert operation.explicit_bounds[:3] == (0.005, 0.01, 0.025)
    processing = {
        "messaging.system": "novaque",
        "messaging.operation.name": "process",
        "messaging.destination.name": "orders",
        "messaging.consumer.group.name": "mailer",
    }
    [consumed] = otel.points("messaging.client.consumed.messages")
    assert (dict(consumed.attributes), consumed.value) == (processing, 5)  # one delivered twice
    durations = {
        dict(p.attributes).get("error.type"): (dict(p.attributes), p.count)
        for p in otel.points("messaging.process.duration")
    }
    assert durations == {
        None: (processing, 4),
        "ValueError": ({**processing, "error.type": "ValueError"}, 1),
    }


# -- asyncio applications -----------------------------------------------------------------


def run_async(
    backend: Backend,
    body: Callable[[novaque.aio.AsyncClient], Awaitable[None]],
    options: novaque.Options | None = None,
) -> None:
    """``body(client)`` on a new event loop, then the client shut down."""

    async def main() -> None:
        engine = create_async_engine(async_url(backend.name, backend.url))
        client = novaque.aio.AsyncClient(engine, options)
        try:
            await asyncio.wait_for(body(client), 60)
        finally:
            await client.shutdown(timeout=5)
            await engine.dispose()

    asyncio.run(main())


@pytest.mark.sync_only
def test_spans_nest_in_the_asyncio_task_that_publishes(backend: Backend, otel: Telemetry) -> None:
    parents: dict[str, tuple[int, int]] = {}

    async def request(client: novaque.aio.AsyncClient, name: str) -> None:
        with otel.app.start_as_current_span(name) as span:
            parents[name] = (span.get_span_context().trace_id, span.get_span_context().span_id)
            await asyncio.sleep(0)
            await client.publish("orders", name.encode())
            await client.publish_many("orders", [name.encode()] * 2)
            assert trace.get_current_span() is span  # restored after the bridge

    async def body(client: novaque.aio.AsyncClient) -> None:
        await client.ensure_channel("orders", "mailer")
        await asyncio.gather(*(request(client, f"request {i}") for i in range(4)))

    run_async(backend, body)
    spans = otel.spans("publish orders")
    assert len(spans) == 8
    by_parent: dict[tuple[int, int] | None, int] = {}
    for span in spans:
        by_parent[parent_of(span)] = by_parent.get(parent_of(span), 0) + 1
    assert by_parent == dict.fromkeys(parents.values(), 2)


@pytest.mark.sync_only
def test_an_async_consumers_handler_runs_in_its_process_span(
    backend: Backend, otel: Telemetry
) -> None:
    seen: dict[bytes, tuple[int, int]] = {}

    async def handler(msg: novaque.Message) -> None:
        await asyncio.sleep(0.01)  # the span stays current across awaits
        context = trace.get_current_span().get_span_context()
        seen[msg.body] = (context.trace_id, context.span_id)

    async def body(client: novaque.aio.AsyncClient) -> None:
        await client.ensure_channel("orders", "mailer")
        for i in range(3):
            with otel.app.start_as_current_span(f"request {i}"):
                await client.publish("orders", str(i).encode())
        consumer = client.subscribe("orders", "mailer", handler, max_in_flight=3)
        await consumer.start()
        for _ in range(1000):
            if len(seen) == 3:
                break
            await asyncio.sleep(0.01)
        await consumer.shutdown(timeout=10)

    run_async(backend, body)
    publishes = {s.attributes["messaging.message.id"]: s for s in otel.spans("publish orders")}
    processes = otel.spans("process orders")
    assert len(processes) == 3
    for span in processes:
        publish = publishes[span.attributes["messaging.message.id"]]
        assert parent_of(span) == ids_of(publish)
    assert sorted(seen.values()) == sorted(ids_of(s) for s in processes)


@pytest.mark.sync_only
def test_drain_of_an_async_client_traces_its_handler_calls(
    backend: Backend, otel: Telemetry
) -> None:
    async def handler(msg: novaque.Message) -> None:
        raise PaymentDeclined("no")

    async def body(client: novaque.aio.AsyncClient) -> None:
        await client.ensure_channel("orders", "mailer")
        await client.publish("orders", b"{}")
        assert await drain(client, "orders", "mailer", handler) == 1

    # A stopped clock: the retry (backoff drawn from [0, 1] s) is never due
    # within the drain, however short its draw.
    run_async(backend, body, novaque.Options(clock=FakeClock()))
    [publish] = otel.spans("publish orders")
    [process] = otel.spans("process orders")
    assert parent_of(process) == ids_of(publish)
    assert dict(process.attributes or {})["error.type"] == DECLINED


@pytest.mark.sync_only
def test_a_publish_in_an_async_session_is_traced_in_the_callers_task(
    backend: Backend, otel: Telemetry
) -> None:
    engine = create_async_engine(async_url(backend.name, backend.url))

    async def body(client: novaque.aio.AsyncClient) -> None:
        await client.ensure_channel("orders", "mailer")
        with otel.app.start_as_current_span("POST /orders") as request:
            async with AsyncSession(engine) as session, session.begin():
                await client.publish("orders", b"{}", session=session)
                [publish] = otel.spans("publish orders")  # ended before the commit
            assert parent_of(publish) == (
                request.get_span_context().trace_id,
                request.get_span_context().span_id,
            )
        [msg] = await client.claim("orders", "mailer")
        assert msg.headers == {"traceparent": traceparent_of(publish)}
        await engine.dispose()

    run_async(backend, body)


@pytest.mark.sync_only
def test_the_instrumentor_is_registered_for_zero_code_instrumentation() -> None:
    from importlib.metadata import entry_points

    [found] = [e for e in entry_points(group="opentelemetry_instrumentor") if e.name == "novaque"]
    assert found.load() is NovaqueInstrumentor
