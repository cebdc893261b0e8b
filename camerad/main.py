"""camerad: serves camera frames into VisionIPC with their camera-state messages.

Each frame is written straight into a free shared buffer (zero-copy producer path), published on its stream, and
described by a camera-state message (roadCameraState, wideRoadCameraState, driverCameraState) with the same frame
id and SOF/EOF timestamps (monotonic ns). All streams of one tick share the frame id and timestamps, except in
--lockstep, where each stream's ids are consecutive and a log's frames keep their recorded times (FrameWriter).
"""
from __future__ import annotations
import argparse, logging, sys, time
import numpy as np
from modeld_service import Stats, add_log_level, StopFlag, Watchdog, notify, set_process_title, setup_logging
from modeld_service.extras import needs_extra
from cereal import log as capnp_log, messaging
from cereal.services import (ANSWERS, CAMERA_OF_STREAM as CAMERA_OF, CAMERA_STATE_SERVICES, SERVICES, answer_streams,
                             road_streams)
from msgq import IpcError
from msgq.zmq import RECONNECT_IVL_MAX_S
from msgq.visionipc import NV12Layout, VisionIpcServer
from msgq.visionipc.server import MAX_BUFFERS
from camerad.scene import shipped_scenes
with needs_extra("camerad", "camera"):   # PyAV and zstandard: video files, devices and logs
  from oproute.video import VideoError
  from camerad.sources import REPUBLISHABLE, STREAMS, NoFramesError, OptionError, Source, SourceError, Tick, open_source

log = logging.getLogger("camerad")
SENSORS = set(capnp_log.FrameData.ImageSensor.schema.enumerants)
BEHIND_RESET_S = 0.5   # real-time pacing that falls this far behind starts counting from now again

EPILOG = f"""sources (--source, repeatable for video files):
  synthetic:SCENE        a scene file or a shipped scene name ({', '.join(shipped_scenes())}):
                         every camera of the scene, plus liveCalibration and carState from the scene
  [CAM=]FILE             a video file (H.264/HEVC in mp4/mkv/ts, raw .h264/.hevc, anything FFmpeg decodes) for camera
                         CAM: road (the default), wide or driver; one file per camera, e.g.
                         --source road=front.mp4 --source wide=wide.mkv --source driver=cabin.ts
  [CAM=]/dev/videoN      a V4L2 device (webcam), paced by the device
  LOG [LOG...]           openpilot routes (a route folder, or a route name whose <route>--<n> segments sit beside
                         it), segment folders or rlog/qlog files (.zst, .bz2 or plain), as openpilot and
                         modeld-record write them: replays the messages and the cameras' frames from their HEVC
                         video (fcamera, ecamera, dcamera), matched to the camera states by the EncodeIdx events
  bridge:HOST            a comma device, live: the cameras its encoder sends (roadEncodeData, wideRoadEncodeData,
                         driverEncodeData) through openpilot's bridge (cereal/messaging/bridge on the device),
                         decoded, with the device's frame ids and times, and the device's messages the daemons
                         read (carState, liveCalibration, ...); modeld-fakedevice stands in for a device

exit codes: 0 done (or stopped by SIGTERM/SIGINT); 1 a source that cannot be served or a lockstep timeout; 2 a bad
option (out of range, an unknown camera, scene or service, options that do not apply to the source, a --layout size
no stream has).

pacing: real time at the source's rate by default; --fps F for a fixed rate; --lockstep sends a frame only once the
daemons published their outputs for the previous one (deterministic, nothing lost however slow the machine).

examples:
  camerad --source synthetic:straight --frames 100
  camerad --source synthetic:lead_braking --lockstep --layout aligned
  camerad --source road=drive.mp4 --loop --fps 20
  camerad --source routes/2026-11-30--04-00-00 --lockstep
  camerad --source realdata/2026-11-30--04-00-00--3 realdata/2026-11-30--04-00-00--4
  camerad --source bridge:192.168.43.1 --artifacts artifacts
"""

