"""docs/how-to/broker.md: its curl examples run, in order, against a live broker,
and between them they call every endpoint the broker serves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests._broker import live_broker, token_of
from tests.conftest import Backend

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "how-to" / "broker.md"
BASH = re.compile(r"```bash\n(.*?)```", re.S)
#: The address the page's examples name.
SHOWN = "http://127.0.0.1:8090"


def examples() -> list[str]:
    return BASH.findall(PAGE.read_text())


def curl_calls(script: str) -> list[tuple[str, str]]:
    """``(method, path)`` of each curl command of ``script`` (each names its
    method and URL on its first line)."""
    calls = []
    for line in script.splitlines():
        if line.startswith("curl "):
            method = re.search(r" -X (\w+)", line)
            url = re.search(re.escape(SHOWN) + r"(/\S*)", line)
            assert url is not None, line
            calls.append(("GET" if method is None else method.group(1), url.group(1)))
    return calls


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_the_curl_examples_run_against_a_live_broker(backend: Backend, tmp_path: Path) -> None:
    if shutil.which("curl") is None or shutil.which("jq") is None:
        pytest.skip("the examples need curl and jq")
    url = backend.scratch_url(tmp_path)
    backend.client(url).migrate()
    with live_broker(backend.name, url) as live:
        script = "\n".join(examples()).replace(SHOWN, live.base_url)
        # Every curl of the page fails the script on an HTTP error (4xx, 5xx).
        prelude = 'set -euo pipefail\ncurl() { command curl --fail-with-body "$@"; echo; }\n'
        done = subprocess.run(
            ["bash", "-c", prelude + script],
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin:/usr/local/bin", "TOKEN": token_of("admin")},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "published.json").read_text()) == {"ids": [1, 2]}
    shown = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert '{"count":1}' in shown
    assert '{"status":"up"}' in shown


def test_the_examples_call_every_endpoint(tmp_path: Path) -> None:
    from starlette.routing import Route

    import novaque.aio
    from novaque.broker import Tokens, create_app
    from tests._twin import async_url

    app = create_app(
        novaque.aio.connect(async_url("sqlite", f"sqlite:///{tmp_path / 'x.db'}")), tokens=Tokens()
    )
    routes = [r for r in app.routes if isinstance(r, Route)]
    served = {(m, r.path) for r in routes for m in (r.methods or ()) if m != "HEAD"}
    called = set()
    for method, path in curl_calls("\n".join(examples())):
        matching = [r for r in routes if r.path_regex.match(path) and method in (r.methods or ())]
        assert matching, f"{method} {path}: no endpoint"
        called.add((method, matching[0].path))
    assert called == served
