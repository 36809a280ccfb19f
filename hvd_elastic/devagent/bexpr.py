"""The subset of HashiCorp's go-bexpr that Consul's ``?filter=`` uses.

Grammar (precedence: ``not`` > ``and`` > ``or``; parentheses group)::

    <Selector> == <Value>        <Selector> != <Value>
    <Value> in <Selector>        <Value> not in <Selector>
    <Selector> contains <Value>  <Selector> not contains <Value>
    <Selector> matches <Value>   <Selector> not matches <Value>
    <Selector> is empty          <Selector> is not empty

Selectors are dotted paths (``Service.Meta.slots``, ``Service.Meta["a-b"]``)
over the JSON shape of one result; values are quoted strings (``"x"`` or
backquoted) or bare words and numbers.  When a selector passes through a list
(``Checks.Status``), a positive match (``==``, ``in``, ``contains``,
``matches``, ``is empty``) is true when it holds for any element, and its
negated form (``!=``, ``not in``, ...) is exactly its negation: so
``Checks.Status != passing`` means "no check is passing".
An expression that does not parse, or names a selector the endpoint's rows do
not have, raises :class:`FilterError` (the caller answers 400).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<lparen>\() | (?P<rparen>\)) |
        (?P<op>==|!=) |
        (?P<string>"(?:[^"\\]|\\.)*"|`[^`]*`) |
        (?P<index>\[\s*(?:"(?:[^"\\]|\\.)*"|`[^`]*`)\s*\]) |
        (?P<word>[A-Za-z0-9_.\-:/+@]+)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "contains", "matches", "is", "empty"}
_MISSING = object()


class FilterError(ValueError):
    """The filter expression is invalid."""


def _unquote(text: str) -> str:
    if text.startswith("`"):
        return text[1:-1]
    return re.sub(r"\\(.)", r"\1", text[1:-1])


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        # lastgroup is never None on a match (every alternative is a named group): checked for the type
        if match is None or match.end() == pos or match.lastgroup is None:
            raise FilterError("Failed to create boolean expression evaluator: "
                              f"syntax error at position {pos}: {text[pos:]!r}")
        kind = match.lastgroup
        value = match.group(kind)
        tokens.append((kind, value))
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str, fields: set[str]) -> None:
        self.tokens = _tokenize(text)
        self.pos = 0
        self.fields = fields
        self.text = text

    def error(self, what: str) -> FilterError:
        return FilterError(f"Failed to create boolean expression evaluator: {what} in {self.text!r}")

    def peek(self, offset: int = 0) -> tuple[str, str] | None:
        i = self.pos + offset
        return self.tokens[i] if i < len(self.tokens) else None

    def is_word(self, word: str, offset: int = 0) -> bool:
        tok = self.peek(offset)
        return tok is not None and tok[0] == "word" and tok[1] == word

    def optional(self, word: str) -> bool:
        """Consume ``word`` if it comes next; say whether it did."""
        if self.is_word(word):
            self.pos += 1
            return True
        return False

    def expect(self, word: str) -> None:
        if not self.optional(word):
            raise self.error(f"expected {word!r}")

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise self.error("unexpected end of expression")
        self.pos += 1
        return tok

    def parse(self) -> Callable[[Any], bool]:
        if not self.tokens:
            raise self.error("empty expression")
        expr = self.parse_or()
        tok = self.peek()
        if tok is not None:
            raise self.error(f"unexpected {tok[1]!r}")
        return expr

    def _chain(self, word: str, operand, combine):
        """``operand (word operand)*``, folded left with ``combine``."""
        left = operand()
        while self.is_word(word):
            self.pos += 1
            left = combine(left, operand())
        return left

    def parse_or(self):
        return self._chain("or", self.parse_and, lambda a, b: lambda row: a(row) or b(row))

    def parse_and(self):
        return self._chain("and", self.parse_not, lambda a, b: lambda row: a(row) and b(row))

    def parse_not(self):
        if self.is_word("not"):
            self.pos += 1
            inner = self.parse_not()
            return lambda row: not inner(row)
        if self.peek() and self.peek()[0] == "lparen":
            self.pos += 1
            inner = self.parse_or()
            if self.take()[0] != "rparen":
                raise self.error("missing ')'")
            return inner
        return self.parse_match()

    def value(self) -> str:
        kind, text = self.take()
        if kind == "string":
            return _unquote(text)
        if kind == "word" and text not in _KEYWORDS:
            return text
        raise self.error(f"expected a value, got {text!r}")

    def selector(self) -> list[str]:
        kind, text = self.take()
        if kind != "word" or text in _KEYWORDS:
            raise self.error(f"expected a selector, got {text!r}")
        path = text.split(".")
        while (tok := self.peek()) and tok[0] == "index":
            path.append(_unquote(self.take()[1][1:-1].strip()))
        if path[0] not in self.fields:
            raise self.error(f"Selector {text!r} is not valid")
        return path

    def parse_match(self):
        tok = self.peek()
        if tok is None:
            raise self.error("unexpected end of expression")
        # <Value> [not] in <Selector>
        value_first = self.is_word("in", 1) or (self.is_word("not", 1) and self.is_word("in", 2))
        if tok[0] == "string" or (tok[0] == "word" and value_first):
            value = self.value()
            negate = self.optional("not")
            self.expect("in")
            path = self.selector()
            return _match(path, lambda v: _contains(v, value), negate)
        path = self.selector()
        kind, text = self.take()
        if kind == "op":
            value = self.value()
            return _match(path, lambda v: _equal(v, value), text == "!=")
        negate = False
        if text == "is":
            negate = self.optional("not")
            self.expect("empty")
            return _match(path, _empty, negate, missing_is=True)
        if text == "not":
            negate = True
            kind, text = self.take()
        if text == "contains":
            value = self.value()
            return _match(path, lambda v: _contains(v, value), negate)
        if text == "matches":
            value = self.value()
            try:
                pattern = re.compile(value)
            except re.error as exc:
                raise self.error(f"invalid regular expression {value!r}: {exc}") from None
            return _match(path, lambda v: isinstance(v, str) and pattern.search(v) is not None, negate)
        raise self.error(f"unexpected {text!r}")


def _resolve(value: Any, path: list[str]) -> list[Any]:
    """All values the path reaches; lists fan out (any-element semantics)."""
    values = [value]
    for part in path:
        nxt = []
        for v in values:
            if isinstance(v, list) and not all(isinstance(x, str) for x in v):
                v_items = v
            else:
                v_items = [v]
            for item in v_items:
                if isinstance(item, dict):
                    nxt.append(item.get(part, _MISSING))
                else:
                    nxt.append(_MISSING)
        values = nxt
    return values


def _match(path: list[str], test: Callable[[Any], bool], negate: bool, missing_is: bool = False):
    def evaluate(row: Any) -> bool:
        values = _resolve(row, path)
        hit = any(missing_is if v is _MISSING else test(v) for v in values)
        return hit != negate

    return evaluate


def _equal(actual: Any, expected: str) -> bool:
    if isinstance(actual, bool):
        return str(actual).lower() == expected.lower()
    if isinstance(actual, int):
        return str(actual) == expected
    return actual == expected


def _contains(actual: Any, expected: str) -> bool:
    if isinstance(actual, str):
        return expected in actual
    if isinstance(actual, (list, dict)):
        return expected in actual
    return False


def _empty(actual: Any) -> bool:
    return actual in (None, "", [], {})


def compile_filter(text: str, fields: set[str]) -> Callable[[Any], bool]:
    """Compile ``text`` into a predicate over rows whose top-level keys are ``fields``."""
    return _Parser(text, fields).parse()
