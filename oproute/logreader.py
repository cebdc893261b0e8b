"""Reading openpilot routes: segments, log files and the events in them, with the LogReader API openpilot users know.

Logs (rlog, qlog; zstd, bzip2 or plain) are Cap'n Proto Events back to back, read as they decompress: memory holds a
chunk and one message (MAX_MESSAGE at most), whatever the file's size. What cannot be read (a cut, damaged data, bytes
that are no Event) ends the file's reading and is reported in `warnings` with file and offset. docs/CAMERAD.md."""
from __future__ import annotations
import bisect, bz2, enum, glob, io, logging, re, struct
from operator import itemgetter
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
# the largest message a log may hold: openpilot's logger writes what msgq carries, at most a third of its largest queue
# (10 MiB: 3,495,240 bytes), and its own initData; 16 MiB leaves a margin of over 4
MAX_MESSAGE = 16 << 20
READ_CHUNK = 1 << 20     # bytes read (and decompressed) at a time
ZSTD_INPUT = 1024        # compressed bytes per zstd call: a 4-byte zstd block can stand for 128 KiB, so at most 32 MiB come out
ZSTD_WINDOW = 1 << 25    # the largest zstd window decoded: zstd's levels up to 20 (openpilot writes level 10: 4 MiB)
SORT_EVENTS, SORT_BYTES = 50_000, 64 << 20   # sort_by_time holds twice as many events, and this many bytes
_TIME = itemgetter(0)
ZSTD_MAGIC, BZ2_MAGIC = b"\x28\xb5\x2f\xfd", b"BZh"
WORD = struct.Struct("<Q")
ONE_SEGMENT = struct.Struct("<II")   # a segment table's first word: (count - 1, the first segment's length in words)

class NotAMessage(MalformedMessageError):
  """Bytes where a log's next message starts that begin no Event: the log is read no further."""

class CompressedDataError(ValueError):
  """A log's compressed data is damaged or ends early: what it says, with how much decoded."""

@dataclass(frozen=True)
class UnknownEvent:
  """An event whose union member this schema does not know (a newer openpilot's): its time, validity and bytes."""
  logMonoTime: int
  valid: bool
  data: bytes
  def which(self) -> str: return "unknown"

def message_length(buf: bytes | memoryview, pos: int = 0) -> int | None:
  """Byte length of the Cap'n Proto message at buf[pos:] from its segment table; None if buf ends before the table and
  the root pointer do. NotAMessage for what begins no Event: a table of more than MAX_SEGMENTS segments, a length over
  MAX_MESSAGE, a first segment of no words, a root that is null, no struct or an empty struct."""
  if len(buf) - pos < 8: return None
  count, first = ONE_SEGMENT.unpack_from(buf, pos)
  if count == 0: head, n = 8, 8 + 8 * first   # one segment, as every message a publisher builds
  elif count >= MAX_SEGMENTS: raise NotAMessage(f"a segment table of {count + 1} segments (a message has at most {MAX_SEGMENTS})")
  else:
    head = (8 + 4 * count + 7) // 8 * 8
    if len(buf) - pos < head: return None
    n = head + 8 * sum(struct.unpack_from(f"<{count + 1}I", buf, pos + 4))
  if n > MAX_MESSAGE: raise NotAMessage(f"a message of {n} bytes, over the cap of {MAX_MESSAGE} bytes on one (MAX_MESSAGE)")
  if first == 0: raise NotAMessage("a message whose first segment is empty: no root pointer")
  if len(buf) - pos < head + 8: return None
  root = WORD.unpack_from(buf, pos + head)[0]
  if root & 3 not in (0, 2) or root & 3 == 0 and root >> 32 == 0:   # a far pointer (2) is the parser's to follow
    raise NotAMessage("a root that is no Event (null, an empty struct, a list or a capability)")
  return n

