"""Reading openpilot routes: segments, log files and the events in them, with the LogReader API openpilot users know.

Logs (rlog, qlog; zstd, bzip2 or plain) are Cap'n Proto Events back to back; what cannot be read (a cut, damaged data,
bytes that are no whole Event) is reported in `warnings` with file and offset, never yielded. docs/CAMERAD.md.
"""
from __future__ import annotations
import bz2, enum, glob, io, logging, re, struct
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator
from typing import BinaryIO
import zstandard as zstd
from cereal.messaging import MalformedMessageError, UnknownMemberError, log_from_bytes

logger = logging.getLogger(__name__)
LOG_NAMES = {"r": ("rlog.zst", "rlog.bz2", "rlog"), "q": ("qlog.zst", "qlog.bz2", "qlog")}

class ReadMode(enum.StrEnum):
  """Which log of each segment to read, as openpilot names the modes."""
  RLOG = "r"               # rlogs only
  QLOG = "q"               # qlogs only
  AUTO = "a"               # the rlog, else the qlog (with a warning)
  AUTO_INTERACTIVE = "i"   # openpilot asks before it falls back; nothing here prompts, so: as AUTO
MODES = tuple(m.value for m in ReadMode)
MAX_SEGMENTS = 512   # Cap'n Proto's own reader limit on segments per message
ZSTD_MAGIC, BZ2_MAGIC = b"\x28\xb5\x2f\xfd", b"BZh"

@dataclass(frozen=True)
class UnknownEvent:
  """An event whose union member this schema does not know (a newer openpilot's): its time, validity and bytes."""
  logMonoTime: int
  valid: bool
  data: bytes
  def which(self) -> str: return "unknown"

def message_length(buf: bytes | memoryview, pos: int = 0) -> int | None:
  """Byte length of the Cap'n Proto message at buf[pos:] from its segment table; None if buf ends before the
  table does or the table is implausible (so: not a message start)."""
  if len(buf) - pos < 8: return None
  n = struct.unpack_from("<I", buf, pos)[0] + 1
  if n > MAX_SEGMENTS: return None
  head = (4 + 4 * n + 7) // 8 * 8
  if len(buf) - pos < head: return None
  return head + 8 * sum(struct.unpack_from(f"<{n}I", buf, pos + 4))

ONE_SEGMENT = struct.Struct("<II")   # a segment table of one segment: (count - 1 = 0, its length in words)

def split_messages(data: bytes) -> tuple[list[tuple[int, bytes]], int]:
  """(offset, message) for the whole messages back to back in data, and the number of bytes after the last one."""
  out, pos, end, mv = [], 0, len(data), memoryview(data)
  while pos < end:
    # one segment, as every message a publisher builds: its length straight from the table
    if end - pos >= 8 and (head := ONE_SEGMENT.unpack_from(data, pos))[0] == 0: n = 8 + 8 * head[1]
    else: n = message_length(mv, pos)
    if n is None or pos + n > end: break
    out.append((pos, data[pos:pos + n]))
    pos += n
  return out, end - pos

def read_log_file(path: str | Path) -> tuple[bytes, str | None]:
  """The decompressed content of a log file (zstd, bzip2 or plain, told by its magic bytes) and a warning when the
  compressed data ends early or is damaged (what came before it is returned)."""
  with open(path, "rb") as f: return decompress(f)

def decompress(f: BinaryIO) -> tuple[bytes, str | None]:
  """read_log_file of an open binary file (or io.BytesIO)."""
  head = f.read(4)
  f.seek(0)
  if head == ZSTD_MAGIC: return _zstd_content(f)
  data = f.read()
  if not head.startswith(BZ2_MAGIC): return data, None
  d, out = bz2.BZ2Decompressor(), []
  try:
    while data:
      out.append(d.decompress(data))
      data = d.unused_data if d.eof else b""
      if d.eof and data: d = bz2.BZ2Decompressor()
  except OSError as e: return b"".join(out), f"compressed data is damaged after {sum(map(len, out))} bytes ({e})"
  return b"".join(out), None if d.eof else f"compressed data ends early after {sum(map(len, out))} bytes"

