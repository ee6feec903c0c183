"""The API reference (docs/api/, built by ``make docs``) documents every public name.

Every name a public module lists in ``__all__`` must have a docstring (for
data, a ``#:`` comment above it) and must appear, with that text, in the
reference that Sphinx builds from docs/: adding a name to ``__all__`` without
documenting it, or without listing it on its module's page, fails here. The
site is built once for the module, in a process of its own, with ``make
docs``'s configuration (broken cross references are warnings, and any
warning fails).
"""

from __future__ import annotations

import importlib
import inspect
import io
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from sphinx import addnodes, deprecation
from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer

from tests import _preloaded

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: The public modules, each documented on a page of docs/api/.
MODULES = (
    "novaque",
    "novaque.aio",
    "novaque.testing",
    "novaque.testing.plugin",
    "novaque.django",
    "novaque.kombu",
    "novaque.otel",
    "novaque.admin",
    "novaque.broker",
)


def public_names(module: ModuleType) -> list[str]:
    """``__all__``, or the module's attributes not starting with ``_``."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return list(names)


def docstring(module: ModuleType, name: str) -> str:
    """The documentation of ``module.name``: a class's or a function's own
    docstring, or the ``#:`` comment above a data name in the module's source."""
    attr_docs = ModuleAnalyzer.for_module(module.__name__).find_attr_docs()
    if ("", name) in attr_docs:
        return "\n".join(attr_docs["", name]).strip()
    obj = getattr(module, name)
    if inspect.isclass(obj) or inspect.isroutine(obj):
        return (obj.__doc__ or "").strip()
    return ""  # data without a comment: a str's docstring would be str's own


def every_public_name() -> list[str]:
    return [
        f"{mod}.{name}" for mod in MODULES for name in public_names(importlib.import_module(mod))
    ]


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_has_a_docstring(module_name: str) -> None:
    module = importlib.import_module(module_name)
    names = public_names(module)
    assert names, f"{module_name} has no public name"
    undocumented = [n for n in names if not docstring(module, n)]
    assert undocumented == [], f"{module_name}: no docstring for {undocumented}"


def build_reference(out: str) -> None:
    """Build docs/ into ``out`` and write ``out/reference.json``: what the build
    warned of, and the text the reference shows under each object it documents.

    Run in a process of its own (see :func:`reference`): autodoc changes the
    objects it documents (their ``__signature__``, for the defaults as written
    in the source), which tests running after it in the same process would see.
    """
    told = io.StringIO()
    with warnings.catch_warnings():
        # Sphinx's notices to its extensions (MyST's) of its API's deprecations:
        # about their code, not about these docs.
        for name in dir(deprecation):
            if name.startswith("RemovedInSphinx"):
                warnings.simplefilter("ignore", getattr(deprecation, name))
        app = Sphinx(
            srcdir=DOCS,
            confdir=DOCS,
            outdir=Path(out) / "html",
            doctreedir=Path(out) / "doctrees",
            buildername="html",
            status=io.StringIO(),
            warning=told,
            freshenv=True,
        )
        app.build()
    described: dict[str, str] = {}
    for docname in sorted(d for d in app.env.found_docs if d.startswith("api/")):
        for desc in app.env.get_doctree(docname).findall(addnodes.desc):
            content = [c for c in desc.children if isinstance(c, addnodes.desc_content)]
            text = " ".join(c.astext() for c in content).strip()
            for signature in desc.children:
                if isinstance(signature, addnodes.desc_signature):
                    described.update(dict.fromkeys(signature["ids"], text))
    result = {
        "status": app.statuscode,
        "told": re.sub(r"\x1b\[[0-9;]*m", "", told.getvalue()),  # no colours
        "described": described,
    }
    (Path(out) / "reference.json").write_text(json.dumps(result))


@dataclass
class Reference:
    #: Where the site was built (``html/``).
    out: Path
    #: What the build warned of.
    told: str
    #: The text the reference shows under each object it documents, by name.
    described: dict[str, str]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    out = tmp_path_factory.mktemp("docs")
    code = "import sys; from tests.test_api_reference import build_reference as b; b(sys.argv[1])"
    done = _preloaded.run(["-c", code, str(out)], cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((out / "reference.json").read_text())
    assert result["status"] == 0, result["told"]
    return Reference(out, result["told"], result["described"])


def test_the_site_builds_without_a_warning(reference: Reference) -> None:
    """What ``make docs`` fails on: a broken cross reference, a malformed
    docstring, a heading anchor the Markdown pages link to and lack."""
    assert reference.told == ""
    index = (reference.out / "html" / "index.html").read_text()
    pages = [p.stem for p in DOCS.glob("*.md") if p.stem != "index"]
    assert pages
    for page in [*pages, "api/index"]:
        assert f'href="{page}.html"' in index, f"the site's index does not link {page}"


def test_every_public_name_is_in_the_reference(reference: Reference) -> None:
    names = every_public_name()
    assert len(names) > 50
    missing = [n for n in names if not reference.described.get(n)]
    assert missing == [], f"not in docs/api/ (or shown without their docstring): {missing}"
    # Methods are there too, under their class.
    assert reference.described["novaque.aio.AsyncClient.publish"]
