"""The code of the tutorial's consumer steps runs as written (on SQLite).

The plain Python blocks of "4. Consume" run in order in one namespace in a
fresh folder, on nothing but the ``engine`` and ``client`` of the earlier
steps; the ``# file: worker.py`` block of "6. Deploy" is run as a real
process, fed a message, and stopped with SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
from tests.test_docs import doc_file, marker

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def chapter_blocks() -> list[str]:
    text = (ROOT / "docs" / "tutorial.md").read_text()
    start = text.index("\n## 4. Consume\n")
    end = text.find("\n## ", start + 1)
    return BLOCK.findall(text[start : end if end != -1 else len(text)])


def test_the_consumer_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step alone, with the ``engine`` and ``client`` of the tutorial's
    "1. Connect" (tests/test_docs.py runs the whole tutorial)."""
    monkeypatch.chdir(tmp_path)
    engine = sa.create_engine("sqlite:///tutorial.db")
    client = novaque.Client(engine)
    client.migrate()
    namespace: dict[str, object] = {
        "__name__": "tutorial_consumers",
        "engine": engine,
        "novaque": novaque,
    }
    namespace["client"] = client
    plain = [b for b in chapter_blocks() if not marker(b)]
    assert len(plain) >= 2
    try:
        for n, block in enumerate(plain, 1):
            exec(compile(block, f"tutorial Consume example {n}", "exec"), namespace)
    finally:
        for value in namespace.values():
            if isinstance(value, novaque.Client):
                value.shutdown(timeout=10)
        engine.dispose()


def test_the_sigterm_recipe_stops_a_worker_cleanly(tmp_path: Path) -> None:
    (tmp_path / "worker.py").write_text(doc_file("worker.py"))
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "handlers.py").write_text(
        textwrap.dedent(
            """
            from pathlib import Path

            def send_mail(msg):
                Path("mailed.txt").write_bytes(msg.body)
            """
        )
    )
    url = f"sqlite:///{tmp_path / 'app.db'}"
    setup = novaque.connect(url)
    setup.migrate()
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "worker.py"], cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 60
        while "mailer" not in _channels(setup):
            assert proc.poll() is None, "the worker died"
            assert time.monotonic() < deadline, "the worker did not subscribe"
            time.sleep(0.02)
        setup.publish("orders", b"hello from the tutorial")
        while not (tmp_path / "mailed.txt").exists():
            assert proc.poll() is None, "the worker died"
            assert time.monotonic() < deadline, "the worker did not handle the message"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        setup.shutdown()
    assert (tmp_path / "mailed.txt").read_bytes() == b"hello from the tutorial"
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM novaque_deliveries").scalar() == 0
    engine.dispose()


def _channels(client: novaque.Client) -> list[str]:
    try:
        return client.list_channels("orders")
    except novaque.TopicNotFound:
        return []
