"""Commands the tests run (``python -m MODULE ...``, ``python -c CODE ...``,
``python SCRIPT ...``) without paying for the interpreter's start each time.

:func:`run` is ``subprocess.run([sys.executable, *args], capture_output=True,
check=False, ...)`` and :func:`popen` is ``subprocess.Popen([sys.executable,
*args], ...)``: the command runs in a process of its own, with its own working
directory, environment, standard streams, signals and exit status. The
process is forked from a server that imported novaque, SQLAlchemy, Alembic,
Django, kombu and Celery once (``multiprocessing``'s forkserver, one per test
process), so a command costs its own work instead of a second or two of
imports. What a fork cannot give starts a real interpreter instead: a
``PYTHON*`` variable the server was not started with, a ``PYTHONPATH`` folder
with another copy of a module the server imported, an interpreter option.
"""

from __future__ import annotations

import atexit
import locale
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

#: What the server imports before it forks (a module it lacks is skipped).
#: Libraries only: a module that reads the environment when imported would
#: keep the server's.
PRELOAD = [
    "tests._preloaded",
    "tests._procs",
    "novaque.cli",
    "novaque.django",
    "novaque.kombu",
    "alembic.config",
    "alembic.command",
    "django.core.management",
    "django.db.models",
    "kombu",
    "celery",
    "celery.bin.celery",
    "pytest",
]

#: Forks from the preloaded server (``Queue``, ``Barrier``...); see :func:`process`.
context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(PRELOAD)
#: The environment the server started with (on first use).
_server_env: dict[str, str] | None = None


def _stop_server() -> None:
    """At exit, stop the server and wait for it: its CPU time (and its
    commands') then counts in this process's children, as a subprocess's
    would, for ``time make test``."""
    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


atexit.register(_stop_server)


def _forkable(args: Sequence[str], env: Mapping[str, str]) -> bool:
    global _server_env
    if _server_env is None:
        _server_env = dict(os.environ)
    if not args or (args[0].startswith("-") and args[0] not in ("-m", "-c")):
        return False
    python = {k for k in (*env, *_server_env) if k.startswith("PYTHON") and k != "PYTHONPATH"}
    if any(env.get(k) != _server_env.get(k) for k in python):
        return False
    # A folder the server's path lacks may be added, unless it holds another
    # copy of a module the server imported.
    imported = {name.partition(".")[0] for name in (*sys.modules, *PRELOAD)}
    entries = [e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e not in sys.path]
    return not any(_modules_in(entry) & imported for entry in entries if os.path.isdir(entry))


def _modules_in(folder: str) -> set[str]:
    """The top-level modules and packages a folder of the path offers."""
    found = set()
    for path in Path(folder).iterdir():
        if path.is_dir() or path.suffix in (".py", ".pyc", ".so", ".pth"):
            found.add(path.name.partition(".")[0])
    return found


def process(target: Callable[..., object], args: Sequence[object]) -> Any:
    """``multiprocessing.get_context("spawn").Process(target=target, args=args)``,
    forked from the preloaded server: for tests that race processes. As in a
    spawned process, the interpreter's exit follows ``target`` (threads
    joined, atexit functions run)."""
    return context.Process(target=_target_then_exit, args=(target, tuple(args)))


def _target_then_exit(target: Callable[..., object], args: tuple[object, ...]) -> None:
    try:
        target(*args)
    finally:
        _exit_work()


def _exit_work() -> None:
    """What the interpreter does at exit (a forked process leaves by os._exit):
    wait for the threads that are not daemons, run the atexit functions."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()


def run(
    args: Sequence[str],
    *,
    cwd: str | Path,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    stdin: str | Path | None = None,
    timeout: float,
    text: bool = True,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run([sys.executable, *args], ...)`` with the output captured.

    ``input`` is fed to standard input; ``stdin`` names a file (a terminal)
    to read it from instead."""
    env = dict(os.environ if env is None else env)
    command = [sys.executable, *args]
    if not _forkable(args, env):
        with open(stdin if stdin is not None else os.devnull, "rb") as source:
            return subprocess.run(
                command,
                cwd=cwd,
                env=env,
                input=input.encode() if isinstance(input, str) else input,
                stdin=None if input is not None else source,
                capture_output=True,
                text=text,
                timeout=timeout,
                check=False,
            )
    with tempfile.TemporaryDirectory(prefix="novaque-run-") as folder:
        source = str(stdin) if stdin is not None else os.path.join(folder, "in")
        if stdin is None:
            Path(source).write_bytes(input.encode() if isinstance(input, str) else input or b"")
        out, err = (os.path.join(folder, name) for name in ("out", "err"))
        process = context.Process(
            target=_main, args=(list(args), str(cwd), env, [source, out, err])
        )
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(command, timeout)
        captured = Path(out).read_bytes(), Path(err).read_bytes()
    if text:
        return subprocess.CompletedProcess(command, process.exitcode, *map(_text, captured))
    return subprocess.CompletedProcess(command, process.exitcode, *captured)


