"""The benchmark harness runs end to end on tiny sizes and writes sane JSON.

No figure is checked against a speed: only that every workload ran, counted
what it was asked to, and reported it in the shape the README describes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import run
from benchmarks._common import Sizes
from tests.conftest import Backend

ENV = {"postgres": "NOVAQUE_BENCH_POSTGRES_URL", "mysql": "NOVAQUE_BENCH_MYSQL_URL"}


def bench(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "bench.json"
    status = run.main([*args, "--runs", "1", "--scale", "0.005", "--json", str(out)])
    return status, json.loads(out.read_text())


TWIN_WORKLOADS = ["W1a", "W1b", "W2", "W3"]


def keyed(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The rows by name: "W2" for the sync client, "W2 aio" for the twin."""
    return {
        r["workload"] + ("" if r["client"] == "sync" else f" {r['client']}"): r
        for r in report["results"]
    }


def check_rows(
    report: dict[str, Any], backend: str, workloads: list[str], *, twin: bool = True
) -> None:
    rows = keyed(report)
    expected = [*workloads, *(f"{w} aio" for w in workloads if twin and w in TWIN_WORKLOADS)]
    assert sorted(rows) == sorted(expected)
    for name, row in rows.items():
        assert row["backend"] == backend
        assert "error" not in row, row.get("error")
        assert row["novaque_runs"], name
        for side in ("novaque_runs", "floor_runs"):
            for one in row[side]:
                assert one["done"] == one["expected"] > 0, (name, side, one)
                assert not one["partial"]
        if row["workload"] == "W3":
            assert row["unit"] == "ms"
            assert set(row["novaque"]) == {"p50_ms", "p95_ms", "p99_ms"}
            assert row["novaque"]["p50_ms"] <= row["novaque"]["p99_ms"]
        else:
            assert row["unit"] == "msg/s"
            assert row["novaque"] > 0
            assert row["floor"] > 0
            assert row["ratio"] > 0
        if row["workload"] in ("W2", "W4", "W7", "W10"):
            assert row["novaque_runs"][0]["left_after"] == 0  # every message was acked
            assert row["novaque_runs"][0]["consumer"] == "subscribe"
        if row["client"] == "aio":
            sync = rows[row["workload"]]
            assert row["floor_runs"] == sync["floor_runs"]  # one floor, interleaved with both
            if row["unit"] == "msg/s":
                assert row["target"] == "twin/sync >= 0.9"
                assert row["twin_vs_sync"] == pytest.approx(row["ratio"] / sync["ratio"], 0.01)
                assert row["figure"].startswith("twin/sync ")
            else:
                assert row["target"] == sync["target"]
                assert "p50 sync/twin" in row["figure"]
            assert isinstance(row["met"], bool)
    if "W4" in rows:
        assert rows["W4"]["figure"].startswith("W4/W2 ")
    if "W6" in rows:
        assert rows["W6"]["figure"].startswith("W6/W1b ")
    if "W7" in rows:
        assert rows["W7"]["figure"].startswith("W7/W2 ")
    if "W8" in rows:
        assert rows["W8"]["figure"].startswith("W8/W6 ")
    if "W10" in rows:
        assert rows["W10"]["figure"].startswith("W10/W2 ")
        (run,) = rows["W10"]["novaque_runs"]
        assert run["urgent_left"] == 0  # every urgent message was handled, ...
        # ... before all but two consumer batches of the others
        assert 0 < run["last_urgent_at"] <= run["done"] // 10 + 2 * report["sizes"]["max_in_flight"]


