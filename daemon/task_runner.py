"""Answer one task request on an engine: input check -> prompt -> schema-constrained
generation -> parse -> validation. Every outcome is a ``TaskResult``; failures carry one of
the contract's error codes (``bad_request``, ``unknown_task``, ``too_long``, ``truncated``,
``invalid_output``) and never a half object presented as valid.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rung.daemon.tasks import Task, TaskError
from rung.daemon.validate import validate_output
from rung.engines import AnyEngine
from rung.engines.errors import GenerationError, RungError, TokenizerError
from rung.engines.generate import generate
from rung.engines.grammar import Constraint, GrammarCompiler, GrammarError
from rung.engines.prefix_cache import PrefixCache
from rung.engines.sampler import SamplingParams
from rung.engines.sequence import Generation
from rung.engines.tokenizer import Tokenizer


@dataclass
class TaskResult:
    task: str
    ok: bool
    output: Any | None
    validation: dict[str, Any] | None
    error: dict[str, str] | None
    generation: Generation | None


@dataclass
class Prepared:
    """A checked request, ready to generate."""

    task: Task
    data: Any
    ids: list[int]
    constraint: Constraint
    params: SamplingParams


def _fail(task: str, code: str, message: str,
          generation: Generation | None = None) -> TaskResult:
    return TaskResult(task, False, None, None, {"code": code, "message": message}, generation)


class TaskRunner:
    """Owns the compiled grammars of a set of tasks for one engine (compiled at start-up:
    a schema that cannot be enforced stops the start, it is never served unconstrained)."""

    def __init__(self, engine: AnyEngine, tokenizer: Tokenizer, tasks: Mapping[str, Task],
                 engine_dir: Path, prefix: PrefixCache | None = None) -> None:
        self.engine, self.tokenizer, self.tasks = engine, tokenizer, dict(tasks)
        self.prefix = prefix
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
                max_tokens: int | None = None) -> Prepared | TaskResult:
        """Check a request and build what generation needs: its prompt ids, its grammar
        constraint and its sampling; or the failed ``TaskResult`` (``unknown_task``,
        ``bad_request``, ``too_long``)."""
        task = self.tasks.get(name)
        if task is None:
            return _fail(name, "unknown_task", f"no task named {name!r}")
        try:
            task.check_input(data)
            ids = self.prompt_ids(task, data)
            row_params = replace(params, stop=(), max_tokens=min(
                max_tokens or task.max_tokens, task.max_tokens))
        except (TaskError, TokenizerError, GenerationError) as e:
            return _fail(name, "bad_request", e.message)
        max_seq = self.engine.manifest.dims.max_seq
        if len(ids) >= max_seq:
            return _fail(name, "too_long", f"prompt of {len(ids)} tokens does not fit the "
                         f"engine's context of {max_seq}")
        return Prepared(task, data, ids, self.compiler.constraint(self.grammars[name]),
                        row_params)

    def finish(self, prepared: Prepared, gen: Generation) -> TaskResult:
        """Parse and validate a finished generation (a validator bug answers
        ``internal``, never loses the request)."""
        try:
            return self._finish(prepared.task, prepared.data, gen, prepared.constraint)
        except Exception as e:
            return _fail(prepared.task.name, "internal",
                         f"validation failed: {type(e).__name__}: {e}", gen)

    def run(self, requests: Sequence[tuple[str, Any]],
            params: SamplingParams | Sequence[SamplingParams],
            max_tokens: int | None | Sequence[int | None] = None) -> list[TaskResult]:
        """Answer ``(task name, input)`` requests as one batch (sampling: one for all or one
        per request); each answer gets at most ``max_tokens`` (one for all or one per
        request; default and upper bound: the task's own)."""
        all_params = ([params] * len(requests) if isinstance(params, SamplingParams)
                      else list(params))
        caps = (list(max_tokens) if isinstance(max_tokens, Sequence)
                else [max_tokens] * len(requests))
        results: list[TaskResult | None] = []
        todo: list[Prepared] = []
        slots: list[int] = []
        for (name, data), req_params, cap in zip(requests, all_params, caps, strict=True):
            p = self.prepare(name, data, req_params, cap)
            if isinstance(p, TaskResult):
                results.append(p)
                continue
            results.append(None)
            todo.append(p)
            slots.append(len(results) - 1)
        if todo:
            try:
                gens = generate(self.engine, self.tokenizer, [p.ids for p in todo],
                                [p.params for p in todo],
                                constraints=[p.constraint for p in todo], prefix=self.prefix)
            except RungError as e:  # one failed step answers every row of the batch
                for slot in slots:
                    results[slot] = _fail(requests[slot][0], "internal", str(e))
                return [r for r in results if r is not None]
            for slot, p, gen in zip(slots, todo, gens, strict=True):
                results[slot] = self.finish(p, gen)
        return [r for r in results if r is not None]

    def prompt_ids(self, task: Task, data: Any) -> list[int]:
        """The token ids of a request's prompt (system prompt + rendered user prompt)."""
        return self.tokenizer.encode(self.render(task.messages(data)), add_bos=None)

    def render(self, messages: list[dict[str, str]]) -> str:
        """The chat as text; a template without a system role gets the system prompt at
        the head of the user message instead."""
        try:
            return self.tokenizer.render_chat(messages)
        except TokenizerError:
            if messages[0]["role"] != "system":
                raise
            merged = f"{messages[0]['content']}\n\n{messages[1]['content']}"
            return self.tokenizer.render_chat([{"role": "user", "content": merged}])

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

    def _finish(self, task: Task, data: Any, gen: Generation,
                constraint: Constraint) -> TaskResult:
        if gen.finish_reason == "error":   # this row's step failed; its neighbours went on
            return _fail(task.name, "internal", f"generation failed: {gen.error}", gen)
        if gen.finish_reason == "length" and not constraint.accepting:
            return _fail(task.name, "truncated", f"max_tokens reached after "
                         f"{len(gen.token_ids)} tokens before the JSON closed", gen)
        try:
            output = json.loads(gen.text)
        except json.JSONDecodeError as e:
            return _fail(task.name, "invalid_output", f"output is not JSON ({e})", gen)
        ok, validation = validate_output(task.output_schema, task.validators, output, data)
        error = None if ok else {"code": "invalid_output", "message": _first_error(validation)}
        return TaskResult(task.name, ok, output, validation, error, gen)


def _first_error(validation: Mapping[str, Any]) -> str:
    for name, section in validation.items():
        if isinstance(section, dict) and not section.get("ok", True):
            errs = section.get("errors") or [{}]
            return f"{name}: {errs[0].get('message', 'failed')}"
    return "validation failed"
