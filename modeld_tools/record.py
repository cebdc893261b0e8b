"""modeld-record: records services (and optionally the camera streams) into an openpilot route (format: oproute).

Segments of --segment-seconds: rlog.zst, qlog.zst and, with --video, each camera as HEVC with its EncodeIdx events.
The logs are flushed as whole zstd frames every --flush-seconds, so a SIGKILL loses at most that; closed segments are complete.
"""
from __future__ import annotations
import argparse, errno, logging, queue, sys, threading, time
from datetime import datetime
from pathlib import Path
from service import Stats, add_log_level, StopFlag, Watchdog, notify, set_process_title, setup_logging
from service.extras import needs_extra
from cereal import messaging
from cereal.services import CAMERAS, SERVICES
from msgq.visionipc.wire import socket_path
from msgq.visionipc import VisionIpcClient
with needs_extra("modeld-record", "tools"):   # zstandard for the logs, PyAV for the video
  from oproute.logreader import message_length, segment_dirs
  from oproute.video import HevcWriter, picture
  from oproute.writer import RouteWriter, unfinished

log = logging.getLogger("modeld-record")
CLOSE_GRACE_S = 5.   # a segment stays open this long at most for its cameras' last EncodeIdx events
CAMERA_WAIT_NOTE_S = 2.   # a camera not reached by then is said to be waited for (no camerad, another prefix)

