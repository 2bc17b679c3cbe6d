"""What the delivery journal's checkpoints cost per request.

    .venv/bin/python bench/journal_writes.py [--requests 300] [--dir DIR]

The four journal writes of one MQTT request (record, started, answer, delivered), on the
file system of ``--dir`` (default: a temporary directory), with rung's checkpoints and with
them switched off (plain WAL). Prints ms per request and the CPU it ran on.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_info

from rung.daemon.journal.store import Incoming, Journal


def per_request_ms(root: Path, n: int, checkpoints: bool) -> float:
    j = Journal(root / f"journal-{checkpoints}.db")
    if not checkpoints:
        j._checkpoint = lambda: None  # type: ignore[method-assign]
    t0 = time.perf_counter()
    for i in range(n):
        e = j.record(Incoming("b/req/st_code", b'{"input": {"description": "x"}, "id": "%d"}'
                              % i))
        assert e is not None
        j.started(e.seq)
        j.answer(e.seq, "b/res/x", b'{"ok": true}' * 50)
        j.delivered(e.seq)
    j.close()
    return (time.perf_counter() - t0) / n * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--dir", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for on in (True, False):
            print(f"{'checkpoints' if on else 'plain WAL'}: "
                  f"{per_request_ms(Path(tmp), args.requests, on):.2f} ms per request")
    print(f"cpu: {machine_info()['cpu_model']}, {machine_info()['cpu_count']} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
