"""Numbers and the arithmetic an answer writes: parsing, a tiny safe evaluator, equation extraction.

No ``eval``: expressions are tokenised and parsed by a small recursive-descent parser over numbers,
``+ - * / x × ÷ ·``, ``^``/``**`` (bounded exponents), parentheses, unary minus and ``%`` (``n%`` is
``n / 100``). Thousands separators (``1,000``), currency signs and ``<<expr=value>>`` calculator
annotations (GSM8K's convention) are understood.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

# A number as written in prose: optional sign handled by the parser; "1,000,000.5", "3.25", ".5".
NUMBER_PATTERN = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_NUMBER = re.compile(NUMBER_PATTERN)
# A number in prose with an optional leading minus directly attached ("-5", not "3 - 5").
_SIGNED_NUMBER = re.compile(rf"(?<![\w.])-?{NUMBER_PATTERN}")
# Runs of characters that can make up a written calculation (no letters except the times sign "x").
_MATH_RUN = re.compile(r"[0-9$€£.,%()+\-*/x×÷·^= \t]+")
_OPERATORS = frozenset("+-*/^")
_MAX_EXPONENT = 64.0
_MAX_TOKENS = 80  # longest expression evaluated (a side of "=" keeps at most this many tokens)
_STOP = "|"


def parse_number(text: str) -> float | None:
    """The value of one written number (``"1,000"``, ``"$3.50"``, ``"-2"``, ``"45%"`` -> 45.0), or None."""
    t = text.strip().replace("$", "").replace("€", "").replace("£", "").rstrip("%").strip()
    neg = t.startswith("-")
    t = t.lstrip("-").strip()
    m = _NUMBER.fullmatch(t)
    if m is None:
        return None
    value = float(t.replace(",", ""))
    return -value if neg else value


def numbers_in(text: str) -> list[float]:
    """Every number written in ``text`` in order (a minus sign counts only when attached: ``-5``)."""
    return [float(m.replace(",", "")) for m in _SIGNED_NUMBER.findall(text)]


def _tokens(expr: str) -> list[str] | None:
    """Tokens of an expression (numbers, operators, parentheses, ``%``), or None when something else is there."""
    out: list[str] = []
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c in " \t$€£":
            i += 1
            continue
        m = _NUMBER.match(expr, i)
        if m is not None and m.end() > i:
            # "1,2" is a list, not a number: the pattern only accepts groups of exactly three digits.
            out.append(m.group(0).replace(",", ""))
            i = m.end()
            continue
        if c == "*" and expr.startswith("**", i):
            out.append("^")
            i += 2
            continue
        if c in "x×·*":
            out.append("*")
        elif c == "÷":
            out.append("/")
        elif c in "+-/^()%":
            out.append(c)
        elif c in ".,":
            out.append(_STOP)  # sentence punctuation: an expression cannot span it
        else:
            return None
        i += 1
    return out


class _Parser:
    """Recursive descent: expr := term (('+'|'-') term)*; term := unary (('*'|'/') unary)*;
    unary := '-' unary | power; power := atom ('^' unary)?; atom := number '%'? | '(' expr ')' '%'?."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def expr(self) -> float:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> float:
        value = self.unary()
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.unary()
            if op == "*":
                value *= rhs
            else:
                if rhs == 0:
                    raise ZeroDivisionError
                value /= rhs
        return value

    def unary(self) -> float:
        if self.peek() == "-":
            self.take()
            return -self.unary()
        if self.peek() == "+":
            self.take()
            return self.unary()
        return self.power()

    def power(self) -> float:
        base = self.atom()
        if self.peek() == "^":
            self.take()
            exponent = self.unary()
            if abs(exponent) > _MAX_EXPONENT:
                raise OverflowError
            if base < 0 and not exponent.is_integer():
                # A root of a negative number ("(-8)^(1/3)"): Python's power is complex, no written value.
                raise ValueError("root of a negative number")
            return float(base**exponent)
        return base

    def atom(self) -> float:
        tok = self.peek()
        if tok is None:
            raise ValueError("unexpected end")
        if tok == "(":
            self.take()
            value = self.expr()
            if self.peek() != ")":
                raise ValueError("unbalanced")
            self.take()
        elif tok[0].isdigit() or tok[0] == ".":
            value = float(self.take())
        else:
            raise ValueError(f"unexpected {tok!r}")
        if self.peek() == "%":
            self.take()
            value /= 100.0
        return value