class Segments:
  """The segment in force: a new one every `seconds` since the start."""
  def __init__(self, seconds: float):
    self.seconds, self.t0, self.n = seconds, time.monotonic(), 0

  def update(self) -> bool:
    """True when a new segment started."""
    n = int((time.monotonic() - self.t0) // self.seconds)
    if n == self.n: return False
    self.n = n
    return True

class CameraRecorder(threading.Thread):
  """Encodes one VisionIPC stream into each segment's HEVC file of that camera; every encoded frame's EncodeIndex event
  goes to `out` as (segment, service, bytes). A frame is copied out of its buffer, then encoded from the copy. Frames
  not recorded are counted: `behind` (camerad had reused the buffer before the recorder got to it: encoding is slower
  than the camera, and the recorder fell more than camerad's --buffers frames behind), `torn` (reused while it was
  copied) and `out_of_order` (an id not after the last one of the same camera session; a restarted camerad is a new
  session, numbering from 0 again)."""
  def __init__(self, camera: str, server: str, route: RouteWriter, segments: Segments, out: queue.Queue, lossless: bool, stop: threading.Event):
    super().__init__(name=f"record-{camera}", daemon=True)
    self.camera, self.route, self.segments, self.out, self.lossless, self.stop = camera, route, segments, out, lossless, stop
    self.client = VisionIpcClient(server, CAMERAS[camera].stream, conflate=False)
    self.frames = self.behind = self.torn = self.out_of_order = self.encode_id = 0
    self.connected = threading.Event()   # the client reached the camera server once
    self.error: BaseException | None = None
    self.segment: int | None = None   # the segment whose file is open
    self._writer = None

  def _index(self, encoded) -> None:
    for e in encoded:
      self.out.put((self.segment, CAMERAS[self.camera].encode_idx, e.index_event(self.camera, self.segment, self.encode_id)))
      self.encode_id += 1

  def _close(self) -> None:
    if self._writer is not None: self._index(self._writer.close())
    self._writer, self.segment = None, None   # after the last index is queued: the main thread may close the segment now

  def run(self) -> None:
    try:
      while not self.stop.is_set() and not self.client.connect(blocking=False): self.stop.wait(0.1)
      self.connected.set()
      session, last = None, -1   # the camera server's id, and its last frame id recorded
      while not self.stop.is_set():
        if self.segment is not None and self.segment != self.segments.n: self._close()
        if (buf := self.client.recv(100)) is None:
          if not self.client.is_connected(): self.client.connect(blocking=False)
          continue
        if self.client.server_id != session: session, last = self.client.server_id, -1
        if buf.frame_id <= last:   # an id this session already had would make the route's index ambiguous
          self.out_of_order += 1
          continue
        if buf.overwritten():   # gone before we got to it: not worth the copy, and not a tear but a recorder too slow
          self.behind += 1
          continue
        frame = picture(buf.array, buf.layout)
        if buf.overwritten():   # camerad reused the buffer while we copied: the copy may mix two frames
          self.torn += 1
          continue
        if self._writer is None or (self._writer.width, self._writer.height) != (buf.width, buf.height):
          self._close()
          self.segment = self.segments.n
          self._writer = HevcWriter(self.route.segment_dir(self.segment) / CAMERAS[self.camera].video, buf.width, buf.height, lossless=self.lossless)
        self._index(self._writer.write(frame, buf.frame_id, buf.timestamp_sof, buf.timestamp_eof))
        last = buf.frame_id
        self.frames += 1
        del buf
    except BaseException as e:   # reported by the main thread, which then exits non-zero
      self.error = e
    finally:
      try: self._close()
      finally: self.client.close()

def record(services: list[str], path: Path, segment_seconds: float, flush_seconds: float, stop: StopFlag, seconds: float | None = None,
           cameras: list[str] = (), server: str = "camerad", lossless: bool = False, stats_interval: float = 10.) -> dict[str, int]:
  """Record until stopped; returns the number of messages written per service. The stats (log line and STATUS=) count
  the messages written per service, `<service>_malformed` those not written, `video_connected` once per camera whose
  stream is connected and `<camera>_video_behind`, `<camera>_video_torn`, `<camera>_video_out_of_order` its frames not
  recorded (CameraRecorder says why)."""
  poller = messaging.Poller()
  socks = {s: messaging.sub_sock(s, poller=poller) for s in services}
  names = {sock: s for s, sock in socks.items()}   # the poller returns the sockets it was given
  route, segments, indexes, cam_stop = RouteWriter(path), Segments(segment_seconds), queue.Queue(), threading.Event()
  route.open_segment(0)
  recorders = [CameraRecorder(c, server, route, segments, indexes, lossless, cam_stop) for c in cameras]
  for r in recorders: r.start()
  connected, waited, t_start = set(), set(), time.monotonic()
  stats, watchdog = Stats(log, interval=stats_interval, rate_key="messages"), Watchdog()
  t_end, last_flush, closing = None if seconds is None else time.monotonic() + seconds, time.monotonic(), {}
  def write(seg: int, svc: str, dat: bytes) -> None:
    route.write(seg, svc, dat)
    stats.count("messages")
    stats.count(svc)
  def drain() -> None:
    while True:
      try: seg, svc, dat = indexes.get_nowait()
      except queue.Empty: return
      write(seg if seg in route.logs else segments.n, svc, dat)
  def receive(sock) -> None:
    svc = names[sock]
    for dat in messaging.drain_sock_raw(sock):
      # only whole, parseable messages of this service: anything else would break the file's framing
      try: ok = message_length(dat) == len(dat) and messaging.log_from_bytes(dat, expect=svc) is not None   # the cheap check first
      except messaging.MalformedMessageError: ok = False
      if not ok:
        stats.count(f"{svc}_malformed")
        continue
      write(segments.n, svc, dat)
  notify("READY=1", f"STATUS=recording {len(services)} services to {path}")
  log.info("recording %d services%s to %s", len(services), f" and {', '.join(cameras)} video" if cameras else "", path)
  try:
    while not stop and (t_end is None or time.monotonic() < t_end):
      for sock in poller.poll(100): receive(sock)
      drain()
      for r in recorders:
        if r.camera not in connected and r.connected.is_set():
          connected.add(r.camera)
          stats.count("video_connected")
          log.info("%s video: connected to %r", r.camera, server)
        elif r.camera not in connected | waited and time.monotonic() - t_start > CAMERA_WAIT_NOTE_S:   # said once, not per turn
          waited.add(r.camera)
          log.info("%s video: waiting for camera server %r (at %s)", r.camera, server, socket_path(server))
        for key, n in (("video_behind", r.behind), ("video_torn", r.torn), ("video_out_of_order", r.out_of_order)):   # the thread's counts, into the stats
          if (new := n - stats.totals.get(k := f"{r.camera}_{key}", 0)) > 0: stats.count(k, new)
      if segments.update():
        for n in range(max(route.logs) + 1, segments.n + 1): route.open_segment(n)
        for n in route.logs:
          if n < segments.n: closing.setdefault(n, time.monotonic())
        log.info("segment %d", segments.n)
      for n, t in list(closing.items()):   # a segment closes once its cameras' files are closed and indexed
        if all(r.segment != n for r in recorders) or time.monotonic() - t > CLOSE_GRACE_S:
          drain()
          route.close_segment(n)
          del closing[n]
      if time.monotonic() - last_flush >= flush_seconds:
        route.flush()
        last_flush = time.monotonic()
      if failed := [r for r in recorders if r.error is not None]:
        raise RuntimeError(f"recording {failed[0].camera} video failed: {failed[0].error!r}")
      watchdog.kick()
      stats.tick()
    for sock in socks.values(): receive(sock)   # a stop keeps what had arrived by then
  finally:
    cam_stop.set()
    for r in recorders: r.join(10)
    drain()
    route.close()
    for sock in socks.values(): sock.close()
  if malformed := [f"{s} {n}" for s in services if (n := stats.totals.get(f"{s}_malformed", 0))]:
    log.warning("malformed messages not recorded: %s", ", ".join(malformed))
  for r in recorders:
    log.info("%s video: %d frames%s%s%s", r.camera, r.frames,
             f", {r.behind} frames dropped as the encoder fell behind (fewer --video cameras, a lower camerad --fps; "
             f"see docs/CAMERAD.md)" if r.behind else "", f", {r.torn} torn frames dropped" if r.torn else "",
             f", {r.out_of_order} frames out of order dropped" if r.out_of_order else "")
  return {k: n for k, n in stats.totals.items() if k in services}   # the per-service counters (not messages, video_connected)

def main(argv: list[str] | None = None) -> int:
  logged = [s for s, v in SERVICES.items() if v.should_log]
  ap = argparse.ArgumentParser(prog="modeld-record", description="Record services (and camera streams) into an openpilot route: "
                               "segments with rlog.zst, qlog.zst and HEVC video, which openpilot's tools, LogReader and "
                               "`camerad --source ROUTE` read.", epilog="example: modeld-record --video road,driver --route routes/drive1")
  ap.add_argument("services", nargs="*", metavar="SERVICE", help=f"services to record (default: every logged one: {', '.join(logged)})")
  ap.add_argument("--route", type=Path, help="route folder to create (default: OUT/<date>--<time>)")
  ap.add_argument("--out", type=Path, default=Path("routes"), help="where new routes go (default: ./routes)")
  ap.add_argument("--segment-seconds", type=float, default=60.0, metavar="S", help="segment length (default: 60, as openpilot)")
  ap.add_argument("--flush-seconds", type=float, default=0.5, metavar="S", help="a crash loses at most this much of the log (default: 0.5)")
  ap.add_argument("--seconds", type=float, metavar="S", help="stop after S seconds (default: until SIGTERM/SIGINT)")
  ap.add_argument("--video", metavar="CAMS", help="also record these cameras' frames (comma list of road,wide,driver) as HEVC")
  ap.add_argument("--lossless", action="store_true", help="lossless HEVC: a replay serves the very same pixels (larger files)")
  ap.add_argument("--camerad-name", default="camerad", help="VisionIPC server name to record from (default: camerad)")
  ap.add_argument("--stats-interval", type=float, default=10., metavar="S", help="seconds between stats log lines and STATUS= updates (default 10)")
  add_log_level(ap)
  args = ap.parse_args(argv)
  # any Event member the schema names (camerad republishes every one a route holds); the services table's are the ones
  # this project publishes, those outside it go to the rlog alone
  if bad := [s for s in args.services if s not in messaging.EVENTS]:
    ap.error(f"unknown services {bad}; known: {', '.join(SERVICES)}, or any other Event member of cereal/log.capnp")
  cameras = args.video.split(",") if args.video else []
  if bad := [c for c in cameras if c not in CAMERAS]: ap.error(f"--video: expected cameras among road, wide, driver; got {bad}")
  if args.segment_seconds <= 0 or args.flush_seconds <= 0: ap.error("--segment-seconds and --flush-seconds must be > 0")
  if args.lossless and not cameras: ap.error("--lossless: applies to --video only")
  if args.seconds is not None and not args.seconds > 0: ap.error(f"--seconds: expected S > 0, got {args.seconds}")
  if not args.stats_interval >= 0: ap.error(f"--stats-interval: expected S >= 0, got {args.stats_interval}")
  setup_logging(args.log_level)
  set_process_title("modeld-record")
  stop, path = StopFlag(), args.route or args.out / datetime.now().strftime("%Y-%m-%d--%H-%M-%S")
  try:
    counts = record(args.services or logged, path, args.segment_seconds, args.flush_seconds, stop, args.seconds, cameras,
                    args.camerad_name, args.lossless, args.stats_interval)
  except (OSError, RuntimeError) as e:
    if getattr(e, "errno", None) not in (errno.ENOSPC, errno.EDQUOT):
      log.error("%s", e)
      return 1
    # which segments the full disk left unfinished, from the files: a log that could not be finalized is not one whole
    # frame (a segment closing as the disk filled is one of them, not only the last)
    left = [d.name for d in segment_dirs(path) if any(unfinished(f) for f in (d / "rlog.zst", d / "qlog.zst") if f.exists())]
    log.error("%s: recording stopped; %s", e, f"{', '.join(left)} unfinished (each reads up to where the disk filled), the other "
              "segments complete" if left else "every segment complete")
    return 1
  log.info("recorded %d messages to %s (%s)", sum(counts.values()), path, ", ".join(f"{s} {n}" for s, n in counts.items() if n) or "nothing")
  return 0

if __name__ == "__main__":
  sys.exit(main())
