"""A calculator tool backed by a small arithmetic parser — never ``eval`` of model text.

Grammar (usual precedence, left associative, ``**`` right associative)::

    expr   := term (('+' | '-') term)*
    term   := unary (('*' | '/' | '//' | '%') unary)*
    unary  := ('+' | '-') unary | power
    power  := atom ('**' unary)?
    atom   := NUMBER | '(' expr ')'

Arithmetic is exact (``fractions.Fraction``); results print as integers when whole and as
decimals rounded to 10 places otherwise. Sizes are bounded so a model cannot ask for 9**9**9.
"""

from __future__ import annotations

import re
from fractions import Fraction

from agentrl.env.tool import Tool, ToolError

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_DIGITS = 60
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?|\.\d+)|(\*\*|//|[-+*/%()]))")


class CalculatorError(ToolError, ValueError):
    """An expression the calculator refuses, with a message meant for the model."""


def evaluate(expression: str, max_ops: int | None = None) -> Fraction:
    """Evaluate ``expression`` exactly; raise ``CalculatorError`` with a readable reason."""
    if not isinstance(expression, str):
        raise CalculatorError("the expression must be text")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    parser = _Parser(_tokenize(expression))
    value = parser.expr()
    if parser.pos != len(parser.tokens):
        raise CalculatorError(f"unexpected {parser.tokens[parser.pos]!r}")
    if max_ops is not None and parser.ops > max_ops:
        raise CalculatorError(
            f"this calculator does {max_ops} operation{'s' if max_ops != 1 else ''} per call; "
            f"the expression has {parser.ops}. Split it into steps."
        )
    return value


def format_number(value: Fraction) -> str:
    """Integers as integers, other values as decimals with at most 10 places."""
    if value.denominator == 1:
        return str(value.numerator)
    text = f"{float(value):.10f}".rstrip("0").rstrip(".")
    return text


class Calculator(Tool):
    """Evaluates arithmetic. ``max_ops`` limits operations per call, so multi-step tasks need several calls."""

    name = "calculator"
    timeout = 5.0
    max_output_chars = 200

    def __init__(self, max_ops: int | None = None) -> None:
        self.max_ops = max_ops

    def run(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: The expression, e.g. "12 * 7".
        """
        return format_number(evaluate(expression, self.max_ops))


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            bad = text[pos:].lstrip()[:10]
            raise CalculatorError(f"cannot read {bad!r}; use numbers, + - * / // % ** and parentheses")
        tokens.append(match.group(1) or match.group(2))
        pos = match.end()
    if not tokens:
        raise CalculatorError("empty expression")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.ops = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise CalculatorError("expression ends too early")
        self.pos += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            self.ops += 1
            value = value + rhs if op == "+" else value - rhs
            _check_size(value)
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/", "//", "%"):
            op = self.take()
            rhs = self.unary()
            self.ops += 1
            if op != "*" and rhs == 0:
                raise CalculatorError("division by zero")
            if op == "*":
                value = value * rhs
            elif op == "/":
                value = value / rhs
            elif op == "//":
                value = Fraction(value // rhs)
            else:
                value = value % rhs
            _check_size(value)
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("+", "-"):
            sign = self.take()
            value = self.unary()
            return -value if sign == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.atom()
        if self.peek() == "**":
            self.take()
            exponent = self.unary()
            self.ops += 1
            if exponent.denominator != 1:
                raise CalculatorError("only whole-number exponents are supported")
            if abs(exponent) > MAX_EXPONENT:
                raise CalculatorError(f"exponent larger than {MAX_EXPONENT}")
            if base == 0 and exponent < 0:
                raise CalculatorError("division by zero")
            base = base**exponent.numerator
            _check_size(base)
        return base

    def atom(self) -> Fraction:
        tok = self.take()
        if tok == "(":
            self.depth += 1
            if self.depth > 32:
                raise CalculatorError("too many nested parentheses")
            value = self.expr()
            if self.take() != ")":
                raise CalculatorError("missing ')'")
            self.depth -= 1
            return value
        if tok[0].isdigit() or tok[0] == ".":
            value = Fraction(tok)
            _check_size(value)
            return value
        raise CalculatorError(f"unexpected {tok!r}")


def _check_size(value: Fraction) -> None:
    if len(str(abs(value.numerator))) > MAX_DIGITS or len(str(value.denominator)) > MAX_DIGITS:
        raise CalculatorError("result too large")
