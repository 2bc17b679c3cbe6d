"""A row's failure is contained to the row and logged once where it is contained, with
its traceback (engines/sequence.py): the answer says what failed in brief, the log says
where."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from rung.engines.sampler import SamplingParams
from rung.engines.sequence import advance, new_row
from rung.engines.tokenizer import Tokenizer, read_tokenizer_spec
from tests.engines.tiny_tokenizer import build_tiny_tokenizer


def test_a_rows_failure_is_logged_with_its_traceback(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    build_tiny_tokenizer(tmp_path)
    tok = Tokenizer.load(tmp_path, read_tokenizer_spec(tmp_path))
    row = new_row(tok, SamplingParams(), room=16)
    caplog.set_level(logging.ERROR, "rung.engine")
    advance(row, np.zeros((3, 3), dtype=np.float32), "row-7", None)   # logits of the wrong shape
    assert row.finish == "error" and row.error is not None
    (rec,) = caplog.records
    assert "row row-7 failed" in rec.getMessage() and rec.exc_info is not None