def test_every_workload_on_sqlite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, report = bench(tmp_path, "--backend", "sqlite")
    assert status == 0
    workloads = ["W1a", "W1b", "W2", "W3", "W4", "W5 x1", "W5 x2", "W5 x4", "W6", "W7", "W8", "W10"]
    check_rows(report, "sqlite", workloads)
    assert report["machine"]["cores"] >= 1
    assert report["runs"] == 1
    assert report["clients"] == ["sync", "aio"]
    assert report["backends"][0]["server"].startswith("SQLite")
    rows = keyed(report)
    assert [rows[f"W5 x{n}"]["novaque_runs"][0]["procs"] for n in (1, 2, 4)] == [1, 2, 4]
    printed = capsys.readouterr()
    assert "| workload | backend" in printed.out
    for name in workloads:
        assert f"| {name} " in printed.out
    assert "| aio " in printed.out
    assert "done" in printed.err  # the progress bar ran to the end


@pytest.mark.parametrize("client", ["sync", "aio"])
def test_one_twin_alone(client: str, tmp_path: Path) -> None:
    # W5's processes are covered by test_every_workload_on_sqlite.
    sync = ["--workloads", "W1a,W1b,W2,W3,W4,W6,W7,W8"] if client == "sync" else []
    status, report = bench(tmp_path, "--backend", "sqlite", "--clients", client, *sync)
    assert status == 0
    assert report["clients"] == [client]
    assert {r["client"] for r in report["results"]} == {client}
    if client == "sync":
        assert {r["workload"] for r in report["results"]} >= {"W4", "W6"}
    else:  # the twin runs W1a-W3 only; with no sync row, no twin/sync
        assert sorted(r["workload"] for r in report["results"]) == sorted(TWIN_WORKLOADS)
        assert all(r["met"] is None or r["unit"] == "ms" for r in report["results"])


