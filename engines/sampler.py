"""Choosing the next token from logits, and deciding when generation stops.

``SamplingParams`` are the per-request knobs, checked on construction. ``Sampler`` turns one
row of logits into a token id (greedy, or temperature / top-k / top-p sampling from a seeded
``numpy.random.Generator``), optionally restricted by a boolean mask of allowed tokens for
grammar-constrained decoding. ``StopChecker`` decides after each token whether generation
ends with ``"stop"`` (eos id or stop string) or ``"length"`` (max_tokens).

Sampling is total over every value ``SamplingParams`` accepts: the logits are shifted so the
largest is 0 before the temperature divides them, so a temperature that underflows (5e-324)
leaves only the largest logits (greedy, ties shared) and one that overflows the quotient
(1e308) spreads the draw evenly over the allowed tokens; neither reaches a NaN or an empty
candidate set.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rung.engines.errors import GenerationError

_PARAMS_HINT = "fix the request's sampling parameters"
_TOP_P_FIRST_WINDOW = 256  # candidates sorted before widening the top-p search


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens and when to stop; checked on construction.

    ``temperature`` 0 means greedy; ``top_k`` 0 and ``top_p`` 1.0 turn those filters off;
    ``seed`` None draws fresh entropy; ``stop`` strings end generation where they appear.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))
        self.validate()

    def validate(self) -> None:
        """Raise ``GenerationError`` naming the first field with an invalid value."""
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            self._bad("temperature", "must be a finite number >= 0 (0 = greedy)")
        if not (0.0 < self.top_p <= 1.0):
            self._bad("top_p", "must be in (0, 1]")
        if self.top_k < 0:
            self._bad("top_k", "must be >= 0 (0 = off)")
        if self.max_tokens < 1:
            self._bad("max_tokens", "must be >= 1")
        if any(not isinstance(s, str) or not s for s in self.stop):
            self._bad("stop", "must be non-empty strings")

    def _bad(self, name: str, rule: str) -> None:
        raise GenerationError(f"sampling parameter {name}={getattr(self, name)!r}: {rule}",
                              _PARAMS_HINT)


class Sampler:
    """Picks token ids from logits according to ``SamplingParams``.

    The random generator is created once from ``params.seed``: the same seed and the same
    logits give the same sequence of tokens.
    """

    def __init__(self, params: SamplingParams) -> None:
        params.validate()
        self.params = params
        self._rng = np.random.default_rng(params.seed)

    def sample(self, logits: npt.NDArray[np.floating],
               allowed: npt.NDArray[np.bool_] | None = None) -> int:
        """Return the next token id for a 1-D row of logits ``[V]``.

        ``allowed`` (boolean ``[V]``) removes every token it marks False before anything
        else. Greedy (temperature 0) takes the first maximum; otherwise logits are top-k
        filtered, divided by the temperature and softmaxed in float64, top-p filtered
        (smallest set reaching ``top_p``, at least one token) and one token is drawn. Where
        the mask leaves tokens whose logits are all -inf, those tokens count as equal.

        Raises:
            GenerationError: logits not 1-D or containing NaN, a mask of the wrong shape, or
                no token left to choose (every token masked out, or no mask and every logit
                -inf).
        """
        x = self._prepare(logits, allowed)
        if self.params.temperature == 0.0:
            return int(np.argmax(x))
        if 0 < self.params.top_k < x.shape[0]:
            x = _top_k(x, self.params.top_k)
        candidates, probs = _softmax_candidates(x, self.params.temperature)
        if self.params.top_p < 1.0:
            candidates, probs = _top_p(candidates, probs, x[candidates], self.params.top_p)
        return int(candidates[self._draw(probs)])

    def _prepare(self, logits: npt.NDArray[np.floating],
                 allowed: npt.NDArray[np.bool_] | None) -> npt.NDArray[np.float64]:
        """Check the inputs and return float64 logits with disallowed tokens at -inf."""
        x = np.asarray(logits, dtype=np.float64)
        if x.ndim != 1 or x.shape[0] == 0:
            raise GenerationError(f"logits must be a non-empty 1-D array, got shape {x.shape}",
                                  "pass one row of the engine's logits")
        if np.isnan(x).any():
            raise GenerationError("logits contain NaN",
                                  "the engine produced invalid output; check the engine")
        if allowed is not None:
            mask = np.asarray(allowed, dtype=np.bool_)
            if mask.shape != x.shape:
                raise GenerationError(f"allowed mask has shape {mask.shape}, logits {x.shape}",
                                      "build the mask over the full vocabulary")
            if not mask.any():
                raise GenerationError("no token is allowed: every logit is masked out",
                                      "check the grammar/allowed-token mask for this step")
            x = np.where(mask, x, -np.inf)
            if np.all(np.isneginf(x)):  # the grammar's choice stands: its tokens as equals
                return np.where(mask, 0.0, -np.inf)
        if np.all(np.isneginf(x)):
            raise GenerationError("no token is allowed: every logit is -inf",
                                  "the engine produced invalid output; check the engine")
        return x

    def _draw(self, probs: npt.NDArray[np.float64]) -> int:
        """Index drawn from unnormalized non-negative ``probs`` by inverse CDF."""
        cdf = np.cumsum(probs)
        u = self._rng.random() * cdf[-1]
        return min(int(np.searchsorted(cdf, u, side="right")), len(probs) - 1)


def _top_k(x: npt.NDArray[np.float64], k: int) -> npt.NDArray[np.float64]:
    """Keep the ``k`` largest logits (ties at the boundary kept), others to -inf."""
    kth = np.partition(x, -k)[-k]
    return np.where(x >= kth, x, -np.inf)


def _softmax_candidates(x: npt.NDArray[np.float64], temperature: float
                        ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """Softmax of ``x / temperature``; returns ids with non-zero probability and their probs.

    ``x`` holds at least one value above -inf. The shift by the maximum comes before the
    division, so the scaled logits lie in [-inf, 0] with the maxima at exactly 0: a quotient
    that overflows goes to -inf (probability 0), one that underflows to 0 (probability 1),
    never NaN. The halving keeps ``x - top`` finite for logits of any finite magnitude.
    """
    top = x.max()
    if np.isposinf(top):  # +inf logits take all the mass, shared evenly
        candidates = np.flatnonzero(np.isposinf(x))
        return candidates, np.full(candidates.shape[0], 1.0 / candidates.shape[0])
    with np.errstate(over="ignore", under="ignore"):
        scaled = (0.5 * x - 0.5 * top) / temperature * 2.0   # [V] in [-inf, 0]
        p = np.exp(scaled)
    candidates = np.flatnonzero(p > 0.0)
    probs = p[candidates]
    return candidates, probs / probs.sum()


def _top_p(candidates: npt.NDArray[np.intp], probs: npt.NDArray[np.float64],
           logits: npt.NDArray[np.float64],
           top_p: float) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float64]]:
    """Keep the most probable candidates whose cumulative probability first reaches top_p.

    Candidates are ranked by their ``logits`` (the order of ``probs``, without the ties a
    huge temperature rounds them into). Sorts only the first ``m`` (found by partition),
    growing ``m`` until they reach ``top_p``: the nucleus is usually small, the vocabulary
    is not.
    """
    n = len(probs)
    m = min(n, _TOP_P_FIRST_WINDOW)
    while True:
        top = np.argpartition(-logits, m - 1)[:m] if m < n else np.arange(n)
        order = top[np.argsort(-logits[top], kind="stable")]
        cumulative = np.cumsum(probs[order])
        keep = int(np.searchsorted(cumulative, top_p, side="left")) + 1
        if keep <= m or m == n:
            keep = min(keep, m)
            return candidates[order[:keep]], probs[order[:keep]]
        m = m * 16 if m * 16 < n // 4 else n


class StopChecker:
    """Decides after each generated token whether generation is finished.

    The text passed to ``check`` is the whole decoded output so far; only its tail that
    could hold a new stop-string match (new text plus the longest stop string) is searched.
    """

    def __init__(self, eos_ids: Iterable[int], stop: Sequence[str], max_tokens: int) -> None:
        self._eos = frozenset(int(i) for i in eos_ids)
        self._stop = tuple(s for s in stop if s)
        self._longest = max((len(s) for s in self._stop), default=0)
        self._max_tokens = max_tokens
        self._searched = 0  # length of the text already searched for stop strings


    @property
    def max_tokens(self) -> int:
        """Tokens a sequence may generate."""
        return self._max_tokens
    def check(self, token_id: int, text: str, n_generated: int) -> str | None:
        """``"stop"`` on an eos id or a stop string in ``text``, ``"length"`` once
        ``n_generated >= max_tokens``, else None."""
        if token_id in self._eos or self._stop_in_tail(text):
            return "stop"
        if n_generated >= self._max_tokens:
            return "length"
        return None

    def truncate(self, text: str) -> str:
        """``text`` cut at the earliest stop-string occurrence (the stop string excluded)."""
        hits = [i for i in (text.find(s) for s in self._stop) if i >= 0]
        return text[:min(hits)] if hits else text

    def _stop_in_tail(self, text: str) -> bool:
        """Search only the part of ``text`` where a match not seen before could lie."""
        if not self._stop:
            return False
        searched = self._searched if len(text) >= self._searched else 0
        tail = text[max(0, searched - self._longest + 1):]
        self._searched = len(text)
        return any(s in tail for s in self._stop)