def _zstd_content(f: BinaryIO) -> tuple[bytes, str | None]:
  """read_log_file of a zstd file: one frame (a closed segment) or several (one cut short while recording), decoded
  frame by frame so that a file ending inside a frame is told apart from one ending after it (zstd's streaming reader
  returns the same bytes for both, silently)."""
  out, d, read, frame_at = [], zstd.ZstdDecompressor().decompressobj(), 0, 0
  try:
    while chunk := f.read(1 << 20):
      read += len(chunk)
      while chunk:
        out.append(d.decompress(chunk))
        if not d.eof: break
        chunk, frame_at = d.unused_data, read - len(d.unused_data)   # the next frame starts in this chunk
        d = zstd.ZstdDecompressor().decompressobj()
  except zstd.ZstdError as e:
    return b"".join(out), f"compressed data is damaged after {sum(map(len, out))} bytes ({e})"
  if read > frame_at:   # the last frame started was not ended
    return b"".join(out), f"compressed data ends early after {sum(map(len, out))} bytes: the zstd frame at byte {frame_at} of the file is cut short"
  return b"".join(out), None

def segment_number(p: Path) -> int:
  m = re.search(r"--(\d+)$", p.name)
  return int(m.group(1)) if m else -1

def route_name(seg: Path) -> str:
  """The route a segment folder belongs to: its name without `--<n>` (a folder not named as a segment: its name)."""
  return seg.name[:seg.name.rindex("--")] if segment_number(seg) >= 0 else seg.name

def segment_log(seg: Path, mode: str = "r") -> Path | None:
  """The segment's log file: mode 'r' rlog, 'q' qlog, 'a' (or 'i') rlog if there is one, else qlog."""
  for kind in ("rq" if mode in "ai" else mode):
    for name in LOG_NAMES[kind]:
      if (seg / name).is_file(): return seg / name
  return None

def segment_dirs(path: str | Path) -> list[Path]:
  """The segment folders of a route, in order: PATH itself if it is a segment, the segments inside PATH (a route
  folder; a folder holding several routes' segments, as a device's `realdata/`, gives them route by route), or the
  folders PATH--<n> beside it (a device's layout, PATH naming the route)."""
  p = Path(path)
  if p.is_dir() and segment_log(p, "a"): return [p]
  inside = [d for d in p.iterdir() if d.is_dir() and segment_number(d) >= 0] if p.is_dir() else []
  beside = [d for d in p.parent.glob(f"{p.name}--*") if d.is_dir() and segment_number(d) >= 0 and route_name(d) == p.name] \
    if p.parent.is_dir() else []
  segs = sorted((d for d in inside or beside if segment_log(d, "a")), key=lambda d: (route_name(d), segment_number(d)))
  if not segs:
    raise FileNotFoundError(f"{p}: expected a log file, a segment folder (<route>--<n>/ with rlog or qlog), a route folder "
                            f"holding segments, or a route name whose segments sit beside it; found none")
  return segs

def routes_of(files: list[Path]) -> list[str]:
  """The routes log files belong to, in order: a segment's route is its folder's route name and where that folder is
  (two runs' copies of one route are two routes); a lone log file is a route of its own folder."""
  return list(dict.fromkeys(str(f.parent.parent / route_name(f.parent)) if segment_number(f.parent) >= 0 else str(f.parent) for f in files))

SLICE = re.compile(r"-?\d+|-?\d*:-?\d*(?::-?\d+)?")
DASH_SLICE = re.compile(rf"(.+?)--({SLICE.pattern})")   # ROUTE--2, ROUTE--0:2, ROUTE---1: the shortest route name

def parse_identifier(identifier: str | Path) -> tuple[Path, str | None, str | None]:
  """(path, segment slice, mode) of a route identifier as openpilot writes them: a slice after `/` or `--` (`ROUTE/2`,
  `ROUTE/2:5`, `ROUTE/-1`, `ROUTE--2`, `ROUTE--0:2`), then a mode (`ROUTE/q`, `ROUTE/1:3/a`, `ROUTE--1:3/a`). A path
  that exists is taken as it is, and so is a route name whose segments sit beside it (`realdata/ROUTE`)."""
  p = Path(identifier)
  if p.exists(): return p, None, None
  mode = None
  if len(p.parts) > 1 and p.name in MODES: p, mode = p.parent, p.name
  if len(p.parts) > 1 and SLICE.fullmatch(p.name): return p.parent, p.name, mode
  if not p.exists() and (m := DASH_SLICE.fullmatch(p.name)) and not any(d.is_dir() for d in p.parent.glob(f"{glob.escape(p.name)}--*")):
    return p.with_name(m.group(1)), m.group(2), mode
  return p, None, mode

