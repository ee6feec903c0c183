"""``novaque demo``: a live tour on the embedded SQLite default.

Migrates the database, serves the admin UI, publishes a stream of sample
order events to the ``orders`` topic and consumes its two channels,
``billing`` and ``shipping``, with handlers that fail now and then: so
retries, backoff and dead letters show up on the dashboard, with the consumers
online and the last hour per minute. Serves the Prometheus metrics too when
``prometheus_client`` is installed. Prints the admin URL and a live progress
line; Ctrl-C (or ``--duration``) stops it cleanly.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

import novaque
from novaque.cli._common import Context, listening, port_number

TOPIC = "orders"
#: channel -> (chance that one attempt fails, chance that it is rejected, error text)
CHANNELS: dict[str, tuple[float, float, str]] = {
    "billing": (0.08, 0.01, "payment gateway answered 503"),
    "shipping": (0.25, 0.02, "carrier API timed out after 5s"),
}
CUSTOMERS = ("ada", "grace", "linus", "margaret", "ken", "barbara", "edsger", "frances")
ITEMS = ("keyboard", "monitor", "cable", "laptop", "dock", "headset", "mouse", "webcam")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def register(commands: Any) -> None:
    """Add ``demo`` to the parser."""
    demo = commands.add_parser(
        "demo",
        help="a live tour: the admin UI over a stream of sample orders",
        description="Migrate the database (the SQLite default unless --url), serve the admin "
        "UI, publish sample order events to topic 'orders' and consume its channels "
        "'billing' and 'shipping' with handlers that fail now and then. Ctrl-C stops.",
    )
    demo.add_argument("--host", default="127.0.0.1", help="admin address (%(default)s)")
    demo.add_argument(
        "--port", type=port_number, default=8080, help="admin port (%(default)s; 0: any)"
    )
    demo.add_argument(
        "--rate", type=_positive, default=10.0, help="orders published per second (%(default)s)"
    )
    demo.add_argument(
        "--duration", type=_positive, metavar="SECONDS", help="stop after SECONDS (default: never)"
    )
    demo.add_argument("--seed", type=int, default=None, help="random seed (repeatable runs)")
    demo.set_defaults(run=run_demo)


class Tally:
    """Thread-safe counts for the progress line."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] += n

    def get(self, key: str) -> int:
        with self._lock:
            return self._counts[key]


def order_body(rng: random.Random, number: int) -> str:
    quantity = rng.randint(1, 4)
    return json.dumps(
        {
            "order": number,
            "customer": rng.choice(CUSTOMERS),
            "item": rng.choice(ITEMS),
            "quantity": quantity,
            "total": round(quantity * rng.uniform(5, 400), 2),
        }
    )


def make_handler(
    channel: str, rng: random.Random, tally: Tally
) -> Callable[[novaque.Message], None]:
    """A handler for ``channel`` that fails or rejects at that channel's rates."""
    fail_rate, reject_rate, error = CHANNELS[channel]
    lock = threading.Lock()

    def handle(msg: novaque.Message) -> None:
        with lock:
            roll = rng.random()
        if roll < reject_rate:
            tally.add(f"{channel}.rejected")
            raise novaque.Reject("order failed validation: unknown address")
        if roll < reject_rate + fail_rate:
            tally.add(f"{channel}.failed")
            raise RuntimeError(error)
        tally.add(f"{channel}.ok")

    return handle


