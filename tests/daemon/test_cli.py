"""``rung export`` / ``rung generate`` as users run them: output forms, error lines, and a
serving path that never imports torch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rung.daemon.cli import main
from rung.engines.manifest import FORMAT_VERSION

pytestmark = pytest.mark.integration


def _rung(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rung.daemon", *args], capture_output=True,
                          text=True, timeout=300)


def test_export_then_generate_json(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "engine"
    assert main(["export", str(checkpoints["qwen3"][0]), "-o", str(out), "--max-seq", "96"]) == 0
    assert "greedy agreement 1.00" in capsys.readouterr().out
    assert main(["generate", str(out), "--prompt", "The pump is running.", "--max-tokens", "9",
                 "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # exactly one JSON object on stdout
    assert set(doc) >= {"text", "token_ids", "finish_reason", "output", "validation",
                        "timings", "ffn_skip_ratio"}
    assert set(doc["timings"]) == {"load_ms", "ttft_ms", "decode_tok_s"}
    assert doc["finish_reason"] in ("stop", "length") and 1 <= len(doc["token_ids"]) <= 9
    assert doc["kv"]["bytes_per_token"] > 0
    assert captured.err == ""  # --json keeps stderr quiet


def test_generate_streams_text(engines: dict[str, Path],
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", str(engines["llama"]), "--prompt", "Öl", "--raw",
                 "--max-tokens", "5", "--temperature", "0.7", "--seed", "3"]) == 0
    captured = capsys.readouterr()
    assert "generated" in captured.err and "tok/s" in captured.err


def test_serving_path_never_imports_torch(engines: dict[str, Path]) -> None:
    code = (
        "import sys\n"
        "from rung.daemon.cli import main\n"
        f"rc = main(['generate', {str(engines['qwen2'])!r}, '--prompt', 'hi', "
        "'--max-tokens', '4', '--json'])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'rung') and (m.startswith(('torch', 'transformers')) "
        "or m.startswith('rung.export')))\n"
        "print('LEAK', bad) if bad else print('CLEAN', rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "CLEAN 0", r.stdout + r.stderr


def _assert_one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("rung: error: ")
    for n in needles:
        assert n in lines[-1], lines[-1]


@pytest.fixture
def broken_ckpt(checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path) -> Path:
    dst = tmp_path / "hf"
    shutil.copytree(checkpoints["mistral"][0], dst)
    return dst


@pytest.mark.slow
def test_error_unsupported_architecture(broken_ckpt: Path, tmp_path: Path) -> None:
    cfg = json.loads((broken_ckpt / "config.json").read_text())
    cfg["architectures"] = ["FalconForCausalLM"]
    (broken_ckpt / "config.json").write_text(json.dumps(cfg))
    _assert_one_line_error(_rung("export", str(broken_ckpt), "-o", str(tmp_path / "e")),
                           "FalconForCausalLM", "not supported", "config.json")


@pytest.mark.slow
def test_error_missing_tokenizer(broken_ckpt: Path, tmp_path: Path) -> None:
    (broken_ckpt / "tokenizer.json").unlink()
    _assert_one_line_error(_rung("export", str(broken_ckpt), "-o", str(tmp_path / "e")),
                           "tokenizer.json")


@pytest.mark.slow
def test_error_truncated_safetensors(broken_ckpt: Path, tmp_path: Path) -> None:
    f = broken_ckpt / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    _assert_one_line_error(_rung("export", str(broken_ckpt), "-o", str(tmp_path / "e")),
                           "model.safetensors", "truncated")


def test_error_newer_manifest(engines: dict[str, Path], tmp_path: Path) -> None:
    dst = tmp_path / "engine"
    shutil.copytree(engines["llama"], dst)
    m = json.loads((dst / "manifest.json").read_text())
    m["format_version"] = FORMAT_VERSION + 1
    (dst / "manifest.json").write_text(json.dumps(m))
    _assert_one_line_error(_rung("generate", str(dst), "--prompt", "x"), "newer", "upgrade")


def test_error_bad_sampling_value(engines: dict[str, Path]) -> None:
    _assert_one_line_error(_rung("generate", str(engines["llama"]), "--prompt", "x",
                                 "--top-p", "1.5"), "top_p")


@pytest.mark.slow
def test_error_options_tensorrt_cannot_run(checkpoints: dict[str, tuple[Path, Any]],
                                           tmp_path: Path) -> None:
    _assert_one_line_error(_rung("export", str(checkpoints["llama"][0]), "-o",
                                 str(tmp_path / "e"), "--target", "trt", "--weights", "int8"),
                           "--weights int8 is not available with --target trt")


@pytest.mark.parametrize("kv,graph,dtype,layout,per_token", [
    ("fp8", "generic", "float8_e4m3fn", "position_major_SBHD", 160),
    ("fp16", "fused", "float16", "head_major_BHSD", 256),
])
def test_export_then_generate_reports_graph_and_kv(
        kv: str, graph: str, dtype: str, layout: str, per_token: int,
        checkpoints: dict[str, tuple[Path, Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "engine"
    assert main(["export", str(checkpoints["qwen2"][0]), "-o", str(out), "--kv", kv,
                 "--max-seq", "64"]) == 0
    assert (f"fp32 weights, {graph} graph, {dtype} KV {per_token} B/token"
            in capsys.readouterr().out)
    assert main(["generate", str(out), "--prompt", "Öl", "--max-tokens", "6", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kv"] == {"dtype": dtype, "layout": layout, "bytes_per_token": per_token}
    assert doc["graph"] == graph and len(doc["token_ids"]) >= 1


@pytest.mark.slow
def test_ffn_skip_calibrate_from_the_command_line(checkpoints: dict[str, tuple[Path, Any]],
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(f"Öltemperatur {i} °C, Druck {i % 7} bar;" for i in range(800)))
    out = tmp_path / "engine"
    assert main(["export", str(checkpoints["llama"][0]), "-o", str(out), "--max-seq", "128",
                 "--ffn-skip", "calibrate", "--calib-text", str(text),
                 "--quality-budget", "0.5"]) == 0
    assert "decode-step FFNs skipped on held-out text" in capsys.readouterr().out
    assert main(["generate", str(out), "--prompt", "Druck", "--max-tokens", "8",
                 "--json"]) == 0
    ratio = json.loads(capsys.readouterr().out)["ffn_skip_ratio"]
    assert isinstance(ratio, float) and 0.0 <= ratio <= 1.0


@pytest.mark.slow
def test_error_calibrate_without_text(checkpoints: dict[str, tuple[Path, Any]],
                                      tmp_path: Path) -> None:
    _assert_one_line_error(_rung("export", str(checkpoints["llama"][0]), "-o",
                                 str(tmp_path / "e"), "--ffn-skip", "calibrate"),
                           "--calib-text")


def test_generate_task_json_reports_output_and_validation(
        task_engine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = {"asset": "Pump 3", "points": [{"name": "oil_temp", "value": 91.0,
                                           "limits": {"alarm": 85}}]}
    rc = main(["generate", str(task_engine), "--task", "diagnosis", "--input",
               json.dumps(data), "--json", "--seed", "4", "--temperature", "1.0"])
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["task"] == "diagnosis" and set(doc) >= {
        "text", "token_ids", "finish_reason", "output", "validation", "timings",
        "ffn_skip_ratio"}
    if doc["ok"]:
        assert rc == 0 and doc["validation"]["schema"]["ok"] and "error" not in doc
    else:  # a random model: truncated, or valid JSON that fails the semantic checks
        assert rc == 1 and doc["error"]["code"] in ("truncated", "invalid_output")
        assert captured.err.strip().startswith(f"rung: error: {doc['error']['code']}")
        if doc["error"]["code"] == "truncated":
            assert doc["output"] is None and doc["finish_reason"] == "length"


def test_generate_task_errors(task_engine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", str(task_engine), "--task", "haiku", "--input", "{}",
                 "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["code"] == "unknown_task" and doc["finish_reason"] == "error"
    assert main(["generate", str(task_engine), "--task", "st_code", "--input",
                 '{"description": 5}', "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "bad_request"
    _assert_one_line_error(_rung("generate", str(task_engine), "--task", "st_code",
                                 "--input", "{not json"), "--input is not valid JSON")


def test_kv_cache_dir_restores_prefixes_across_runs(task_engine: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    prompt = "The hydraulic press reports low pressure and high oil temperature. " * 3
    docs = []
    for _ in range(2):
        assert main(["generate", str(task_engine), "--prompt", prompt, "--max-tokens", "8",
                     "--kv-cache", str(state), "--json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0]["cached_tokens"] == 0 and docs[1]["cached_tokens"] >= 64
    assert docs[0]["token_ids"] == docs[1]["token_ids"]
    files = sorted((state / "kv").glob("*.rkv"))
    assert files
    files[0].write_bytes(files[0].read_bytes()[:-10])   # a truncated entry: dropped, not used
    assert main(["generate", str(task_engine), "--prompt", prompt, "--max-tokens", "8",
                 "--kv-cache", str(state), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["token_ids"] == docs[0]["token_ids"]


def test_session_continues_a_conversation(task_engine: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    turns = ["Describe the pump alternation logic for two pumps in detail please.",
             "And the alarm?"]
    cached = []
    for text in turns:
        assert main(["generate", str(task_engine), "--prompt", text, "--max-tokens", "40",
                     "--kv-cache", str(state), "--session", "line3-pumps", "--json"]) == 0
        cached.append(json.loads(capsys.readouterr().out)["cached_tokens"])
    history = json.loads((state / "sessions" / "line3-pumps.json").read_text())
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert cached[0] == 0 and cached[1] >= 64  # the first turn's KV came back
    _assert_one_line_error(_rung("generate", str(task_engine), "--prompt", "x", "--session",
                                 "s1"), "--session needs --kv-cache")