def select_segments(segs: list[Path], sl: str, where: str) -> list[Path]:
  """The segments a slice names, as openpilot's segment ranges do: `N` one segment (negative: from the end), `A:B[:S]`
  a Python slice over the segment numbers: over 0..B-1 when both bounds are given and not negative, else over 0..last.
  A segment named that the route does not have is an error (where: the identifier, for the messages)."""
  if len(routes := {route_name(d) for d in segs}) > 1:
    raise ValueError(f"{where}: holds {len(routes)} routes ({', '.join(sorted(routes))}): a segment range needs one route")
  by_n, last = {segment_number(d): d for d in segs}, max(segment_number(d) for d in segs)
  has = f"the route has {', '.join(map(str, sorted(by_n)))}"
  try:
    if ":" in sl:
      bounds = [int(x) if x else None for x in sl.split(":")]
      start, stop = bounds[0], bounds[1]
      n = stop if stop is not None and stop >= 0 and (start is None or start >= 0) else last + 1
      wanted = list(range(n))[slice(*bounds)]
    else: wanted = [int(sl) + (last + 1 if int(sl) < 0 else 0)]
  except ValueError as e: raise ValueError(f"{where}: not a segment range ({e})") from None
  if not wanted: raise FileNotFoundError(f"{where}: the range names no segment ({has})")
  if missing := [n for n in wanted if n not in by_n]:
    raise FileNotFoundError(f"{where}: no segment{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing)) if ':' in sl else sl} ({has})")
  return [by_n[n] for n in wanted]

def route_segments(identifier: str | Path) -> tuple[list[Path], str | None]:
  """The segment folders a route, a segment or an identifier with a segment range names, and the mode it carries."""
  p, sl, mode = parse_identifier(identifier)
  if not p.exists() and not p.parent.is_dir(): raise FileNotFoundError(f"{p}: no such log, segment or route")
  segs = segment_dirs(p)
  return (select_segments(segs, sl, str(identifier)) if sl else segs), mode

def log_files(identifier: str | Path | list, mode: str = "r") -> list[Path]:
  """The log files of log files, segments and routes, in order (a segment without the mode's log is an error). A route
  may carry a segment range and a mode, as openpilot's identifiers do: `ROUTE/2:4/q`."""
  if isinstance(identifier, (list, tuple)): return [f for i in identifier for f in log_files(i, mode)]
  if (p := Path(identifier)).is_file(): return [p]
  segs, sel = route_segments(identifier)
  mode = sel or mode
  files = [(d, segment_log(d, mode)) for d in segs]
  if missing := [d.name for d, f in files if f is None]:
    raise FileNotFoundError(f"{p}: no {'/'.join(LOG_NAMES[mode])} in segment(s) {', '.join(missing)} "
                            f"(mode {mode!r}; 'a' falls back to the qlog)" if mode in "rq" else f"{p}: no log in segment(s) {', '.join(missing)}")
  if mode in "ai" and (n := sum(f.name.startswith("qlog") for _, f in files)):
    logger.warning("%s: %d/%d rlogs not found, reading the qlogs of those segments", p, n, len(files))
  return [f for _, f in files]

