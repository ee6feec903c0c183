"""The code in README.md and docs/ runs as written, and the docs hold together.

Each page's Python blocks without a marker run in order, in one namespace of
their own (a page runs on its own, as a reader would run it), on SQLite in a
fresh folder, twice. ``# backend: postgres`` / ``# backend: mysql`` blocks run
against the test server (the example URL swapped for the server's). ``# file:
NAME`` blocks are files that a test builds a project around (FILE_BLOCKS says
which test). A ``# prints: TEXT`` comment is checked against what the block
printed. No block is left out: test_every_python_block_is_run_by_a_test.

The links of README.md and docs/ resolve, down to their #anchors (GitHub's);
docs/reference.md lists every ``Options`` field with its default and every
error class.

docs/quickstart.md is run by tests/test_quickstart.py, path by path, with
its shell commands: there ``# file: NAME`` blocks are written to NAME, and
``# append: NAME`` blocks are added at the end of NAME, a file that an
earlier command of the page made (Django's settings).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import re
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

import novaque
import novaque.errors
from tests.conftest import Backend, run_pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
#: The docs' example server database: ``app`` on localhost, user ``app``, password ``secret``.
EXAMPLE = r"(postgresql\+psycopg|mysql\+pymysql)://app:secret@localhost(:\d+)?/app"
EXAMPLE_URL = re.compile(f'"{EXAMPLE}"')
#: The multi-host URL of docs/how-to/failover.md, two string literals.
MULTI_HOST_URL = re.compile(
    r'"postgresql\+psycopg://app:secret@/app"\s*'
    r'"\?host=db1\.internal,db2\.internal&port=5432,5432&target_session_attrs=read-write"'
)
#: ``# prints: TEXT``: a line the code prints (``...`` stands for any text).
PRINTS = re.compile(r"#\s*prints:\s*(.+?)\s*$", re.M)
BACKEND_MARKERS = {"backend: postgres", "backend: mysql"}
#: Every ``# file: NAME`` block of the docs, and the test that builds a
#: project around it (each reads it with :func:`doc_file`).
FILE_BLOCKS = {
    "env.py": "tests/test_alembic_app.py",
    "orders.py": "tests/test_docs.py",
    "test_orders.py": "tests/test_docs.py",
    "worker.py": "tests/test_guide_consumers.py",
    "tasks.py": "tests/test_kombu.py",
    "send.py": "tests/test_kombu.py",
    "mysite/settings.py": "tests/test_django.py",
    "shop/models.py": "tests/test_django.py",
    "shop/orders.py": "tests/test_django.py",
    "shop/handlers.py": "tests/test_django.py",
}
#: Pages whose Python blocks run elsewhere, and how.
RUN_ELSEWHERE = {
    "docs/admin.md": "its mounting recipes need Flask, Django or FastAPI and a "
    "server: tests/test_admin_mount.py runs the same code in each framework",
    "docs/quickstart.md": "each path is a project with its shell commands: "
    "tests/test_quickstart.py runs them, path by path, on the path's own database",
}


def doc_pages() -> list[str]:
    """README.md and every page under docs/, as paths relative to the root."""
    pages = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
    return ["README.md", *pages]


def blocks(doc: str) -> list[str]:
    return BLOCK.findall((ROOT / doc).read_text())


def fenced(lang: str) -> list[str]:
    """Every ``lang`` block of the docs, page by page."""
    pattern = re.compile(rf"```{lang}\n(.*?)```", re.S)
    return [b for doc in doc_pages() for b in pattern.findall((ROOT / doc).read_text())]


def marker(block: str) -> str:
    first = block.splitlines()[0]
    return first[2:].strip() if first.startswith("# ") and ":" in first else ""


def doc_file(name: str) -> str:
    """The ``# file: NAME`` block of the docs (there is exactly one, but in the
    pages RUN_ELSEWHERE)."""
    (block,) = [
        b
        for doc in doc_pages()
        if doc not in RUN_ELSEWHERE  # their files are their own tests'
        for b in blocks(doc)
        if marker(b) == f"file: {name}"
    ]
    return block


def run_pages() -> list[str]:
    """The pages with blocks to run on SQLite."""
    return [
        doc
        for doc in doc_pages()
        if doc not in RUN_ELSEWHERE and any(not marker(b) for b in blocks(doc))
    ]


def check_prints(block: str, printed: str, name: str) -> None:
    """Each ``# prints:`` line of ``block`` matches a line of ``printed``, in order."""
    lines = printed.splitlines()
    start = 0
    for expected in PRINTS.findall(block):
        pattern = re.compile(".*".join(re.escape(part) for part in expected.split("...")))
        found = next((i for i in range(start, len(lines)) if pattern.fullmatch(lines[i])), None)
        assert found is not None, f"{name}: printed no line {expected!r}, but {lines[start:]}"
        start = found + 1