def run_demo(args: argparse.Namespace, context: Context) -> int:
    from novaque.admin import create_app
    from novaque.admin._serve import start_background

    rng = random.Random(args.seed)
    # Failing handlers are the point of the demo: keep their warnings off the terminal.
    logger = logging.getLogger("novaque.demo")
    logger.setLevel(logging.DEBUG if context.debug else logging.ERROR)
    client = context.client(
        create=True,
        logger=logger,
        default_max_attempts=4,
        backoff=novaque.Backoff(base=1.0, cap=8.0),
        stats_flush_interval=1.0,
        # The admin's consumers online show each consumer's load: refresh it often.
        consumer_heartbeat=2.0,
    )
    client.migrate()
    for channel in CHANNELS:
        client.ensure_channel(TOPIC, channel)
    metrics = _has_prometheus_client()
    with listening(args.host, args.port):
        server = start_background(create_app(client, metrics=metrics), args.host, args.port)
    stop = threading.Event()
    tally = Tally()
    handlers = {
        channel: make_handler(channel, random.Random(rng.random()), tally) for channel in CHANNELS
    }
    workers = [
        threading.Thread(
            target=_guard(_produce, stop),
            args=(client, rng, args.rate, tally, stop),
            name="demo-producer",
            daemon=True,
        )
    ]
    previous = _on_sigterm(stop)
    print(f"novaque demo on {context.shown_url}")
    print(f"admin UI: {server.base_url}/admin/", flush=True)
    if metrics:
        print(f"Prometheus metrics: {server.base_url}/admin/metrics", flush=True)
    print("publishing orders to 'orders' (channels: billing, shipping); Ctrl-C stops", flush=True)
    client.start()  # maintenance loops: lease reaper, TTL purge, stats flush
    for channel, handler in handlers.items():
        client.subscribe_and_start(TOPIC, channel, handler, max_in_flight=4)
    # A second consumer of billing, as a second worker process would be: the
    # admin lists both under consumers online.
    client.subscribe_and_start(TOPIC, "billing", handlers["billing"], max_in_flight=2)
    for worker in workers:
        worker.start()
    deadline = None if args.duration is None else time.monotonic() + args.duration
    tty = sys.stdout.isatty()
    last_line = 0.0
    try:
        while not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            stop.wait(0.5)
            if tty or time.monotonic() - last_line >= 2.0:
                _progress(client, tally, tty)
                last_line = time.monotonic()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=15)
        client.shutdown(timeout=10)  # finish running handlers, flush acks and counters
        server.stop()
        signal.signal(signal.SIGTERM, previous)
    _progress(client, tally, tty)
    if tty:
        print()
    print("stopped cleanly; the data stays in the database (browse it with `novaque admin`)")
    errors = [w.name for w in workers if getattr(w, "failed", False)]
    return 1 if errors else 0


def _has_prometheus_client() -> bool:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def _produce(
    client: novaque.Client, rng: random.Random, rate: float, tally: Tally, stop: threading.Event
) -> None:
    number = 1000 + rng.randint(0, 8999) * 100
    interval = 1.0 / rate
    batch = max(1, int(rate // 5))  # publish a few per transaction at high rates
    while not stop.is_set():
        started = time.monotonic()
        bodies = [order_body(rng, number + i) for i in range(batch)]
        client.publish_many(TOPIC, bodies, headers={"source": "novaque-demo"})
        number += batch
        tally.add("published", batch)
        stop.wait(max(0.0, interval * batch - (time.monotonic() - started)))


def _progress(client: novaque.Client, tally: Tally, tty: bool) -> None:
    parts = [f"published {tally.get('published')}"]
    backlog = getattr(client, "channel_backlog", None)
    for channel in CHANNELS:
        part = (
            f"{channel}: ok {tally.get(f'{channel}.ok')} failed {tally.get(f'{channel}.failed')}"
            f" rejected {tally.get(f'{channel}.rejected')}"
        )
        if backlog is not None:
            part += f" dead letters {backlog(TOPIC, channel).dead}"
        parts.append(part)
    line = " | ".join(parts)
    if tty:
        print("\r" + line.ljust(100), end="", flush=True)
    else:
        print(line, flush=True)


def _guard(target: Callable[..., None], stop: threading.Event) -> Callable[..., None]:
    """Run ``target``; on an error, report it in one line and stop the demo."""

    def run(*args: Any) -> None:
        try:
            target(*args)
        except Exception as exc:
            threading.current_thread().failed = True  # type: ignore[attr-defined]
            print(
                f"\nnovaque demo: {threading.current_thread().name} failed: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
                file=sys.stderr,
                flush=True,
            )
            stop.set()

    return run


def _on_sigterm(stop: threading.Event) -> Any:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    return signal.signal(signal.SIGTERM, handler)
