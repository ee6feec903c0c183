"""Profile novaque's hot paths on one backend with pyinstrument (a dev tool).

``python -m benchmarks.profile postgres publish|publish_many|claim_ack|consume
[--n N] [--groups G] [--html PATH]``; ``--groups`` makes the channel
``group_fifo`` with the messages spread over ``G`` groups (W7's drain). Needs
``pip install pyinstrument`` in the venv (it is not a dependency of novaque).
Prints where the time of the loop went.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks import workloads as nq
from benchmarks._common import Deadline, Sizes, body
from benchmarks._databases import Database, close_client


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile")
    parser.add_argument("backend", choices=["sqlite", "postgres", "mysql"])
    parser.add_argument("path", choices=["publish", "publish_many", "claim_ack", "consume"])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument(
        "--groups", type=int, default=0, help="a group_fifo channel over this many groups (W7)"
    )
    parser.add_argument("--html", help="write pyinstrument's HTML report here")
    args = parser.parse_args(argv)
    from pyinstrument import Profiler

    sizes = Sizes()
    db = Database(args.backend)
    try:
        db.migrate()
        client = nq.make_client(db, sizes)
        client.ensure_channel(nq.TOPIC, nq.CHANNEL, ordering="group_fifo" if args.groups else None)
        if args.path in ("claim_ack", "consume"):
            nq.prefill(client, args.n, groups=args.groups)
        client.publish(nq.TOPIC, body(0))
        profiler = Profiler(interval=0.0005)
        started = time.perf_counter()
        profiler.start()
        if args.path == "publish":
            for i in range(args.n):
                client.publish(nq.TOPIC, body(i))
        elif args.path == "publish_many":
            for s in range(0, args.n, 500):
                client.publish_many(nq.TOPIC, [body(i) for i in range(s, s + 500)])
        elif args.path == "claim_ack":
            while msgs := client.claim(nq.TOPIC, nq.CHANNEL, max_messages=10):
                client.ack_many(msgs)
        else:
            close_client(client)
            client = None  # type: ignore[assignment]
            run = nq.drain(
                db,
                sizes.scaled(args.n / sizes.w2_messages),
                Deadline(120),
                prefilled=True,
                groups=args.groups,
            )
            print(run.to_json())
        profiler.stop()
        elapsed = time.perf_counter() - started
        print(f"{args.path} x{args.n} on {args.backend}: {elapsed:.2f} s")
        print(
            profiler.output_text(
                unicode=False,
                color=False,
                show_all=bool(__import__("os").environ.get("PROFILE_ALL")),
            )
        )
        if args.html:
            with open(args.html, "w") as f:
                f.write(profiler.output_html())
        if client is not None:
            close_client(client)
    finally:
        db.drop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
