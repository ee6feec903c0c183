"""Consumers on one node of a Galera cluster, for tests/test_galera.py.

``python -m tests.galera_worker URL OUT [--max-in-flight N] [--lease S]``
runs two consumers of the channel ``t``/``c`` in this process, each on its
own engine: one of the sync client (``novaque.connect``, pymysql) and one of
the asyncio twin (``novaque.aio.connect``, asyncmy, on an event loop of its
own thread). Their handler writes a line when it starts and one when it ends::

    S <client> <delivery id> <lease token> <message id> <wall clock ns> <lease expiry, epoch us>
    E <client> <delivery id> <lease token> <message id> <wall clock ns>

(``client``: ``sync`` or ``aio``; every process of the machine and the
servers share the wall clock, and each client reads its server's clock when
it starts). novaque's log records of WARNING and above go to ``OUT.log``.
The process touches ``OUT.ready`` when both are subscribed, starts consuming
when the file ``go`` appears next to OUT, and shuts both down cleanly on
SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from pathlib import Path

import sqlalchemy as sa

import novaque
import novaque.aio
from tests._handshake import ready_then_go


class Sink:
    def __init__(self, out: Path) -> None:
        self._file = out.open("a", buffering=1)
        self._lock = threading.Lock()

    def started(self, client: str, msg: novaque.Message) -> None:
        expires = int(msg.lease_expires_at.timestamp() * 1_000_000)
        self._write(
            f"S {client} {msg.delivery_id} {msg.lease_token} {msg.id} {time.time_ns()} {expires}"
        )

    def ended(self, client: str, msg: novaque.Message) -> None:
        self._write(f"E {client} {msg.delivery_id} {msg.lease_token} {msg.id} {time.time_ns()}")

    def _write(self, line: str) -> None:
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--lease", type=float, default=30.0)
    args = parser.parse_args()

    out = Path(args.out)
    log = logging.FileHandler(out.with_suffix(".log"))
    log.setLevel(logging.WARNING)
    log.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logging.getLogger("novaque").addHandler(log)
    sink = Sink(out)
    flow = {"max_in_flight": args.max_in_flight, "lease": args.lease}

    def handler(msg: novaque.Message) -> None:
        sink.started("sync", msg)
        sink.ended("sync", msg)

    async def async_handler(msg: novaque.Message) -> None:
        sink.started("aio", msg)
        sink.ended("aio", msg)

    client = novaque.connect(args.url, poll_interval=0.05)
    consumer = client.subscribe("t", "c", handler, **flow)

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def on_loop(coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)  # type: ignore[arg-type]

    async_url = sa.make_url(args.url).set(drivername="mysql+asyncmy")
    aio_client = novaque.aio.connect(async_url, poll_interval=0.05)
    aio_consumer = aio_client.subscribe("t", "c", async_handler, **flow)

    stop = ready_then_go(out)
    consumer.start()
    on_loop(aio_consumer.start())
    stop.wait()
    on_loop(aio_client.shutdown(timeout=10))
    client.shutdown(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    sink.close()


if __name__ == "__main__":
    main()
