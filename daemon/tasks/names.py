"""Names an answer declares kept new, at the token level: while a name that must differ from
some others is being written (an ST variable's, after its ``"name":"``), the tokens that
would close the string as one of them are refused at that position (and at the opening
quote, a token that would write one whole, quote to quote).

A grammar could say the same (the name's terminal minus the names taken so far), but it
would be a new grammar for every name: llguidance compiles one in ~3-4 ms, about five
decode steps of the demo model, fifteen times in an answer of fourteen variables. Here the
answer keeps the grammar it has; the names' own syntax stays the grammar's, and a position
whose every allowed token would be refused keeps them (the validators then judge the
answer, as they judge every answer).

``NameGuard`` follows one answer's tokens (``seen``) and says which tokens to refuse next
(``refused``); ``Closers`` is the per-tokenizer table it looks them up in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# (the answer's text so far) -> when a name that must be new is being written: what of it
# is written (None: its opening quote comes next), and the names it may not be (compared
# case-insensitively); else None
NamesAt = Callable[[str], tuple[str | None, Sequence[str]] | None]
QUOTE = '"'
ASK_AFTER = (QUOTE, ":")   # a name opens after '"name":' and starts after its quote


class Closers:
    """The tokens that close a JSON string, by what they carry before the quote (upper
    case): a name "ab" + a token 'c"' closes as "abc"; and the tokens that open and close
    one, by what they carry between the quotes: a token '"id"' is a whole name."""

    def __init__(self, token_texts: Sequence[str]) -> None:
        self.by_prefix: dict[str, list[int]] = {}
        self.by_quoted: dict[str, list[int]] = {}
        for tid, text in enumerate(token_texts):
            cut = text.find(QUOTE)
            if cut < 0:
                continue
            self.by_prefix.setdefault(text[:cut].upper(), []).append(tid)
            end = text.find(QUOTE, 1) if cut == 0 else -1
            if end > 0:
                self.by_quoted.setdefault(text[1:end].upper(), []).append(tid)


class NameGuard:
    """One answer's names, kept new. ``names_at`` is asked after each token that carries a
    quote or a colon (a name opens after ``"name":``); from there the name is followed
    token by token until a token closes it."""

    def __init__(self, closers: Closers, names_at: NamesAt) -> None:
        self.closers = closers
        self.names_at = names_at
        self.written: str | None = None       # the name being written (None: not in one)
        self.opening = False                  # its opening quote comes next
        self.banned: frozenset[str] = frozenset()

    def seen(self, token_text: str, text: Callable[[], str]) -> None:
        """Follow the answer over its next token (``text`` gives the whole answer so far,
        decoded only when asked)."""
        if self.opening:
            self.opening = False
            rest = token_text[1:] if token_text.startswith(QUOTE) else None
            if rest is not None and QUOTE not in rest:
                self.written = rest     # opened, not closed: followed from here
            return
        if self.written is not None:
            if QUOTE in token_text:
                self.written = None     # closed
            else:
                self.written += token_text
            return
        if any(c in token_text for c in ASK_AFTER):
            found = self.names_at(text())
            if found is not None:
                written, banned = found
                self.written, self.opening = written, written is None
                self.banned = frozenset(n.upper() for n in banned if n)

    def refused(self) -> list[int]:
        """The tokens that would close the name being written as a banned one (or, at its
        opening quote, write a banned one whole)."""
        if self.opening:
            return [t for name in self.banned for t in self.closers.by_quoted.get(name, ())]
        if self.written is None:
            return []
        head = self.written.upper()
        out: list[int] = []
        for name in self.banned:
            if name.startswith(head):
                out += self.closers.by_prefix.get(name[len(head):], ())
        return out
