"""Recorded logs: routes of segments of zstandard-compressed Cap'n Proto `Event`s, as modeld-record writes them.

Layout (openpilot's): a route is a folder of segment folders `<route>--<n>/`, each holding `rlog.zst` (the events)
and, when cameras were recorded, `road.mkv`, `wide.mkv`, `driver.mkv` (each frame's pts is its frame id).
`rlog.zst` is a sequence of zstd frames whose concatenated content is the messages back to back, exactly the bytes
that were published. Cap'n Proto messages are self-delimiting (a segment table leads each one), so a file cut
short by a crash ends in a partial message that the framing detects; the reader stops there and warns.
"""
from __future__ import annotations
import heapq, logging, re, struct, sys
from pathlib import Path
from typing import Iterator
import zstandard as zstd
from cereal.messaging import MalformedMessageError, log_from_bytes

logger = logging.getLogger("tools.logreader")
LOG_NAME = "rlog.zst"
VIDEO_NAMES = {"road": "road.mkv", "wide": "wide.mkv", "driver": "driver.mkv"}
REORDER_NS = 1_000_000_000   # events are put in time order within this window (publishers interleave slightly)
MAX_SEGMENTS = 512           # Cap'n Proto's own reader limit on segments per message

def message_length(buf: bytes | memoryview, pos: int = 0) -> int | None:
  """Byte length of the Cap'n Proto message at buf[pos:] from its segment table; None if buf ends before the
  table does or the table is implausible (so: not a message start)."""
  if len(buf) - pos < 8: return None
  n = struct.unpack_from("<I", buf, pos)[0] + 1
  if n > MAX_SEGMENTS: return None
  head = (4 + 4 * n + 7) // 8 * 8
  if len(buf) - pos < head: return None
  return head + 8 * sum(struct.unpack_from(f"<{n}I", buf, pos + 4))

def split_messages(data: bytes) -> tuple[list[bytes], int]:
  """Whole messages back to back in data, and the number of trailing bytes that are not a whole message."""
  out, pos, mv = [], 0, memoryview(data)
  while pos < len(data):
    n = message_length(mv, pos)
    if n is None or pos + n > len(data): break
    out.append(data[pos:pos + n])
    pos += n
  return out, len(data) - pos

def read_log_file(path: str | Path) -> bytes:
  """The decompressed content of a log file (plain files too); a zstd stream cut short yields what it holds."""
  with open(path, "rb") as f:
    if f.read(4) != b"\x28\xb5\x2f\xfd": return Path(path).read_bytes()   # not zstd: an uncompressed rlog
    f.seek(0)
    chunks, r = [], zstd.ZstdDecompressor().stream_reader(f, read_across_frames=True)
    try:
      while chunk := r.read(1 << 20): chunks.append(chunk)
    except zstd.ZstdError as e:
      logger.warning("%s: compressed data is damaged after %d bytes (%s); reading what came before", path, sum(map(len, chunks)), e)
  return b"".join(chunks)

def _segment_number(p: Path) -> int:
  m = re.search(r"--(\d+)$", p.name)
  return int(m.group(1)) if m else -1

def segment_dirs(path: str | Path) -> list[Path]:
  """The segment folders of a route folder, in order; [path] for a segment folder."""
  p = Path(path)
  if (p / LOG_NAME).is_file(): return [p]
  segs = sorted((d for d in p.iterdir() if d.is_dir() and _segment_number(d) >= 0 and (d / LOG_NAME).is_file()), key=_segment_number)
  if not segs: raise FileNotFoundError(f"{p}: expected a route folder (with <route>--<n>/{LOG_NAME}) or a segment folder, found neither")
  return segs

def log_files(path: str | Path) -> list[Path]:
  p = Path(path)
  if p.is_file(): return [p]
  if not p.exists(): raise FileNotFoundError(f"{p}: no such log, segment or route")
  return [d / LOG_NAME for d in segment_dirs(p)]

class LogReader:
  """Events of a route folder, a segment folder or one log file, in time order (logMonoTime) across segments.

  `for ev in LogReader(path)` yields Event readers; `LogReader(path).raw()` yields (bytes, event) where bytes are
  exactly what was published. A truncated or damaged tail is skipped with a warning (see `.warnings`)."""
  def __init__(self, path: str | Path, sort_by_time: bool = True):
    self.files, self.sort_by_time, self.warnings = log_files(path), sort_by_time, []

  def _warn(self, msg: str) -> None:
    self.warnings.append(msg)
    logger.warning("%s", msg)

  def _file_events(self, path: Path) -> Iterator[tuple[bytes, object]]:
    msgs, rest = split_messages(read_log_file(path))
    if rest: self._warn(f"{path}: the last {rest} bytes are not a whole message (cut short by a crash?); read {len(msgs)} messages")
    for i, dat in enumerate(msgs):
      try: yield dat, log_from_bytes(dat)
      except MalformedMessageError as e: self._warn(f"{path}: message {i} skipped: {e}")

  def raw(self) -> Iterator[tuple[bytes, object]]:
    seq, heap = 0, []
    for f in self.files:
      for dat, ev in self._file_events(f):
        if not self.sort_by_time:
          yield dat, ev
          continue
        heapq.heappush(heap, (ev.logMonoTime, seq, dat, ev))
        seq += 1
        while heap and heap[0][0] < ev.logMonoTime - REORDER_NS:
          yield heapq.heappop(heap)[2:]
    while heap: yield heapq.heappop(heap)[2:]

  def __iter__(self) -> Iterator[object]:
    for _, ev in self.raw(): yield ev

def main(argv: list[str] | None = None) -> int:
  import argparse
  ap = argparse.ArgumentParser(description="Summarise a recorded route, segment or log file: events per service and time span.")
  ap.add_argument("path", help="route folder, segment folder (<route>--<n>) or rlog.zst file")
  args = ap.parse_args(argv)
  counts, t0, t1 = {}, None, None
  lr = LogReader(args.path)
  for ev in lr:
    counts[ev.which()] = counts.get(ev.which(), 0) + 1
    t0, t1 = t0 if t0 is not None else ev.logMonoTime, ev.logMonoTime
  for s, n in sorted(counts.items()): print(f"{s:24s} {n}")
  if t0 is not None: print(f"{sum(counts.values())} events over {(t1 - t0) / 1e9:.2f} s in {len(lr.files)} file(s)")
  return 0

if __name__ == "__main__":
  sys.exit(main())
