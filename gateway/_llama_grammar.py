"""Grammar checks for the embedded model's child process (see ``gateway/_llama_child.py``).

* **Grammars llama.cpp cannot take are errors, not crashes.** ``llama_sampler_init_grammar`` returns
  NULL for a grammar it cannot parse, and llama-cpp-python adds that NULL to the sampler chain, which
  kills the process (SIGSEGV) on the first token. A grammar that parses but needs a character no token
  produces aborts it too (see :func:`_dead_end`). :func:`unparsable_grammars_are_errors` raises
  :class:`GrammarError` for both instead, which :mod:`gateway._llama_requests` answers with a 400.

Nothing at module level may import llama.cpp (the gateway imports the child's module).
"""

from __future__ import annotations

from typing import Any


class GrammarError(ValueError):
    """A grammar (a request's ``grammar``, or one built from a JSON schema) llama.cpp cannot parse or survive."""


# Code points a token can produce: llama.cpp matches grammars against C strings of decoded UTF-8,
# so never NUL (a C string ends there) and never a surrogate or anything past U+10FFFF.
_PRODUCIBLE = ((0x01, 0xD7FF), (0xE000, 0x10FFFF))
_ESCAPES = {"x": 2, "u": 4, "U": 8}
_NAMED_ESCAPES = {"t": 0x09, "r": 0x0D, "n": 0x0A}


def _grammar_char(text: str, index: int) -> tuple[int, int]:
    """The code point of the (possibly escaped) GBNF character at ``index``, and the index after it."""
    if text[index] != "\\" or index + 1 >= len(text):
        return ord(text[index]), index + 1
    kind = text[index + 1]
    if kind in _ESCAPES:
        digits = text[index + 2 : index + 2 + _ESCAPES[kind]]
        try:
            return int(digits, 16), index + 2 + len(digits)
        except ValueError:
            return -1, index + 2 + len(digits)  # llama.cpp refuses it when parsing
    return _NAMED_ESCAPES.get(kind, ord(kind)), index + 2


def _covers(ranges: list[tuple[int, int]], low: int, high: int) -> bool:
    """Whether the union of ``ranges`` covers every code point from ``low`` to ``high``."""
    for start, end in sorted(ranges):
        if start > low:
            return False
        low = max(low, end + 1)
        if low > high:
            return True
    return low > high


def _dead_end(grammar: str) -> str | None:
    """What in ``grammar`` no token can ever produce (a NUL, an empty character class, ...), or None.

    llama.cpp does not survive such a grammar: once it masks every token, whichever token is sampled
    fails the grammar's accept step, which throws a C++ exception through the C API and aborts the
    process. Conservative: an unproducible literal or class anywhere in the grammar counts.
    """
    index = 0
    while index < len(grammar):
        char = grammar[index]
        if char == "#":
            end = grammar.find("\n", index)
            index = len(grammar) if end < 0 else end
        elif char == '"':
            index += 1
            while index < len(grammar) and grammar[index] != '"':
                point, index = _grammar_char(grammar, index)
                if not any(low <= point <= high for low, high in _PRODUCIBLE):
                    return f"the character U+{max(point, 0):04X}"
            index += 1
        elif char == "[":
            start = index
            index += 1
            negated = grammar[index : index + 1] == "^"
            index += negated
            ranges: list[tuple[int, int]] = []
            while index < len(grammar) and grammar[index] != "]":
                low, index = _grammar_char(grammar, index)
                high = low
                if grammar[index : index + 1] == "-" and grammar[index + 1 : index + 2] not in ("", "]"):
                    high, index = _grammar_char(grammar, index + 1)
                ranges.append((low, high))
            index += 1
            if negated:
                possible = not all(_covers(ranges, low, high) for low, high in _PRODUCIBLE)
            else:
                possible = any(
                    max(low, p_low) <= min(high, p_high) for low, high in ranges for p_low, p_high in _PRODUCIBLE
                )
            if not possible:
                return f"the character class {grammar[start:index][:40]}"
        else:
            index += 1
    return None


def unparsable_grammars_are_errors() -> None:
    """Refuse a grammar llama.cpp cannot parse, or cannot survive, instead of crashing on it.

    ``llama_sampler_init_grammar`` returns NULL for a grammar it cannot parse, and llama-cpp-python
    adds that NULL to the sampler chain, which kills the process (SIGSEGV) on the first token: one
    request with ``"grammar": "root ::= ("`` would take the model down for everyone. A grammar that
    parses but needs a character no token produces aborts it too (see :func:`_dead_end`); that one is
    reachable with valid OpenAI fields (``response_format`` with ``{"const": "\\u0000"}``: llama-cpp-python's
    schema converter writes ``\\u0000`` into the grammar as a NUL).
    """
    import llama_cpp.llama_cpp as bindings
    from llama_cpp._internals import LlamaSampler

    def add_grammar(self: LlamaSampler, model: Any, grammar: Any) -> None:
        """``LlamaSampler.add_grammar``, raising :class:`GrammarError` where the stock one would crash."""
        dead_end = _dead_end(grammar._grammar)
        if dead_end is not None:
            raise GrammarError(f"the grammar requires {dead_end}, which the model can never produce")
        sampler = bindings.llama_sampler_init_grammar(
            model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
        )
        if not sampler:
            raise GrammarError("llama.cpp could not parse the grammar")
        bindings.llama_sampler_chain_add(self.sampler, sampler)

    LlamaSampler.add_grammar = add_grammar  # type: ignore[method-assign]

