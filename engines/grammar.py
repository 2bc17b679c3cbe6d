"""Schema-constrained decoding with llguidance, on numpy (no torch).

A ``GrammarCompiler`` is built once per engine from its ``tokenizer.json``; it turns a JSON
Schema into a grammar (compact JSON, no free whitespace) and refuses a schema with any
keyword llguidance cannot enforce, naming it: rung never falls back to unconstrained
generation. A ``Constraint`` follows one sequence: ``allowed()`` gives the token mask for
the next step, ``consume()`` advances it with the sampled token.
"""

from __future__ import annotations

import json
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from rung.engines.errors import RungError

if TYPE_CHECKING:  # a stub-only type
    from llguidance._lib import JsonCompileOptions

JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False}
CACHE_SIZE = 512   # compiled grammars kept (the task schemas and the recent narrowed ones)


class GrammarError(RungError):
    """A schema cannot be enforced, or a constraint broke while decoding."""


def unenforceable_keywords(schema: dict[str, Any]) -> list[str]:
    """The schema keywords llguidance cannot enforce (empty list = all enforceable)."""
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if not is_error:
        return []
    found = re.findall(r'"([^"]+)"', " ".join(m for m in messages if "nimplemented" in m))
    return found or [m for m in messages]


@dataclass(frozen=True)
class Lark:
    """A grammar in llguidance's Lark syntax, for what a JSON Schema cannot say (e.g. a
    language inside a string, over names the answer declared)."""

    text: str


class GrammarCompiler:
    """Compiles JSON Schemas for one tokenizer."""

    def __init__(self, tokenizer_json: Path, eos_ids: Sequence[int], vocab_size: int) -> None:
        try:
            self.tokenizer = llguidance.LLTokenizer(
                Path(tokenizer_json).read_text(encoding="utf-8"), n_vocab=vocab_size,
                eos_token=list(eos_ids) if eos_ids else None)
        except (OSError, ValueError, RuntimeError) as e:
            raise GrammarError(f"{tokenizer_json}: llguidance cannot use this tokenizer ({e})",
                               "export the model with a tokenizer.json from `tokenizers`") from e
        self.vocab_size = vocab_size
        self._cache: OrderedDict[str, str] = OrderedDict()   # LRU: requests narrow schemas

    def compile(self, schema: dict[str, Any]) -> str:
        """The grammar for ``schema``.

        Raises:
            GrammarError: a keyword the constraint engine cannot enforce, or a bad schema.
        """
        key = json.dumps(schema, sort_keys=True)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self.tokenizer)
        if is_error:
            bad = unenforceable_keywords(schema)
            detail = "; ".join(m.replace("\n", " ") for m in messages)
            raise GrammarError(f"schema cannot be enforced: {detail}",
                               f"remove or rewrite {', '.join(bad)}" if bad else None)
        self._cache[key] = grammar
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return grammar

    def compile_lark(self, lark: Lark) -> str:
        """The grammar for a Lark text, built per request while decoding: neither cached nor
        validated apart (a matcher built on a bad one is in error, and ``Constraint``
        reports it when it cannot replay the answer)."""
        try:
            return str(llguidance.grammar_from("lark", lark.text))
        except ValueError as e:
            raise GrammarError(f"bad Lark grammar: {e}") from e

    def constraint(self, grammar: str) -> Constraint:
        return Constraint(llguidance.LLMatcher(self.tokenizer, grammar), self.vocab_size,
                          self)


# (tokens consumed so far) -> the grammar for the whole document from here on, or None
Restage = Callable[[list[int]], str | None]


