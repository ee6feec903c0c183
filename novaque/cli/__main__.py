"""``python -m novaque.cli``: the same as the ``novaque`` command."""

from __future__ import annotations

import sys

from novaque.cli import main

sys.exit(main())
