"""The open guard (``unfinished.OpenGuard``) over token texts, without a model."""

from __future__ import annotations

from rung.daemon.tasks.unfinished import OpenGuard

QUOTES = [7, 8]   # the tokens that carry a quote


def _follow(tokens: list[str]) -> tuple[OpenGuard, list[list[int]]]:
    asked: list[tuple[str, str]] = []

    def judge(head: str, written: str) -> bool:
        asked.append((head, written))
        return "x" not in written   # may close once it holds an x

    guard = OpenGuard(QUOTES, '"body":"', judge)
    text = ""
    refused = []
    for t in tokens:
        text += t
        guard.seen(t, lambda text=text: text)
        refused.append(list(guard.refused()))
    return guard, refused


def test_the_string_is_held_open_until_it_may_close() -> None:
    guard, refused = _follow(['{"a":1,', '"body":"', "ab", "c", "x", "y", '"', "}"])
    assert refused == [[], QUOTES, QUOTES, QUOTES, [], [], [], []]
    assert guard.head == '{"a":1,"body":"' and guard.closed


def test_a_mark_split_over_tokens_and_text_after_it_in_one_token() -> None:
    _, refused = _follow(['{"bo', 'dy":', '"ab', "x", '"}'])
    assert refused == [[], [], QUOTES, [], []]
    _, refused = _follow(['{"body', '":"x', '"}'])
    assert refused == [[], [], []]


def test_a_string_closed_in_the_token_that_opens_it_is_left_alone() -> None:
    guard, refused = _follow(['{"body":""', "}"])
    assert refused == [[], []] and guard.closed
