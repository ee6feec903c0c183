"""novaque's use of cel-python for channel filters: what a filter is, known
before it runs (its type, its depth and the most it can cost), and an
evaluator that counts what it spends. Imported only where filters are used:
cel-python is an extra (``novaque[cel]``).

cel-python has neither a type checker nor a cost estimate; :class:`Checker`
is both, over its parse tree (a lark tree of ``celpy/cel.lark``). The
language it accepts is a typed subset of CEL: the operators, the standard
functions and methods of strings, bytes, numbers, lists, maps, timestamps
and durations, ``has()``, and the macros ``all``, ``exists``, ``exists_one``,
``map`` and ``filter``. Operands must have one type (``1 == 1.0`` is refused,
as cel-python cannot run it); patterns of ``matches``, time zones and the
text of ``duration()`` must be string literals, checked here (cel-python
parses durations with a regular expression whose time grows exponentially
with its input).

The cost is counted in evaluation steps, the unit :class:`Counted` counts
while it evaluates: one step per node of the parse tree evaluated,
:data:`ITERATION_STEPS` more per evaluation and per turn of a macro, and one
per :data:`CHARS_PER_STEP` characters that ``+`` builds or ``matches`` reads
(one per element of a list ``+`` builds). The estimate is an upper bound:
every node counted once, both sides of ``&&``, ``||`` and ``?:``, a macro's
body once per element of the largest list or map its range can be
(``headers``: the most keys a message may carry), and strings at their longest (a header
key or value as long as the headers can hold). Other work on a string (``==``,
``contains``) runs at C speed over at most a few hundred kilobytes, which
the characters charged for building it bound.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import celpy
import re2  # type: ignore[import-untyped]  # google-re2: cel-python's `matches`
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import Activation, Evaluator
from lark import Token, Tree

from novaque._limits import MAX_HEADERS, MAX_HEADERS_BYTES

#: Deepest parse tree accepted: cel-python evaluates recursively, about six
#: Python frames a level, and sets the recursion limit to 2500.
MAX_DEPTH = 200
#: Steps charged for each evaluation and each turn of a macro (cel-python
#: builds a new activation each time: about as long as ten nodes).
ITERATION_STEPS = 10
#: Characters (or bytes) per step charged where ``+`` builds a string and
#: where ``matches`` reads one.
CHARS_PER_STEP = 64
#: Longest topic name and group (``_validate``: 1-200 characters).
MAX_NAME = 200


class Refused(Exception):
    """Why a filter is refused (the text follows ``filter '...' ``)."""


@dataclass(frozen=True)
class Type:
    """A CEL type with, for strings, bytes, lists and maps, the largest size
    (characters, bytes, elements, entries) a value of it can have here."""

    kind: str
    args: tuple[Type, ...] = ()
    size: int = 0

    def __str__(self) -> str:
        if self.kind in ("list", "map"):
            return f"{self.kind}({', '.join(map(str, self.args))})"
        return self.kind


BOOL = Type("bool")
INT = Type("int")
UINT = Type("uint")
DOUBLE = Type("double")
NULL = Type("null")
TIMESTAMP = Type("timestamp")
DURATION = Type("duration")
#: The element of an empty list or map literal: any type.
DYN = Type("dyn")


def string(size: int) -> Type:
    return Type("string", size=size)


def bytes_(size: int) -> Type:
    return Type("bytes", size=size)


#: Sizes of the scalar results of conversions to string (``string(1.5)``).
_PRINTED = 40
_NUMBERS = ("int", "uint", "double")
_ORDERED = frozenset({"bool", "int", "uint", "double", "string", "bytes", "timestamp", "duration"})
_MAP_KEYS = frozenset({"bool", "int", "uint", "string"})
#: Nodes of one child that pass their child's value on.
_PASS = frozenset(
    {
        "expr",
        "conditionalor",
        "conditionaland",
        "relation",
        "addition",
        "multiplication",
        "unary",
        "member",
        "primary",
        "paren_expr",
    }
)
_RELATIONS = {
    "relation_lt": "<",
    "relation_le": "<=",
    "relation_gt": ">",
    "relation_ge": ">=",
    "relation_eq": "==",
    "relation_ne": "!=",
    "relation_in": "in",
}
_ARITHMETIC = {
    "addition_add": "+",
    "addition_sub": "-",
    "multiplication_mul": "*",
    "multiplication_div": "/",
    "multiplication_mod": "%",
}
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_TIMESTAMP_GETTERS = frozenset(
    {
        "getFullYear",
        "getMonth",
        "getDate",
        "getDayOfMonth",
        "getDayOfWeek",
        "getDayOfYear",
        "getHours",
        "getMinutes",
        "getSeconds",
        "getMilliseconds",
    }
)
_DURATION_GETTERS = frozenset({"getHours", "getMinutes", "getSeconds", "getMilliseconds"})
_STRING_TESTS = frozenset({"contains", "startsWith", "endsWith"})
#: What a filter may call, for the error that names something else.
FUNCTIONS = (
    "has, size, int, uint, double, string, bytes, bool, timestamp, duration, matches; "
    "the methods contains, startsWith, endsWith, matches, size, the getters of "
    "timestamps and durations (getHours, ...), and the macros all, exists, "
    "exists_one, map and filter"
)


_UNSUPPORTED = {
    "member_object": "builds a protocol buffer message, which a filter cannot",
    "dot_ident": "names a variable from the root scope (a leading dot): write the name alone",
    "dot_ident_arg": "calls a function from the root scope (a leading dot): write the name alone",
}


def same(a: Type, b: Type) -> bool:
    """Whether values of ``a`` and ``b`` can be compared (sizes aside)."""
    if a.kind == "dyn" or b.kind == "dyn":
        return True
    return a.kind == b.kind and all(same(x, y) for x, y in zip(a.args, b.args, strict=True))


def join(a: Type, b: Type) -> Type | None:
    """The type holding values of ``a`` and of ``b`` at their largest; None if none."""
    if a.kind == "dyn":
        return b
    if b.kind == "dyn":
        return a
    if a.kind != b.kind:
        return None
    args = [join(x, y) for x, y in zip(a.args, b.args, strict=True)]
    if any(arg is None for arg in args):
        return None
    return Type(a.kind, tuple(arg for arg in args if arg is not None), max(a.size, b.size))


def read(value: Type) -> int:
    """The steps charged for building (``+``) or matching a value of ``value``
    at its largest: one per :data:`CHARS_PER_STEP` characters or bytes, one
    per element of a list."""
    if value.kind in ("string", "bytes"):
        return math.ceil(value.size / CHARS_PER_STEP)
    return value.size if value.kind == "list" else 0


class Info(NamedTuple):
    """What the check knows of a subtree: its type and its cost in steps."""

    type: Type
    cost: int


Scope = Mapping[str, Type]


def depth(tree: Tree[Any]) -> int:
    """The depth of the parse tree (iterative: the tree may be very deep)."""
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((c, level + 1) for c in node.children if isinstance(c, Tree))
    return deepest


class Checker:
    """Types and costs the parse tree of ``text``; :class:`Refused` if it is
    not a well-typed filter of the subset."""

    def __init__(self, text: str, variables: Scope) -> None:
        self.text = text
        self.variables = variables

    # -- the entry point -------------------------------------------------

    def root(self, tree: Tree[Any]) -> Info:
        """The filter's type and cost: one evaluation (ITERATION_STEPS) and its tree."""
        info = self.node(tree, self.variables)
        return Info(info.type, info.cost + ITERATION_STEPS)

    # -- helpers ---------------------------------------------------------

    def source(self, tree: Tree[Any] | Token) -> str:
        """The text of ``tree`` in the filter (for error messages), shortened."""
        if isinstance(tree, Token):
            return str(tree)
        starts: list[int] = []
        ends: list[int] = []
        for node in tree.iter_subtrees():
            start, end = (getattr(node.meta, key, None) for key in ("start_pos", "end_pos"))
            if start is not None and end is not None:
                starts.append(start)
                ends.append(end)
            for token in node.children:
                if isinstance(token, Token) and token.start_pos is not None:
                    starts.append(token.start_pos)
                    ends.append(token.end_pos or token.start_pos)
        if not starts:  # cel-python's boolean literals have no position
            return " ".join(str(t) for t in tree.scan_values(lambda v: isinstance(v, Token)))
        shown = " ".join(self.text[min(starts) : max(ends)].split())
        return shown if len(shown) <= 60 else shown[:57] + "..."

    def refused(self, tree: Tree[Any] | Token, what: str) -> Refused:
        """Why the filter is refused: ``tree`` (its text quoted) ``what``."""
        return Refused(f"is invalid: `{self.source(tree)}` {what}")

    def node(self, tree: Tree[Any], scope: Scope) -> Info:
        kind = tree.data
        children = tree.children
        if kind in _PASS and len(children) == 1 and isinstance(children[0], Tree):
            inner = self.node(children[0], scope)
            return Info(inner.type, inner.cost + 1)
        method = getattr(self, f"_{kind}", None)
        if method is None:
            raise self.refused(
                tree, _UNSUPPORTED.get(kind, f"is not supported; a filter may call {FUNCTIONS}")
            )
        info: Info = method(tree, scope)
        return info

    def boolean(self, tree: Tree[Any], scope: Scope, where: str) -> Info:
        info = self.node(tree, scope)
        if info.type.kind != "bool":
            raise self.refused(tree, f"is {info.type}: {where} must be bool")
        return info

    def args(self, tree: Tree[Any] | None) -> list[Tree[Any]]:
        """The expressions of an ``exprlist`` (none when absent)."""
        if tree is None:
            return []
        return [c for c in tree.children if isinstance(c, Tree)]

    def string_literal(self, tree: Tree[Any], what: str) -> str:
        """The value of ``tree`` if it is a string literal, else refused."""
        node: Tree[Any] | Token = tree
        while isinstance(node, Tree) and node.data != "literal" and len(node.children) == 1:
            node = node.children[0]
        if isinstance(node, Tree) and node.data == "literal":
            value = literal_value(node)
            if isinstance(value, str):
                return value
        raise self.refused(tree, f"must be a string literal ({what})")

    # -- operators -------------------------------------------------------

    def _expr(self, tree: Tree[Any], scope: Scope) -> Info:
        condition, yes, no = tree.children
        test = self.boolean(condition, scope, "the condition of ?:")
        a, b = self.node(yes, scope), self.node(no, scope)
        joined = join(a.type, b.type)
        if joined is None:
            raise Refused(
                f"is invalid: the branches `{self.source(yes)}` and `{self.source(no)}` of ?: "
                f"have types {a.type} and {b.type}: they must have one type"
            )
        return Info(joined, 1 + test.cost + a.cost + b.cost)

    def _conditionalor(self, tree: Tree[Any], scope: Scope) -> Info:
        return self.logical(tree, scope, "||")

    def _conditionaland(self, tree: Tree[Any], scope: Scope) -> Info:
        return self.logical(tree, scope, "&&")

    def logical(self, tree: Tree[Any], scope: Scope, operator: str) -> Info:
        left, right = tree.children
        a = self.boolean(left, scope, f"an operand of {operator}")
        b = self.boolean(right, scope, f"an operand of {operator}")
        return Info(BOOL, 1 + a.cost + b.cost)

    def _relation(self, tree: Tree[Any], scope: Scope) -> Info:
        op_node, right = tree.children
        operator = _RELATIONS[op_node.data]
        a, b = self.node(op_node.children[0], scope), self.node(right, scope)
        cost = 2 + a.cost + b.cost  # the relation and its operator's node
        if operator == "in":
            container = b.type
            if container.kind not in ("list", "map"):
                raise self.refused(tree, f"looks in {container}: `in` needs a list or a map")
            if not same(a.type, container.args[0]):  # an element, or a key
                raise self.refused(tree, f"looks for {a.type} in {container}")
            return Info(BOOL, cost)
        if not same(a.type, b.type):
            raise self.refused(
                tree, f"compares {a.type} with {b.type}: both sides must have one type"
            )
        if operator not in ("==", "!=") and a.type.kind not in _ORDERED:
            raise self.refused(tree, f"orders {a.type} values, which have no order")
        return Info(BOOL, cost)

    def _addition(self, tree: Tree[Any], scope: Scope) -> Info:
        return self.arithmetic(tree, scope)

    def _multiplication(self, tree: Tree[Any], scope: Scope) -> Info:
        return self.arithmetic(tree, scope)

    def arithmetic(self, tree: Tree[Any], scope: Scope) -> Info:
        op_node, right = tree.children
        operator = _ARITHMETIC[op_node.data]
        a, b = self.node(op_node.children[0], scope), self.node(right, scope)
        cost = 2 + a.cost + b.cost
        result = self.arithmetic_type(operator, a.type, b.type)
        if result is None:
            raise self.refused(tree, f"has no operator {operator} for {a.type} and {b.type}")
        if operator == "+":
            cost += read(result)
        return Info(result, cost)

    @staticmethod
    def arithmetic_type(operator: str, a: Type, b: Type) -> Type | None:
        kinds = (a.kind, b.kind)
        if a.kind == b.kind and a.kind in _NUMBERS:
            if operator == "%" and a.kind == "double":
                return None
            return a
        if operator == "+":
            if a.kind == b.kind and a.kind in ("string", "bytes"):
                return Type(a.kind, size=a.size + b.size)
            if a.kind == b.kind == "list":
                joined = join(a, b)
                return None if joined is None else Type("list", joined.args, a.size + b.size)
            if kinds in (("timestamp", "duration"), ("duration", "timestamp")):
                return TIMESTAMP
            if kinds == ("duration", "duration"):
                return DURATION
        if operator == "-":
            if kinds == ("timestamp", "timestamp"):
                return DURATION
            if kinds == ("timestamp", "duration"):
                return TIMESTAMP
            if kinds == ("duration", "duration"):
                return DURATION
        return None

    def _unary(self, tree: Tree[Any], scope: Scope) -> Info:
        op_node, operand = tree.children
        info = self.node(operand, scope)
        cost = 2 + info.cost
        if op_node.data == "unary_not":
            if info.type.kind != "bool":
                raise self.refused(tree, f"negates {info.type}: `!` needs bool")
            return Info(BOOL, cost)
        if info.type.kind not in ("int", "double", "duration"):
            raise self.refused(tree, f"negates {info.type}: `-` needs int, double or duration")
        return Info(info.type, cost)

    # -- members, calls, macros ------------------------------------------

    def _member_dot(self, tree: Tree[Any], scope: Scope) -> Info:
        member, _field = tree.children
        info = self.node(member, scope)
        if info.type.kind != "map" or not same(info.type.args[0], string(0)):
            raise self.refused(
                tree, f"selects a field of {info.type}: only maps with string keys have"
            )
        return Info(info.type.args[1], 1 + info.cost)

    def _member_index(self, tree: Tree[Any], scope: Scope) -> Info:
        member, index = tree.children
        container, key = self.node(member, scope), self.node(index, scope)
        cost = 1 + container.cost + key.cost
        kind = container.type.kind
        if kind == "list" and key.type.kind in ("int", "dyn"):
            return Info(container.type.args[0], cost)
        if kind == "map" and same(key.type, container.type.args[0]):
            return Info(container.type.args[1], cost)
        if kind in ("list", "map"):
            raise self.refused(tree, f"indexes {container.type} with {key.type}")
        raise self.refused(tree, f"indexes {container.type}, which cannot be indexed")

    def _member_dot_arg(self, tree: Tree[Any], scope: Scope) -> Info:
        member, name_token, *rest = tree.children
        name = str(name_token)
        args = self.args(rest[0] if rest else None)
        if name in _MACROS:
            return self.macro(tree, name, member, args, scope)
        target = self.node(member, scope)
        infos = [self.node(arg, scope) for arg in args]
        cost = 1 + target.cost + (1 + sum(i.cost for i in infos) if rest else 0)
        result = self.method(tree, name, target.type, [i.type for i in infos], args)
        if name == "matches":
            cost += read(target.type)
        return Info(result, cost)

    def method(
        self, tree: Tree[Any], name: str, target: Type, types: list[Type], args: list[Tree[Any]]
    ) -> Type:
        kinds = [t.kind for t in types]
        if name == "size" and not types and target.kind in ("string", "bytes", "list", "map"):
            return INT
        if target.kind == "string" and name in _STRING_TESTS and kinds == ["string"]:
            return BOOL
        if target.kind == "string" and name == "matches" and kinds == ["string"]:
            self.pattern(args[0])
            return BOOL
        getters = {"timestamp": _TIMESTAMP_GETTERS, "duration": _DURATION_GETTERS}
        if name in getters.get(target.kind, ()):
            if not types:
                return INT
            if target.kind == "timestamp" and kinds == ["string"]:
                self.zone(args[0])
                return INT
        shown = ", ".join(map(str, types))
        raise self.refused(tree, f"calls {name}({shown}) on {target}, which has no such method")

    def pattern(self, tree: Tree[Any]) -> None:
        pattern = self.string_literal(tree, "a pattern built at publish could take long to run")
        error = pattern_error(pattern)
        if error is not None:
            raise self.refused(tree, f"is not a valid RE2 pattern: {error}")

    def zone(self, tree: Tree[Any]) -> None:
        zone = self.string_literal(tree, "the time zone")
        error = zone_error(zone)
        if error is not None:
            raise self.refused(tree, f"is not a time zone: {error}")

    def macro(
        self, tree: Tree[Any], name: str, member: Tree[Any], args: list[Tree[Any]], scope: Scope
    ) -> Info:
        if len(args) != 2:
            raise self.refused(
                tree, f"passes {len(args)} arguments: {name}() takes a variable and an expression"
            )
        variable = self.variable(args[0])
        if variable is None:
            raise self.refused(
                args[0], f"is not a name: {name}() takes a variable and an expression"
            )
        over = self.node(member, scope)
        kind = over.type.kind
        if kind not in ("list", "map"):
            raise self.refused(member, f"is {over.type}: {name}() runs over a list or a map")
        element = over.type.args[0]
        body = self.node(args[1], {**scope, variable: element})
        if name in ("all", "exists", "exists_one", "filter") and body.type.kind != "bool":
            raise self.refused(args[1], f"is {body.type}: the expression of {name}() must be bool")
        turns = over.type.size
        cost = 1 + over.cost + turns * (body.cost + ITERATION_STEPS)
        if name == "map":
            return Info(Type("list", (body.type,), turns), cost)
        if name == "filter":
            return Info(Type("list", (element,), turns), cost)
        return Info(BOOL, cost)

    @staticmethod
    def variable(tree: Tree[Any]) -> str | None:
        """The name ``tree`` is if it is one (``x`` in ``l.all(x, ...)``)."""
        node: Tree[Any] | Token = tree
        while isinstance(node, Tree) and len(node.children) == 1:
            if node.data == "ident":
                return str(node.children[0])
            node = node.children[0]
        return None

    def _ident(self, tree: Tree[Any], scope: Scope) -> Info:
        name = str(tree.children[0])
        if name not in scope:
            raise Refused(
                f"uses {name}: a filter knows only headers (map of string to string), "
                "group (string) and topic (string)"
            )
        return Info(scope[name], 1)

    def _ident_arg(self, tree: Tree[Any], scope: Scope) -> Info:
        name_token, *rest = tree.children
        name = str(name_token)
        args = self.args(rest[0] if rest else None)
        if name == "has":
            return self.has(tree, args, scope)
        infos = [self.node(arg, scope) for arg in args]
        cost = 1 + (1 + sum(i.cost for i in infos) if rest else 0)
        result = self.function(tree, name, [i.type for i in infos], args)
        if name == "matches":
            cost += read(infos[0].type)
        return Info(result, cost)

    def has(self, tree: Tree[Any], args: list[Tree[Any]], scope: Scope) -> Info:
        field = args[0] if len(args) == 1 else None
        while field is not None and field.data != "member_dot" and len(field.children) == 1:
            child = field.children[0]
            field = child if isinstance(child, Tree) else None
        if field is None or field.data != "member_dot":
            raise self.refused(tree, "must test one field: has(headers.name)")
        info = self.node(args[0], scope)  # types the selection (a map with string keys)
        return Info(BOOL, 2 + info.cost)

    def function(
        self, tree: Tree[Any], name: str, types: list[Type], args: list[Tree[Any]]
    ) -> Type:
        kinds = [t.kind for t in types]
        one = kinds[0] if len(kinds) == 1 else None
        if name == "size" and one in ("string", "bytes", "list", "map"):
            return INT
        if name == "matches" and kinds == ["string", "string"]:
            self.pattern(args[1])
            return BOOL
        conversions: dict[str, tuple[str, ...]] = {
            "int": ("int", "uint", "double", "string", "timestamp"),
            "uint": ("int", "uint", "double", "string"),
            "double": ("int", "uint", "double", "string"),
            "bool": ("bool", "string"),
            "bytes": ("bytes", "string"),
            "string": ("int", "uint", "double", "string", "bytes", "timestamp", "duration"),
            "timestamp": ("timestamp", "string"),
            "duration": ("duration", "string"),
        }
        if one is not None and one in conversions.get(name, ()):
            if name == "duration" and one == "string":
                self.literal_duration(args[0])
            size = types[0].size
            if name == "string":
                return string(size if one in ("string", "bytes") else _PRINTED)
            if name == "bytes":
                return bytes_(size * 4 if one == "string" else size)  # UTF-8: 4 bytes a character
            return Type(name)
        shown = ", ".join(map(str, types))
        raise self.refused(
            tree, f"calls {name}({shown}), which a filter does not know; it may call {FUNCTIONS}"
        )

    def literal_duration(self, tree: Tree[Any]) -> None:
        text = self.string_literal(
            tree, "cel-python parses a duration in a time that grows exponentially with its text"
        )
        error = duration_error(text)
        if error is not None:
            raise self.refused(tree, f"is an invalid duration: {error}")

    # -- literals ----------------------------------------------------------

    def _literal(self, tree: Tree[Any], scope: Scope) -> Info:
        token = tree.children[0]
        assert isinstance(token, Token)  # a literal's one child
        value = literal_value(tree)
        if isinstance(value, Exception):
            detail = value.args[0] if value.args else type(value).__name__
            raise self.refused(tree, f"is out of range or invalid: {detail}")
        kind = {
            "INT_LIT": INT,
            "UINT_LIT": UINT,
            "FLOAT_LIT": DOUBLE,
            "BOOL_LIT": BOOL,
            "NULL_LIT": NULL,
        }.get(token.type)
        if kind is not None:
            return Info(kind, 1)
        if token.type == "BYTES_LIT":
            return Info(bytes_(len(value)), 1)
        return Info(string(len(value)), 1)

    def _list_lit(self, tree: Tree[Any], scope: Scope) -> Info:
        items = [
            self.node(arg, scope) for arg in self.args(tree.children[0] if tree.children else None)
        ]
        element = DYN
        for item in items:
            joined = join(element, item.type)
            if joined is None:
                raise self.refused(
                    tree, f"mixes {element} and {item.type}: a list's elements must have one type"
                )
            element = joined
        cost = 1 + (1 + sum(i.cost for i in items) if tree.children else 0)
        return Info(Type("list", (element,), len(items)), cost)

    def _map_lit(self, tree: Tree[Any], scope: Scope) -> Info:
        inits = self.args(tree.children[0] if tree.children else None)
        infos = [self.node(arg, scope) for arg in inits]
        key, value = DYN, DYN
        for i in range(0, len(infos), 2):
            k, v = infos[i].type, infos[i + 1].type
            if k.kind not in _MAP_KEYS:
                raise self.refused(inits[i], f"is {k}: map keys must be bool, int, uint or string")
            joined_key, joined_value = join(key, k), join(value, v)
            if joined_key is None or joined_value is None:
                raise self.refused(
                    tree, "mixes types: a map's keys must have one type, and its values one type"
                )
            key, value = joined_key, joined_value
        cost = 1 + (1 + sum(i.cost for i in infos) if tree.children else 0)
        return Info(Type("map", (key, value), len(infos) // 2), cost)


# -- what cel-python makes of literals ---------------------------------------

_EVALUATOR = Evaluator(ast=Tree("expr", []), activation=Activation())
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # RE2 would print its error to stderr too


def literal_value(tree: Tree[Any]) -> Any:
    """The value cel-python gives a ``literal`` node, or the exception it makes."""
    try:
        value = _EVALUATOR.literal(tree)
    except Exception as exc:  # a bad unsigned literal raises
        return exc
    return value


def pattern_error(text: str) -> str | None:
    """Why ``text`` is no RE2 pattern (what ``matches`` runs); None if it is one."""
    try:
        re2.compile(text, _RE2_OPTIONS)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        return detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
    return None


def zone_error(text: str) -> str | None:
    """Why ``text`` is no time zone of the timestamp getters; None if it is one."""
    try:
        celtypes.TimestampType.tz_parse(celtypes.StringType(text))
    except Exception as exc:  # pendulum and cel-python raise their own errors
        return str(exc) or type(exc).__name__
    return None


def duration_error(text: str) -> str | None:
    """Why ``text`` is no duration; None if it is one."""
    try:
        celtypes.DurationType(text)
    except Exception as exc:  # cel-python raises ValueError, and others
        return str(exc) or type(exc).__name__
    return None


# -- evaluation within a budget ------------------------------------------------


class OverBudget(Exception):
    """An evaluation reached its budget of steps (not a cel-python error: no
    part of cel-python catches it)."""


class Budget:
    """The steps an evaluation has taken, and the most it may take."""

    __slots__ = ("limit", "steps")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.steps = 0

    def charge(self, steps: int) -> None:
        self.steps += steps
        if self.steps > self.limit:
            raise OverBudget(self.limit)


class Plan:
    """What :class:`Counted` charges at each node of one tree, found once:
    by node id, the number of subtrees, and the nodes where ``+`` builds."""

    __slots__ = ("built", "subtrees")

    def __init__(self, tree: Tree[Any]) -> None:
        self.subtrees: dict[int, int] = {}
        built: set[int] = set()
        for node in tree.iter_subtrees():
            self.subtrees[id(node)] = sum(1 for c in node.children if isinstance(c, Tree))
            if node.data == "addition" and len(node.children) == 2:
                built.add(id(node))
        self.built = frozenset(built)


class Counted(Evaluator):
    """cel-python's evaluator, charging each step to a :class:`Budget` before
    taking it. A node is evaluated either by :meth:`visit` or among its
    parent's children (:meth:`visit_children`): each is counted once."""

    def __init__(self, ast: Tree[Any], activation: Activation, budget: Budget, plan: Plan) -> None:
        super().__init__(ast, activation)
        self.budget = budget
        self.plan = plan

    def visit(self, tree: Tree[Any]) -> Any:
        self.budget.charge(1)
        result = super().visit(tree)
        if id(tree) in self.plan.built:
            self.charge_size(result)
        return result

    def visit_children(self, tree: Tree[Any]) -> list[Any]:
        subtrees = self.plan.subtrees.get(id(tree))
        if subtrees is None:  # a tree cel-python made (a call's empty argument list)
            subtrees = sum(1 for child in tree.children if isinstance(child, Tree))
        self.budget.charge(subtrees)
        results = super().visit_children(tree)
        built = self.plan.built
        for child, result in zip(tree.children, results, strict=True):
            if id(child) in built:
                self.charge_size(result)
        return results

    def charge_size(self, value: Any) -> None:
        """Charge a string or bytes by its length, a list by its elements."""
        if isinstance(value, (str, bytes)):
            self.budget.charge(len(value) // CHARS_PER_STEP)
        elif isinstance(value, list):
            self.budget.charge(len(value))

    def method_eval(self, object: Any, method_ident: Token, exprlist: Any = None) -> Any:
        if method_ident == "matches" and isinstance(object, str):
            self.charge_size(object)
        return super().method_eval(object, method_ident, exprlist)

    def function_eval(self, name_token: Token, exprlist: Any = None) -> Any:
        if name_token == "matches" and isinstance(exprlist, list) and exprlist:
            self.charge_size(exprlist[0])
        return super().function_eval(name_token, exprlist)

    def set_activation(self, values: Any) -> Evaluator:
        """Each evaluation and each turn of a macro: a new activation."""
        self.budget.charge(ITERATION_STEPS)
        return super().set_activation(values)

    def sub_evaluator(self, ast: Tree[Any]) -> Evaluator:
        return Counted(ast, self.activation, self.budget, self.plan)


class Program:
    """A checked filter, ready to run: its tree and its static cost."""

    def __init__(self, tree: Tree[Any], cost: int) -> None:
        self.tree = tree
        self.cost = cost
        self.plan = Plan(tree)
        self.runner = _environment().program(tree)

    def evaluate(self, context: Mapping[str, Any], limit: int) -> tuple[Any, int]:
        """The result for ``context`` (or the exception), and the steps taken."""
        budget = Budget(limit)
        evaluator = Counted(self.tree, self.runner.new_activation(), budget, self.plan)
        try:
            result = evaluator.evaluate(dict(context))
        except Exception as exc:  # cel-python raises or returns its CELEvalError
            return exc, budget.steps
        return result, budget.steps


@functools.cache
def _environment() -> celpy.Environment:
    """The one cel-python environment. Making one sets the recursion limit to
    2500 (cel-python evaluates recursively): a process's higher limit is kept."""
    limit = sys.getrecursionlimit()
    environment = celpy.Environment()
    sys.setrecursionlimit(max(limit, sys.getrecursionlimit()))
    return environment


def parse(text: str) -> Tree[Any]:
    """The parse tree of ``text``; :class:`Refused` with the parser's message."""
    try:
        tree: Tree[Any] = _environment().compile(text)
    except CELParseError as exc:
        raise Refused(
            f"does not parse: {' '.join(str(exc).split()) or type(exc).__name__}"
        ) from None
    return tree


def variables() -> dict[str, Type]:
    """The variables of a filter, at their largest."""
    return {
        "headers": Type(
            "map",
            (string(MAX_HEADERS_BYTES), string(MAX_HEADERS_BYTES)),
            MAX_HEADERS,
        ),
        "group": string(MAX_NAME),
        "topic": string(MAX_NAME),
    }


def compile_filter(text: str, max_cost: int) -> Program:
    """The checked program of ``text``: :class:`Refused` if it does not parse,
    nests deeper than :data:`MAX_DEPTH`, is not a boolean of the subset, or may
    cost more than ``max_cost`` steps."""
    tree = parse(text)
    levels = depth(tree)
    if levels > MAX_DEPTH:
        raise Refused(
            f"nests too deep: its syntax tree has {levels:,} levels, the limit is {MAX_DEPTH} "
            "(a pair of parentheses, a call or an index adds about ten, each "
            "chained operator one or two)"
        )
    scope = variables()
    info = Checker(text, scope).root(tree)
    if info.type.kind != "bool":
        raise Refused(f"is not boolean (it is {info.type}): it must be true or false")
    if info.cost > max_cost:
        raise Refused(
            f"may cost up to {info.cost:,} evaluation steps; the limit is {max_cost:,}. A macro "
            "runs its expression once per element of its list or map: over headers, up to "
            f"{scope['headers'].size:,} times (as many headers as a message can carry); nested "
            f"macros multiply, and + counts a step per {CHARS_PER_STEP} characters it builds"
        )
    return Program(tree, info.cost)
