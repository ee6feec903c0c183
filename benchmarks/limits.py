"""What a channel limit costs per claim: claim + ack on a limited channel whose
limit never binds, against the same on a channel without limits, in one run.

    python -m benchmarks.limits [sqlite|postgres|mysql ...] [--messages N] [--rounds R]

Each round publishes N messages to each channel (a topic each), then drains
each in turn, in an order that rotates from round to round, with
``claim(max_messages=10)`` and ``ack_many`` (a low-level loop: every claim
is a claim) and with a consumer (``max_in_flight=4``: its acks go with its
next claim). The channels: ``free`` (no limit), ``max_leased`` (1,000,000),
``rate_limit`` (2,000,000,000 a day) and ``group_max_leased`` (1,000; the
messages in 10 groups). Figures: messages per second, the median of the
rounds, and each limited channel's rate as a share of ``free``'s. URLs as
for ``benchmarks.round_trips`` (private databases, dropped afterwards).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any

import novaque
from benchmarks.round_trips import database

CHANNELS: dict[str, dict[str, Any]] = {
    "free": {},
    "max_leased": {"max_leased": 1_000_000},
    "rate_limit": {"rate_limit": (2_000_000_000, 86_400)},
    "group_max_leased": {"group_max_leased": 1_000},
}
BATCH = 10


def _publish(client: novaque.Client, name: str, messages: int) -> None:
    groups = [f"g{i % 10}" for i in range(messages)]
    for start in range(0, messages, 500):
        chunk = groups[start : start + 500]
        client.publish_many(name, [b"x"] * len(chunk), groups=chunk)


def _drain_loop(client: novaque.Client, name: str) -> int:
    done = 0
    while got := client.claim(name, "c", max_messages=BATCH):
        client.ack_many(got)
        done += len(got)
    return done


def _drain_consumer(client: novaque.Client, name: str, messages: int) -> int:
    left = threading.Semaphore(0)
    consumer = client.subscribe(name, "c", lambda msg: left.release(), max_in_flight=4)
    consumer.start()
    try:
        for _ in range(messages):
            if not left.acquire(timeout=120):
                break
    finally:
        consumer.shutdown(timeout=30)
    return messages


def measure(url: str, messages: int, rounds: int) -> dict[str, dict[str, float]]:
    """Messages per second (median of ``rounds``) per channel, for each way of draining."""
    client = novaque.connect(url, poll_interval=0.01)
    client.migrate()
    for name, settings in CHANNELS.items():
        client.ensure_channel(name, "c", **settings)
    rates: dict[str, dict[str, list[float]]] = {"loop": {}, "consumer": {}}
    names = list(CHANNELS)
    try:
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for way in rates:
                for name in order:
                    _publish(client, name, messages)
                for name in order:
                    started = time.perf_counter()
                    if way == "loop":
                        done = _drain_loop(client, name)
                    else:
                        done = _drain_consumer(client, name, messages)
                    took = time.perf_counter() - started
                    rates[way].setdefault(name, []).append(done / took)
    finally:
        client.shutdown(timeout=10)
        client.engine.dispose()
    return {
        way: {name: statistics.median(found) for name, found in by_name.items()}
        for way, by_name in rates.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backends", nargs="*", default=["sqlite", "postgres", "mysql"])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'backend':9} {'drain':9} {'channel':17} {'msg/s':>8} {'vs free':>8}")
    for backend in args.backends:
        with database(backend) as url:
            found = measure(url, args.messages, args.rounds)
        for way, by_name in found.items():
            free = by_name["free"]
            for name, rate in by_name.items():
                print(f"{backend:9} {way:9} {name:17} {rate:8.0f} {rate / free:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
