"""The benchmark record rendered: a markdown table and a grouped bar chart; and the one way
every bench script writes its results (``<out>/<stamp>.json`` and ``.md``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

BASELINE = "ortgenai"


def write_record(out: Path, record: dict[str, Any], md: str) -> Path:
    """Write ``record`` as JSON and ``md`` next to it; returns the common stem."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / record["stamp"]   # a stamp may hold dots (a preset's "qwen2.5-0.5b")
    Path(f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    Path(f"{stem}.md").write_text(md)
    return stem


def by_size(first: str, label: Callable[[int], str], sizes: Sequence[int],
            results: Mapping[str, Mapping[int, float]],
            cell: Callable[[Mapping[int, float], int], str]) -> list[str]:
    """A markdown table of ``results`` (row name -> size -> value), one column a size."""
    return [f"| {first} | " + " | ".join(label(n) for n in sizes) + " |",
            "|---|" + "---|" * len(sizes),
            *(f"| {name} | " + " | ".join(cell(v, n) for n in sizes) + " |"
              for name, v in results.items())]


def publish(out: Path, record: dict[str, Any], md_lines: list[str]) -> None:
    """Write ``record`` and its markdown (``md_lines``) under ``out``; print the table."""
    text = "\n".join(md_lines) + "\n"
    stem = write_record(out, record, text)
    print(text)
    print(f"written {stem}.json/.md", file=sys.stderr)


def _decode(res: dict[str, Any], ctx: int) -> float | None:
    d = res.get("decode", {}).get(str(ctx))
    return None if d is None else float(d["tok_s"])


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def _ratio(res: dict[str, Any], base: dict[str, Any] | None, ctx: int) -> str:
    mine, theirs = _decode(res, ctx), None if base is None else _decode(base, ctx)
    return "n/a" if mine is None or not theirs else f"{mine / theirs:.2f}x"


def table(record: dict[str, Any]) -> str:
    """engine | prefill tok/s | TTFT | decode @ each context | decode ratio to the baseline
    (``record["baseline"]``, default ortgenai)."""
    w = record["workload"]
    c = w["contexts"]
    baseline = record.get("baseline", BASELINE)
    head = (f"| engine | prefill tok/s ({w['prompt']}) | TTFT ms ({w['prompt']}) | "
            + " | ".join(f"decode tok/s @{x}" for x in c)
            + f" | decode vs {baseline} ({' / '.join(f'@{x}' for x in c)}) |")
    gated = any("ffn_skip_ratio" in r for r in record["results"].values())
    if gated:
        head += " FFN skipped (decode) |"
    rows = [head, "|" + "---|" * (4 + len(c) + gated)]
    base = record["results"].get(baseline)
    base = None if base is None or "error" in base else base
    for name, res in record["results"].items():
        if "error" in res:
            rows.append(f"| {name} | failed: {res['error']} |" + " |" * (2 + len(c)))
            continue
        pre = res["prefill"]
        mark = " (1 token per batch)" if pre.get("note") else ""
        rows.append(f"| {name} | {pre['tok_s']:.1f}{mark} | {pre['ttft_ms']:.0f} | "
                    + " | ".join(_fmt(_decode(res, x)) for x in c) + " | "
                    + " / ".join(_ratio(res, base, x) for x in c) + " |"
                    + (f" {res['ffn_skip_ratio']:.1%} |" if "ffn_skip_ratio" in res
                       else " - |" if gated else ""))
    return "\n".join(rows) + "\n"


def _gib(m: dict[str, Any]) -> str:
    kb = str(m.get("mem_total") or "").split()
    return f"{int(kb[0]) / 2**20:.0f} GiB" if kb and kb[0].isdigit() else "? GiB"


def markdown(record: dict[str, Any]) -> str:
    m, w = record["machine"], record["workload"]
    v = ", ".join(f"{k} {val}" for k, val in m["versions"].items())
    weights = record.get("engine_weights") or {}
    precision = ("fp32" if set(weights.values()) <= {"fp32"} else "weights: " + ", ".join(
        f"{e} {p}" for e, p in weights.items()))
    return (f"# rung benchmark {record['stamp']} ({record['model']}, {precision}, greedy)\n\n"
            f"Command: `{record['command']}`\n\n"
            f"Machine: {m['cpu_model']}, {m['cpus_usable']} usable cores, {_gib(m)} RAM; "
            f"{w['threads']} threads per engine.\n\nVersions: {v}.\n\n"
            f"Median of {w['reps'] * w.get('rounds', 1)} repetitions{_rounds(w)}; decode = "
            f"{w['steps']} greedy steps after prefilling the stated context.\n\n"
            + table(record)
            + ("\n" + roofline_section(record) if "bandwidth_gbs" in record else ""))


def roofline_section(record: dict[str, Any]) -> str:
    from roofline import section

    return section(record)


def _rounds(w: dict[str, Any]) -> str:
    rounds = w.get("rounds", 1)
    return f" ({rounds} rounds over the engines in turn)" if rounds > 1 else ""


def plot(record: dict[str, Any], path: Path) -> None:
    """Two panels of grouped bars: prefill tok/s, and decode tok/s per context."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = {k: r for k, r in record["results"].items() if "error" not in r}
    ctxs = record["workload"]["contexts"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12.5, 4.2),
                                   gridspec_kw={"width_ratios": [1, len(ctxs)]})
    width = 0.8 / max(len(ok), 1)
    for i, (name, res) in enumerate(ok.items()):
        bars = ax1.bar([i * width], [res["prefill"]["tok_s"]], width, label=name)
        ax1.bar_label(bars, fmt="%.0f", fontsize=8)
        xs = [j + i * width for j in range(len(ctxs))]
        bars = ax2.bar(xs, [_decode(res, c) or 0.0 for c in ctxs], width, label=name)
        ax2.bar_label(bars, fmt="%.1f", fontsize=8)
    ax1.set_xticks([width * (len(ok) - 1) / 2], [f"prompt {record['workload']['prompt']}"])
    ax1.set_title("prefill (tokens/s)")
    ax2.set_xticks([j + width * (len(ok) - 1) / 2 for j in range(len(ctxs))],
                   [f"context {c}" for c in ctxs])
    ax2.set_title("decode (tokens/s)")
    ax2.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.suptitle(f"{record['model']} {record.get('weights', 'fp32')} weights, "
                 f"{record['workload']['threads']} threads, "
                 f"{record['machine']['cpu_model']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
