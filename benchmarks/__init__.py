"""novaque's benchmarks: the raw-SQL floor and the workloads W1a-W8.

Run them with ``novaque bench`` or ``python -m benchmarks.run`` (see
``benchmarks/README.md``). Every figure is reported next to the floor measured
in the same run on the same database, because the machines are shared and
noisy: only ratios mean something from one run to the next.
"""

from __future__ import annotations
