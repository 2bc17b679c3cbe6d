"""LoRA training on a real pretrained base (SmolLM2 cut to two layers): a few steps lower
the loss on the answers, the adapter is what ``rung export --adapter`` merges, a run
continues from its adapter, and a plant's own examples are checked line by line first."""

from __future__ import annotations

import io
import json
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from rung.export.exporter import ExportOptions, export
from rung.tools.corpus import generate
from rung.tools.corpus_reading import reword
from rung.tools.examples import read_examples
from rung.tools.train_lora import LoraTrainConfig, encode_all, main, train
from tests import real_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def base() -> Path:
    return real_checkpoint.cut_hf_dir(2)


def test_answers_are_trained_on_the_served_prompt(base: Path) -> None:
    """The prompt part is the chat ``rung serve`` encodes, followed by the answer's start
    where code writes one (fed as the runner feeds it: all but its last token); the loss
    starts where the model writes when served, and the answer ends with the end of the
    turn."""
    from rung.daemon.tasks.runner import TaskRunner
    from rung.daemon.tasks.task import load_tasks
    from rung.engines.tokenizer import Tokenizer, read_tokenizer_spec

    tok = Tokenizer.load(base, read_tokenizer_spec(base, extra_eos_ids=[]))
    tasks = dict(load_tasks())
    runner: Any = Namespace(tokenizer=tok)
    samples = generate(8, seed=4)
    encoded, _, _ = encode_all(base, samples, 4096)
    starts = {}
    for sample, (ids, start) in zip(samples, encoded, strict=True):
        task = tasks[sample["task"]]
        served = tok.encode_chat(task.messages(sample["input"]),
                                 render=lambda m: TaskRunner.render(runner, m))
        prefix = task.kind.shape(task.output_schema, sample["input"]).prefix
        assert ids[:len(served)] == served
        assert ids[len(served):start] == (tok.encode(prefix, add_bos=False)[:-1]
                                          if prefix else [])
        assert tok.decode(ids[len(served):-1]) == json.dumps(
            sample["output"], separators=(",", ":"), ensure_ascii=False)
        assert ids[-1] == tok.encode("<|im_end|>", add_bos=False)[0]
        starts[sample["task"]] = max(starts.get(sample["task"], 0), start - len(served))
    # an ST POU's declared start and a diagnosis's computed states are code's, not trained
    # on; a fault tree is the model's from its first token
    assert starts["st_code"] > 0 and starts["diagnosis"] > 0 and starts["fault_tree"] == 0


def test_a_few_steps_lower_the_loss_and_the_adapter_exports(base: Path, tmp_path: Path) -> None:
    samples = generate(6, seed=3)
    cfg = LoraTrainConfig(rank=4, alpha=8, lr=5e-3, warmup_steps=1, batch_tokens=8192,
                          max_steps=6, minutes=5.0, corpus="test")
    result = train(cfg, base, samples, tmp_path / "adapter", log=io.StringIO())
    losses = [h["loss"] for h in result["history"]]
    assert result["steps"] == 6 and losses[-1] < losses[0], losses
    assert result["final"] and result["machine"]["threads"] >= 1
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 4 and saved["base_model_name_or_path"] == "smollm2"
    log = json.loads((tmp_path / "adapter" / "training_log.json").read_text())
    assert log["config"]["corpus"] == "test" and log["tokens"] > 0
    m = export(base, tmp_path / "engine", ExportOptions(kv="fp32", max_seq=256,
                                                        adapter=tmp_path / "adapter"))
    assert m.adapter is not None and m.adapter["rank"] == 4 and m.adapter["modules"] == 14
    assert m.parity is not None and m.parity.passed
    # continued from the adapter: its first loss is the end of the first run's, not the
    # base's
    more = train(LoraTrainConfig(**{**cfg.__dict__, "max_steps": 1,
                                    "init": str(tmp_path / "adapter")}),
                 base, samples, tmp_path / "more", log=io.StringIO())
    assert more["history"][0]["loss"] < losses[0]


def test_a_plants_examples_are_checked_by_line(base: Path, tmp_path: Path) -> None:
    good = {"task": "st_code", "input": {"description": "Run the pump while start is held."},
            "answer": {"pou_type": "FUNCTION_BLOCK", "name": "FB_Pump", "variables": [
                {"section": "VAR_INPUT", "name": "bStart", "type": "BOOL"},
                {"section": "VAR_OUTPUT", "name": "bPump", "type": "BOOL"}],
                "body": "bPump := bStart;"}}
    undeclared = {**good, "answer": {**good["answer"], "variables": []}}
    lines = ["# our POUs", json.dumps(good), json.dumps(undeclared), "{not json",
             json.dumps({"task": "ladder", "input": {}, "answer": {}}),
             json.dumps({"task": "st_code", "input": {"description": ""}, "answer": {}})]
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n")
    kept, refused = read_examples(path)
    assert len(kept) == 1 and kept[0]["output"] == good["answer"]
    assert [n for n, _ in refused] == [3, 4, 5, 6]
    assert "undeclared identifier 'bPump'" in refused[0][1]
    assert "not JSON" in refused[1][1] and "'ladder'" in refused[2][1]
    assert "description" in refused[3][1]
    args = Namespace(base=str(base), seed=0, samples=None, rank=4, lr=None,
                     batch_tokens=4096, minutes=2.0, max_steps=1, save_minutes=10.0,
                     init=None, examples=path, tasks=None, out=tmp_path / "adapter")
    assert main(args) == 0
    log = json.loads((tmp_path / "adapter" / "training_log.json").read_text())
    assert log["train_samples"] == 1 and log["config"]["corpus"].startswith("examples:")


def test_reworded_requests_read_as_the_same_request() -> None:
    """A reworded ST request states the same values (code reads them alike) and its answer
    still passes every check; about half are asked as a description only."""
    import random

    from rung.daemon.tasks.st import request as st_request
    from rung.tools.corpus_reading import same_request

    rng = random.Random(0)
    samples = generate(40, seed=11, tasks=("st_code",))
    out = [reword(s, rng) for s in samples]
    changed = [(a, b) for a, b in zip(samples, out, strict=True) if b.get("reworded")]
    assert len(changed) >= 30
    assert sum("name" not in b["input"] for _, b in changed) >= 10
    from rung.daemon.tasks.shaping import compact
    from rung.daemon.tasks.task import load_tasks

    task = dict(load_tasks())["st_code"]
    for a, b in changed:
        # the answer starts as rung writes it for the reworded request, body kept
        prefix = task.kind.shape(task.output_schema, b["input"]).prefix
        assert compact(b["output"]).startswith(prefix), (prefix, compact(b["output"]))
        assert b["output"]["body"].count(";") == a["output"]["body"].count(";")
        assert [v.number for v in st_request.read(a["input"]).values] == \
            [v.number for v in st_request.read(b["input"]).values]
        assert same_request("st_code", a["input"], b["input"], b["output"])
    # a rewording that changes a stated value is refused
    a = next(s for s in samples if st_request.read(s["input"]).values)
    first = st_request.read(a["input"]).values[0].text
    bent = {**a["input"], "description": a["input"]["description"].replace(first, "987", 1)}
    assert not same_request("st_code", a["input"], bent, a["output"])
