"""modeld-record: records services (and optionally the camera streams) into a route of fixed-length segments.

Files (format: tools/logreader.py): ROUTE/<name>--<n>/rlog.zst, plus road.mkv / wide.mkv / driver.mkv with --video.
Crash safety: the log is flushed as a complete zstd frame every --flush-seconds, and a video's clusters are written
as they close, so a SIGKILL loses at most the last moments; closed segments are complete.
"""
from __future__ import annotations
import argparse, errno, logging, sys, threading, time
from datetime import datetime
from fractions import Fraction
from pathlib import Path
import av
import numpy as np
import zstandard as zstd
from common.service import Stats, StopFlag, Watchdog, notify, set_process_title, setup_logging
from cereal import messaging
from cereal.services import SERVICES
from msgq.visionipc import DRIVER, ROAD, WIDE_ROAD, VisionIpcClient
from tools.logreader import LOG_NAME, VIDEO_NAMES, message_length

log = logging.getLogger("modeld-record")
CAMERA_STREAMS = {"road": ROAD, "wide": WIDE_ROAD, "driver": DRIVER}
CODECS = {"h264": ("libx264", {"preset": "ultrafast", "tune": "zerolatency", "crf": "18"}),
          "hevc": ("libx265", {"preset": "ultrafast", "x265-params": "log-level=error"}),
          "ffv1": ("ffv1", {})}   # ffv1: lossless, a replay serves the very same pixels
# pts are frame ids in the container's 1/1000 time base; a cluster (what a crash can lose) spans at most 10 of them
MKV_OPTIONS = {"live": "1", "cluster_time_limit": "10"}

