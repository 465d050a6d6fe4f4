"""SQL92 selectors: RocketMQ 4.9's grammar and its evaluation rules (three-valued logic, a string
property converted to the type of the constant it is compared with, errors that make a message
not match), and the reasons given for selectors that do not compile."""

from __future__ import annotations

import pytest

from rmqbroker.filter.sql92 import FilterEvalError, FilterParseError, compile_sql92

PROPS = {"a": "10", "b": "abc", "flag": "TRUE", "TAGS": "TagA", "d": "1.5", "big": "3000000000", "neg": "-4",
         "q": "it's", "sp": " 7 ", "e": "1e3"}

MATCHES = [
    ("a > 5 AND b = 'abc'", True),
    ("a > 5", True), ("a >= 10", True), ("a < 10", False), ("a <= 10", True), ("a = 10", True), ("a <> 10", False),
    ("5 < a", True), ("10 = a", True),
    ("a BETWEEN 10 AND 10", True), ("a BETWEEN 11 AND 20", False), ("a NOT BETWEEN 11 AND 20", True),
    ("b IN ('x', 'abc')", True), ("b NOT IN ('x', 'abc')", False), ("q = 'it''s'", True), ("q IN ('it''s')", True),
    ("TAGS IS NOT NULL AND TAGS IN ('TagA', 'TagB')", True),
    # a missing property: unknown, never a match, also under NOT
    ("x > 5", False), ("NOT (x > 5)", False), ("x IS NULL", True), ("x IS NOT NULL", False), ("x = 'v'", False),
    ("x <> 'v'", False), ("x IN ('v')", False), ("x NOT IN ('v')", False),
    # unknown OR true is true, unknown AND false is false
    ("x > 5 OR a = 10", True), ("NOT (x > 5 AND a = 11)", True),
    # conversion to the constant's type
    ("d > 1", False),  # '1.5' is not a Java Integer: the message does not match
    ("d > 1.0", True), ("d = 1.5", True), ("e = 1000.0", True), ("neg < -3", True), ("neg = -4", True),
    ("big > 5", False),  # out of Integer's range
    ("big > 2147483648", True), ("big = 3000000000", True), ("a = 10L", True),
    ("sp = 7", False),  # Integer.valueOf does not trim
    ("sp = 7.0", True),  # Double.valueOf does
    ("flag = TRUE", True), ("b = TRUE", False),
    # an error anywhere fails the whole selector, even where OR would not need it
    ("b = 5 OR a = 10", False), ("a = 10 OR b = 5", True),
    # two strings are ordered only as numbers
    ("a > d", True), ("a > b", False),
    ("TRUE", True), ("FALSE", False), ("NULL", False), ("b", False), ("NOT b", True),
    ("-- a comment\n a > 5 /* and another */", True), ("A > 5", False), ("a > 5 and b = 'abc'", True),
    ("((a > 5))", True), ("+a > 5", True),
    ("-a < -5", False),  # minus on a string property is unknown, as in RocketMQ
]


@pytest.mark.parametrize(("expression", "selected"), MATCHES)
def test_selects_as_rocketmq_does(expression: str, selected: bool) -> None:
    assert compile_sql92(expression).matches(PROPS) is selected


def test_unknown_is_told_apart_from_false_and_errors_raise() -> None:
    assert compile_sql92("x > 5").evaluate(PROPS) is None
    assert compile_sql92("a > 50").evaluate(PROPS) is False
    with pytest.raises(FilterEvalError):
        compile_sql92("b = 5").evaluate(PROPS)


REFUSED = [
    ("", "empty"),
    ("a >", "column 4"),
    ("a > 'x'", "cannot be compared"),
    ("a > TRUE", "cannot be compared"),
    ("NOT x > 5", "cannot be compared"),  # NOT binds to x, as in RocketMQ's grammar
    ("a = NULL", "IS NULL"),
    ("TRUE = 5", "cannot be compared with"),
    ("a BETWEEN 3 AND 1", "BETWEEN"),
    ("a BETWEEN NULL AND 1", "NULL"),
    ("5", "boolean"),
    ("'x'", "boolean"),
    ("a IN (1)", "string literal"),
    ("'x' IN ('a')", "property"),
    ("a IN ()", "string literal"),
    ("(a > 5", "')'"),
    ("a > 5 b", "column 7"),
    ("a ! 5", "'!'"),
    ("a > 99999999999999999999", "long"),
    ("a > 1e999", "double"),
    ("a IS 5", "NULL"),
]


@pytest.mark.parametrize(("expression", "reason"), REFUSED)
def test_refused_with_a_reason(expression: str, reason: str) -> None:
    with pytest.raises(FilterParseError, match=reason if reason[0].isalpha() else None) as info:
        compile_sql92(expression)
    assert reason in str(info.value)


def test_deep_nesting_is_refused_not_a_crash() -> None:
    with pytest.raises(FilterParseError, match="nested too deeply"):
        compile_sql92("(" * 5000 + "a > 1" + ")" * 5000)


def test_long_selectors_evaluate_within_the_limits_and_beyond_them_are_refused() -> None:
    """A generated selector of 300 alternatives works; one nested deeper than the evaluation stack
    allows, or longer than 64 KiB, is refused when compiled, never when a pull evaluates it."""
    many = " OR ".join(f"a = {i}" for i in range(300))
    assert compile_sql92(many).matches({"a": "299"}) and not compile_sql92(many).matches({"a": "300"})
    with pytest.raises(FilterParseError, match="nested more than"):
        compile_sql92(" OR ".join(f"a = {i}" for i in range(500)))
    with pytest.raises(FilterParseError, match="nested"):
        compile_sql92("NOT " * 600 + "a > 1")
    with pytest.raises(FilterParseError, match="longer than"):
        compile_sql92("a IN (" + ", ".join(f"'{i:08d}'" for i in range(7000)) + ")")
    # error messages quote operands, cut short
    with pytest.raises(FilterParseError) as info:
        compile_sql92("(" + many + ") > 5")
    assert len(str(info.value)) < 200
