"""Channel filters: expressions in Google's Common Expression Language (CEL),
through ``cel-python`` (the ``novaque[cel]`` extra).

A filter sees three variables: ``headers`` (``map(string, string)``),
``group`` (``string``, ``""`` when the message has none) and ``topic``
(``string``), and must be boolean. :func:`program` compiles and checks an
expression once: its type, its depth and the most it can cost, counted in
evaluation steps (:mod:`novaque._cel`, which holds everything that needs
cel-python); programs, and refusals, are cached by their text, so each
setting is checked once per process and a setting changed elsewhere (a new
text) is checked when first met. :func:`matches` evaluates one within a
budget of :data:`MAX_STEPS` steps, failing closed.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from novaque._limits import UNSTORABLE
from novaque.errors import InvalidFilter

if TYPE_CHECKING:
    from novaque._cel import Program

__all__ = ["MAX_COST", "MAX_STEPS", "VARIABLES", "check", "cost", "evaluate", "matches", "program"]

#: The names a filter may use.
VARIABLES = frozenset({"headers", "group", "topic"})
#: Longest filter stored (it is TEXT on every backend; this keeps it readable).
MAX_FILTER_CHARS = 4000
#: Most evaluation steps a filter may cost, by its static estimate: 0.1 to
#: 0.2 s of one core (a step takes 5 to 8 microseconds of cel-python).
MAX_COST = 20_000
#: Steps one evaluation may take before it stops and counts as false: a
#: second line behind :data:`MAX_COST`, which no accepted filter reaches.
MAX_STEPS = MAX_COST


def _celpy() -> None:
    try:
        import celpy  # noqa: F401
    except ImportError:  # pragma: no cover - the dev extra installs it
        raise InvalidFilter("channel filters need cel-python: pip install 'novaque[cel]'") from None


@functools.lru_cache(maxsize=1024)
def _compiled(text: str) -> Program | InvalidFilter:
    """The checked program of ``text``, or why it is refused (cached too: a
    filter stored by an older novaque is checked once, not at every publish)."""
    _celpy()
    from novaque import _cel

    try:
        return _cel.compile_filter(text, MAX_COST)
    except _cel.Refused as exc:
        return InvalidFilter(f"filter {_shown(text)} {exc}")


def program(text: str) -> Program:
    """The compiled, checked program of ``text``; :class:`InvalidFilter` if bad."""
    compiled = _compiled(text)
    if isinstance(compiled, InvalidFilter):
        raise InvalidFilter(str(compiled))
    return compiled


def cost(text: str) -> int:
    """The most evaluation steps ``text`` can take (:class:`InvalidFilter` if bad)."""
    return int(program(text).cost)


def check(text: object) -> str | None:
    """A filter as stored: None for ``""`` (no filter), else the checked text."""
    if not isinstance(text, str):
        raise TypeError(f"filter must be a str, got {type(text).__name__}")
    if text == "":
        return None
    if len(text) > MAX_FILTER_CHARS:
        raise InvalidFilter(
            f"filter is {len(text)} characters long; the limit is {MAX_FILTER_CHARS}"
        )
    bad = UNSTORABLE.search(text)
    if bad is not None:
        what = "NUL" if bad.group() == "\x00" else "a lone surrogate"
        raise InvalidFilter(
            f"filter {_shown(text)} holds {what} ({bad.group()!r}) at index {bad.start()}, "
            "which no database stores as text; a filter may not contain NUL or lone "
            "surrogates (U+D800-U+DFFF): in a string literal, write NUL as \\x00"
        )
    program(text)
    return text


def evaluate(
    text: str, headers: Mapping[str, str], group: str | None, topic: str
) -> tuple[bool | str, int]:
    """The verdict of :func:`matches` and the evaluation steps it took."""
    try:
        compiled = program(text)
    except InvalidFilter as exc:  # stored by an older novaque, or cel-python missing
        return str(exc), 0
    from celpy import celtypes

    from novaque import _cel

    result, steps = compiled.evaluate(_context(headers, group or "", topic), MAX_STEPS)
    if isinstance(result, _cel.OverBudget):
        return (
            f"filter {_shown(text)} stopped after {MAX_STEPS:,} evaluation steps, its budget",
            steps,
        )
    if isinstance(result, Exception):
        return f"filter {_shown(text)} failed: {result}", steps
    if not isinstance(result, celtypes.BoolType):
        return f"filter {_shown(text)} gave {result!r}, not a boolean", steps
    return bool(result), steps


def matches(text: str, headers: Mapping[str, str], group: str | None, topic: str) -> bool | str:
    """True or False, or (failing closed) the text of the error that made it false."""
    return evaluate(text, headers, group, topic)[0]


def _context(headers: Mapping[str, str], group: str, topic: str) -> dict[str, Any]:
    from celpy import celtypes

    return {
        "headers": celtypes.MapType(
            {celtypes.StringType(k): celtypes.StringType(v) for k, v in headers.items()}
        ),
        "group": celtypes.StringType(group),
        "topic": celtypes.StringType(topic),
    }


def _shown(text: str) -> str:
    """``text`` quoted for a message, shortened past 100 characters."""
    return repr(text if len(text) <= 100 else text[:97] + "...")