def run_sqlite_examples(doc: str, run: int) -> None:
    namespace: dict[str, object] = {"__name__": "docs_example"}
    ran = 0
    try:
        for block in blocks(doc):
            if marker(block):
                continue
            name = f"{doc} example {ran + 1} (run {run})"
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(block, name, "exec", dont_inherit=True), namespace)
            sys.stdout.write(printed.getvalue())
            check_prints(block, printed.getvalue(), name)
            ran += 1
    finally:
        for value in namespace.values():
            shutdown = getattr(value, "shutdown", None)
            if isinstance(value, novaque.Client) and shutdown is not None:
                shutdown(timeout=10)
            if isinstance(value, sa.Engine):
                value.dispose()
            engine = getattr(getattr(value, "_executor", None), "engine", None)
            if isinstance(engine, sa.Engine):
                engine.dispose()
        if "novaque.kombu" in sys.modules:  # the Celery examples' clients
            sys.modules["novaque.kombu"].shutdown_clients()
    assert ran >= 1


@pytest.mark.parametrize("doc", run_pages())
def test_sqlite_examples_run_and_run_again(
    doc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twice on the same database files: a reader may run the examples again."""
    monkeypatch.chdir(tmp_path)
    run_sqlite_examples(doc, 1)
    run_sqlite_examples(doc, 2)


def test_server_examples_run(backend: Backend) -> None:
    wanted = {"postgres": "backend: postgres", "mysql": "backend: mysql"}.get(backend.name)
    if wanted is None:
        return  # SQLite's examples run in test_sqlite_examples_run
    examples = [(doc, b) for doc in doc_pages() for b in blocks(doc) if marker(b) == wanted]
    assert examples, f"the docs show no {backend.name} example"
    for doc, block in examples:
        code = EXAMPLE_URL.sub(repr(backend.url), block)
        code = MULTI_HOST_URL.sub(repr(multi_host(backend.url)), code)
        namespace: dict[str, object] = {}
        exec(compile(code, f"{doc} {backend.name} example", "exec", dont_inherit=True), namespace)
        client = namespace["client"]
        assert client.list_topics() == ["audit"]  # type: ignore[attr-defined]
        client.engine.dispose()  # type: ignore[attr-defined]


def multi_host(url: str) -> str:
    """The multi-host form of ``url``: a first host that refuses connections,
    then ``url``'s server, the one that takes writes."""
    parsed = sa.make_url(url)
    return (
        f"{parsed.drivername}://{parsed.username}@/{parsed.database}?host=127.0.0.1,"
        f"{parsed.host}&port=1,{parsed.port or 5432}&target_session_attrs=read-write"
    )


def test_testing_example_is_a_passing_pytest_project(tmp_path: Path) -> None:
    """The tutorial's pytest example, as a project of its own: novaque's plugin
    is found through its entry point, and every test of the example passes."""
    for name in ("orders.py", "test_orders.py"):
        (tmp_path / name).write_text(doc_file(name))
    done = run_pytest(tmp_path, "-W", "error")
    assert done.returncode == 0, done.stdout + done.stderr
    tests = doc_file("test_orders.py").count("\ndef test_")
    assert tests == 4
    assert f"{tests} passed" in done.stdout, done.stdout


def test_every_python_block_is_run_by_a_test() -> None:
    """No example is only read: each block runs here on SQLite (no marker),
    against a server (``# backend:``), or as a file of a project that the test
    FILE_BLOCKS names builds."""
    unrun = []
    for doc in doc_pages():
        for block in blocks(doc):
            mark = marker(block)
            where = f"{doc}: {block.splitlines()[0]!r}"
            if doc in RUN_ELSEWHERE:
                continue
            if mark == "":
                assert doc in run_pages()
            elif mark.startswith("file: "):
                if mark.removeprefix("file: ") not in FILE_BLOCKS:
                    unrun.append(f"{where}: no test builds this file (FILE_BLOCKS)")
            elif mark not in BACKEND_MARKERS:
                unrun.append(f"{where}: an unknown marker")
            if mark and PRINTS.search(block):
                unrun.append(f"{where}: a '# prints:' comment in a block this file does not run")
    assert unrun == []
    for name, test in FILE_BLOCKS.items():
        assert doc_file(name)  # exactly one block, found by the test below
        assert f'"{name}"' in (ROOT / test).read_text(), f"{test} does not read {name}"
    for doc in RUN_ELSEWHERE:
        assert blocks(doc), f"{doc} has no Python block to run elsewhere"


# -- links ------------------------------------------------------------------------------

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"``.+?``|`[^`]*`", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
#: docs/ pages named in code and tests (docstrings, help texts, comments).
DOC_PATH = re.compile(r"\bdocs/[\w./-]+\.md\b")


def prose(text: str) -> str:
    """Markdown without its code (fenced blocks, code spans)."""
    return FENCE.sub("", text)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of ``page``: lower case, punctuation dropped
    (``_`` and ``-`` kept), spaces to ``-``, ``-1``, ``-2``... for repeats."""
    found: set[str] = set()
    for heading in HEADING.findall(prose(page.read_text())):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


def test_github_anchors_are_computed_as_github_does(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n## MySQL (≥ 8.0.1) and MariaDB (≥ 10.6)\n## Defer: `defer` and "
        "`claim_deferred`\n```python\n# not a heading\n```\n## Title\n## 6. Deploy\n"
    )
    assert anchors(page) == {
        "title",
        "mysql--801-and-mariadb--106",
        "defer-defer-and-claim_deferred",
        "title-1",
        "6-deploy",
    }


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    for doc in doc_pages():
        page = ROOT / doc
        text = CODE_SPAN.sub("", prose(page.read_text()))
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{doc}: {target} (no such file)")
            elif anchor and anchor not in anchors(linked):
                broken.append(f"{doc}: {target} (no such heading)")
    assert broken == []


def test_docs_named_in_code_exist() -> None:
    """Docstrings, help texts and tests that name a docs/ page name one that exists."""
    missing = []
    for top in ("novaque", "tests", "benchmarks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for name in DOC_PATH.findall(path.read_text()):
                if not (ROOT / name).exists():
                    missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert missing == []


# -- the reference ----------------------------------------------------------------------


def reference_section(title: str) -> str:
    text = (ROOT / "docs" / "reference.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_reference_lists_every_option_with_its_default() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", reference_section("Options"), re.M)
    names = [name for name, _ in rows]
    fields = [f.name for f in dataclasses.fields(novaque.Options)]
    assert sorted(names) == sorted(fields)
    defaults = novaque.Options()
    known = {"timedelta": timedelta, "Backoff": novaque.Backoff, "logging": logging}
    for name, default in rows:
        assert eval(default, known) == getattr(defaults, name), name


def test_reference_lists_every_error() -> None:
    first_cells = re.findall(r"^\| (`[^|]+`) \|", reference_section("Errors"), re.M)
    listed = {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}
    assert set(novaque.errors.__all__) <= listed
    assert all(hasattr(novaque.errors, name) for name in listed), listed


#: Text that belongs to the project's own records, never to what a user reads:
#: a design document's sections, notes on proposed names, tracker issues.
INTERNAL = re.compile(r"DESIGN|§|\(proposed|\*\(proposed|\bissue \d+|\bstop \d+\b")
#: What users read: the docs, the changelog, and everything shipped (docstrings,
#: log lines, error texts, CLI output, the admin's pages, migration messages).
USER_FACING = ("README.md", "CHANGELOG.md", "docs", "novaque", "migrations")


def test_no_internal_text_reaches_users() -> None:
    found = []
    for top in USER_FACING:
        root = ROOT / top
        files = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in files:
            if path.suffix not in {".md", ".py", ".js", ".html", ".css", ".txt"}:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if INTERNAL.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_architecture_names_every_module() -> None:
    """docs/architecture.md names every module of the package, by its dotted
    name (``novaque.ops.publish``) or its path (``ops/publish.py``, or for a
    package's ``__init__.py`` the package's folder, ``ops/``)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    package = ROOT / "novaque"
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        parts = rel[: -len(".py")].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
            names = [f"{'/'.join(parts)}/" if parts else "novaque/__init__.py", rel]
        else:
            names = [rel, f"novaque/{rel}"]
        names.append(".".join(["novaque", *parts]))
        if not any(
            re.search(rf"(?<![\w/.]){re.escape(name)}(?![\w]|\.\w)", text) for name in names
        ):
            missing.append(rel)
    assert missing == []
