"""novaque's operations: module-level functions of a sync ``Connection``.

Each operation takes ``(conn, dialect, ...)`` and everything else it needs as
parameters (the time ``now`` in epoch microseconds included: no operation reads
a clock), runs its statements on ``conn`` and returns its result together with
what must happen once the transaction commits, as data (:class:`Effects`). An
operation never touches a client's caches, counters buffer or wake-ups: the
client applies the effects after the commit. So the same operations run on a
sync connection and, through ``AsyncConnection.run_sync``, on an async one.
"""

from __future__ import annotations

import dataclasses

from novaque._stats import Tally

__all__ = ["Batch", "Effects"]


@dataclasses.dataclass(frozen=True)
class Effects:
    """What a committed operation leaves for its client to do.

    ``tally``: counter deltas to add to the stats buffer; ``wake``: topics whose
    local consumers to wake; ``topic_ids``: topic ids learned in the
    transaction, to cache (only once it committed); ``no_channel``: a topic a
    message was stored for with no channel to deliver it to (worth a warning);
    ``warnings``: what to log at WARNING (a channel filter that failed).
    """

    tally: Tally = dataclasses.field(default_factory=Tally)
    wake: tuple[str, ...] = ()
    topic_ids: tuple[tuple[str, int], ...] = ()
    no_channel: str | None = None
    warnings: tuple[str, ...] = ()


#: What a batch operation returns: how many rows it saw (a batch that sees fewer
#: than its size is the last), how many it changed, and its effects.
Batch = tuple[int, int, Effects]
