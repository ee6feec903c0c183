"""A redrive in a process of its own, for the crash test of tests/test_redrive_processes.py.

``python -m tests.redrive_worker URL TOPIC CHANNEL TO_CHANNEL RATE`` moves
every dead letter of CHANNEL to TO_CHANNEL at RATE letters per second and
prints how many when done (the test kills it with SIGKILL long before).
"""

from __future__ import annotations

import sys

import novaque


def main() -> None:
    url, topic, channel, to_channel, rate = sys.argv[1:6]
    client = novaque.connect(url)
    moved = client.requeue_dead(topic, channel, to_channel=to_channel, rate=float(rate))
    print(moved, flush=True)
    client.shutdown()


if __name__ == "__main__":
    main()
