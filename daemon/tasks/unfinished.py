"""A string an answer may not close yet, at the token level: while an ST body does not use
every value the request states (``7.5 bar`` written, or a setpoint that holds it read),
the tokens that would close it are refused, so the model writes the statement that uses
the value instead of an answer the ``relevance`` check refuses after the whole try.

As with the name guard (``names.py``), a position whose every allowed token would be
refused keeps them, and the validators judge the answer. ``OpenGuard`` follows one
answer's tokens (``seen``) and says which tokens to refuse next (``refused``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# (the answer's text up to and including the string's opening mark, the string so far,
# JSON-escaped) -> whether it may not close yet
Unfinished = Callable[[str, str], bool]
QUOTE = '"'


class OpenGuard:
    """One answer's string kept open: the string opens where the text reaches ``mark``
    (``"body":"``); from there it is followed token by token until a token closes it.
    ``quotes``: the tokens that carry a quote (in a JSON string, the one that closes it)."""

    def __init__(self, quotes: Sequence[int], mark: str, unfinished: Unfinished) -> None:
        self.quotes, self.mark, self.unfinished = quotes, mark, unfinished
        self.head: str | None = None
        self.written = ""
        self.closed = False
        self.hold = False

    def seen(self, token_text: str, text: Callable[[], str]) -> None:
        """Follow the answer over its next token (``text`` gives the whole answer so far,
        decoded only until the string opens)."""
        if self.closed:
            return
        if self.head is None:
            if QUOTE not in token_text:
                return
            whole = text()
            at = whole.find(self.mark)
            if at < 0:
                return
            self.head, self.written = whole[:at + len(self.mark)], whole[at + len(self.mark):]
            if QUOTE in self.written:
                self.closed = True
                return
        elif QUOTE in token_text:
            self.closed, self.hold = True, False
            return
        else:
            self.written += token_text
        self.hold = self.unfinished(self.head, self.written)

    def refused(self) -> Sequence[int]:
        """The tokens that would close the string while it may not close yet."""
        return self.quotes if self.hold else ()
