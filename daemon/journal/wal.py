"""A check of an SQLite write-ahead log before SQLite opens it: does it end cleanly?

SQLite replays a WAL up to its last valid commit frame and silently ignores the rest: a torn
frame, a transaction cut short, a header cut off. The journal checkpoints after every write
and acknowledges a request to the broker only after that checkpoint, so acknowledged rows
never depend on the WAL; what a damaged tail can hold is a write that was never
acknowledged. It is still reported, never passed over: it means the disk or the file system
lost bytes it had promised to keep.

The format (https://sqlite.org/fileformat.html#the_write_ahead_log): a 32-byte header
(magic, version, page size, checkpoint sequence, salt-1, salt-2, checksum-1, checksum-2),
then frames of a 24-byte header (page number, database size after a commit or 0, salt-1,
salt-2, checksum-1, checksum-2) and one page. Checksums run cumulatively over 32-bit words
in the byte order the magic names.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

_MAGIC = {0x377F0682: "<", 0x377F0683: ">"}
_HEADER, _FRAME_HEADER = 32, 24


@dataclass(frozen=True)
class WalState:
    """What a WAL file holds: committed frames SQLite will replay, and the tail it will
    drop (bytes past the last valid commit that belong to this WAL generation)."""

    size: int
    committed_frames: int
    dropped_bytes: int
    problem: str | None      # None: the file ends cleanly (or there is none)


def _checksum(data: bytes, order: str, s0: int, s1: int) -> tuple[int, int]:
    words = struct.unpack(f"{order}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def inspect(path: Path) -> WalState:
    """Read ``path`` (a ``-wal`` file) and say whether SQLite would drop part of it."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return WalState(0, 0, 0, None)
    if not data:
        return WalState(0, 0, 0, None)
    if len(data) < _HEADER:
        return WalState(len(data), 0, len(data), f"a {len(data)}-byte header, cut short")
    magic, _version, page, _ckpt, salt1, salt2, c0, c1 = struct.unpack(">8I", data[:_HEADER])
    order = _MAGIC.get(magic)
    page = 65536 if page == 1 else page
    if order is None or page < 512 or page & (page - 1):
        return WalState(len(data), 0, len(data), "a header that is not an SQLite WAL header")
    s0, s1 = _checksum(data[:24], order, 0, 0)
    if (s0, s1) != (c0, c1):
        return WalState(len(data), 0, len(data), "a header with a wrong checksum")
    frame = _FRAME_HEADER + page
    committed = frames = 0
    end = _HEADER          # offset just past the last valid commit frame
    problem: str | None = None
    off = _HEADER
    while off < len(data):
        if len(data) - off < frame:
            problem = f"a frame cut short ({len(data) - off} of {frame} bytes)"
            break
        fh = data[off:off + _FRAME_HEADER]
        _pgno, db_size, f1, f2, fc0, fc1 = struct.unpack(">6I", fh)
        if (f1, f2) != (salt1, salt2):
            break           # a frame of an earlier generation: SQLite's normal leftovers
        s0, s1 = _checksum(fh[:8] + data[off + _FRAME_HEADER:off + frame], order, s0, s1)
        if (s0, s1) != (fc0, fc1):
            problem = "a frame with a wrong checksum (a torn write)"
            break
        frames += 1
        off += frame
        if db_size:
            committed, end = frames, off
    if problem is None and frames > committed:
        problem = f"{frames - committed} frames of a transaction without its commit"
    dropped = (len(data) - end) if problem is not None else 0
    return WalState(len(data), committed, dropped, problem)