class LogReader:
  """Events of log files, segments or routes (one, or a list), segment after segment.

  As openpilot's: `for ev in LogReader(path)`, `lr.filter('carState')` (the inner messages), `lr.first('initData')`,
  `LogReader.from_bytes(dat)`, `lr.run_across_segments(n, func)`, `lr.reset()`; `default_mode` a ReadMode ('r' rlogs,
  'q' qlogs, 'a' rlog else qlog, 'i' as 'a'), overridden per route by an identifier's own (`ROUTE/2:4/q`: segments 2 and
  3, qlogs); `sort_by_time` orders each file's events by logMonoTime; `only_union_types` leaves out events of members
  this schema does not know. Added: `raw()` yields (bytes, event), the bytes exactly as logged; `warnings` lists what
  could not be read, each also logged unless log_warnings is False (a second read of logs already reported).
  Routes are local paths: there is no download."""
  def __init__(self, identifier: str | Path | list, default_mode: str = ReadMode.RLOG, sort_by_time: bool = False, only_union_types: bool = False,
               log_warnings: bool = True):
    if default_mode not in MODES: raise ValueError(f"default_mode must be one of {', '.join(map(repr, MODES))}, got {default_mode!r}")
    self.identifier, self.default_mode, self.log_warnings = identifier, default_mode, log_warnings
    self.sort_by_time, self.only_union_types, self.warnings, self._data = sort_by_time, only_union_types, [], None
    self.reset()

  def reset(self) -> None:
    """Look for the log files again (a route still being recorded has grown)."""
    self.files = log_files(self.identifier, self.default_mode) if self.identifier is not None else []

  def run_across_segments(self, num_processes: int, func, disable_tqdm: bool = False, desc: str | None = None) -> list:
    """func(LogReader of one segment's log) in num_processes processes, one segment each; the lists it returns, joined
    in segment order."""
    import multiprocessing
    from functools import partial
    # spawned, not forked: a fork of a process with threads (ZMQ's, a logger's) can copy a lock held mid-call, and the
    # child then waits on it forever. func must be importable (a module's top-level function), as openpilot's must be.
    with multiprocessing.get_context("spawn").Pool(num_processes) as pool:
      results = pool.imap(partial(_run_on_file, func, self.sort_by_time, self.only_union_types), self.files)
      if not disable_tqdm:
        try:
          from tqdm import tqdm
          results = tqdm(results, total=len(self.files), desc=desc)
        except ImportError: pass   # tqdm comes with the [tools] extra; without it, no progress bar
      return [x for r in results for x in r]

  @classmethod
  def from_bytes(cls, dat: bytes, **kwargs) -> LogReader:
    """The events of a log's bytes: zstd, bzip2 or plain, as a log file."""
    lr = cls(None, **kwargs)
    lr._data, lr._data_problem = decompress(io.BytesIO(dat))
    return lr

  def _warn(self, msg: str) -> None:
    self.warnings.append(msg)
    if self.log_warnings: logger.warning("%s", msg)

  def _events(self, name: str, data: bytes) -> Iterator[tuple[bytes, object]]:
    msgs, rest = split_messages(data)
    if rest: self._warn(f"{name}: {rest} bytes from offset {len(data) - rest} are not a whole message (cut short, or not a log); "
                        f"read the {len(msgs)} messages before them")
    out = []
    for off, dat in msgs:
      try: ev = log_from_bytes(dat)
      except UnknownMemberError as e:
        if self.only_union_types: continue
        ev = UnknownEvent(e.logMonoTime, e.valid, dat)
      except MalformedMessageError as e:
        self._warn(f"{name}: message at offset {off} skipped: {e}")
        continue
      out.append((dat, ev))
    if self.sort_by_time: out.sort(key=lambda x: x[1].logMonoTime)
    yield from out

  def raw(self) -> Iterator[tuple[bytes, object]]:
    if self._data is not None:
      if self._data_problem: self._warn(f"<bytes>: {self._data_problem}")
      yield from self._events("<bytes>", self._data)
    for f in self.files:
      data, problem = read_log_file(f)
      if problem: self._warn(f"{f}: {problem}")
      yield from self._events(str(f), data)

  def __iter__(self) -> Iterator[object]:
    for _, ev in self.raw(): yield ev

  def filter(self, msg_type: str) -> Iterator[object]:
    return (getattr(ev, msg_type) for ev in self if ev.which() == msg_type)

  def first(self, msg_type: str):
    return next(self.filter(msg_type), None)

def _run_on_file(func, sort_by_time: bool, only_union_types: bool, f: Path):
  return func(LogReader(f, sort_by_time=sort_by_time, only_union_types=only_union_types))
