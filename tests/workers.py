"""Code run in separate OS processes by the multi-process tests.

``python -m tests.workers claim URL TOPIC CHANNEL OUT`` claims and acks until
the channel stays empty, writing each claimed delivery id to OUT.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import sqlalchemy as sa

import novaque


def wait_for_start(out: str) -> None:
    """Say "ready" (OUT.ready), then wait for the test's "go" (OUT's folder/go)."""
    path = Path(out)
    path.with_suffix(".ready").touch()
    deadline = time.monotonic() + 60
    while not (path.parent / "go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal within 60 s")
        time.sleep(0.005)


def claim_all(url: str, topic: str, channel: str, out: str, how: str = "plain") -> None:
    """Claim and ack until the channel stays empty for a second.

    ``how`` is "connect" for an engine built by novaque.connect, "plain" for
    the application's own ``create_engine`` (both must behave the same).
    """
    batch = 10
    client = novaque.connect(url) if how == "connect" else novaque.Client(sa.create_engine(url))
    client.list_topics()  # connect and check the schema before the start line
    wait_for_start(out)
    idle_since: float | None = None
    with open(out, "w") as sink:
        while True:
            got = client.claim(topic, channel, max_messages=batch, lease=120)
            if not got:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > 1.0:
                    return
                time.sleep(0.01)
                continue
            idle_since = None
            sink.write("".join(f"{m.delivery_id}\n" for m in got))
            sink.flush()
            assert client.ack_many(got) == []
            # A moment with the write lock free: on SQLite the other processes
            # wait in the busy handler, which only looks now and then, and a
            # process that takes the lock again at once can starve them.
            time.sleep(0.002)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "claim":
        claim_all(*args)
    else:
        raise SystemExit(f"unknown command {command!r}")