def decompressed(f: BinaryIO) -> Iterator[bytes]:
  """The content of a log file (zstd, bzip2 or plain, told by its magic bytes), a chunk of about READ_CHUNK bytes at a
  time whatever the compression ratio; where the compressed data is damaged or ends early, CompressedDataError after
  the chunks before it."""
  head = f.read(4)
  f.seek(0)
  if head == ZSTD_MAGIC: chunks = _zstd_chunks(f)
  elif head.startswith(BZ2_MAGIC): chunks = _bz2_chunks(f)
  else: chunks = iter(lambda: f.read(READ_CHUNK), b"")
  batch, size, error = [], 0, None
  try:
    for c in chunks:
      batch.append(c)
      if (size := size + len(c)) >= READ_CHUNK:
        yield b"".join(batch)
        batch, size = [], 0
  except CompressedDataError as e: error = e
  if batch: yield b"".join(batch)
  if error: raise error

def _zstd_chunks(f: BinaryIO) -> Iterator[bytes]:
  """A zstd file's content, frame by frame (a closed segment is one frame, one cut short while recording several), so
  that a file ending inside a frame is told apart from one ending after it (zstd's streaming reader returns the same
  bytes for both, silently); ZSTD_INPUT compressed bytes at a time, so that no call returns more than 32 MiB."""
  new = zstd.ZstdDecompressor(max_window_size=ZSTD_WINDOW).decompressobj
  d, read, frame_at, out = new(), 0, 0, 0
  while block := f.read(READ_CHUNK):
    mv = memoryview(block)
    for i in range(0, len(block), ZSTD_INPUT):
      piece, end = mv[i:i + ZSTD_INPUT], min(read + i + ZSTD_INPUT, read + len(block))
      while piece:
        try: chunk = d.decompress(piece)
        except zstd.ZstdError as e: raise CompressedDataError(f"compressed data is damaged after {out} bytes ({e})") from None
        if chunk:
          out += len(chunk)
          yield chunk
        if not d.eof: break
        piece, frame_at, d = d.unused_data, end - len(d.unused_data), new()   # the next frame starts in this piece
    read += len(block)
  if read > frame_at:   # the last frame started was not ended
    raise CompressedDataError(f"compressed data ends early after {out} bytes: the zstd frame at byte {frame_at} of the file is cut short")

def _bz2_chunks(f: BinaryIO) -> Iterator[bytes]:
  """A bzip2 file's content (one stream or several back to back), at most READ_CHUNK bytes a call."""
  d, data, out = bz2.BZ2Decompressor(), b"", 0
  while True:
    if d.eof:
      if not (data := d.unused_data or f.read(READ_CHUNK)): return
      d = bz2.BZ2Decompressor()
    elif d.needs_input and not (data := f.read(READ_CHUNK)):
      raise CompressedDataError(f"compressed data ends early after {out} bytes")
    try: chunk = d.decompress(data, READ_CHUNK)
    except OSError as e: raise CompressedDataError(f"compressed data is damaged after {out} bytes ({e})") from None
    data, out = b"", out + len(chunk)
    if chunk: yield chunk

