"""The network broker against the Python client, per backend.

``novaque bench broker [--backend sqlite|postgres|mysql|all] [--messages N]
[--clients 4] [--batch 50] [--runs 3] [--wakeups 50] [--json PATH]``
(or ``python -m benchmarks.broker ...``).

The broker runs as ``novaque serve`` in a process of its own, as deployed;
the HTTP clients (httpx, keep-alive connections) are threads of this process.
For each backend, on a private database:

- **publish**: ``--clients`` threads publish ``--messages`` 200-byte bodies in
  batches of ``--batch``, through the broker (``POST .../messages``) and
  through ``novaque.Client.publish_many`` (as many threads), in turns; the
  figure is broker / Python (medians of ``--runs``).
- **drain**: ``--clients`` threads drain a channel holding ``--messages``:
  through the broker (``receive`` up to ``--batch``, then ``settle``
  ``complete`` for them all), and through ``claim`` + ``ack_many``; broker /
  Python.
- **wake-up**: one long poll (``receive`` with ``wait``) is waiting; a publish
  from another client (another connection: the wake-up comes through the
  database, ``NOTIFY`` or the change watcher) is timed from its commit to the
  poll's answer; p50 and p99 over ``--wakeups``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

import novaque
from benchmarks._common import body, median, percentile
from benchmarks._databases import BACKENDS, Database, close_client
from novaque.broker import new_token, token_toml

CHANNEL = "drain"


class Broker:
    """``novaque serve`` on a free port, in a process of its own."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.token = new_token()
        tokens = workdir / "tokens.toml"
        tokens.write_text(token_toml(self.token, ["admin"]))
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "novaque.cli",
                "--url",
                url,
                "serve",
                "--tokens",
                str(tokens),
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        found = re.search(r"(http://\S+)/v1/", line)
        if found is None:
            self.proc.kill()
            rest = self.proc.stdout.read()
            self.proc.stdout.close()
            self.proc.wait(30)
            raise RuntimeError(f"novaque serve did not start: {line}{rest}")
        self.base_url = found.group(1)
        #: What it prints afterwards (read, so that it never blocks on a full pipe).
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def http(self) -> httpx.Client:
        # TCP_NODELAY, as browsers, Node and Go set it: without it a request
        # whose headers and body leave in two writes waits for the server's
        # delayed ACK (40 ms on Linux) before its body is sent.
        nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=60,
            transport=httpx.HTTPTransport(socket_options=nodelay),
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self._reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def _parallel(clients: int, work: Callable[[int], None]) -> float:
    """Seconds ``clients`` threads took to run ``work(n)`` each."""
    start = threading.Barrier(clients + 1)

    def run(n: int) -> None:
        start.wait()
        work(n)

    with ThreadPoolExecutor(clients) as pool:
        futures = [pool.submit(run, n) for n in range(clients)]
        start.wait()
        began = time.perf_counter()
        for future in futures:
            future.result()
    return time.perf_counter() - began


