"""camerad: serves camera frames into VisionIPC with their camera-state messages.

Each frame is written straight into a free shared buffer (zero copy) and published with a camera-state message of the
same frame id and SOF/EOF timestamps; docs/CAMERAD.md says how ids and times are given (FrameWriter, --lockstep).
"""
from __future__ import annotations
import argparse, logging, sys, time
from service import Stats, add_log_level, StopFlag, Watchdog, notify, set_process_title, setup_logging
from service.extras import needs_extra
from cereal import messaging
from cereal.services import (CAMERA_OF_STREAM as CAMERA_OF, CAMERA_STATE_SERVICES, SERVICES)
from msgq import IpcError
from msgq.visionipc import NV12Layout, VisionIpcServer
from msgq.visionipc.server import MAX_BUFFERS
from service.owned import NotOwnedError
from camerad.scene import shipped_scenes
with needs_extra("camerad", "camera"):   # PyAV and zstandard: video files, devices and logs
  from oproute.video import VideoError
  from camerad.sources import REPUBLISHABLE, STREAMS, NoFramesError, OptionError, Source, SourceError, Tick, open_source
  from camerad.frames import FrameWriter, camera_state
  from camerad.lockstep import LOCKSTEP_FIRST_SETTLE_S, LOCKSTEP_SETTLE_S, Lockstep, LockstepTimeout

log = logging.getLogger("camerad")
LATE_PERIODS = 2      # a paced frame this many frame periods behind its time is skipped, not served late
MAX_AGE_S = 0.25      # a live frame older than this (its end of frame to now) is skipped, not served

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

exit codes: 0 done (or stopped by SIGTERM/SIGINT); 1 a source that cannot be served, a lockstep timeout, another
camerad of the name, or a file of another account where its socket or lock goes (named with its owner); 2 a bad
option (out of range, an unknown camera, scene or service, options that do not apply to the source, a --layout size
no stream has).

pacing: real time at the source's rate by default; --fps F for a fixed rate; --lockstep sends a frame only once the
daemons published their outputs for the previous one (deterministic, nothing lost however slow the machine). Without
--lockstep nothing is served late: a frame two frame periods behind its time, or a live frame over 250 ms old, is
skipped and counted (the stats' skipped, the summary's reasons).

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
  """Sleeps until each tick is due: at the source's timestamps (real time), at a fixed rate, or not at all. The
  schedule never slips (a source that goes back, a loop, restarts it): wait() is False for a tick more than LATE_PERIODS
  frame periods behind it, whose frames the caller skips, so what is served stays current however slow the machine."""
  def __init__(self, stop: StopFlag, fps: float | None, src_fps: float, free: bool, idle=lambda: None):
    self.stop, self.fps, self.src_fps, self.free, self.idle = stop, fps, src_fps, free, idle
    self.due = self.t = None
    self.late_s = LATE_PERIODS / (fps or src_fps)

  def wait(self, tick: Tick) -> bool:
    if self.free: return True
    now = time.monotonic()
    if self.fps is not None: dt = 1 / self.fps if tick.frames else 0.0
    elif self.t is not None and tick.t >= self.t: dt = tick.t - self.t
    else:   # first tick, or the source went back (a loop): the schedule starts again
      dt, self.due = (1 / self.src_fps if tick.frames else 0.0), None
    self.t = tick.t
    self.due = now if self.due is None else self.due + dt
    while not self.stop and (left := self.due - time.monotonic()) > 0:
      self.idle()
      time.sleep(min(left, 0.1))
    return time.monotonic() - self.due <= self.late_s

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

def stream_layouts(args: argparse.Namespace, streams: dict[int, tuple[int, int]]) -> dict[int, NV12Layout]:
  return artifact_layouts(args.artifacts, streams) if args.artifacts else option_layouts(args.layouts, streams)

class LateStreams:
  """Cameras a live source finds while serving (a device's camera that starts late): each gets its buffers and its
  camera-state publisher at its first frame, or is refused once, as at start."""
  def __init__(self, args: argparse.Namespace, source: Source, server: VisionIpcServer, pm, layouts: dict[int, NV12Layout]):
    self.args, self.source, self.server, self.pm, self.layouts = args, source, server, pm, layouts
    self.refused = set(source.streams) - set(layouts)   # refused at start, named in the log then

  def served(self, stream: int) -> bool:
    if stream in self.layouts: return True
    if stream in self.refused or stream not in self.source.streams: return False
    try: l = stream_layouts(self.args, {**{s: self.source.streams[s] for s in self.layouts}, stream: self.source.streams[stream]})[stream]
    except (SourceError, KeyError):   # refused (named in the log) or no layout
      self.refused.add(stream)
      return False
    self.server.create_buffers_with_sizes(stream, self.args.buffers, l.width, l.height, l.size, l.stride, l.uv_offset)
    self.pm.add(CAMERA_STATE_SERVICES[stream])
    self.layouts[stream] = l
    log.info("serving %s %s too", CAMERA_OF[stream], l)
    notify(f"STATUS=serving {', '.join(CAMERA_OF[s] for s in self.layouts)}")
    return True

def serve(args: argparse.Namespace, source: Source, stop: StopFlag) -> int:
  pm = lock = server = None
  try:
    layouts = stream_layouts(args, source.streams)
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
  late = LateStreams(args, source, server, pm, layouts)
  done = sent_msgs = False
  counted = 0   # skipped frames already in the stats
  def count_skipped() -> None:
    nonlocal counted
    if (n := sum(source.skipped.values())) > counted: stats.count("skipped", n - counted)
    counted = n
  while not done and not stop:
    any_frame = False
    writer.new_pass()
    for tick in source.ticks(args.start):
      if stop: break
      on_time = pacer.wait(tick)
      for svc, dat in tick.msgs:
        if not isinstance(dat, bytes): dat.logMonoTime = time.monotonic_ns()   # built ahead of pacing: stamp when sent
        pm.send(svc, dat)
        sent_msgs = True
      for k, v in tick.timings.items(): stats.timing(k, v)
      tick.frames = {s: f for s, f in tick.frames.items() if late.served(s)}   # not a refused camera's
      now = time.monotonic_ns()
      for s in list(tick.frames):   # late: a newer frame is due (paced) or this one is stale (live); never a backlog
        if not on_time: why = f"over {pacer.late_s * 1e3:.0f} ms behind real time"
        elif now - tick.eof_here.get(s, now) > MAX_AGE_S * 1e9: why = f"older than {MAX_AGE_S * 1e3:.0f} ms"
        else: continue
        if not source.skipped[late_why := f"{CAMERA_OF[s]}: late, not served ({why})"]: log.warning("skipping late frames: %s", late_why)
        del tick.frames[s]
        source.skipped[late_why] += 1
      count_skipped()
      if not tick.frames:
        watchdog.kick()
        stats.tick()
        continue
      if lock is not None and sent_msgs: time.sleep(LOCKSTEP_SETTLE_S if stats.totals.get('frames') else LOCKSTEP_FIRST_SETTLE_S)
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
  log.info("served %d frames in %.2f s (%.1f frames/s)%s", served, dt, served / dt if dt > 0 else 0.0, f", skipped {skipped}" if skipped else "")
  for reason, n in source.skipped.most_common(): log.warning("skipped %d: %s", n, reason)
  count_skipped()
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
  except (SourceError, VideoError, LockstepTimeout, IpcError, NotOwnedError) as e:
    log.error("%s%s", e, ". Give --messages-only to republish the messages alone." if isinstance(e, NoFramesError) else "")
    return 1

if __name__ == "__main__":
  sys.exit(main())