def evaluate(expr: str) -> float | None:
    """The value of an arithmetic expression, or None when it is not one (or divides by zero, overflows)."""
    tokens = _tokens(expr)
    if not tokens or len(tokens) > _MAX_TOKENS:
        return None
    return _evaluate_tokens(tokens)


def _evaluate_tokens(tokens: list[str]) -> float | None:
    parser = _Parser(tokens)
    try:
        value = parser.expr()
    except (ValueError, ZeroDivisionError, OverflowError, IndexError):
        return None
    if parser.pos != len(tokens) or not math.isfinite(value) or isinstance(value, complex):
        return None
    return float(value)


def _has_operator(tokens: list[str]) -> bool:
    # A leading minus is a sign, not a calculation; "20%" alone is a number, not a calculation.
    return any(t in _OPERATORS for t in tokens[1:])


def _longest_tail(tokens: list[str]) -> tuple[list[str], float] | None:
    """The longest suffix of ``tokens`` that is a whole expression (text before a calculation, such as
    "16, so 3 + 4", leaves stray tokens in front)."""
    for start in range(len(tokens)):
        if tokens[start] in ("*", "/", "^", ")", "%", "+") or (start and tokens[start - 1] == "^"):
            continue  # an exponent is no calculation of its own ("(-8)^(1/3) = -2" is not "1/3 = -2")
        value = _evaluate_tokens(tokens[start:])
        if value is not None:
            return tokens[start:], value
    return None


def _longest_head(tokens: list[str]) -> tuple[list[str], float] | None:
    """The longest prefix of ``tokens`` that is a whole expression (what follows "=" may run on)."""
    for end in range(len(tokens), 0, -1):
        value = _evaluate_tokens(tokens[:end])
        if value is not None:
            return tokens[:end], value
    return None


@dataclass(frozen=True)
class Equation:
    """One written ``left = right`` step where at least one side computes something.

    Attributes:
        left: The left side's value.
        right: The right side's value (what the answer claims).
        decimals: Decimal places written on the right side (sets the rounding tolerance).
        correct: Whether ``left`` rounds to ``right`` at the written precision (or within 0.1%).
    """

    left: float
    right: float
    decimals: int
    correct: bool


def _decimals(tokens: list[str]) -> int:
    last = tokens[-1] if tokens else ""
    return len(last.split(".", 1)[1]) if "." in last else 0


def agrees(computed: float, written: float, decimals: int) -> bool:
    """Whether a written value is the computed one at its written precision (rounding, or 0.1% relative)."""
    tolerance = max(0.5 * 10.0 ** (-decimals) + 1e-9, 1e-3 * abs(computed))
    return abs(computed - written) <= tolerance


def equations(text: str) -> list[Equation]:
    """Every checkable ``a op b = c`` step written in ``text`` (chains ``a = b = c`` give one per ``=``).

    A step counts when both sides parse and at least one of them holds an operator; steps that merely
    restate a number (``13 = 13``) or convert units in words are skipped.
    """
    out: list[Equation] = []
    # "<<48/2=24>>24": a calculator annotation; its content is one more run, the brackets split runs.
    for run in _MATH_RUN.findall(text.replace("<<", " \n ").replace(">>", " \n ")):
        if "=" not in run:
            continue
        sides = run.split("=")
        parsed: list[tuple[list[str], float] | None] = []
        for i, side in enumerate(sides):
            tokens = _tokens(side)
            if not tokens:
                parsed.append(None)
                continue
            # Left of the first "=" keep the longest tail, elsewhere the longest head (bounded: the
            # search is quadratic in a side's tokens).
            if i == 0:
                parsed.append(_longest_tail(tokens[-_MAX_TOKENS:]))
            else:
                parsed.append(_longest_head(tokens[:_MAX_TOKENS]))
        for a, b in itertools.pairwise(parsed):
            if a is None or b is None:
                continue
            if not (_has_operator(a[0]) or _has_operator(b[0])):
                continue
            decimals = _decimals(b[0])
            out.append(Equation(a[1], b[1], decimals, agrees(a[1], b[1], decimals)))
    return out