def _shares(total: int, clients: int, batch: int) -> list[list[int]]:
    """The batch sizes of each client: ``total`` messages in batches of ``batch``."""
    sizes = [batch] * (total // batch) + ([total % batch] if total % batch else [])
    return [sizes[n::clients] for n in range(clients)]


class Side:
    """One backend's runs: the broker and the Python client, in turns."""

    def __init__(self, db: Database, args: argparse.Namespace, broker: Broker) -> None:
        self.db = db
        self.args = args
        self.broker = broker
        self.runs = 0
        self.topic = ""

    def _python(self) -> novaque.Client:
        return novaque.connect(self.db.url, max_in_flight=self.args.clients)

    def _fresh(self) -> str:
        """Empty tables, and a topic (with its channel) never used before: the
        broker keeps the ids of the names it used (as every client does), and
        a name deleted under it is found again only after a while."""
        self.db.reset()
        self.runs += 1
        topic = self.topic = f"bench-{self.runs}"
        client = self._python()
        try:
            client.ensure_channel(topic, CHANNEL)
        finally:
            close_client(client)
        return topic

    def publish_broker(self) -> float:
        self._fresh()
        shares = _shares(self.args.messages, self.args.clients, self.args.batch)
        payloads = {
            size: {
                "messages": [{"body_b64": base64.b64encode(body(i)).decode()} for i in range(size)]
            }
            for size in {s for share in shares for s in share}
        }
        https = [self.broker.http() for _ in shares]

        def work(n: int) -> None:
            for size in shares[n]:
                answer = https[n].post(f"/v1/topics/{self.topic}/messages", json=payloads[size])
                answer.raise_for_status()

        try:
            seconds = _parallel(self.args.clients, work)
        finally:
            for http in https:
                http.close()
        return self.args.messages / seconds

    def publish_python(self) -> float:
        self._fresh()
        shares = _shares(self.args.messages, self.args.clients, self.args.batch)
        client = self._python()
        bodies = [body(i) for i in range(self.args.batch)]
        try:
            client.list_topics()  # the schema check, outside the timing

            def work(n: int) -> None:
                for size in shares[n]:
                    client.publish_many(self.topic, bodies[:size])

            seconds = _parallel(self.args.clients, work)
        finally:
            close_client(client)
        return self.args.messages / seconds

    def _filled(self) -> None:
        self._fresh()
        client = self._python()
        try:
            bodies = [body(i) for i in range(1000)]
            left = self.args.messages
            while left > 0:
                client.publish_many(self.topic, bodies[: min(1000, left)])
                left -= 1000
        finally:
            close_client(client)
        self.db.analyze()

    def drain_broker(self) -> float:
        self._filled()
        https = [self.broker.http() for _ in range(self.args.clients)]
        path = f"/v1/topics/{self.topic}/channels/{CHANNEL}"
        batch = min(self.args.batch, 100)

        def work(n: int) -> None:
            http = https[n]
            while True:
                got = http.post(f"{path}/receive", json={"max_messages": batch}).json()
                messages = got["messages"]
                if not messages:
                    return
                items = [
                    {
                        "delivery_id": m["delivery_id"],
                        "lease_token": m["lease_token"],
                        "action": "complete",
                    }
                    for m in messages
                ]
                results = http.post(f"{path}/settle", json={"items": items}).json()["results"]
                assert all(r["ok"] for r in results), results

        try:
            seconds = _parallel(self.args.clients, work)
        finally:
            for http in https:
                http.close()
        return self.args.messages / seconds

    def drain_python(self) -> float:
        self._filled()
        client = self._python()
        batch = min(self.args.batch, 100)
        try:
            client.list_topics()

            def work(n: int) -> None:
                while True:
                    got = client.claim(self.topic, CHANNEL, max_messages=batch)
                    if not got:
                        return
                    assert client.ack_many(got) == []

            seconds = _parallel(self.args.clients, work)
        finally:
            close_client(client)
        return self.args.messages / seconds

    def wakeups(self) -> list[float]:
        """Milliseconds from a publish's commit to the long poll's answer."""
        self._fresh()
        client = self._python()
        path = f"/v1/topics/{self.topic}/channels/{CHANNEL}/receive"
        latencies: list[float] = []
        try:
            client.list_topics()
            with self.broker.http() as http, ThreadPoolExecutor(1) as pool:
                for _ in range(self.args.wakeups):
                    polling = pool.submit(http.post, path, json={"wait": 20})
                    time.sleep(0.05)  # the poll is waiting (its first claim found nothing)
                    client.publish(self.topic, b"wake up")
                    committed = time.perf_counter()
                    answer = polling.result()
                    latencies.append((time.perf_counter() - committed) * 1000)
                    [msg] = answer.json()["messages"]
                    settled = http.post(
                        path.replace("/receive", "/settle"),
                        json={
                            "items": [
                                {
                                    "delivery_id": msg["delivery_id"],
                                    "lease_token": msg["lease_token"],
                                    "action": "complete",
                                }
                            ]
                        },
                    )
                    settled.raise_for_status()
        finally:
            close_client(client)
        return latencies


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    db = Database(backend)
    result: dict[str, Any] = {"backend": backend}
    try:
        result["server"] = db.migrate()
        with tempfile.TemporaryDirectory(prefix="novaque-bench-broker-") as tmp:
            broker = Broker(db.url, Path(tmp))
            try:
                side = Side(db, args, broker)
                for name in ("publish", "drain"):
                    runs: dict[str, list[float]] = {"broker": [], "python": []}
                    for k in range(args.runs):
                        order = ["broker", "python"] if k % 2 == 0 else ["python", "broker"]
                        for who in order:
                            runs[who].append(getattr(side, f"{name}_{who}")())
                            print(
                                f"  {backend} {name} {who}: {runs[who][-1]:,.0f} msg/s",
                                file=sys.stderr,
                            )
                    result[name] = {
                        "broker_msg_s": round(median(runs["broker"]), 1),
                        "python_msg_s": round(median(runs["python"]), 1),
                        "ratio": round(median(runs["broker"]) / median(runs["python"]), 3),
                        "runs": runs,
                    }
                latencies = side.wakeups()
                result["wakeup"] = {
                    "p50_ms": round(percentile(latencies, 50), 2),
                    "p99_ms": round(percentile(latencies, 99), 2),
                    "n": len(latencies),
                }
            finally:
                broker.stop()
    finally:
        db.drop()
    return result


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "| backend | publish broker | publish python | ratio | drain broker | drain python "
        "| ratio | wake-up p50 | wake-up p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['backend']} | error: {r['error'][:80]} | | | | | | | |")
            continue
        p, d, w = r["publish"], r["drain"], r["wakeup"]
        lines.append(
            f"| {r['backend']} | {p['broker_msg_s']:,.0f} msg/s | {p['python_msg_s']:,.0f} msg/s "
            f"| {p['ratio']:.2f} | {d['broker_msg_s']:,.0f} msg/s | {d['python_msg_s']:,.0f} msg/s "
            f"| {d['ratio']:.2f} | {w['p50_ms']:.1f} ms | {w['p99_ms']:.1f} ms |"
        )
    lines.append(
        f"\n{args.clients} clients each side, batches of {args.batch}, {args.messages:,} messages "
        f"per run, {args.runs} run(s) per side (medians); ratio = broker / Python client; "
        f"wake-up over {args.wakeups} publishes from another connection."
    )
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="novaque bench broker",
        description="The network broker against the Python client (see benchmarks/README.md).",
    )
    parser.add_argument("--backend", default="all", choices=[*BACKENDS, "all"])
    parser.add_argument("--messages", type=int, default=10_000, help="per run (10,000)")
    parser.add_argument("--clients", type=int, default=4, help="threads per side (4)")
    parser.add_argument("--batch", type=int, default=50, help="messages per request (50)")
    parser.add_argument("--runs", type=int, default=3, help="runs per side; the median counts")
    parser.add_argument("--wakeups", type=int, default=50, help="long-poll wake-ups timed (50)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    for name in ("messages", "clients", "batch", "runs", "wakeups"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.batch > 500:
        parser.error("--batch is at most 500 (the broker's bound per request)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    results = []
    for backend in backends:
        try:
            results.append(run_backend(backend, args))
        except Exception as exc:
            results.append({"backend": backend, "error": f"{type(exc).__name__}: {exc}"})
    print(table(results, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
            f.write("\n")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
