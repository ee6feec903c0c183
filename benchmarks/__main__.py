"""``python -m benchmarks`` is ``python -m benchmarks.run``."""

from __future__ import annotations

import sys

from benchmarks.run import main

sys.exit(main(sys.argv[1:]))