def test_sync_only_workloads_need_the_sync_client(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--clients", "aio", "--workloads", "W2,W4"])
    assert exit_info.value.code == 2
    assert "W4 run(s) the sync client only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run.main(["--clients", "sync,tornado"])


@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)  # SQLite: above
def test_the_servers_without_w5(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert backend.server_url is not None
    monkeypatch.setenv(ENV[backend.name], backend.server_url)
    status, report = bench(
        tmp_path, "--backend", backend.name, "--workloads", "W1a,W1b,W2,W3,W4,W6,W7,W8"
    )
    assert status == 0
    check_rows(report, backend.name, ["W1a", "W1b", "W2", "W3", "W4", "W6", "W7", "W8"])


def test_a_workload_out_of_time_stops_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, report = bench(tmp_path, "--backend", "sqlite", "--workloads", "W2", "--timeout", "0")
    assert status == 0
    assert [r["client"] for r in report["results"]] == ["sync", "aio"]
    for row in report["results"]:
        assert row["novaque_runs"] == []
        assert any("limit" in note for note in row["notes"])


def test_unknown_workloads_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--workloads", "W1a,W99"])
    assert exit_info.value.code == 2
    assert "unknown workload(s) W99" in capsys.readouterr().err


def test_w9_runs_only_when_named() -> None:
    assert "W9" not in run.parse_args([]).selected
    args = run.parse_args(["--workloads", "W9", "--no-hold", "--w9-rate", "20"])
    assert args.selected == ["W9"]
    assert (args.hold, args.w9_rate) == (False, 20)
    with pytest.raises(SystemExit):
        run.parse_args(["--workloads", "W9", "--w9-minutes", "0"])


def test_w9_steady_churn(
    backend: Backend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """W9 for a few seconds: every message handled, buckets over the publishing
    and the settle, the gauge's fields in every bucket and at every mark."""
    from benchmarks.churn import GAUGE_FIELDS

    if backend.server_url is not None:
        monkeypatch.setenv(ENV[backend.name], backend.server_url)
    out = tmp_path / "w9.json"
    status = run.main(
        [
            *("--backend", backend.name, "--workloads", "W9", "--json", str(out)),
            *("--w9-minutes", "0.04", "--w9-rate", "50", "--w9-settle", "1"),
            *("--w9-bucket", "1"),
        ]
    )
    assert status == 0
    report = json.loads(out.read_text())
    assert report["sizes"]["w9_rate"] == 50
    [row] = report["results"]
    assert (row["workload"], row["backend"], row["unit"]) == ("W9", backend.name, "ms")
    assert "error" not in row, row.get("error")
    assert row["figure"].startswith("last/first min p99 ")
    assert isinstance(row["met"], bool)
    [one] = row["novaque_runs"]
    summary = one["summary"]
    assert one["done"] == one["expected"] == summary["published"] == summary["handled"] == 120
    assert summary["hold"] is True
    assert summary["snapshot_kept_to_the_end"] is True
    assert summary["first_minute"]["n"] > 0
    assert summary["last_minute"]["n"] > 0
    buckets = one["buckets"]
    assert len(buckets) >= 3
    assert sum(b["published"] for b in buckets) == 120
    assert sum(b["handled"] for b in buckets) == 120
    assert buckets[0]["phase"] == "publish"
    assert buckets[-1]["phase"] == "settle"
    assert buckets[0]["p50_ms"] <= buckets[0]["p99_ms"]
    fields = set(GAUGE_FIELDS[backend.name])
    for bucket in buckets:
        assert fields <= set(bucket["gauge"]), bucket
    marks = [s["mark"] for s in one["series"]]
    for mark in ("start", "publish end", "snapshot closed", "end"):
        assert mark in marks
    for sample in one["series"]:
        assert fields <= set(sample), sample
    printed = capsys.readouterr().out
    assert f"W9 on {backend.name}: every bucket" in printed
    assert "| snapshot closed |" in printed
    # The cost curves draw the report as it is (the settle's buckets have no latency).
    drawn = tmp_path / "curves"
    assert run.main(["--curves", "w9", "--w9-json", str(out), "--out", str(drawn)]) == 0
    assert (drawn / "w9.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("engine", ["connect", "plain"])
def test_the_clients_are_on_the_engine_asked_for(engine: str) -> None:
    """``--engine plain``: every client of the run on ``sqlalchemy.create_engine``
    (novaque owns no engine of it, its pool as large as ``connect``'s), the
    twin's on ``create_async_engine``; ``connect``: novaque's own."""
    import asyncio

    from benchmarks import workloads
    from benchmarks._common import Sizes
    from benchmarks._databases import Database, close_client

    db = Database("sqlite")
    try:
        db.migrate()
        sizes = Sizes(engine=engine)
        client = workloads.make_client(db, sizes, start=False)
        try:
            assert client._context.owns_engine is (engine == "connect")
            if engine == "plain":  # connect() sizes SQLite's pool its own way
                assert client.engine.pool.size() == sizes.max_in_flight + 4  # type: ignore[attr-defined]
        finally:
            close_client(client)
        twin = asyncio.run(workloads._aio_connect(db, sizes, start=False))
        try:
            assert twin._core._context.owns_engine is (engine == "connect")
            assert twin.engine.url.drivername == "sqlite+aiosqlite"
        finally:
            asyncio.run(workloads._aio_close(twin))
    finally:
        db.drop()


def test_the_servers_on_plain_engines(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``bench-peers`` drives, an application's own engine, in ``novaque bench``."""
    if backend.server_url is not None:
        monkeypatch.setenv(ENV[backend.name], backend.server_url)
    workloads = ["W1a", "W1b", "W2", "W3"]
    status, report = bench(
        tmp_path, "--backend", backend.name, "--engine", "plain", "--workloads", ",".join(workloads)
    )
    assert status == 0
    assert report["sizes"]["engine"] == "plain"
    check_rows(report, backend.name, workloads)


def test_the_broker_benchmark_runs_on_sqlite(tmp_path: Path) -> None:
    """``novaque bench broker``: publish and drain through the broker and the
    Python client, and the long poll's wake-ups, in the JSON the README shows."""
    out = tmp_path / "broker.json"
    status = run.main(
        [
            *("broker", "--backend", "sqlite", "--messages", "120", "--batch", "20"),
            *("--runs", "1", "--wakeups", "3", "--json", str(out)),
        ]
    )
    assert status == 0
    [result] = json.loads(out.read_text())["results"]
    assert result["backend"] == "sqlite"
    for name in ("publish", "drain"):
        assert result[name]["broker_msg_s"] > 0
        assert result[name]["python_msg_s"] > 0
        assert result[name]["ratio"] > 0
    assert result["wakeup"]["n"] == 3
    assert 0 < result["wakeup"]["p50_ms"] <= result["wakeup"]["p99_ms"]


CURVES = ("backlog", "channels", "procs", "idle")


def curves(tmp_path: Path, backend: str, *more: str) -> tuple[int, dict[str, Any], Path]:
    """``novaque bench --curves`` at a tiny scale, two processes at most."""
    out, report = tmp_path / "curves", tmp_path / "curves.json"
    status = run.main(
        [
            *("--curves", "--backend", backend, "--scale", "0.005"),
            *("--procs", "1,2", "--idle-procs", "1,2"),
            *("--out", str(out), "--json", str(report), *more),
        ]
    )
    return status, json.loads(report.read_text()), out


def check_curves(report: dict[str, Any], out: Path, backend: str) -> None:
    assert sorted(report["curves"]) == sorted(CURVES)
    for name in CURVES:
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        curve = report["curves"][name]
        series = curve["backends"][backend]
        assert "error" not in series, series.get("trace")
        assert [p["x"] for p in series["points"]] == curve["x"], name  # a point per x value
        for point in series["points"]:
            assert point["y"] > 0, (name, point)
            [one] = point["runs"]
            assert not one.get("partial"), (name, one)
    assert report["curves"]["procs"]["x"] == [1, 2]
    assert report["curves"]["channels"]["x"] == [1, 10, 100]
    backlog = report["curves"]["backlog"]["backends"][backend]["points"]
    # The drained messages came off the top: the depth is what is left behind,
    # less what the consumer's last batches took past the count (a batch is
    # claimed whole, and handled while the consumer stops).
    batch = Sizes.max_in_flight
    for point in backlog:
        assert point["x"] - 2 * batch <= point["runs"][0]["left_after"] <= point["x"], point
    idle = report["curves"]["idle"]["backends"][backend]["points"]
    assert all(p["runs"][0]["counted"] for p in idle)
    assert report["commit"]
    assert report["scale"] == 0.005


def test_the_cost_curves_on_sqlite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The curves measured and drawn, and W9's over time drawn from a file of
    the shape ``benchmarks/_plot.py``'s reader documents."""
    w9 = tmp_path / "w9.json"
    buckets = [{"t": 30 * i, "p50_ms": 3.0 + i % 3, "p99_ms": 9.0 + i % 5} for i in range(6)]
    w9.write_text(json.dumps({"sqlite": buckets, "postgres": buckets[:3]}))
    status, report, out = curves(tmp_path, "sqlite", "--w9-json", str(w9))
    assert status == 0
    check_curves(report, out, "sqlite")
    assert (out / "w9.png").read_bytes()[:4] == b"\x89PNG"
    assert [b["t"] for b in report["w9"]["sqlite"]] == [30.0 * i for i in range(6)]
    assert list(report["w9"]) == ["sqlite"]  # --backend sqlite
    printed = capsys.readouterr()
    assert "| backlog | sqlite |" in printed.out
    assert "sqlite idle 2" in printed.err  # the progress bar
    assert "done" in printed.err


def test_a_w9_file_of_another_shape_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w9 = tmp_path / "w9.json"
    w9.write_text(json.dumps({"sqlite": [{"t": 0, "p50": 3.0}]}))
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--curves", "w9", "--w9-json", str(w9), "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "sqlite, bucket 0: expected numbers t, p50_ms and p99_ms" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run.main(["--curves", "w9"])  # drawn from a file only


@pytest.mark.parametrize("backend", ["postgres", "mysql"], indirect=True)  # SQLite: above
def test_the_cost_curves_on_the_servers(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert backend.server_url is not None
    monkeypatch.setenv(ENV[backend.name], backend.server_url)
    status, report, out = curves(tmp_path, backend.name)
    assert status == 0
    check_curves(report, out, backend.name)
