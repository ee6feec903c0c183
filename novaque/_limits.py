"""Limits of what a message carries and of what a text column stores.

Shared by the checks of user input (:mod:`novaque._validate`) and those of
channel filters (:mod:`novaque._filters`, :mod:`novaque._cel`), which
:mod:`novaque._validate` calls: this module imports nothing of novaque.
"""

from __future__ import annotations

import re

__all__ = ["MAX_HEADERS", "MAX_HEADERS_BYTES", "UNSTORABLE"]

#: Headers as JSON, in UTF-8 bytes: what a TEXT column holds on every backend
#: (MySQL/MariaDB TEXT: 65,535 bytes).
MAX_HEADERS_BYTES = 65_535
#: Most headers (keys) a message may carry: what bounds a filter's macros over
#: ``headers``, and so what a filter costs each publish.
MAX_HEADERS = 128

#: What no backend stores in text: NUL (PostgreSQL refuses it) and lone
#: surrogates (not encodable as UTF-8, which every driver sends).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
