"""Answer one task request on an engine: input check -> prompt -> schema-constrained
generation -> parse -> validation. Every outcome is an ``Answer`` (``TaskResult`` here);
failures carry one of the contract's error codes (``bad_request``, ``unknown_task``,
``too_long``, ``truncated``, ``invalid_output``) and never a half object presented as valid.
Batches and retries are driven by ``drive.Drive``, the same driver the daemon's scheduler
runs (``TaskRunner.run`` is a plain loop over it).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rung.daemon.request import Answer, Request
from rung.daemon.tasks import shaping
from rung.daemon.tasks.drive import Drive, drive_all
from rung.daemon.tasks.names import Closers, NameGuard
from rung.daemon.tasks.task import Task, TaskError
from rung.daemon.tasks.validate import validate_output
from rung.engines import AnyEngine
from rung.engines.drafts import inexact
from rung.engines.errors import GenerationError, TokenizerError, brief
from rung.engines.grammar import Constraint, GrammarCompiler, GrammarError, Lark
from rung.engines.prefix_cache import PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer

if TYPE_CHECKING:
    from rung.daemon.config import RetriesConfig

log = logging.getLogger("rung.tasks")


# the runner's results are answers: one shape from the validator to the payload (tools
# and bench scripts know it by this name)
TaskResult = Answer


@dataclass
class Prepared:
    """A checked request, ready to generate."""

    task: Task
    data: Any
    ids: list[int]            # prompt, then the computed start of the answer
    constraint: Constraint
    params: SamplingParams
    prefix: str = ""          # the answer's start that code computed (in ``ids``)
    grammar_ms: float = 0.0   # building this request's grammar and matcher
    attempt: int = 1          # 1 = the first try; a verified retry counts on
    started: float = field(default_factory=time.monotonic)   # the first try's start
    failed_checks: tuple[str, ...] = ()   # of the tries before this one
    feedback: bool = False    # this try's prompt carries the findings of the one before
    room: int | None = None   # tokens the engine's context leaves after ``ids`` (None: any)

    @property
    def token_budget(self) -> int:
        """The tokens this try may write: its ``max_tokens`` or the context's room, the
        less."""
        cap = self.params.max_tokens
        return cap if self.room is None else min(cap, self.room)


RETRY_MODES = ("resample", "feedback")
FEEDBACK_FORMS = ("append", "transcript")
# a feedback retry needs room for an answer this much longer than the failed one (or for
# the request's max_tokens, when that is less); where its prompt leaves less, that try is
# resampled instead (the demo model's appended-feedback answers average 1.3 times the
# failed one's length)
FEEDBACK_ROOM = 1.5


@dataclass(frozen=True)
class RetryPolicy:
    """Verified retries: an answer that fails validation, or loops to the task's token
    limit, is tried again (``allows``), up to ``attempts`` tries in all (per task:
    ``per_task``), as long as no more than ``budget_s`` have passed since the first try
    started. Fail-closed after the last: ``invalid_output`` with the last findings, or
    ``truncated``.

    ``mode``: how a retry is made. ``resample``: the same prompt, another seed.
    ``feedback``: the prompt carries the validator's findings of the failed try
    (``form``: ``append`` adds them to the task's user turn, ``transcript`` puts the
    failed answer as the assistant's turn and the findings as the user's next one),
    sampled as a resampled try is (or as the request asked, greedy staying greedy, without
    ``feedback_sampled``); a try whose feedback prompt leaves too little room for the
    answer (``FEEDBACK_ROOM``) is resampled instead.
    Resampling is the default: with the demo model feedback passes no more answers, and
    fewer where many failed (docs/benchmarks/answers.md, "Answers that pass")."""

    attempts: int = 3
    budget_s: float = 60.0
    temperature: float = 0.7       # a greedy request is resampled at this temperature
    per_task: Mapping[str, int] = field(default_factory=dict)
    mode: str = "resample"
    form: str = "append"
    feedback_sampled: bool = True   # feedback tries at ``temperature`` too

    @classmethod
    def from_config(cls, r: RetriesConfig) -> RetryPolicy:
        """The policy the config's ``retries`` section sets (``rung serve`` and ``rung
        generate --task`` alike)."""
        return cls(r.attempts, r.budget_s, r.temperature, dict(r.per_task), mode=r.mode)

    def __post_init__(self) -> None:
        if self.mode not in RETRY_MODES or self.form not in FEEDBACK_FORMS:
            raise ValueError(f"retry mode {self.mode!r}, form {self.form!r}: expected a "
                             f"mode of {RETRY_MODES} and a form of {FEEDBACK_FORMS}")

    def allows(self, prepared: Prepared, result: Answer,
               deadline: float | None = None) -> bool:
        """Whether ``result`` gets another try: it failed its checks, or it ran out of the
        task's own token budget before its JSON closed (a loop another draw may not
        repeat; a request that asked for fewer tokens, or whose prompt left the answer
        less room in the engine's context than that budget, would run out again: the same
        prompt leaves the same room), and tries and time are left: within ``budget_s`` of
        the first try and before the request's ``deadline`` (wall clock, ``time.time()``;
        a retry after it would answer a request whose asker stopped waiting)."""
        if deadline is not None and time.time() >= deadline:
            return False
        code = (result.error or {}).get("code")
        retriable = code == "invalid_output" or (
            code == "truncated" and prepared.token_budget >= prepared.task.max_tokens)
        return (not result.ok and retriable
                and prepared.attempt < self.per_task.get(prepared.task.name, self.attempts)
                and time.monotonic() - prepared.started < self.budget_s)


def _request(task: str, data: Any) -> Request:
    """The request as the runner knows it (task and input); the driver gives an answer
    the request it was asked with."""
    return Request(task=task, input=data, received=time.time(), deadline=math.inf)


def _fail(task: str, data: Any, code: str, message: str,
          generation: Generation | None = None) -> Answer:
    return Answer(_request(task, data), False, code, message, generation=generation)


class TaskRunner:
    """Owns the compiled grammars of a set of tasks for one engine (compiled at start-up:
    a schema that cannot be enforced stops the start, it is never served unconstrained)."""

    def __init__(self, engine: AnyEngine, tokenizer: Tokenizer, tasks: Mapping[str, Task],
                 engine_dir: Path, prefix: PrefixCache | None = None,
                 shaped: bool = True, fast: bool = False) -> None:
        """``shaped``: narrow each request's grammar and compute what code can
        (``shaping``); off only to measure what that buys. ``fast``: decode with draft
        tokens checked per step (``engines/drafts.py``)."""
        self.engine, self.tokenizer, self.tasks = engine, tokenizer, dict(tasks)
        self.prefix = prefix
        self.shaped = shaped
        self.fast = fast
        self._closer_table: Closers | None = None   # built at the first name guarded
        self.compiler = GrammarCompiler(Path(engine_dir) / "tokenizer.json",
                                        tokenizer.eos_token_ids,
                                        engine.manifest.dims.vocab_size)
        self.grammars: dict[str, str] = {}
        for name, task in self.tasks.items():
            try:
                self.grammars[name] = self.compiler.compile(task.output_schema)
            except GrammarError as e:
                raise TaskError(f"{task.path}: key 'output_schema': {e.message}", e.hint) from e

    def prepare(self, name: str, data: Any, params: SamplingParams,
                max_tokens: int | None = None) -> Prepared | Answer:
        """Check a request and build what generation needs: its prompt ids, its grammar
        constraint and its sampling; or the failed answer (``unknown_task``,
        ``bad_request``, ``too_long``)."""
        task = self.tasks.get(name)
        if task is None:
            return _fail(name, data, "unknown_task", f"no task named {name!r}")
        try:
            task.check_input(data)   # and what the task's kind refuses (``Kind.check_input``)
            ids = self.prompt_ids(task, data)
            row_params = replace(params, stop=(), max_tokens=min(
                max_tokens or task.max_tokens, task.max_tokens))
        except (TaskError, TokenizerError, GenerationError) as e:
            return _fail(name, data, "bad_request", e.message)
        t0 = time.perf_counter()
        constraint, prefix_ids, prefix = self._shaped(task, data)
        grammar_ms = (time.perf_counter() - t0) * 1000
        ids += prefix_ids
        max_seq = self.engine.manifest.dims.max_seq
        if len(ids) >= max_seq:
            return _fail(name, data, "too_long", f"prompt of {len(ids)} tokens does not fit the "
                         f"engine's context of {max_seq}")
        return Prepared(task, data, ids, constraint, row_params, prefix, grammar_ms,
                        room=max_seq - len(ids))

    def _shaped(self, task: Task, data: Any) -> tuple[Constraint, list[int], str]:
        """The request's constraint (its narrowed schema, compiled once per distinct
        schema) already advanced over the answer's computed start, and that start's
        tokens."""
        shape = (task.kind.shape(task.output_schema, data) if self.shaped
                 else shaping.Shape(task.output_schema))
        grammar = (self.grammars[task.name] if shape.schema is task.output_schema
                   else self.compiler.compile(shape.schema))
        constraint = self.compiler.constraint(grammar)
        if shape.restage is not None or shape.names is not None:
            self._follow(constraint, shape)
        prefix_ids, prefix = fed_start(self.tokenizer, shape.prefix)
        for tok in prefix_ids:
            constraint.consume(tok)
        return constraint, prefix_ids, prefix

    def retry(self, prepared: Prepared, policy: RetryPolicy, failed: Answer) -> Prepared:
        """The next attempt at a request whose answer (``failed``) failed validation: the
        same shape; resampled (the task's prompt, at ``policy.temperature`` at least,
        another seed) or, in feedback mode, prompted with the findings of ``failed`` (see
        ``RetryPolicy``). The answer's computed start follows the prompt either way."""
        params = prepared.params
        seed = (params.seed or 0) + prepared.attempt   # a different draw each try
        constraint, prefix_ids, _ = self._shaped(prepared.task, prepared.data)
        ids = (self.feedback_ids(prepared.task, prepared.data, failed, policy.form)
               if policy.mode == "feedback" else None)
        feedback = ids is not None and self._room_for(len(ids) + len(prefix_ids), params,
                                                      failed)
        if ids is None or not feedback:
            ids = self.prompt_ids(prepared.task, prepared.data)
        temperature = (params.temperature if feedback and not policy.feedback_sampled
                       else max(params.temperature, policy.temperature))
        return replace(prepared, ids=ids + prefix_ids, constraint=constraint,
                       attempt=prepared.attempt + 1, failed_checks=failed.failed_checks,
                       feedback=feedback,
                       room=self.engine.manifest.dims.max_seq - len(ids) - len(prefix_ids),
                       params=replace(params, seed=seed, temperature=temperature))

    def feedback_ids(self, task: Task, data: Any, failed: Answer,
                     form: str = "append") -> list[int] | None:
        """The prompt of a feedback retry (``RetryPolicy.form``) as token ids; None when
        ``failed`` has no answer to show."""
        messages = task.messages(data)
        findings = feedback_findings(failed)
        if form == "append":
            messages[-1] = {"role": messages[-1]["role"], "content": (
                f"{messages[-1]['content'].rstrip()}\n\nA previous answer was refused: "
                f"{findings}. Answer again without these errors.")}
        else:
            if failed.generation is None:
                return None
            messages += [{"role": "assistant", "content": failed.generation.text},
                         {"role": "user", "content": f"This answer was refused: {findings}. "
                                                     "Answer again without these errors."}]
        return self.tokenizer.encode_chat(messages, render=self.render)

    def _room_for(self, prompt_len: int, params: SamplingParams, failed: Answer) -> bool:
        """Whether a prompt of ``prompt_len`` tokens leaves a retry room for its answer:
        ``FEEDBACK_ROOM`` times the failed answer's length, or ``params.max_tokens``
        when less."""
        written = len(failed.generation.token_ids) if failed.generation is not None else 0
        need = min(params.max_tokens, math.ceil(FEEDBACK_ROOM * written))
        return prompt_len + need <= self.engine.manifest.dims.max_seq

    def _follow(self, constraint: Constraint, shape: shaping.Shape) -> None:
        """Hook a shape's restage and name guard onto ``constraint``: each token is read by
        its own text; the answer's whole text is decoded only when one of them asks (the
        restage after a token carrying ``shape.restage_at``, the guard after a quote or a
        colon); a stage the answer is already in is not applied again."""
        restage, at = shape.restage, shape.restage_at
        guard = (NameGuard(self._closers(), shape.names) if shape.names is not None
                 else None)
        applied: list[dict[str, Any] | Lark] = []
        texts = self.tokenizer.token_texts()

        def on_tokens(tokens: list[int]) -> str | None:
            last = texts[tokens[-1]] if tokens[-1] < len(texts) else ""
            answer: list[str] = []

            def text() -> str:
                if not answer:
                    answer.append(self.tokenizer.decode(tokens))
                return answer[0]

            if guard is not None:
                guard.seen(last, text)
            if restage is None or at not in last:
                return None
            spec = restage(text())
            if spec is None or spec in applied[-1:]:
                return None
            applied[:] = [spec]
            return (self.compiler.compile_lark(spec) if isinstance(spec, Lark)
                    else self.compiler.compile(spec))

        constraint.restage = on_tokens
        if guard is not None:
            constraint.refuse = guard.refused

    def _closers(self) -> Closers:
        if self._closer_table is None:
            self._closer_table = Closers(self.tokenizer.token_texts())
        return self._closer_table

    def finish(self, prepared: Prepared, gen: Generation) -> Answer:
        """Parse and validate a finished generation (a validator bug answers
        ``internal``, never loses the request)."""
        try:
            res = self._finish(prepared.task, prepared.data, gen, prepared.constraint,
                               prepared.prefix)
        except Exception as e:   # a validator bug: logged here, the client told in brief
            log.exception("checking a %s answer failed inside rung", prepared.task.name)
            res = _fail(prepared.task.name, prepared.data, "internal",
                        brief("checking the answer failed", type(e).__name__), gen)
        res.attempts = prepared.attempt
        res.failed_checks = prepared.failed_checks
        if not res.ok:
            res.failed_checks += (_failed_check(res),)
        return res

    def run(self, requests: Sequence[tuple[str, Any]],
            params: SamplingParams | Sequence[SamplingParams],
            max_tokens: int | None | Sequence[int | None] = None,
            retry: RetryPolicy | None = None, rows: int | None = None) -> list[Answer]:
        """Answer ``(task name, input)`` requests, in their order (sampling: one for all or
        one per request); each answer gets at most ``max_tokens`` (one for all or one per
        request; default and upper bound: the task's own); ``retry``: verified retries of
        answers that fail validation. Run as ``rung serve`` runs them: the daemon's driver
        (``drive.Drive``) on a continuous batch of ``rows`` rows (default: one per request),
        all that fit joining at once and the rest as rows free up; a request's failure is
        that request's answer."""
        all_params = ([params] * len(requests) if isinstance(params, SamplingParams)
                      else list(params))
        caps = (list(max_tokens) if isinstance(max_tokens, Sequence)
                else [max_tokens] * len(requests))
        if not requests:
            return []
        now = time.time()
        asked = [(Request(task=name, input=data, received=now, deadline=math.inf,
                          ref=f"request {i}", max_tokens=cap), p)
                 for i, ((name, data), p, cap) in enumerate(zip(requests, all_params, caps,
                                                                 strict=True))]
        return drive_all(Drive(self, rows or len(requests), retry), asked)

    def prompt_ids(self, task: Task, data: Any) -> list[int]:
        """The token ids of a request's prompt (system prompt + rendered user prompt)."""
        return self.tokenizer.encode_chat(task.messages(data), render=self.render)

    def render(self, messages: list[dict[str, str]]) -> str:
        """The chat as text; a template without a system role gets the system prompt at
        the head of the user message instead."""
        try:
            return self.tokenizer.render_chat(messages)
        except TokenizerError:
            if messages[0]["role"] != "system":
                raise
            merged = f"{messages[0]['content']}\n\n{messages[1]['content']}"
            return self.tokenizer.render_chat([{"role": "user", "content": merged},
                                               *messages[2:]])

    def warm(self) -> dict[str, int]:
        """Prefill each task's fixed prompt head (the system prompt up to where the user's
        text starts) once and pin it in the prefix cache; tokens pinned per task."""
        if self.prefix is None:
            return {}
        sentinel = "\u2063rung\u2063"
        pinned = {}
        for name, task in self.tasks.items():
            text = self.render([{"role": "system", "content": task.system_prompt},
                                {"role": "user", "content": sentinel}])
            cut = text.find(sentinel)
            if cut < 0:  # the template rewrote the content: nothing fixed to pin
                pinned[name] = 0
                continue
            head = self.tokenizer.encode(text[:cut], add_bos=None)
            pinned[name] = self.prefix.warm(self.engine, head[:-1])  # the seam may re-merge
        return pinned

    def _finish(self, task: Task, data: Any, gen: Generation, constraint: Constraint,
                prefix: str = "") -> Answer:
        if gen.finish_reason == "error":   # this row's step failed; its neighbours went on
            kind = (gen.error or "").partition(":")[0] or "error"
            return _fail(task.name, data, "internal", brief("generation failed", kind), gen)
        if gen.finish_reason == "length" and not constraint.accepting:
            return _fail(task.name, data, "truncated", f"max_tokens reached after "
                         f"{len(gen.token_ids)} tokens before the JSON closed", gen)
        gen.text = prefix + gen.text   # the whole answer (its computed start included)
        try:
            output = json.loads(gen.text)
        except json.JSONDecodeError as e:
            return _fail(task.name, data, "invalid_output", f"output is not JSON ({e})", gen)
        ok, validation = validate_output(task.output_schema, task.kind, output, data)
        return Answer(_request(task.name, data), ok, None if ok else "invalid_output",
                      "" if ok else _first_error(validation), output, validation,
                      generation=gen)


