"""The one backoff (``daemon/backoff.py``): delays by failures in a row, the cap, reset,
jitter; and the parts that wait with it keep their numbers."""

from __future__ import annotations

import pytest

from rung.daemon.backoff import Backoff
from rung.daemon.mqtt.outbox import JOURNAL_RETRY_MAX_S, JOURNAL_RETRY_S
from rung.daemon.supervise import Policy


def test_delays_double_from_first_to_the_cap() -> None:
    b = Backoff(0.5, 30.0)
    assert [b.next() for _ in range(9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert b.failures == 9


def test_reset_starts_over() -> None:
    b = Backoff(0.2, 2.0)
    assert [b.next() for _ in range(3)] == [0.2, 0.4, 0.8]
    b.reset()
    assert b.failures == 0
    assert [b.next() for _ in range(5)] == [0.2, 0.4, 0.8, 1.6, 2.0]


def test_stateless_delay_by_failures_in_a_row() -> None:
    b = Backoff(0.05, 0.65)
    assert [b.delay(n) for n in range(1, 7)] == [0.05, 0.1, 0.2, 0.4, 0.65, 0.65]
    assert b.delay(0) == b.delay(-3) == 0.05        # less than one failure counts as one
    assert b.delay(10**9) == 0.65                   # no overflow far past the cap
    assert b.failures == 0                          # ``delay`` counts nothing


def test_factor_and_a_cap_below_first() -> None:
    assert [Backoff(1.0, 100.0, factor=3.0).delay(n) for n in (1, 2, 3, 4, 5)] == [
        1.0, 3.0, 9.0, 27.0, 81.0]
    assert [Backoff(1.0, 1.0, factor=1.0).next() for _ in range(3)] == [1.0, 1.0, 1.0]
    assert Backoff(5.0, 2.0).delay(1) == 2.0        # the cap holds from the first delay


def test_jitter_takes_off_at_most_its_fraction() -> None:
    high = Backoff(1.0, 8.0, jitter=0.5, rng=lambda: 1.0)
    assert [high.next() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    none = Backoff(1.0, 8.0, jitter=0.5, rng=lambda: 0.0)
    assert [none.next() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    real = Backoff(1.0, 8.0, jitter=0.25)
    for n in range(1, 8):
        exact = Backoff(1.0, 8.0).delay(n)
        assert 0.75 * exact <= real.delay(n) <= exact


@pytest.mark.parametrize("kwargs", [{"jitter": -0.1}, {"jitter": 1.5}, {"factor": 0.5}])
def test_nonsense_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(1.0, 2.0, **kwargs)


def test_the_parts_keep_their_numbers() -> None:
    """The supervisor's restarts, the PLC handshake's backoff and the outbox's journal
    retries, through the one helper."""
    p = Policy()
    assert [p.delay(n) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    outbox = Backoff(JOURNAL_RETRY_S, JOURNAL_RETRY_MAX_S)
    assert [outbox.next() for _ in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