def popen(
    args: Sequence[str],
    *,
    cwd: str | Path,
    env: Mapping[str, str] | None = None,
    stdout: IO[Any] | int | None = None,
    stderr: int | None = None,
    text: bool = False,
) -> Any:
    """``subprocess.Popen([sys.executable, *args], ...)``, started from the
    preloaded server when it can be: a :class:`Forked` then (``pid``,
    ``returncode``, ``poll``, ``wait``, ``communicate``, ``send_signal``,
    ``terminate``, ``kill``).

    ``stdout``: ``None`` (this process's output, where pytest captures it),
    ``DEVNULL``, ``PIPE`` (for ``communicate``) or an open file;
    ``stderr``: ``None``, ``PIPE`` or ``STDOUT``.
    """
    env = dict(os.environ if env is None else env)
    if not _forkable(args, env):
        return subprocess.Popen(
            [sys.executable, *args], cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text
        )
    return Forked(list(args), str(cwd), env, stdout, stderr, text)


class Forked:
    """A command forked from the preloaded server, seen as a ``subprocess.Popen``."""

    def __init__(
        self,
        args: list[str],
        cwd: str,
        env: dict[str, str],
        stdout: IO[Any] | int | None,
        stderr: int | None,
        text: bool,
    ) -> None:
        self.args = [sys.executable, *args]
        self._text = text
        folder = tempfile.mkdtemp(prefix="novaque-popen-")
        self._cleanup = weakref.finalize(self, shutil.rmtree, folder, True)
        if stdout == subprocess.DEVNULL:
            out = os.devnull
        elif stdout is None or stdout == subprocess.PIPE:
            out = os.path.join(folder, "out")
        else:
            assert not isinstance(stdout, int)
            out = stdout.name  # an open file: appended to, as the inherited one would be
        err = out if stderr == subprocess.STDOUT else os.path.join(folder, "err")
        #: What the process wrote to a stream that is not the caller's.
        self._captured = {path: b"" for path in (out, err) if os.path.dirname(path) == folder}
        self._echo = [(out, sys.stdout)] if stdout is None else []
        if stderr is None:
            self._echo.append((err, sys.stderr))
        self._out, self._err = out, err
        self._process = context.Process(target=_main, args=(args, cwd, env, [os.devnull, out, err]))
        self._process.start()
        assert self._process.pid is not None
        self.pid: int = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        if self._process.exitcode is not None:
            self._ended()
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            assert timeout is not None
            raise subprocess.TimeoutExpired(self.args, timeout)
        self._ended()
        return self._process.exitcode

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        self.wait(timeout)
        out, err = (self._captured.get(path) for path in (self._out, self._err))
        if self._text:
            return tuple(None if b is None else _text(b) for b in (out, err))  # type: ignore[return-value]
        return out, err

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _ended(self) -> None:
        """Once: read what the command wrote; what it wrote to an inherited
        stream reaches this process's."""
        if not self._cleanup.alive:
            return
        for path in self._captured:
            if os.path.exists(path):
                self._captured[path] = Path(path).read_bytes()
        for path, stream in self._echo:
            stream.write(_text(self._captured[path]))
        self._cleanup()


def _text(data: bytes) -> str:
    """Decoded as ``subprocess`` decodes with ``text=True`` (universal newlines)."""
    decoded = data.decode(locale.getpreferredencoding(False))
    return decoded.replace("\r\n", "\n").replace("\r", "\n")


def _main(args: list[str], cwd: str, env: dict[str, str], streams: list[str]) -> None:
    """In the forked process: become ``python ARGS`` in ``cwd`` with ``env``,
    its standard streams read from and written to ``streams``."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    source, out, err = streams
    opened = [
        os.open(source, os.O_RDONLY),
        os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND),
    ]
    opened.append(opened[1] if err == out else os.open(err, os.O_WRONLY | os.O_CREAT | os.O_APPEND))
    for fd, was in enumerate(opened):
        os.dup2(was, fd)
    for was in set(opened):
        os.close(was)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = open(  # noqa: SIM115
        2, "w", buffering=1, closefd=False, errors="backslashreplace"
    )
    # The path as the interpreter builds it: the script's folder (the working
    # directory for -m and -c) first, then PYTHONPATH, then the rest.
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    script = os.path.join(cwd, args[0])
    first = cwd if args[0] in ("-m", "-c") else os.path.dirname(script)
    sys.path[:] = [first, *paths, *(p for p in sys.path if p not in paths and p != first)]
    status: Any = 0
    try:
        if args[0] == "-m":
            sys.argv = ["-m", *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(args)
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        status = exc.code
    except KeyboardInterrupt:
        traceback.print_exc()
        status = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        status = 1
    _exit_work()
    if status == -signal.SIGINT:  # interrupted: the interpreter dies of the signal
        sys.stdout.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(status)