def fed_start(tokenizer: Tokenizer, start: str) -> tuple[list[int], str]:
    """The tokens of an answer's computed start as the runner feeds them, and their text:
    all but the last token, which is left to the model (token healing: the text after it
    is forced by the grammar anyway, and the model picks the tokens it would have written
    at that seam). GrammarError where they do not decode to a start of ``start``."""
    ids = tokenizer.encode(start, add_bos=False)[:-1]
    text = tokenizer.decode(ids)
    if not start.startswith(text):
        raise GrammarError(f"the answer's computed start does not round-trip through "
                           f"the tokenizer ({text[:40]!r})")
    return ids, text


def fast_decoding(decode: str, engine: AnyEngine, key: str = "engine.decode") -> bool:
    """``decode`` (``key``: where it was given) resolved. Fast decoding must answer exactly
    as plain decoding does, so it applies to an engine without FFN gates (drafts run its
    FFNs unskipped) whose weights are float or, quantized, on the fused graph (exact through
    padded steps, see ``drafts.pads_steps``): auto chooses it there and plain elsewhere;
    fast asked of another engine is refused.

    Raises:
        GenerationError: fast on an engine where it would answer otherwise.
    """
    why = inexact(engine.manifest.weights, engine.ffn_skips is not None,
                  engine.manifest.kv.layout)
    if decode == "fast" and why is not None:
        raise GenerationError(f"{key} fast: on this engine fast decoding would answer "
                              f"otherwise than plain decoding ({why})",
                              "use auto (fast where the answers are the same) or plain")
    return decode == "fast" or (decode == "auto" and why is None)