class Route:
  """The route folder and its current segment; `segment` changes every `segment_seconds`."""
  def __init__(self, path: Path, segment_seconds: float):
    self.path, self.segment_seconds = path, segment_seconds
    path.mkdir(parents=True, exist_ok=True)
    if any(path.glob(f"{path.name}--*")): raise FileExistsError(f"route {path} already has segments; choose a new route folder")
    self.segment, self.t0 = 0, time.monotonic()
    self.segment_dir(0).mkdir()

  def segment_dir(self, n: int) -> Path: return self.path / f"{self.path.name}--{n}"

  def update(self) -> bool:
    """Start the next segment when the current one is full; True if it did."""
    n = int((time.monotonic() - self.t0) // self.segment_seconds)
    if n == self.segment: return False
    self.segment_dir(n).mkdir(exist_ok=True)
    self.segment = n
    return True

class LogWriter:
  """One segment's rlog.zst. flush() ends a zstd frame and hands it to the OS: from then on it survives a crash."""
  def __init__(self, path: Path):
    self.f = open(path, "wb")
    self.z = zstd.ZstdCompressor(level=3, write_checksum=True).stream_writer(self.f, closefd=False)

  def write(self, dat: bytes) -> None: self.z.write(dat)

  def flush(self) -> None:
    self.z.flush(zstd.FLUSH_FRAME)
    self.f.flush()

  def close(self) -> None:
    self.z.close()
    self.f.close()

class CameraRecorder(threading.Thread):
  """Encodes one VisionIPC stream into <segment>/<camera>.mkv, each frame's pts being its frame id."""
  def __init__(self, camera: str, server: str, route: Route, codec: str, stop: threading.Event):
    super().__init__(name=f"record-{camera}", daemon=True)
    self.camera, self.route, self.codec, self.stop = camera, route, codec, stop
    self.client = VisionIpcClient(server, CAMERA_STREAMS[camera], conflate=False)
    self.frames = self.torn = 0
    self.error: BaseException | None = None
    self._container = self._stream = self._segment = None

  def _open(self, w: int, h: int) -> None:
    self._close()
    self._segment = self.route.segment
    path = self.route.segment_dir(self._segment) / VIDEO_NAMES[self.camera]
    name, options = CODECS[self.codec]
    self._container = av.open(str(path), "w", format="matroska", options=MKV_OPTIONS, container_options={"flush_packets": "1"})
    st = self._stream = self._container.add_stream(name)
    st.width, st.height, st.pix_fmt = w, h, "yuv420p"
    st.time_base = st.codec_context.time_base = Fraction(1, 1000)
    st.codec_context.options = options

  def _close(self) -> None:
    if self._container is None: return
    for p in self._stream.encode(): self._container.mux(p)
    self._container.close()
    self._container = None

  def run(self) -> None:
    try:
      while not self.stop.is_set() and not self.client.connect(blocking=False): self.stop.wait(0.1)
      last = -1
      while not self.stop.is_set():
        if (buf := self.client.recv(100)) is None:
          if not self.client.is_connected(): self.client.connect(blocking=False)
          continue
        if buf.frame_id <= last: continue   # pts must increase: a restarted camerad starting over is not recorded twice
        frame = av.VideoFrame(buf.width, buf.height, "yuv420p")
        y = np.frombuffer(buf.data, np.uint8)
        planes = [y[:buf.stride * buf.height].reshape(buf.height, buf.stride)[:, :buf.width],
                  (uv := y[buf.uv_offset:buf.uv_offset + buf.stride * buf.height // 2].reshape(buf.height // 2, buf.stride))[:, 0:buf.width:2],
                  uv[:, 1:buf.width:2]]
        for p, src in zip(frame.planes, planes):
          np.frombuffer(p, np.uint8).reshape(-1, p.line_size)[:src.shape[0], :src.shape[1]] = src
        del y, uv, planes
        if buf.overwritten():   # camerad reused the buffer while we copied: the copy may mix two frames
          self.torn += 1
          continue
        if self._container is None or self._segment != self.route.segment or (self._stream.width, self._stream.height) != (buf.width, buf.height):
          self._open(buf.width, buf.height)
        frame.pts, frame.time_base, last = buf.frame_id, Fraction(1, 1000), buf.frame_id
        for p in self._stream.encode(frame): self._container.mux(p)
        self.frames += 1
    except BaseException as e:   # reported by the main thread, which then exits non-zero
      self.error = e
    finally:
      try: self._close()
      finally: self.client.close()

def record(services: list[str], route: Route, flush_seconds: float, stop: StopFlag, seconds: float | None = None,
           cameras: list[str] = (), server: str = "camerad", codec: str = "h264") -> dict[str, int]:
  """Record until stopped; returns the number of messages written per service."""
  poller = messaging.Poller()
  socks = {s: messaging.sub_sock(s, poller=poller) for s in services}
  names = {sock.sock: s for s, sock in socks.items()}
  cam_stop = threading.Event()
  recorders = [CameraRecorder(c, server, route, codec, cam_stop) for c in cameras]
  for r in recorders: r.start()
  counts, malformed = dict.fromkeys(services, 0), dict.fromkeys(services, 0)
  stats, watchdog = Stats(log, interval=10.0, rate_key="messages"), Watchdog()
  writer, t_end = LogWriter(route.segment_dir(0) / LOG_NAME), None if seconds is None else time.monotonic() + seconds
  last_flush = time.monotonic()
  notify("READY=1", f"STATUS=recording {len(services)} services to {route.path}")
  log.info("recording %d services%s to %s", len(services), f" and {', '.join(cameras)} video" if cameras else "", route.path)
  try:
    while not stop and (t_end is None or time.monotonic() < t_end):
      for sock in poller.poll(100):
        svc = names[sock.sock]
        for dat in messaging.drain_sock_raw(sock):
          # only whole, parseable messages of this service: anything else would break the file's framing
          try: ok = message_length(dat) == len(dat) and messaging.log_from_bytes(dat).which() == svc
          except messaging.MalformedMessageError: ok = False
          if not ok:
            malformed[svc] += 1
            continue
          writer.write(dat)
          counts[svc] += 1
          stats.count("messages")
      if route.update():
        writer.close()
        writer = LogWriter(route.segment_dir(route.segment) / LOG_NAME)
        log.info("segment %d", route.segment)
      elif time.monotonic() - last_flush >= flush_seconds:
        writer.flush()
        last_flush = time.monotonic()
      if failed := [r for r in recorders if r.error is not None]:
        raise RuntimeError(f"recording {failed[0].camera} video failed: {failed[0].error!r}")
      watchdog.kick()
      stats.tick()
  finally:
    writer.close()
    cam_stop.set()
    for r in recorders: r.join(5)
    for sock in socks.values(): sock.close()
  for s, n in malformed.items():
    if n: log.warning("%s: %d malformed messages not recorded", s, n)
  for r in recorders: log.info("%s video: %d frames%s", r.camera, r.frames, f", {r.torn} torn frames dropped" if r.torn else "")
  return counts

def main(argv: list[str] | None = None) -> int:
  logged = [s for s, v in SERVICES.items() if v.should_log]
  ap = argparse.ArgumentParser(prog="modeld-record", description="Record services (and camera streams) into a route of "
                               "zstd-compressed log segments that LogReader and `camerad --source ROUTE` read back.",
                               epilog="example: modeld-record --video road,driver --route routes/drive1")
  ap.add_argument("services", nargs="*", metavar="SERVICE", help=f"services to record (default: every logged one: {', '.join(logged)})")
  ap.add_argument("--route", type=Path, help="route folder to create (default: OUT/<date>--<time>)")
  ap.add_argument("--out", type=Path, default=Path("routes"), help="where new routes go (default: ./routes)")
  ap.add_argument("--segment-seconds", type=float, default=60.0, metavar="S", help="segment length (default: 60)")
  ap.add_argument("--flush-seconds", type=float, default=0.5, metavar="S", help="a crash loses at most this much of the log (default: 0.5)")
  ap.add_argument("--seconds", type=float, metavar="S", help="stop after S seconds (default: until SIGTERM/SIGINT)")
  ap.add_argument("--video", metavar="CAMS", help="also record these cameras' frames (comma list of road,wide,driver) as video")
  ap.add_argument("--codec", choices=list(CODECS), default="h264", help="video codec (default: h264; ffv1 is lossless)")
  ap.add_argument("--camerad-name", default="camerad", help="VisionIPC server name to record from (default: camerad)")
  ap.add_argument("--log-level", default="INFO")
  args = ap.parse_args(argv)
  if bad := [s for s in args.services if s not in SERVICES]: ap.error(f"unknown services {bad}; known: {', '.join(SERVICES)}")
  cameras = args.video.split(",") if args.video else []
  if bad := [c for c in cameras if c not in CAMERA_STREAMS]: ap.error(f"--video: expected cameras among road, wide, driver; got {bad}")
  if args.segment_seconds <= 0 or args.flush_seconds <= 0: ap.error("--segment-seconds and --flush-seconds must be > 0")
  setup_logging(args.log_level)
  set_process_title("modeld-record")
  stop = StopFlag()
  try:
    route = Route(args.route or args.out / datetime.now().strftime("%Y-%m-%d--%H-%M-%S"), args.segment_seconds)
    counts = record(args.services or logged, route, args.flush_seconds, stop, args.seconds, cameras, args.camerad_name, args.codec)
  except (OSError, RuntimeError) as e:
    full = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
    log.error("%s%s", e, ": recording stopped; the segments before the last are complete" if full else "")
    return 1
  log.info("recorded %d messages in %d segments to %s (%s)", sum(counts.values()), route.segment + 1, route.path,
           ", ".join(f"{s} {n}" for s, n in counts.items() if n) or "nothing")
  return 0

if __name__ == "__main__":
  sys.exit(main())
