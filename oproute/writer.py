"""Writing openpilot routes: ROUTE/ROUTE--<n>/ segments with rlog.zst (every event) and qlog.zst (every Nth event of a
service, N its qlog decimation in the services table), initData first in both.

Logs are flushed as zstd frames (a crash loses what came since the last flush) and rewritten as one frame on close,
which one-shot decoders read; `finalize` does that for a crashed segment's logs (docs/CAMERAD.md)."""
from __future__ import annotations
import os, platform, time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
import zstandard as zstd
from cereal import messaging
from cereal.services import SERVICES
from oproute.logreader import ZSTD_MAGIC, LogStream
from service.owned import open_private, private_dir, private_dirs

WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC

FINAL_LEVEL = 10   # zstd level of a closed segment's logs (openpilot's); 3 while recording, for speed

def init_data() -> bytes:
  """The initData event that starts every log: this machine and software, and the wall clock."""
  msg = messaging.new_message("initData")
  d = msg.initData
  d.deviceType, d.wallTimeNanos = "pc", time.time_ns()
  d.kernelVersion, d.osVersion = platform.release(), platform.platform()
  try: d.version = version("tinymodeld")
  except PackageNotFoundError: pass
  return msg.to_bytes()

def unfinished(path: Path) -> bool:
  """True for a zstd log that is not one frame with its size: frames as the recorder writes them, or a file a crash cut
  short (empty, or its header cut)."""
  with open(path, "rb") as f: head = f.read(18)   # a zstd frame header is at most 18 bytes
  if head and head[:4] != ZSTD_MAGIC[:len(head)]: return False   # not zstd
  try: return zstd.frame_content_size(head) == -1
  except zstd.ZstdError: return True

def private_file(path: Path) -> int:
  """A new file of a route (its folder one of ours), for writing: 0600 whatever the umask (owned.open_private)."""
  return open_private(str(path), WRITE, "route file")

def finalize(path: Path, repair: bool = False) -> str | None:
  """Rewrite a zstd log as one frame of its whole messages with its content size, atomically (a crash meanwhile leaves
  the old file), read twice as it decompresses (the size first). What does not read is an OSError, or with repair what
  reads is kept and what does not is returned."""
  with open(path, "rb") as f:
    stream = LogStream(f)
    size = sum(len(m) for _, m in stream)
  problem = stream.problem or (stream.rest and f"{stream.rest} bytes of a partial message at the end dropped") or None
  if problem and not repair: raise OSError(f"{path}: {problem}")
  tmp = path.with_name(path.name + ".tmp")
  try:
    with open(path, "rb") as src, os.fdopen(private_file(tmp), "wb") as f:
      with zstd.ZstdCompressor(level=FINAL_LEVEL, write_checksum=True).stream_writer(f, size=size, closefd=False) as z:
        written = 0
        for _, m in LogStream(src):
          if (written := written + len(m)) > size: break   # the file grew meanwhile: what was counted
          z.write(m)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:   # a full disk, say: the log stays as it was, a sequence of frames
    tmp.unlink(missing_ok=True)
    raise
  return problem

class LogFile:
  """One zstd log being written: write() compresses, flush() ends a frame and hands it to the OS (from then on it
  survives a crash), close() finalizes it."""
  def __init__(self, path: Path):
    self.path, self.f = path, os.fdopen(private_file(path), "wb")
    self.z = zstd.ZstdCompressor(level=3, write_checksum=True).stream_writer(self.f, closefd=False)

  def write(self, dat: bytes) -> None: self.z.write(dat)

  def flush(self) -> None:
    self.z.flush(zstd.FLUSH_FRAME)
    self.f.flush()

  def close(self) -> None:
    try: self.z.close()
    finally: self.f.close()
    finalize(self.path)

class RouteWriter:
  """A new route folder; segments open and close as the caller says. Messages go to a segment's rlog, and to its qlog
  as the services table's decimation says (counted over the whole route, as openpilot's logger does)."""
  def __init__(self, path: Path):
    self.path = Path(path)
    private_dirs(str(self.path), "route folder")
    if any(self.path.glob(f"{self.path.name}--*")): raise FileExistsError(f"route {self.path} already has segments; choose a new route folder")
    self.logs: dict[int, tuple[LogFile, LogFile]] = {}
    self.qlog_count: dict[str, int] = {}

  def segment_dir(self, n: int) -> Path: return self.path / f"{self.path.name}--{n}"

  def open_segment(self, n: int) -> Path:
    d = self.segment_dir(n)
    private_dir(str(d), "segment folder")
    self.logs[n] = LogFile(d / "rlog.zst"), LogFile(d / "qlog.zst")
    init = init_data()
    for f in self.logs[n]: f.write(init)
    return d

  def write(self, n: int, service: str, dat: bytes) -> None:
    rlog, qlog = self.logs[n]
    rlog.write(dat)
    if (dec := getattr(SERVICES.get(service), "decimation", None)) is not None:   # a service outside the table: rlog only
      if self.qlog_count.get(service, 0) % dec == 0: qlog.write(dat)
      self.qlog_count[service] = self.qlog_count.get(service, 0) + 1

  def flush(self) -> None:
    for logs in self.logs.values():
      for f in logs: f.flush()

  def close_segment(self, n: int) -> None:
    errors = []
    for f in self.logs.pop(n):
      try: f.close()
      except OSError as e: errors.append(e)
    if errors: raise errors[0]

  def close(self) -> None:
    """Close every open segment; the first error (a full disk) is raised once all were tried."""
    errors = []
    for n in list(self.logs):
      try: self.close_segment(n)
      except OSError as e: errors.append(e)
    if errors: raise errors[0]
