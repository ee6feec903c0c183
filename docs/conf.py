"""Sphinx configuration of novaque's documentation site (``make docs``).

The guide pages are the Markdown files of this folder (MyST); the API
reference (``api/``) is generated from the docstrings by autodoc. ``make
docs`` builds afresh with ``-W --keep-going -n``: any warning, a broken
cross reference included, fails the build.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # novaque from this checkout, installed or not

import sqlalchemy.orm  # noqa: E402

import novaque  # noqa: E402
import novaque._publishing  # noqa: E402

# The client's publish methods name SQLAlchemy's ORM Session in their
# signatures, imported only for type checking (an application that does not
# use the ORM does not load it): autodoc evaluates those annotations, so it is
# given the name here.
novaque._publishing.Session = sqlalchemy.orm.Session  # type: ignore[attr-defined]

project = "novaque"
author = "novaque's authors"
copyright = "novaque's authors"
release = version = novaque.__version__

extensions = ["sphinx.ext.autodoc", "myst_parser"]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Every cross reference to novaque's own objects must resolve. Those to the
# objects of the standard library and of the libraries novaque works with
# would need their inventories, fetched over the network at each build: they
# are shown as plain text instead.
nitpicky = True
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(collections|datetime|django|kombu|logging|opentelemetry|os|pathlib|sqlalchemy|typing)"
        r"(\..*)?",
    )
]

autodoc_member_order = "groupwise"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True

# The guide's links to its own headings ("guide.md#asyncio"), as GitHub writes
# them: every heading of levels 1 to 3 gets an anchor.
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = f"novaque {release}"
html_theme_options = {
    "description": "Durable topic → channel message queues in your relational database",
    "fixed_sidebar": True,
}
html_show_sourcelink = False


#: Classes that novaque makes for you (``Client.subscribe``, ``Client.claim``):
#: their constructors' parameters are no part of the API.
MADE_BY_NOVAQUE = {"novaque.Consumer", "novaque.Message", "novaque.aio.AsyncConsumer"}


def _no_constructor(
    app: Any, what: str, name: str, obj: Any, options: Any, signature: str, annotation: str
) -> tuple[str, None] | None:
    if what == "class" and name in MADE_BY_NOVAQUE:
        return "", None
    return None


def setup(app: Any) -> None:
    app.connect("autodoc-process-signature", _no_constructor)