def _failed_check(res: Answer) -> str:
    """The first failed validation section (or the error code)."""
    for name, section in (res.validation or {}).items():
        if isinstance(section, dict) and not section.get("ok", True) \
                and not section.get("advisory"):
            return name
    return (res.error or {}).get("code", "internal")


# findings a feedback retry is shown, at most
MAX_FINDINGS = 5


def feedback_findings(res: Answer) -> str:
    """The findings of a failed answer as one line for a feedback prompt: each failed
    check's errors (``section: line L, column C: message``), distinct, at most
    ``MAX_FINDINGS``; the error message where there are no sections."""
    found: list[str] = []
    for name, section in (res.validation or {}).items():
        if not isinstance(section, dict) or section.get("ok", True) or section.get("advisory"):
            continue
        for err in section.get("errors") or []:
            where = (f"line {err['line']}, column {err['column']}: " if "line" in err
                     else f"{err['path']}: " if err.get("path") else "")
            text = f"{name}: {where}{err.get('message', 'failed')}"
            if text not in found:
                found.append(text)
    if not found:
        return (res.error or {}).get("message", "validation failed")
    return "; ".join(found[:MAX_FINDINGS])


def _first_error(validation: Mapping[str, Any]) -> str:
    for name, section in validation.items():
        if isinstance(section, dict) and not section.get("ok", True) \
                and not section.get("advisory"):
            errs = section.get("errors") or [{}]
            return f"{name}: {errs[0].get('message', 'failed')}"
    return "validation failed"
