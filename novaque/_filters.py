"""Channel filters: expressions in Google's Common Expression Language (CEL),
through ``cel-python`` (the ``novaque[cel]`` extra).

A filter sees three variables: ``headers`` (``map(string, string)``),
``group`` (``string``, ``""`` when the message has none) and ``topic``
(``string``), and must be boolean. :func:`program` compiles and checks an
expression once; programs are cached by their text, so each setting is
compiled once per process and a setting changed elsewhere (a new text) is
compiled when first met. :func:`matches` evaluates one, failing closed.

cel-python has no static type checker: :func:`program` checks what can be
known from the expression's tree (every name is one of the three variables or
bound by a macro; the outermost operation yields a boolean) and, where the
tree cannot tell, evaluates it once over a message with no headers and no
group: a result other than a boolean or an error is refused.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

from novaque.errors import InvalidFilter

__all__ = ["VARIABLES", "check", "matches", "program"]

#: The names a filter may use.
VARIABLES = frozenset({"headers", "group", "topic"})
#: Macros whose first argument names a variable bound inside them.
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
#: Methods and functions that yield a boolean.
_BOOLEAN_CALLS = frozenset(
    {"startsWith", "endsWith", "contains", "matches", "all", "exists", "exists_one", "has"}
)
#: Longest filter stored (it is TEXT on every backend; this keeps it readable).
MAX_FILTER_CHARS = 4000


def _celpy() -> Any:
    try:
        import celpy
    except ImportError:  # pragma: no cover - the dev extra installs it
        raise InvalidFilter("channel filters need cel-python: pip install 'novaque[cel]'") from None
    return celpy


@functools.lru_cache(maxsize=1024)
def program(text: str) -> Any:
    """The compiled, checked program of ``text``; :class:`InvalidFilter` if bad."""
    celpy = _celpy()
    env = celpy.Environment()
    try:
        tree = env.compile(text)
    except celpy.CELParseError as exc:
        raise InvalidFilter(f"filter {text!r} does not parse: {_parser_text(exc)}") from None
    unknown = sorted(set(_names(tree)) - VARIABLES - set(_bound(tree)))
    if unknown:
        raise InvalidFilter(
            f"filter {text!r} uses {', '.join(unknown)}: a filter knows only "
            "headers (map of string to string), group (string) and topic (string)"
        )
    compiled = env.program(tree)
    boolean = _boolean(tree)
    if boolean is None:  # the tree cannot tell: try it on an empty message
        result = _evaluate(compiled, {}, "", "")
        boolean = isinstance(result, (celpy.celtypes.BoolType, Exception))
    if not boolean:
        raise InvalidFilter(f"filter {text!r} is not boolean: it must be true or false")
    return compiled


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
    from novaque._validate import _UNSTORABLE  # _validate imports this module

    bad = _UNSTORABLE.search(text)
    if bad is not None:
        what = "NUL" if bad.group() == "\x00" else "a lone surrogate"
        raise InvalidFilter(
            f"filter {_shown(text)} holds {what} ({bad.group()!r}) at index {bad.start()}, "
            "which no database stores as text; a filter may not contain NUL or lone "
            "surrogates (U+D800-U+DFFF): in a string literal, write NUL as \\x00"
        )
    program(text)
    return text


def matches(text: str, headers: Mapping[str, str], group: str | None, topic: str) -> bool | str:
    """True or False, or (failing closed) the text of the error that made it false."""
    try:
        compiled = program(text)
    except InvalidFilter as exc:  # stored by an older novaque, or cel-python missing
        return str(exc)
    result = _evaluate(compiled, headers, group or "", topic)
    if isinstance(result, Exception):
        return f"filter {text!r} failed: {result}"
    if not isinstance(result, _celpy().celtypes.BoolType):
        return f"filter {text!r} gave {result!r}, not a boolean"
    return bool(result)


def _evaluate(compiled: Any, headers: Mapping[str, str], group: str, topic: str) -> Any:
    """The result of ``compiled`` for one message, or the exception it raised."""
    celtypes = _celpy().celtypes
    activation = {
        "headers": celtypes.MapType(
            {celtypes.StringType(k): celtypes.StringType(v) for k, v in headers.items()}
        ),
        "group": celtypes.StringType(group),
        "topic": celtypes.StringType(topic),
    }
    try:
        return compiled.evaluate(activation)
    except Exception as exc:  # cel-python raises or returns its CELEvalError
        return exc


def _parser_text(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _subtrees(tree: Any) -> Iterator[Any]:
    yield from tree.iter_subtrees()


def _names(tree: Any) -> Iterator[str]:
    """Every name the expression reads (not methods, functions or fields)."""
    for node in _subtrees(tree):
        if node.data == "ident":
            yield str(node.children[0])


def _bound(tree: Any) -> Iterator[str]:
    """Names bound by macros (``headers.exists(k, ...)`` binds ``k``)."""
    for node in _subtrees(tree):
        if node.data == "member_dot_arg" and str(node.children[1]) in _MACROS:
            args = node.children[2] if len(node.children) > 2 else None
            if args is not None and args.children:
                names = [n for n in _subtrees(args.children[0]) if n.data == "ident"]
                if names:
                    yield str(names[0].children[0])


def _boolean(tree: Any) -> bool | None:
    """Whether the expression's outermost operation yields a boolean (None: unknown)."""
    from lark import Token, Tree

    node = tree
    while isinstance(node, Tree) and len(node.children) == 1:
        child = node.children[0]
        if not isinstance(child, Tree):
            break
        node = child
    if not isinstance(node, Tree):
        return None
    kind = node.data
    if kind in ("conditionalor", "conditionaland", "relation"):
        return True  # ||, && and comparisons (one child would have been skipped)
    if kind == "expr" and len(node.children) == 3:  # c ? a : b
        branches = [_boolean(node.children[1]), _boolean(node.children[2])]
        return False if False in branches else (True if all(branches) else None)
    if kind == "unary":
        first = node.children[0]
        return isinstance(first, Tree) and first.data == "unary_not"
    if kind == "literal":
        token = node.children[0]
        return isinstance(token, Token) and str(token) in ("true", "false")
    if kind == "member_dot_arg":
        return True if str(node.children[1]) in _BOOLEAN_CALLS else None
    if kind == "ident_arg":
        return True if str(node.children[0]) in _BOOLEAN_CALLS else None
    # Arithmetic, lists, maps, a variable, a header (a string): never booleans.
    if kind in (
        "addition",
        "multiplication",
        "list_lit",
        "map_lit",
        "ident",
        "member_index",
        "member_dot",
    ):
        return False
    return None


def _shown(text: str) -> str:
    """``text`` quoted for a message, shortened past 100 characters."""
    return repr(text if len(text) <= 100 else text[:97] + "...")