class LogStream:
  """The whole messages of one log, read as it decompresses: iterating gives (offset, bytes) of each in order. Reading
  ends at bytes that begin no message (NotAMessage) or at compressed data that is damaged or cut: `problem` then says
  what and where. `messages` counts the messages read, `rest` the bytes after the last that are no whole message."""
  def __init__(self, f: BinaryIO):
    self.f, self.problem, self.messages, self.rest, self.end = f, None, 0, 0, 0   # end: the offset after the last message

  def __iter__(self) -> Iterator[tuple[int, bytes]]:
    pending, need, pos = [], 8, 0
    try:
      for chunk in decompressed(self.f):
        pending.append(chunk)
        if (have := self.rest + len(chunk)) < need:
          self.rest = have
          continue
        data, pos = b"".join(pending) if len(pending) > 1 else chunk, 0
        while (n := message_length(data, pos)) is not None and pos + n <= len(data):
          yield self.end + pos, data[pos:pos + n]
          pos, self.messages = pos + n, self.messages + 1
        pending, self.rest, need, self.end, pos = [data[pos:]], len(data) - pos, n or len(data) - pos + 1, self.end + pos, 0
    except NotAMessage as e:
      self.problem, self.end, self.rest = f"not a log from offset {self.end + pos}: {e}; read the {self.messages} messages before it", self.end + pos, 0
    except CompressedDataError as e: self.problem = str(e)

  def problems(self) -> list[str]:
    """What ended the reading early, then what is left after the last whole message: each with its offset."""
    return [p for p in (self.problem, self.rest and f"{self.rest} bytes from offset {self.end} are not a whole message (cut short, "
                        f"or not a log); read the {self.messages} messages before them") if p]

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
    lr._data = dat
    return lr

  def _warn(self, msg: str) -> None:
    self.warnings.append(msg)
    if self.log_warnings: logger.warning("%s", msg)

  def _parsed(self, name: str, stream: LogStream) -> Iterator[tuple[bytes, object]]:
    """(bytes, event) of each message; the first that is no Event ends the file, as openpilot's LogReader stops at its
    first corrupt event (what follows it cannot be told from garbage)."""
    for off, dat in stream:
      try: yield dat, log_from_bytes(dat)
      except UnknownMemberError as e:
        if not self.only_union_types: yield dat, UnknownEvent(e.logMonoTime, e.valid, dat)
      except MalformedMessageError as e:
        self._warn(f"{name}: not a log from offset {off}: a message that is no Event ({e}); read the {stream.messages - 1} messages before it")
        return

  def _events(self, name: str, f: BinaryIO) -> Iterator[tuple[bytes, object]]:
    stream = LogStream(f)
    events = self._parsed(name, stream)
    if self.sort_by_time: events = self._sorted(name, events)
    yield from events
    for p in stream.problems(): self._warn(f"{name}: {p}")

  def _sorted(self, name: str, events: Iterator[tuple[bytes, object]]) -> Iterator[tuple[bytes, object]]:
    """events in logMonoTime order (of equal times, in file order) as a sort of the whole file gives them wherever no
    event is SORT_EVENTS events (or half of SORT_BYTES) from its place, holding twice that at most: the held events are
    sorted and the earlier half goes out. A logger writes each event within a fraction of a second of its time; one
    further out of order comes out late, counted in a warning."""
    held, size, last, late = [], 0, -1, 0
    def earliest(n: int) -> list:
      nonlocal held, size, last, late
      held.sort(key=_TIME)
      out, held = held[:n], held[n:]
      size -= sum(len(dat) for _, dat, _ in out)
      late += bisect.bisect_left(out, last, key=_TIME)   # those before what already went out
      last = max(last, out[-1][0]) if out else last
      return out
    for dat, ev in events:
      held.append((ev.logMonoTime, dat, ev))
      size += len(dat)
      if len(held) >= 2 * SORT_EVENTS or size > SORT_BYTES:
        for _, dat, ev in earliest(len(held) // 2): yield dat, ev
    for _, dat, ev in earliest(len(held)): yield dat, ev
    if late: self._warn(f"{name}: {late} events further out of time order than {SORT_EVENTS} events or {SORT_BYTES >> 21} MiB: "
                        f"read after later ones")

  def raw(self) -> Iterator[tuple[bytes, object]]:
    if self._data is not None: yield from self._events("<bytes>", io.BytesIO(self._data))
    for f in self.files:
      with open(f, "rb") as fh: yield from self._events(str(f), fh)

  def __iter__(self) -> Iterator[object]:
    for _, ev in self.raw(): yield ev

  def filter(self, msg_type: str) -> Iterator[object]:
    return (getattr(ev, msg_type) for ev in self if ev.which() == msg_type)

  def first(self, msg_type: str):
    return next(self.filter(msg_type), None)

def _run_on_file(func, sort_by_time: bool, only_union_types: bool, f: Path):
  return func(LogReader(f, sort_by_time=sort_by_time, only_union_types=only_union_types))