class Constraint:
    """One sequence's position in its grammar.

    A grammar may be narrowed while decoding (``restage``): after each token the callback
    sees the tokens so far and may return a grammar that also accepts them, built from
    what they say (e.g. references that must now resolve, names already taken); the
    matcher is rebuilt on it and the tokens replayed, so the rest is generated under it
    (until the callback narrows it again).
    """

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int,
                 compiler: GrammarCompiler | None = None) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.compiler = compiler
        self._bits = allocate_token_bitmask(1, vocab_size)
        self._filled = False                 # _bits hold the mask of the next position
        self.mask_seconds: list[float] = []  # time to compute each step's mask
        self.tokens: list[int] = []          # consumed so far
        self.restage: Restage | None = None
        self._refuse: Callable[[], Sequence[int]] | None = None
        self.restages = 0                    # times the grammar was narrowed
        self.restage_seconds = 0.0           # building and replaying the narrowed grammar

    @property
    def refuse(self) -> Callable[[], Sequence[int]] | None:
        """() -> tokens refused at the next position besides what the grammar refuses (a
        name kept new: ``daemon/tasks/names.py``); a position they would leave without any
        token keeps the grammar's choice; ids past the vocabulary are ignored."""
        return self._refuse

    @refuse.setter
    def refuse(self, hook: Callable[[], Sequence[int]] | None) -> None:
        self._refuse = hook
        self._filled = False   # the next mask is asked of the new hook

    def allowed(self) -> np.ndarray:
        """Boolean mask [V]: tokens the grammar accepts next (EOS once it is complete)."""
        self._fill()
        mask = np.unpackbits(self._bits.view(np.uint8), bitorder="little")[:self.vocab_size]
        return mask.astype(bool)

    def first_choice(self, logits: np.ndarray) -> int | None:
        """The highest of ``logits`` [V] (the first of equals) where the grammar accepts it
        next, else None: then the greedy pick under the mask is another token
        (``allowed()``). The model's own first choice is tested against the grammar's bits
        as they are, without unpacking the mask (most steps of a trained model)."""
        self._fill()
        if logits.shape != (self.vocab_size,):
            return None   # the sampler's checks say what is wrong with them
        tok = int(np.argmax(logits))
        if np.isnan(logits[tok]) or not (int(self._bits[0, tok >> 5]) >> (tok & 31)) & 1:
            return None   # NaN logits: the sampler's checks say so
        return tok

    def _fill(self) -> None:
        """The grammar's bits for the next token, once per position."""
        if self._filled:
            return
        t0 = time.perf_counter()
        fill_next_token_bitmask(self.matcher, self._bits, 0)
        if self.matcher.is_error():
            raise GrammarError(f"constraint failed: {self.matcher.get_error()}")
        refused = self._refuse() if self._refuse is not None else ()
        if len(refused):
            words = self._bits.view(np.uint32)[0]
            kept = words.copy()
            toks = np.asarray(refused, dtype=np.int64)
            toks = toks[(toks >= 0) & (toks < self.vocab_size)]
            np.bitwise_and.at(words, toks >> 5,
                              ~(np.uint32(1) << (toks & 31).astype(np.uint32)))
            if not words.any():
                words[:] = kept
        self.mask_seconds.append(time.perf_counter() - t0)
        self._filled = True

    def consume(self, token: int) -> None:
        self._filled = False
        if not self.matcher.consume_token(token):
            raise GrammarError(f"constraint rejected token {token}: {self.matcher.get_error()}")
        self.tokens.append(token)
        if self.restage is not None:
            t0 = time.perf_counter()
            grammar = self.restage(self.tokens)
            if grammar is not None:
                self._rebuild(grammar)
            self.restage_seconds += time.perf_counter() - t0

    def _rebuild(self, grammar: str) -> None:
        """Continue under ``grammar``: a new matcher that has consumed the same tokens."""
        if self.compiler is None:
            raise GrammarError("a constraint without its compiler cannot be narrowed")
        matcher = llguidance.LLMatcher(self.compiler.tokenizer, grammar)
        if matcher.try_consume_tokens(self.tokens) != len(self.tokens):
            raise GrammarError("the narrowed grammar does not accept the answer so far: "
                               f"{matcher.get_error()}")
        self.matcher = matcher
        self._filled = False
        self.restages += 1

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (empty when the model has a choice)."""
        return list(self.matcher.compute_ff_tokens())

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of ``tokens`` the grammar would accept from here, in order."""
        return int(self.matcher.validate_tokens(tokens))

    @property
    def accepting(self) -> bool:
        """The text so far is a complete document of the grammar."""
        return bool(self.matcher.is_accepting())
