"""Where an instrumentation plugs into novaque: nothing, until one is installed.

:mod:`novaque.otel` sets these two callbacks when it is instrumented and
resets them to ``None`` when it is not. The core reads one of them on its hot
paths, once per call (one attribute read), and does nothing more while it is
``None``: without an instrumentation, tracing costs that read and no import.

- :data:`publish` wraps every :meth:`~novaque.Client.publish` and
  :meth:`~novaque.Client.publish_many` call of both twins
  (``Publishing._publish``, :mod:`novaque._publishing`): it gets the
  topic, how many bodies, whether the call is a batch (``publish_many``),
  the caller's headers (not validated yet) and ``write``, which publishes
  with the headers it is given (the caller's, or a copy carrying the trace
  context) and returns the ids.
- :data:`process` wraps every handler call (``_settle.outcome_of``, used by
  the thread and asyncio consumers and :func:`novaque.testing.drain`): it
  gets the message and ``run``, which calls (or awaits) the handler and
  raises what the handler raised; the hook must let that exception through.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from novaque.models import Message

__all__ = ["ProcessHook", "PublishHook", "process", "publish"]


class PublishHook(Protocol):
    def __call__(
        self,
        topic: str,
        count: int,
        batch: bool,
        headers: Mapping[str, str] | None,
        write: Callable[[Mapping[str, str] | None], list[int]],
        /,
    ) -> list[int]: ...


class ProcessHook(Protocol):
    def __call__(self, msg: Message, run: Callable[[], object], /) -> None: ...


#: Called around each publish call; None: nothing is instrumented.
publish: PublishHook | None = None
#: Called around each handler call; None: nothing is instrumented.
process: ProcessHook | None = None
