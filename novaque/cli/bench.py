"""``novaque bench``: the benchmarks, run from a source checkout.

The benchmarks live in the repository's ``benchmarks/`` folder (they are not
part of the installed package); this command finds it next to the package and
hands the arguments to ``benchmarks/run.py``'s ``main``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

from novaque.cli._common import CommandError, Context


def register(commands: Any) -> None:
    """Add ``bench`` to the parser."""
    bench = commands.add_parser(
        "bench",
        help="run the benchmarks (from a source checkout)",
        description="Run benchmarks/run.py from the source checkout; every argument after "
        "`bench` is passed on (try `novaque bench --help`).",
        add_help=False,
    )
    bench.set_defaults(run=run_bench, passthrough=True)


def source_root() -> Path:
    """The checkout the package was imported from (the folder above ``novaque/``)."""
    return Path(__file__).resolve().parent.parent.parent


def run_bench(args: argparse.Namespace, context: Context) -> int:
    root = source_root()
    if not (root / "benchmarks" / "run.py").is_file():
        raise CommandError(
            "the benchmarks run from a source checkout of novaque (benchmarks/run.py was not "
            f"found in {root}): clone the repository and run `make bench` there"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    module = importlib.import_module("benchmarks.run")
    status: int = module.main(list(args.extra))
    return status