def parse_args(argv: list[str] | None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(prog="camerad", description="Serve camera frames into VisionIPC with their camera-state messages.",
                               epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--source", action="extend", nargs="+", required=True, metavar="SPEC",
                  help="what to serve (see sources below); several after one --source, or --source repeated")
  ap.add_argument("--name", default="camerad", help="VisionIPC server name (default: camerad)")
  ap.add_argument("--cameras", metavar="LIST", help="synthetic only: comma-separated subset of road,wide,driver to serve")
  ap.add_argument("--services", metavar="LIST", help="LOG only: comma-separated services to republish (default: every "
                  "recorded one except the daemons' outputs, the cameras' EncodeIdx events and initData)")
  ap.add_argument("--messages-only", action="store_true", help="LOG only: republish the messages without serving any camera")
  pace = ap.add_mutually_exclusive_group()
  pace.add_argument("--fps", type=float, help="serve at this fixed rate instead of the source's")
  pace.add_argument("--lockstep", action="store_true", help="send each frame after the daemons answered the previous one")
  ap.add_argument("--lockstep-services", metavar="LIST", help="outputs to wait for (default: modelV2 when road or wide "
                  "is served, driverStateV2 when driver is); only the daemons that publish them need to run")
  ap.add_argument("--lockstep-timeout", type=float, metavar="S",
                  help="seconds to wait for a client of each stream and for each frame's outputs; then exit 1 (default: 30)")
  ap.add_argument("--loop", action="store_true", help="start over at the end (frame ids keep increasing)")
  ap.add_argument("--start", type=int, default=0, metavar="N", help="first frame of the source (default: 0)")
  ap.add_argument("--frames", type=int, metavar="N", help="stop after serving N frames")
  ap.add_argument("--layout", action="append", default=[], metavar="SPEC",
                  help="buffer layout: packed (default) or aligned (stride to 128, rows padded like real camera buffers); "
                       "WxH:stride:uv_offset:size (or WxH:aligned) for the streams of that size; repeatable")
  ap.add_argument("--artifacts", metavar="DIR", help="serve each camera in a buffer layout the daemons' artifacts (modeld-compile "
                  "--out DIR) take; a camera of a size they lack is not served, and the modeld-compile command that adds it is named")
  ap.add_argument("--buffers", type=int, default=8, metavar="N", help=f"buffers per stream, 1 to {MAX_BUFFERS} (default: 8)")
  add_log_level(ap)
  args = ap.parse_args(argv)
  if args.fps is not None and not 0 < args.fps <= 1000: ap.error(f"--fps: expected 0 < F <= 1000, got {args.fps}")
  if args.start < 0: ap.error(f"--start: expected >= 0, got {args.start}")
  if args.frames is not None and args.frames < 1: ap.error(f"--frames: expected >= 1, got {args.frames}")
  if args.lockstep_timeout is not None and not args.lockstep: ap.error("--lockstep-timeout: applies to --lockstep only")
  if args.lockstep_timeout is None: args.lockstep_timeout = 30.
  if args.lockstep_timeout <= 0: ap.error(f"--lockstep-timeout: expected > 0, got {args.lockstep_timeout}")
  if not 1 <= args.buffers <= MAX_BUFFERS: ap.error(f"--buffers: expected 1 <= N <= {MAX_BUFFERS}, got {args.buffers}")
  if args.lockstep_services and not args.lockstep: ap.error("--lockstep-services: applies to --lockstep only")
  def split(v: str | None) -> list[str] | None: return v.split(",") if v else None
  args.cameras, args.services, args.lockstep_services = split(args.cameras), split(args.services), split(args.lockstep_services)
  if args.cameras and (bad := set(args.cameras) - set(STREAMS)): ap.error(f"--cameras: expected road, wide, driver; got {sorted(bad)}")
  if args.services and (bad := set(args.services) - REPUBLISHABLE):
    ap.error(f"--services: expected services of cereal/log.capnp's Event (not initData, sentinel), got {sorted(bad)}")
  if args.lockstep_services and (bad := set(args.lockstep_services) - set(SERVICES)):
    ap.error(f"--lockstep-services: unknown services {sorted(bad)}; known: {', '.join(SERVICES)}")
  try: args.layouts = parse_layouts(args.layout)
  except ValueError as e: ap.error(str(e))
  if args.artifacts and args.layout: ap.error("--layout and --artifacts: give one (--artifacts picks the layouts the daemons take)")
  if any(s.startswith("bridge:") for s in args.source) and (args.lockstep or args.loop or args.start or args.fps):
    ap.error("--lockstep, --loop, --start and --fps do not apply to bridge:HOST: a live device sends at its own pace")
  return args

def parse_layouts(specs: list[str]) -> tuple[str, dict[tuple[int, int], NV12Layout]]:
  """('packed' or 'aligned', {(w, h): explicit layout})."""
  kind, explicit = "packed", {}
  for spec in specs:
    if spec in ("packed", "aligned"): kind = spec
    else:
      l = NV12Layout.parse(spec)
      explicit[(l.width, l.height)] = l
  return kind, explicit

def option_layouts(layouts: tuple[str, dict], streams: dict[int, tuple[int, int]]) -> dict[int, NV12Layout]:
  """Each stream's layout: the explicit one of its size, else packed or aligned. An explicit layout no stream has the
  size of is an OptionError (a typo would otherwise go unnoticed)."""
  kind, explicit = layouts
  if unused := [str(l) for (w, h), l in explicit.items() if (w, h) not in streams.values()]:
    raise OptionError(f"--layout {', '.join(unused)}: no stream of that size (streams: "
                      f"{', '.join(f'{CAMERA_OF[s]} {w}x{h}' for s, (w, h) in streams.items())})")
  return {s: explicit.get((w, h)) or (NV12Layout.aligned(w, h) if kind == "aligned" else NV12Layout.packed(w, h))
          for s, (w, h) in streams.items()}

class Pacer:
  """Sleeps until each tick is due: at the source's timestamps (real time), at a fixed rate, or not at all."""
  def __init__(self, stop: StopFlag, fps: float | None, src_fps: float, free: bool, idle=lambda: None):
    self.stop, self.fps, self.src_fps, self.free, self.idle = stop, fps, src_fps, free, idle
    self.due = self.t = None
    self.late = 0

  def wait(self, tick: Tick) -> None:
    if self.free: return
    now = time.monotonic()
    if self.fps is not None: dt = 1 / self.fps if tick.frames else 0.0
    elif self.t is not None and tick.t >= self.t: dt = tick.t - self.t
    else: dt = 1 / self.src_fps if tick.frames else 0.0   # first tick, or the source went back (a loop)
    self.t = tick.t
    self.due = now if self.due is None else self.due + dt
    if self.due < now - BEHIND_RESET_S:
      self.late += 1
      self.due = now
    while not self.stop and (left := self.due - time.monotonic()) > 0:
      self.idle()
      time.sleep(min(left, 0.1))

class LockstepTimeout(Exception): pass

class SourceClock:
  """Lockstep frame times: the source's own, not the send time. A log's frames keep their recorded timestamps; other
  sources' start at the first frame's send time and advance by source time. So modeld's frame sync sees the source's
  frame spacing whatever pace the daemons set (and does not wait for a newer frame that lockstep will not send), and
  a replay's outputs carry the log's times. A new loop pass continues one frame period after the last frame."""
  def __init__(self, fps: float):
    self.period, self.shift, self.last = int(1e9 / fps), None, None

  def new_pass(self) -> None: self.shift = None

  def times(self, tick: Tick, stream: int, fill_ns: int) -> tuple[int, int]:
    st = tick.states.get(stream)
    sof, eof = (st.timestampSof, st.timestampEof) if st is not None else (round(tick.t * 1e9), round(tick.t * 1e9) + fill_ns)
    if self.shift is None:
      self.shift = 0 if self.last is None and st is not None else (time.monotonic_ns() if self.last is None else self.last + self.period) - sof
    self.last = sof + self.shift
    return sof + self.shift, eof + self.shift

class FrameWriter:
  """What camerad serves of a tick: each stream's frame written into a buffer, with the frame id and SOF/EOF times it
  goes out with. A frame that cannot be written (a damaged picture) is skipped and counted in the source's `skipped`.
  Ids are the source's index, continued across loop passes; in lockstep each stream's ids are consecutive from its
  first frame on (a log's own up to its first gap): modeld takes a frame after a gap in the ids for one after a drop
  and answers it with nothing, so lockstep would wait forever; for the same reason a road or wide frame whose partner
  is missing (both served) is skipped and counted. Times: the write's own, in lockstep the source's
  (SourceClock). modeld-batch serves its segments through this too, so its frames are numbered and timed as a
  lockstep replay's."""
  def __init__(self, source: Source, lockstep: bool):
    self.source, self.lockstep, self.clock = source, lockstep, SourceClock(source.fps) if lockstep else None
    self.last: dict[int, int] = {}   # each stream's last frame id
    self.offset: int | None = None   # this pass's frame id less the source's index
    pair = set(road_streams(source.streams) or ())
    self.pair = pair if lockstep and len(pair) == 2 else set()   # road and wide, both served: in lockstep, only together

  def new_pass(self) -> None:
    self.offset = None
    if self.clock is not None: self.clock.new_pass()

  def write(self, tick: Tick, bufs: dict[int, tuple[np.ndarray, NV12Layout]]) -> dict[int, tuple[int, int, int]]:
    """Writes the tick's frames into bufs ({stream: (buffer, its layout)}); {stream: (frame id, SOF, EOF)} of those written."""
    if self.offset is None: self.offset = 0 if not self.last else max(self.last.values()) + 1 - tick.index
    sof, written = time.monotonic_ns(), []
    for s, (out, layout) in bufs.items():
      try:
        tick.frames[s](out, layout)
        written.append(s)
      except ValueError as e: self.source.skipped[f"{CAMERA_OF[s]}: {e}"] += 1
    if len(alone := self.pair & set(written)) == 1:   # modeld runs a road frame only with its wide one: alone, it would never be answered
      written.remove(s := alone.pop())
      self.source.skipped[f"{CAMERA_OF[s]}: frame without its {CAMERA_OF[(self.pair - {s}).pop()]} frame (lockstep serves them together)"] += 1
    eof = time.monotonic_ns()
    if tick.ids:   # a device's own ids and times
      self.last.update({s: tick.ids[s][0] for s in written})
      return {s: tick.ids[s] for s in written}
    ids = {s: self.last[s] + 1 if self.lockstep and s in self.last else tick.index + self.offset for s in written}
    self.last.update(ids)
    return {s: (i, *((sof, eof) if self.clock is None else self.clock.times(tick, s, eof - sof))) for s, i in ids.items()}

# messages and frames travel on separate sockets: in lockstep, the messages that come before a frame get this long to be
# taken in by the daemons (idle, waiting for that frame) before the frame goes out, so they apply to it and not later
LOCKSTEP_SETTLE_S = 0.005
# before frame 1: subscribers made before camerad's publishers connect within msgq's reconnect interval, and a daemon
# takes its subscriptions live when it next polls (every 0.1 s while idle); at most LOCKSTEP_READERS_S for a reader each
LOCKSTEP_CONNECT_S = RECONNECT_IVL_MAX_S + 0.2
LOCKSTEP_READERS_S = 2.

class Lockstep:
  """Waits for the daemons' outputs (frameId == the frame just sent) before the next frame is sent."""
  def __init__(self, services: list[str] | None, streams, timeout: float, stop: StopFlag, idle=lambda: None):
    self.timeout, self.stop, self.idle, self.socks = timeout, stop, idle, {}
    self.expect = answer_streams(services or ANSWERS, streams)   # any service not dmonitoringd's answers a road frame
    if not self.expect: raise OptionError("--lockstep: the source serves no camera stream, nothing to wait for")
    # the daemons waited for: modeld takes every road stream (its frames go in pairs), dmonitoringd the driver's; a
    # stream no awaited answer comes from (the driver's with --lockstep-services modelV2) is served without waiting
    road = set(road_streams(streams) or ())
    self.clients = [s for s in streams if s in self.expect.values() or (s in road and road & set(self.expect.values()))]

  def answers(self, streams) -> dict[str, int]:
    """What answers a frame of these streams (of those served), and the stream whose frame id it carries: modeld's
    modelV2 the main camera's frame, dmonitoringd's driverStateV2 the driver's (or the --lockstep-services given)."""
    return {s: stream for s, stream in self.expect.items() if stream in streams}

  def wait_for_clients(self, server: VisionIpcServer, pm, since: float) -> None:
    """Before the first frame: a frame sent before a daemon's client subscribed would never be answered, and messages
    sent before its subscriptions reach camerad's publishers (up since `since`) would be lost (a log's calibration,
    say). Publishers no daemon subscribes to within LOCKSTEP_READERS_S are not waited for."""
    deadline = time.monotonic() + self.timeout
    while not self.stop and not all(server.has_readers(s) for s in self.clients):
      if time.monotonic() > deadline:
        missing = [CAMERA_OF[s] for s in self.clients if not server.has_readers(s)]
        raise LockstepTimeout(f"--lockstep: no VisionIPC client for {', '.join(missing)} within {self.timeout:g} s: is the daemon running?")
      self.idle()
      time.sleep(0.01)
    readers_deadline = time.monotonic() + LOCKSTEP_READERS_S
    while not self.stop and (time.monotonic() < since + LOCKSTEP_CONNECT_S or
                             (time.monotonic() < readers_deadline and not all(pm.all_readers_updated(s) for s in pm.sock))):
      self.idle()
      time.sleep(0.01)
    # subscribe now: a daemon's publisher is normally up once its camera client is, and a subscription to a running
    # publisher is live when sub_sock returns, so the answer to the first frame cannot slip by while connecting
    self.socks = {s: messaging.sub_sock(s, timeout=100) for s in self.expect}   # not conflated: no answer is missed

  def wait(self, frame_ids: dict[int, int]) -> None:
    """frame_ids: the frame just sent on each stream."""
    deadline = time.monotonic() + self.timeout
    for svc, stream in self.answers(frame_ids).items():
      frame_id = frame_ids[stream]
      while not self.stop:
        self.idle()   # a slow daemon is not a hung camerad: keep the service manager's watchdog fed
        if (dat := self.socks[svc].receive()) is not None:
          # an event of another service on this topic is skipped too: reading it as this one would raise
          try: ev = messaging.log_from_bytes(dat, expect=svc)
          except messaging.MalformedMessageError as e: log.warning("lockstep: malformed %s ignored: %s", svc, e)
          else:
            if getattr(ev, svc).frameId == frame_id: break
        if time.monotonic() > deadline:
          raise LockstepTimeout(f"--lockstep: no {svc} for frame {frame_id} within {self.timeout:g} s: is the daemon running?")

  def close(self) -> None:
    for s in self.socks.values(): s.close()

def camera_state(svc: str, frame_id: int, source_index: int, sof: int, eof: int, processing_s: float, sensor: str, recorded=None):
  """The camera-state message of a frame served as frame_id. frameIdSensor is the frame's index in the source (scene
  frame, video frame, the log's frame id): frame ids can differ from it (a loop continues them, lockstep closes a
  log's gaps), so this is what ties an output back to its source frame."""
  msg = messaging.new_message(svc)
  if recorded is not None: setattr(msg, svc, recorded)   # keep the recorded fields; this run's id and times below
  st = getattr(msg, svc)
  st.frameId, st.frameIdSensor, st.timestampSof, st.timestampEof, st.processingTime = frame_id, source_index, sof, eof, processing_s
  st.sensor = sensor if sensor in SENSORS else "unknown"
  return msg

def artifact_layouts(artifacts: str, streams: dict[int, tuple[int, int]]) -> dict[int, NV12Layout]:
  """Each stream's layout, one the artifacts' warps take (modelrt.artifact.camerad_layouts). A camera of a size the
  artifacts were not built for is refused, named with the modeld-compile command that adds it; the others are served.
  SourceError when none is left."""
  from modelrt.artifact import ArtifactError, camerad_layouts
  refused = {}
  for s, size in streams.items():
    try: camerad_layouts(artifacts, {s: size})
    except ArtifactError as e: raise SourceError(f"--artifacts: {e}") from None
    except ValueError as e: refused[s] = str(e)
  for why in refused.values(): log.error("not served: %s", why)
  if not (served := {s: size for s, size in streams.items() if s not in refused}):
    raise SourceError(f"--artifacts {artifacts}: no camera to serve ({'; '.join(refused.values())})")
  try: specs = camerad_layouts(artifacts, served)
  except ValueError as e: raise SourceError(f"--artifacts: {e}") from None
  by_size = {(l.width, l.height): l for l in map(NV12Layout.parse, specs)}
  return {s: by_size[size] for s, size in served.items()}

def serve(args: argparse.Namespace, source: Source, stop: StopFlag) -> int:
  pm = lock = server = None
  try:
    layouts = artifact_layouts(args.artifacts, source.streams) if args.artifacts else option_layouts(args.layouts, source.streams)
    server = VisionIpcServer(args.name)
    for s, l in layouts.items(): server.create_buffers_with_sizes(s, args.buffers, l.width, l.height, l.size, l.stride, l.uv_offset)
    pm, pm_up = messaging.PubMaster([CAMERA_STATE_SERVICES[s] for s in layouts] + list(source.services)), time.monotonic()
    watchdog = Watchdog()
    if args.lockstep: lock = Lockstep(args.lockstep_services, layouts, args.lockstep_timeout, stop, idle=watchdog.kick)
    server.start_listener()
    log.info("serving %s as %r: %s", ", ".join(args.source), args.name,
             ", ".join(f"{CAMERA_OF[s]} {l}" for s, l in layouts.items()) or "messages only")
    notify("READY=1", f"STATUS=serving {', '.join(CAMERA_OF[s] for s in layouts)}")
    if lock is not None: lock.wait_for_clients(server, pm, pm_up)
    return run(args, source, server, pm, lock, layouts, stop, watchdog)
  finally:
    if lock is not None: lock.close()
    if pm is not None: pm.close()
    if server is not None: server.close()
    source.close()

def run(args, source: Source, server: VisionIpcServer, pm, lock, layouts: dict, stop: StopFlag, watchdog: Watchdog) -> int:
  stats = Stats(log, interval=10.0)
  pacer = Pacer(stop, args.fps, source.fps, free=args.lockstep or source.live, idle=watchdog.kick)
  served, t0 = 0, time.monotonic()
  writer = FrameWriter(source, args.lockstep)
  done = sent_msgs = False
  while not done and not stop:
    any_frame = False
    writer.new_pass()
    for tick in source.ticks(args.start):
      if stop: break
      pacer.wait(tick)
      for svc, dat in tick.msgs:
        if not isinstance(dat, bytes): dat.logMonoTime = time.monotonic_ns()   # built ahead of pacing: stamp when sent
        pm.send(svc, dat)
        sent_msgs = True
      for k, v in tick.timings.items(): stats.timing(k, v)
      tick.frames = {s: f for s, f in tick.frames.items() if s in layouts}   # not a refused camera's
      if not tick.frames:
        watchdog.kick()
        stats.tick()
        continue
      if lock is not None and sent_msgs: time.sleep(LOCKSTEP_SETTLE_S)
      sent_msgs = False
      bufs, t = {s: server.get_free_buffer(s) for s in tick.frames}, time.monotonic_ns()
      frames = writer.write(tick, {s: (b.array, layouts[s]) for s, b in bufs.items()})
      written = time.monotonic_ns()
      for s, (fid, sof, eof) in frames.items():
        server.publish(s, bufs[s], fid, sof, eof)
        svc = CAMERA_STATE_SERVICES[s]
        pm.send(svc, camera_state(svc, fid, tick.index, sof, eof, (time.monotonic_ns() - written) / 1e9, source.sensor[s], tick.states.get(s)))
        if s in tick.eof_here: stats.timing("frame_age", (time.monotonic_ns() - tick.eof_here[s]) / 1e9)   # a device's EOF to served
      del bufs   # no view of a shared buffer outlives its frame
      any_frame, served = True, served + 1
      stats.count("frames")
      stats.timing("fill", (written - t) / 1e9)
      watchdog.kick()
      stats.tick()
      if lock is not None and frames: lock.wait({s: fid for s, (fid, _, _) in frames.items()})
      if args.frames is not None and served >= args.frames:
        done = True
        break
    if not args.loop or not any_frame: break
  dt = time.monotonic() - t0
  skipped = sum(source.skipped.values())
  log.info("served %d frames in %.2f s (%.1f frames/s)%s%s", served, dt, served / dt if dt > 0 else 0.0,
           f", {pacer.late} times behind real time" if pacer.late else "", f", skipped {skipped}" if skipped else "")
  for reason, n in source.skipped.most_common(): log.warning("skipped %d: %s", n, reason)
  if skipped: stats.count("skipped", skipped)
  stats.set_state("stopped")   # a last STATUS= with the totals: what a service manager shows of the finished run
  if served == 0 and layouts and not stop:
    raise SourceError(f"the source gave no frame{f' from --start {args.start} on (past its end?)' if args.start else ''}")
  return 0

def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  setup_logging(args.log_level)
  set_process_title("camerad")
  stop = StopFlag()
  try:
    source = open_source(args.source, args.cameras, args.services, args.messages_only)
    for cam, why in getattr(source, 'unserved', {}).items(): log.warning("not served: %s: %s", cam, why)
    for why, services in getattr(source, 'left_out', {}).items(): log.info("not republished (%s): %s", why, ", ".join(services))
    return serve(args, source, stop)
  except OptionError as e:   # found once the source is known (a --layout size it lacks, an unknown scene): a bad option all the same
    log.error("%s", e)
    return 2
  except (SourceError, VideoError, LockstepTimeout, IpcError) as e:
    log.error("%s%s", e, ". Give --messages-only to republish the messages alone." if isinstance(e, NoFramesError) else "")
    return 1

if __name__ == "__main__":
  sys.exit(main())
