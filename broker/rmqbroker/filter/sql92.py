"""RocketMQ's SQL92 message selector (``MessageSelector.bySql``): parsing and evaluation.

The grammar and the evaluation rules are those of RocketMQ 4.9's filter module (a trimmed JMS
selector): ``OR``/``AND``/``NOT``, ``=``/``<>``, ``>``/``>=``/``<``/``<=``, ``[NOT] BETWEEN``,
``[NOT] IN`` (string literals), ``IS [NOT] NULL``, unary ``+``/``-``, literals (strings in single
quotes, integers, floats, ``TRUE``/``FALSE``/``NULL``) and property names. Message properties are
strings; a comparison with a number converts the property to the constant's Java type (Integer,
Long or Double), as RocketMQ does, and a property that does not convert makes the whole selector
fail for that message, which then does not match. Comparisons with a missing property are
unknown (SQL's three-valued logic), and only a true result matches.

Differences from RocketMQ, each stricter or friendlier and never changing what a valid selector
matches: input left over after a complete expression is an error (Java's parser silently ignores
it), and ``0.0`` is a valid literal (Java rejects floats below ``Double.MIN_VALUE``).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

Value = object  # None, bool, int (Java Integer), JavaLong, float (Java Double) or str
Evaluator = Callable[[Mapping[str, str]], Value]

_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1
# Limits that keep a hostile or generated selector from costing the broker memory or its stack.
MAX_EXPRESSION_LENGTH = 65536
MAX_DEPTH = 400
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


class FilterParseError(ValueError):
    """A selector that RocketMQ would refuse to compile; the message says where and why."""


class FilterEvalError(Exception):
    """A selector that cannot be evaluated against one message (a property that does not convert)."""


class JavaLong(int):
    """An integer constant outside Java's int range: compared and converted as a Java Long."""

    def __neg__(self) -> JavaLong:
        return JavaLong(-int(self))


# -- tokens ----------------------------------------------------------------------------------------

_KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"})
_TOKEN = re.compile(r"""
    (?P<ws>[ \t\n\r\f]+)
  | (?P<line_comment>--[^\n\r]*(?:\r\n|\n|\r|$))
  | (?P<block_comment>/\*.*?\*/)
  | (?P<float>(?:[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+))
  | (?P<decimal>(?:0|[1-9][0-9]*[lL]?))
  | (?P<string>'(?:''|[^'])*')
  | (?P<id>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op><>|>=|<=|[=<>(),+-])
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # decimal, float, string, id, op, a keyword (upper case), or eof
    text: str
    column: int


def _tokenize(sql: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if m is None:
            raise FilterParseError(f"unexpected character {sql[pos]!r} at column {pos + 1}")
        kind = m.lastgroup or ""
        text = m.group()
        if kind == "id" and text.upper() in _KEYWORDS:
            kind = text.upper()
        if kind not in ("ws", "line_comment", "block_comment"):
            tokens.append(_Token(kind, text, pos + 1))
        pos = m.end()
    tokens.append(_Token("eof", "", len(sql) + 1))
    return tokens


# -- Java's comparison rules -------------------------------------------------------------------------

_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+\Z")
_JAVA_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)\Z")


def _to_integer(text: str, lo: int, hi: int, java_type: str) -> int:
    if _JAVA_INTEGER.match(text) is not None:
        n = int(text)
        if lo <= n <= hi:
            return n
    raise FilterEvalError(f"{text!r} is not a Java {java_type}")


def _to_double(text: str) -> float:
    # Java's Double.valueOf trims control characters and spaces, and takes a type suffix.
    trimmed = text.strip("".join(chr(c) for c in range(33)))
    if _JAVA_DOUBLE.match(trimmed) is None:
        raise FilterEvalError(f"{text!r} is not a Java Double")
    if trimmed[-1] in "fFdD" and not trimmed.endswith("Infinity"):
        trimmed = trimmed[:-1]
    return float(trimmed)


def _java_kind(v: Value) -> str:
    t = type(v)
    if t is bool:
        return "B"
    if t is int:
        return "I"
    if t is JavaLong:
        return "L"
    if t is float:
        return "D"
    return "S"


def _order(a: Value, b: Value) -> int:
    """compareTo of two values of one kind (Double.compare's NaN and signed zero included)."""
    if type(a) is float or type(b) is float:
        x, y = float(a), float(b)  # type: ignore[arg-type]
        if x < y:
            return -1
        if x > y:
            return 1
        xn, yn = math.isnan(x), math.isnan(y)
        if xn or yn:
            return xn - yn
        sx, sy = math.copysign(1.0, x), math.copysign(1.0, y)
        return (sx > sy) - (sx < sy)
    return int((a > b) - (a < b))  # type: ignore[operator]


def _compare(lv: Value, rv: Value) -> int:
    """RocketMQ's ``__compare`` with string conversion on: the operands are brought to one type
    (the number's, when one side is a string), and -1 when there is no rule for the pair."""
    lk, rk = _java_kind(lv), _java_kind(rv)
    if lk != rk:
        if lk == "B":
            if rk == "S":
                # Java casts the Boolean to String here and fails; the message does not match.
                raise FilterEvalError("a boolean cannot be compared with a string")
            return -1
        if lk in "IL":
            if rk == "D":
                lv = float(lv)  # type: ignore[arg-type]
            elif rk == "S":
                rv = _to_integer(rv, *((_INT_MIN, _INT_MAX, "Integer") if lk == "I"  # type: ignore[arg-type]
                                       else (_LONG_MIN, _LONG_MAX, "Long")))
            elif rk not in "IL":
                return -1
        elif lk == "D":
            if rk in "IL":
                rv = float(rv)  # type: ignore[arg-type]
            elif rk == "S":
                rv = _to_double(rv)  # type: ignore[arg-type]
            else:
                return -1
        else:  # a string against a boolean or a number
            text: str = lv  # type: ignore[assignment]
            if rk == "B":
                lv = text.lower() == "true"
            elif rk == "I":
                lv = _to_integer(text, _INT_MIN, _INT_MAX, "Integer")
            elif rk == "L":
                lv = _to_integer(text, _LONG_MIN, _LONG_MAX, "Long")
            else:
                lv = _to_double(text)
    return _order(lv, rv)


# -- expression nodes -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Node:
    fn: Evaluator
    text: str
    boolean: bool  # a BooleanExpression in RocketMQ's terms: usable under AND/OR/NOT
    constant: bool = False
    value: Value = None
    prop: str | None = None
    depth: int = 1  # of nested evaluations: bounded so that evaluating never exhausts the stack


def _composite(fn: Evaluator, text: str, boolean: bool, *children: _Node) -> _Node:
    depth = 1 + max(c.depth for c in children)
    if depth > MAX_DEPTH:
        raise FilterParseError(f"the SQL92 expression is nested more than {MAX_DEPTH} operators deep")
    return _Node(fn, text, boolean, depth=depth)


def _short(text: str) -> str:
    # Error messages quote operands; a long one is cut so that building them stays linear.
    return text if len(text) <= 60 else text[:57] + "..."


def _java_literal(v: Value) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(float(v)) if isinstance(v, float) else str(int(v))  # type: ignore[call-overload]


def _constant(v: Value) -> _Node:
    return _Node(lambda _ctx: v, _java_literal(v), boolean=v is None or isinstance(v, bool), constant=True, value=v)


def _property(name: str) -> _Node:
    def get(ctx: Mapping[str, str]) -> Value:
        return ctx.get(name)
    return _Node(get, name, boolean=False, prop=name)


def _as_boolean(node: _Node) -> _Node:
    if node.boolean:
        return node
    if node.prop is not None:
        fn = node.fn

        def cast(ctx: Mapping[str, str]) -> Value:
            v = fn(ctx)
            if v is None:
                return None
            return v if type(v) is bool else False
        return _composite(cast, node.text, True, node)
    raise FilterParseError(f"expression will not result in a boolean value: {node.text}")


def _not(node: _Node) -> _Node:
    fn = _as_boolean(node).fn

    def neg(ctx: Mapping[str, str]) -> Value:
        v = fn(ctx)
        if v is None:
            return None
        if type(v) is not bool:
            raise FilterEvalError(f"NOT of a non-boolean value {v!r}")
        return not v
    return _composite(neg, f"NOT {_short(node.text)}", True, node)


def _logic(left: _Node, right: _Node, word: str) -> _Node:
    """AND or OR in SQL's three-valued logic: the deciding value (false for AND, true for OR) on
    either side decides; otherwise an unknown side makes the result unknown."""
    lf, rf = _as_boolean(left).fn, _as_boolean(right).fn
    decides = word == "OR"

    def combine(ctx: Mapping[str, str]) -> Value:
        lv = lf(ctx)
        if lv is decides:
            return decides
        rv = rf(ctx)
        if rv is decides:
            return decides
        return None if lv is None or rv is None else not decides
    return _composite(combine, f"({_short(left.text)}) {word} ({_short(right.text)})", True, left, right)


def _and(left: _Node, right: _Node) -> _Node:
    return _logic(left, right, "AND")


def _or(left: _Node, right: _Node) -> _Node:
    return _logic(left, right, "OR")


def _negate(node: _Node) -> _Node:
    fn = node.fn

    def minus(ctx: Mapping[str, str]) -> Value:
        v = fn(ctx)
        if type(v) in (int, JavaLong, float):
            return -v  # type: ignore[operator]
        return None
    if node.constant and type(node.value) in (int, JavaLong, float):
        return _constant(-node.value)  # type: ignore[operator]
    return _composite(minus, f"-{_short(node.text)}", False, node)


def _check_orderable(node: _Node) -> None:
    if node.constant:
        if type(node.value) in (int, JavaLong, float):
            return
        raise FilterParseError(f"value {node.text} cannot be compared")
    if node.boolean:
        raise FilterParseError(f"value {node.text} cannot be compared")


def _ordering(left: _Node, right: _Node, symbol: str, accept: Callable[[int], bool]) -> _Node:
    _check_orderable(left)
    _check_orderable(right)
    lf, rf = left.fn, right.fn

    def cmp(ctx: Mapping[str, str]) -> Value:
        lv = lf(ctx)
        if lv is None:
            return None
        rv = rf(ctx)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:
            # Two strings are ordered only as numbers (RocketMQ refuses string ordering).
            lv, rv = _to_double(lv), _to_double(rv)
        return accept(_compare(lv, rv))
    return _composite(cmp, f"{_short(left.text)} {symbol} {_short(right.text)}", True, left, right)


def _equal_unchecked(left: _Node, right: _Node, text: str) -> _Node:
    lf, rf = left.fn, right.fn

    def eq(ctx: Mapping[str, str]) -> Value:
        lv = lf(ctx)
        rv = rf(ctx)
        if lv is None or rv is None:
            if lv is None and rv is None:
                return True
            return None if lv is None else False
        if type(lv) is type(rv) and type(lv) is not float and lv == rv:
            return True
        return _compare(lv, rv) == 0
    return _composite(eq, text, True, left, right)


def _equal(left: _Node, right: _Node) -> _Node:
    for side in (left, right):
        if side.constant and side.value is None:
            raise FilterParseError(f"{side.text} cannot be compared: use IS NULL")
    if left.constant and right.constant and left.boolean and not right.boolean:
        raise FilterParseError(f"{left.text} cannot be compared with {right.text}")
    return _equal_unchecked(left, right, f"{_short(left.text)} = {_short(right.text)}")


def _is_null(node: _Node) -> _Node:
    return _equal_unchecked(node, _constant(None), f"{_short(node.text)} IS NULL")


def _in(node: _Node, items: list[str], negated: bool) -> _Node:
    if node.prop is None:
        raise FilterParseError(f"expected a property for IN, got: {node.text}")
    fn = node.fn
    members = frozenset(items)

    def contains(ctx: Mapping[str, str]) -> Value:
        v = fn(ctx)
        if type(v) is not str:
            return None
        return (v in members) != negated
    words = "NOT IN" if negated else "IN"
    listed = _short(", ".join(_java_literal(i) for i in items[:10]))
    return _composite(contains, f"{node.text} {words} ({listed})", True, node)


def _between(value: _Node, low: _Node, high: _Node) -> _Node:
    if low.constant and high.constant:
        if low.value is None or high.value is None:
            raise FilterParseError("illegal values of BETWEEN: values cannot be NULL")
        try:
            ordered = _compare(high.value, low.value) >= 0
        except FilterEvalError as exc:
            raise FilterParseError(f"illegal values of BETWEEN: {exc}") from exc
        if not ordered:
            raise FilterParseError(f"illegal values of BETWEEN: {low.text} must not be greater than {high.text}")
    return _and(_ordering(value, low, ">=", lambda c: c >= 0), _ordering(value, high, "<=", lambda c: c <= 0))


def _not_between(value: _Node, low: _Node, high: _Node) -> _Node:
    return _or(_ordering(value, low, "<", lambda c: c < 0), _ordering(value, high, ">", lambda c: c > 0))


# -- parser (recursive descent over RocketMQ's grammar) ------------------------------------------------

class _Parser:
    def __init__(self, sql: str) -> None:
        self.tokens = _tokenize(sql)
        self.pos = 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.pos]

    def peek(self, ahead: int = 1) -> _Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def at(self, kind: str, text: str | None = None) -> bool:
        t = self.tok
        return t.kind == kind and (text is None or t.text == text)

    def take(self, kind: str, text: str | None = None, what: str | None = None) -> _Token:
        if not self.at(kind, text):
            self.fail(what or (repr(text) if text else kind))
        t = self.tok
        self.pos += 1
        return t

    def fail(self, expected: str) -> None:
        t = self.tok
        found = "the end of the expression" if t.kind == "eof" else repr(t.text)
        raise FilterParseError(f"expected {expected} at column {t.column}, found {found}")

    def parse(self) -> _Node:
        node = _as_boolean(self.or_expr())
        if not self.at("eof"):
            self.fail("AND, OR or the end of the expression")
        return node

    def or_expr(self) -> _Node:
        left = self.and_expr()
        while self.at("OR"):
            self.pos += 1
            left = _or(left, self.and_expr())
        return left

    def and_expr(self) -> _Node:
        left = self.equality_expr()
        while self.at("AND"):
            self.pos += 1
            left = _and(left, self.equality_expr())
        return left

    def equality_expr(self) -> _Node:
        left = self.comparison_expr()
        while True:
            if self.at("op", "="):
                self.pos += 1
                left = _equal(left, self.comparison_expr())
            elif self.at("op", "<>"):
                self.pos += 1
                left = _not(_equal(left, self.comparison_expr()))
            elif self.at("IS"):
                self.pos += 1
                negated = self.at("NOT")
                if negated:
                    self.pos += 1
                self.take("NULL", what="NULL after IS")
                left = _not(_is_null(left)) if negated else _is_null(left)
            else:
                return left

    def comparison_expr(self) -> _Node:
        left = self.unary_expr()
        while True:
            t = self.tok
            if t.kind == "op" and t.text in (">", ">=", "<", "<="):
                self.pos += 1
                right = self.unary_expr()
                accept: Callable[[int], bool] = {
                    ">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0,
                }[t.text]
                left = _ordering(left, right, t.text, accept)
            elif t.kind == "BETWEEN" or (t.kind == "NOT" and self.peek().kind == "BETWEEN"):
                negated = t.kind == "NOT"
                self.pos += 2 if negated else 1
                low = self.unary_expr()
                self.take("AND", what="AND in BETWEEN")
                high = self.unary_expr()
                left = _not_between(left, low, high) if negated else _between(left, low, high)
            elif t.kind == "IN" or (t.kind == "NOT" and self.peek().kind == "IN"):
                negated = t.kind == "NOT"
                self.pos += 2 if negated else 1
                self.take("op", "(", what="'(' after IN")
                items = [self.string_literal()]
                while self.at("op", ","):
                    self.pos += 1
                    items.append(self.string_literal())
                self.take("op", ")", what="',' or ')' in the IN list")
                left = _in(left, items, negated)
            else:
                return left

    def unary_expr(self) -> _Node:
        if self.at("op", "+"):
            self.pos += 1
            return self.unary_expr()
        if self.at("op", "-"):
            self.pos += 1
            return _negate(self.unary_expr())
        if self.at("NOT"):
            self.pos += 1
            return _not(self.unary_expr())
        return self.primary_expr()

    def primary_expr(self) -> _Node:
        t = self.tok
        if t.kind == "op" and t.text == "(":
            self.pos += 1
            node = self.or_expr()
            self.take("op", ")", what="')'")
            return node
        if t.kind == "id":
            self.pos += 1
            return _property(t.text)
        if t.kind == "string":
            return _constant(self.string_literal())
        self.pos += 1
        if t.kind == "decimal":
            digits = t.text.rstrip("lL")
            n = int(digits)
            if n > _LONG_MAX:
                raise FilterParseError(f"{t.text} at column {t.column} is out of the range of a Java long")
            return _constant(n if n <= _INT_MAX else JavaLong(n))
        if t.kind == "float":
            f = float(t.text)
            if math.isinf(f):
                raise FilterParseError(f"{t.text} at column {t.column} is greater than a Java double can hold")
            return _constant(f)
        if t.kind in ("TRUE", "FALSE", "NULL"):
            return _constant({"TRUE": True, "FALSE": False, "NULL": None}[t.kind])
        self.pos -= 1
        self.fail("a property, a literal, '(', '+', '-' or NOT")
        raise AssertionError("unreachable")

    def string_literal(self) -> str:
        t = self.take("string", what="a string literal in single quotes")
        return t.text[1:-1].replace("''", "'")


@dataclass(frozen=True, slots=True)
class Selector:
    """A compiled selector: ``matches`` answers whether a message with these properties is selected."""

    expression: str
    _fn: Evaluator

    def evaluate(self, properties: Mapping[str, str]) -> Value:
        """True, False or None (unknown); raises :class:`FilterEvalError` when a property does not convert."""
        return self._fn(properties)

    def matches(self, properties: Mapping[str, str]) -> bool:
        try:
            return self._fn(properties) is True
        except FilterEvalError:
            return False


@functools.lru_cache(maxsize=256)
def compile_sql92(expression: str) -> Selector:
    """Compile a selector; raises :class:`FilterParseError` with the reason (cached, like RocketMQ's parser)."""
    if not expression or not expression.strip():
        raise FilterParseError("the SQL92 expression is empty")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise FilterParseError(f"the SQL92 expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        return Selector(expression, _Parser(expression).parse().fn)
    except RecursionError as exc:
        raise FilterParseError("the SQL92 expression is nested too deeply") from exc
