"""``python -m MODULE ...`` or ``python SCRIPT ...`` as the tests run commands,
without paying for the interpreter's start each time.

:func:`run` is ``subprocess.run([sys.executable, *args], capture_output=True,
check=False, ...)``: the command runs in a process of its own, with its own
working directory, environment, standard streams and exit status. The process
is forked from a server that imported novaque, SQLAlchemy, Alembic and Django
once (``multiprocessing``'s forkserver, one per test process), so a command
costs its own work instead of a second of imports. What a fork cannot give
falls back to a real interpreter: a ``PYTHON*`` variable the server was not
started with, or a ``PYTHONPATH`` entry the server's path lacks.
"""

from __future__ import annotations

import atexit
import locale
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: What the server imports before it forks (a module it lacks is skipped).
PRELOAD = [
    "tests._preloaded",
    "novaque.cli",
    "novaque.django",
    "alembic.config",
    "alembic.command",
    "django.core.management",
    "django.db.models",
    "pytest",
]

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)
#: The environment the server was started with (it starts on first use).
_server_env: dict[str, str] | None = None


def _forkable(args: Sequence[str], env: Mapping[str, str]) -> bool:
    if not args or (args[0].startswith("-") and args[0] != "-m"):
        return False
    assert _server_env is not None
    python = {k for k in (*env, *_server_env) if k.startswith("PYTHON") and k != "PYTHONPATH"}
    if any(env.get(k) != _server_env.get(k) for k in python):
        return False
    return all(p in sys.path for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)


def run(
    args: Sequence[str],
    *,
    cwd: str | Path,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    timeout: float,
    text: bool = True,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run([sys.executable, *args], ...)`` with the output captured."""
    global _server_env
    env = dict(os.environ if env is None else env)
    if _server_env is None:
        _server_env = dict(os.environ)
    command = [sys.executable, *args]
    if not _forkable(args, env):
        return subprocess.run(
            command,
            cwd=cwd,
            env=env,
            input=input,
            capture_output=True,
            text=text,
            timeout=timeout,
            check=False,
        )
    with tempfile.TemporaryDirectory(prefix="novaque-run-") as folder:
        streams = [os.path.join(folder, name) for name in ("in", "out", "err")]
        Path(streams[0]).write_bytes(input.encode() if isinstance(input, str) else input or b"")
        process = _context.Process(
            target=_main, args=(list(args), str(cwd), env, streams), daemon=False
        )
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(command, timeout)
        out, err = (Path(path).read_bytes() for path in streams[1:])
    assert process.exitcode is not None
    if text:
        return subprocess.CompletedProcess(command, process.exitcode, _text(out), _text(err))
    return subprocess.CompletedProcess(command, process.exitcode, out, err)


def _text(data: bytes) -> str:
    """Decoded as ``subprocess.run(text=True)`` decodes (universal newlines)."""
    decoded = data.decode(locale.getpreferredencoding(False))
    return decoded.replace("\r\n", "\n").replace("\r", "\n")


def _main(args: list[str], cwd: str, env: dict[str, str], streams: list[str]) -> None:
    """In the forked process: become ``python ARGS`` in ``cwd`` with ``env``."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    writing = os.O_WRONLY | os.O_CREAT
    for fd, path, flags in zip((0, 1, 2), streams, (os.O_RDONLY, writing, writing), strict=True):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = open(  # noqa: SIM115
        2, "w", buffering=1, closefd=False, errors="backslashreplace"
    )
    # The path as the interpreter builds it: the script's folder (the working
    # directory for -m) first, then PYTHONPATH, then the rest.
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    script = os.path.join(cwd, args[0])
    first = cwd if args[0] == "-m" else os.path.dirname(script)
    sys.path[:] = [first, *paths, *(p for p in sys.path if p not in paths and p != first)]
    status: Any = 0
    try:
        if args[0] == "-m":
            sys.argv = ["-m", *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(args)
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        status = exc.code
    except BaseException:
        traceback.print_exc()
        status = 1
    # What the interpreter runs at exit (a forked process leaves by os._exit).
    atexit._run_exitfuncs()
    raise SystemExit(status)
