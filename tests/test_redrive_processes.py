"""A paced redrive killed with SIGKILL half-way leaves every letter moved or not, never half."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from novaque.schema import DEAD_VISIBLE_AT, STATE_DEAD, STATE_READY, channels, deliveries, messages
from tests import _preloaded
from tests.conftest import Backend

ROOT = Path(__file__).resolve().parent.parent
WAIT = 60.0
LETTERS = 50
RATE = 10  # letters a second: chunks of 10, one transaction each

pytestmark = pytest.mark.slow


def rows(backend: Backend) -> list[tuple[int, str, int, int, int, int | None, int]]:
    """Every delivery: (id, channel, state, visible_at, attempts, died_at, expires_at)."""
    engine = sa.create_engine(backend.url, poolclass=sa.NullPool)
    d = deliveries
    try:
        with engine.connect() as conn:
            found = conn.execute(
                sa.select(
                    d.c.id,
                    channels.c.name,
                    d.c.state,
                    d.c.visible_at,
                    d.c.attempts,
                    d.c.died_at,
                    messages.c.expires_at,
                )
                .join_from(d, channels, channels.c.id == d.c.channel_id)
                .join(messages, messages.c.id == d.c.message_id)
                .order_by(d.c.id)
            ).all()
            return [tuple(r) for r in found]  # type: ignore[misc]
    finally:
        engine.dispose()


def test_sigkill_mid_redrive_leaves_each_letter_moved_or_not(backend: Backend) -> None:
    client = backend.client()
    client.ensure_channel("t", "src")
    client.publish_many("t", [f"m{i}" for i in range(LETTERS)], ttl=3600)
    for msg in client.claim("t", "src", max_messages=LETTERS):
        client.reject(msg, "bad")
    client.ensure_channel("t", "dst")  # late: it holds none of them
    before = rows(backend)
    letters = {r[0] for r in before}
    assert len(letters) == LETTERS

    proc = _preloaded.popen(
        ["-m", "tests.redrive_worker", backend.url, "t", "src", "dst", str(RATE)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WAIT
        while not any(r[1] == "dst" for r in rows(backend)):  # the first chunk committed
            assert proc.poll() is None, "the redrive ended before it was killed"
            assert time.monotonic() < deadline, "timed out waiting for the first chunk"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT)
    after = rows(backend)
    assert {r[0] for r in after} == letters  # every letter is there, once
    moved = [r for r in after if r[1] == "dst"]
    stayed = [r for r in after if r[1] == "src"]
    assert len(moved) + len(stayed) == LETTERS
    # Killed half-way, and in whole chunks: never a letter half moved.
    assert 0 < len(moved) < LETTERS
    assert len(moved) % RATE == 0
    for _, _, state, visible, attempts, died, expires in moved:
        assert (state, attempts, died) == (STATE_READY, 0, None)
        assert visible < DEAD_VISIBLE_AT
        assert expires > before[0][6]  # the fresh TTL came with the move
    for _, _, state, visible, attempts, died, _ in stayed:
        assert (state, visible, attempts) == (STATE_DEAD, DEAD_VISIBLE_AT, 1)
        assert died is not None
    # What is left moves on the next run.
    assert client.requeue_dead("t", "src", to_channel="dst") == len(stayed)
