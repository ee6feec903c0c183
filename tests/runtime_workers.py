"""A consumer process for the multi-process runtime tests.

``python -m tests.runtime_workers URL TOPIC CHANNEL OUT [--max-in-flight N]
[--lease S] [--poll-interval S] [--handle-ms MS]`` subscribes with a handler
that writes one line when it starts and one when it ends::

    S <delivery id> <lease token> <message id> <monotonic ns>
    E <delivery id> <lease token> <message id> <monotonic ns>

(``time.monotonic_ns`` is one clock for every process of the machine on
Linux). A message whose body starts with ``hang`` blocks its handler until
the process dies; ``--handle-ms`` makes every other handler take that long
(work that holds its lease a while). The process touches ``OUT.ready`` when subscribed, starts
consuming when the file ``go`` appears next to OUT, and shuts down cleanly
on SIGTERM (the recipe of docs/tutorial.md, "6. Deploy").
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import sqlalchemy as sa

import novaque
from tests._handshake import ready_then_go


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("topic")
    parser.add_argument("channel")
    parser.add_argument("out")
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--lease", type=float, default=30.0)
    parser.add_argument("--poll-interval", type=float, default=0.05)
    parser.add_argument("--handle-ms", type=float, default=0.0)
    args = parser.parse_args()

    out = Path(args.out)
    sink = out.open("a", buffering=1)
    lock = threading.Lock()
    forever = threading.Event()

    def record(kind: str, msg: novaque.Message) -> None:
        line = f"{kind} {msg.delivery_id} {msg.lease_token} {msg.id} {time.monotonic_ns()}\n"
        with lock:
            sink.write(line)
            sink.flush()

    def handler(msg: novaque.Message) -> None:
        record("S", msg)
        if msg.body.startswith(b"hang"):
            forever.wait()
        if args.handle_ms:
            time.sleep(args.handle_ms / 1000)
        record("E", msg)

    client = novaque.Client(
        sa.create_engine(args.url), novaque.Options(poll_interval=args.poll_interval)
    )
    consumer = client.subscribe(
        args.topic, args.channel, handler, max_in_flight=args.max_in_flight, lease=args.lease
    )
    # The SIGTERM recipe of docs/tutorial.md: a signal sets an event; the main
    # thread waits for it, then shuts down gracefully.
    stop = ready_then_go(out)
    consumer.start()
    stop.wait()
    client.shutdown(timeout=10)
    sink.close()


if __name__ == "__main__":
    main()
