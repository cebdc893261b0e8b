"""Frame sources for camerad: synthetic scenes, video files, V4L2 devices and openpilot routes.

Each is a Source: its streams, a finite iterator of Ticks that write frames into buffers of any layout, and `skipped`
(problems met while running, with the reason); problems found while opening are SourceErrors naming the file.
"""
from __future__ import annotations
import itertools, os, time
from collections import Counter
from pathlib import Path
from dataclasses import dataclass, field
from collections.abc import Callable, Iterator
import numpy as np
from cereal import messaging
from cereal.services import CAMERAS, DAEMON_OUTPUTS, STREAM_OF_STATE
from msgq.visionipc import NV12Layout
from camerad.render import SceneRenderer
from camerad.scene import SceneError, load_scene, scene_path, shipped_scenes
from oproute.logreader import LogReader, log_files, parse_identifier, routes_of
from oproute.video import DEFAULT_FPS, ENCODE_IDX_OF, CameraVideo, EncodeIndex, VideoDecoder, VideoError, fill_frame

STREAMS = {name: c.stream for name, c in CAMERAS.items()}
# what a log replay can republish: every member of openpilot's Event (any name is an endpoint; those outside the
# services table get msgq's default size limit), but those the logger writes itself and nobody publishes
LOGGER_EVENTS = ("initData", "sentinel")
REPUBLISHABLE = messaging.EVENTS - set(LOGGER_EVENTS)

class SourceError(Exception):
  """A source that cannot be served: the message names what and why (a VideoError says it of one video file)."""

class NoFramesError(SourceError):
  """A log source with no camera frame to serve (camerad can still republish its messages)."""

class OptionError(SourceError):
  """An option that is wrong whatever the source's files hold: an unknown camera or scene name, options that do not go
  together or do not apply to the source. camerad exits 2 for it, as for any bad option; 1 is for a source that
  cannot be served."""

Fill = Callable[[np.ndarray, NV12Layout], None]

@dataclass
class Tick:
  index: int                # the frame's position in the source (scene frame, video frame, recorded frame id)
  t: float                  # source time, seconds: drives real-time pacing
  frames: dict[int, Fill] = field(default_factory=dict)      # stream -> writes the frame into a buffer
  msgs: list[tuple[str, object]] = field(default_factory=list)   # (service, builder or raw bytes), sent before the frames
  states: dict[int, object] = field(default_factory=dict)    # stream -> recorded FrameData to extend (log replay)
  ids: dict[int, tuple[int, int, int]] = field(default_factory=dict)   # stream -> (frame id, SOF, EOF) the source gives (a device's)
  eof_here: dict[int, int] = field(default_factory=dict)     # stream -> its end of frame on this machine's clock: the frame's age
  timings: dict[str, float] = field(default_factory=dict)    # the source's own timings of the tick (seconds), for the stats

class Source:
  """`streams` ({VisionIPC stream: (width, height)}), `sensor` ({stream: ImageSensor name}), `fps` (the nominal rate) and
  `ticks()`: a finite iterator of Ticks in source order, each carrying per stream a function that writes the frame as
  NV12 into a flat buffer of any layout, plus messages to publish just before the frames. Problems met while running
  (undecodable packets, frames missing from a recording) are counted in `skipped` with the reason."""
  streams: dict[int, tuple[int, int]]
  sensor: dict[int, str]
  fps: float
  services: tuple[str, ...] = ()   # services published besides the camera states
  live: bool = False               # paced by the device itself
  def __init__(self): self.skipped: Counter[str] = Counter()
  def ticks(self, start: int = 0) -> Iterator[Tick]: raise NotImplementedError
  def close(self) -> None: pass

# ---- synthetic scenes
class SyntheticSource(Source):
  """A scene of camerad/scene.py rendered straight into the buffers, with the scene's liveCalibration (4 Hz) and
  carState (every frame, from the truth)."""
  services = ("liveCalibration", "carState")
  def __init__(self, scene: str, cameras: list[str] | None = None):
    super().__init__()
    if not (path := scene_path(scene)).exists():
      shipped = ", ".join(shipped_scenes())
      if path != Path(scene): raise OptionError(f"--source synthetic:{scene}: no shipped scene {scene!r} (shipped: {shipped}; or give a scene file)")
      raise SourceError(f"synthetic scene {scene!r}: no such file (or give a shipped scene: {shipped})")
    try: self.scene = load_scene(path)
    except (OSError, SceneError) as e: raise SourceError(f"synthetic scene {scene!r}: {e}") from None
    cams = cameras or list(self.scene.cameras)
    if bad := [c for c in cams if c not in self.scene.cameras]:
      raise OptionError(f"--cameras: {', '.join(bad)} not in synthetic scene {scene!r}, whose cameras are {', '.join(self.scene.cameras)}")
    self.cams = {STREAMS[c]: c for c in cams}
    self.streams = {s: (self.scene.cameras[c].width, self.scene.cameras[c].height) for s, c in self.cams.items()}
    self.sensor = dict.fromkeys(self.streams, self.scene.sensor)
    self.fps, self.calib_every = self.scene.fps, max(1, round(self.scene.fps / 4))
    self._renderers: dict[tuple[int, NV12Layout], SceneRenderer] = {}

  def _render(self, stream: int, i: int) -> Fill:
    def fill(out: np.ndarray, layout: NV12Layout) -> None:
      if (r := self._renderers.get((stream, layout))) is None:
        r = self._renderers[(stream, layout)] = SceneRenderer(self.scene, self.cams[stream], layout)
      r.render(i, out)
    return fill

  def messages(self, i: int) -> list[tuple[str, object]]:
    truth, out = self.scene.truth(i), []
    if i % self.calib_every == 0:
      cal = messaging.new_message("liveCalibration")
      cal.liveCalibration.calStatus = "calibrated"
      cal.liveCalibration.calPerc = 100
      cal.liveCalibration.rpyCalib = list(self.scene.calib)
      cal.liveCalibration.height = [self.scene.height]
      out.append(("liveCalibration", cal))
    cs = messaging.new_message("carState")
    cs.carState.vEgo = cs.carState.vEgoRaw = truth["v_ego"]
    cs.carState.aEgo = truth["a_ego"]
    cs.carState.standstill = truth["v_ego"] < 0.1
    out.append(("carState", cs))
    return out

  def ticks(self, start: int = 0) -> Iterator[Tick]:
    for i in range(start, self.scene.n_frames):
      yield Tick(i, i / self.fps, {s: self._render(s, i) for s in self.streams}, self.messages(i))

# ---- video files and V4L2 devices
class VideoSource(Source):
  """One video file (or V4L2 device) per stream; a tick takes the next frame of each. It ends with the shortest."""
  def __init__(self, files: dict[int, str], v4l2: bool = False):
    super().__init__()
    self.files, self.v4l2, self.live = files, v4l2, v4l2
    decs = self._open()
    self.streams = {s: (d.width, d.height) for s, d in decs.items()}
    self.sensor = dict.fromkeys(files, "unknown")
    self.fps = min(d.fps for d in decs.values())
    self._decs = decs   # the first pass uses the decoders opened to check the files

  def _open(self) -> dict[int, VideoDecoder]:
    decs = {}
    try:
      for s, path in self.files.items():
        decs[s] = VideoDecoder(path, self.skipped, fmt="v4l2" if self.v4l2 else None)
    except BaseException:   # a file that cannot be opened (VideoError) or anything else: close the ones already open
      for d in decs.values(): d.close()
      raise
    return decs

  def ticks(self, start: int = 0) -> Iterator[Tick]:
    decs, self._decs = self._decs or self._open(), None
    try:
      its = {s: d.frames() for s, d in decs.items()}
      for i in itertools.count():
        frames = {}
        for s, it in its.items():
          if (f := next(it, None)) is None:
            if i == 0: raise SourceError(f"{self.files[s]}: no frame could be decoded")
            return
          frames[s] = f
        if i >= start: yield Tick(i, i / self.fps, {s: (lambda out, layout, f=f: fill_frame(f, out, layout)) for s, f in frames.items()},
                                  eof_here={s: t for s, f in frames.items() if self.v4l2 and (t := _monotonic_ns(f)) is not None})
    finally:
      for d in decs.values(): d.close()

  def close(self) -> None:
    if self._decs:
      for d in self._decs.values(): d.close()

def _monotonic_ns(frame) -> int | None:
  """A V4L2 frame's capture time, where the driver stamps it on this machine's monotonic clock (FFmpeg passes the
  kernel's timestamp on by default): how old the frame is when served. None for another clock."""
  if frame.time is None: return None
  t = round(frame.time * 1e9)
  return t if abs(time.monotonic_ns() - t) < 10e9 else None

# ---- openpilot routes (oproute)
class LogSource(Source):
  """Routes, segments or log files in openpilot's layout. Recorded messages are republished (byte for byte) at their
  recorded pace, every service of the schema's Event, except the daemons' outputs (unless asked for), the cameras'
  EncodeIdx events (they place frames in the route's video, not in this run) and the logger's own events; which
  recorded services are left out and why: `left_out`. A camera with video (HEVC files and their EncodeIndex
  events) is served again: each recorded camera state whose frame the video holds becomes a frame, its state re-sent
  with this run's frame id and timestamps; a state whose frame is missing is skipped and counted. Camera states of a
  camera without video are republished as recorded. A route with no camera frame to serve is refused, unless
  messages_only. decode_threads: per video (0: FFmpeg's choice)."""
  def __init__(self, paths: list[str], services: list[str] | None = None, messages_only: bool = False, decode_threads: int = 0):
    super().__init__()
    self.paths = paths
    try: self.files = log_files(paths, "a")   # rlogs; a segment without one falls back to its qlog
    except (OSError, ValueError) as e: raise SourceError(f"log {e}") from None   # the reader's errors name the path
    if len(routes := routes_of(self.files)) > 1:   # frame ids and segment numbers start again in each route
      raise SourceError(f"log {' '.join(paths)}: segments of {len(routes)} routes ({', '.join(routes)}); camerad serves one route "
                        f"at a time: give one route, or segments of one")
    recorded, index, self.sensor, problems = self._scan()
    self.videos, self.streams, self.unserved = {}, {}, {}   # unserved: camera with states -> why it has no frame to serve
    for cam, c in CAMERAS.items():
      if messages_only: break
      if c.state not in recorded: continue
      if (v := CameraVideo.of(cam, self.files, index, self.skipped, decode_threads)) is None: self.unserved[cam] = f"no {c.encode_idx} events"; continue
      try: self.streams[c.stream] = v.size()
      except VideoError as e: self.unserved[cam] = str(e); continue
      self.videos[c.stream] = v
    if not self.streams and not messages_only:
      cams = [cam for cam, c in CAMERAS.items() if c.state in recorded]
      raise NoFramesError(f"log {' '.join(paths)}: no camera frame to serve: " + (self.why_unserved() if self.unserved else
                          "no camera states in the log" if not cams else f"{', '.join(cams)} recorded without video") +
                          "".join(f"; {p}" for p in problems))
    why_not = {**dict.fromkeys(LOGGER_EVENTS, "written by the logger, never published"),
               **dict.fromkeys(ENCODE_IDX_OF, "where frames are in the route's video"),
               **({} if services else dict.fromkeys(DAEMON_OUTPUTS, "the daemons' outputs"))}
    replay, self.left_out = [], {}   # left_out: why -> recorded services not republished
    for s in recorded:
      if STREAM_OF_STATE.get(s) in self.streams or (services and s not in services): continue   # re-sent with its frames; not asked for
      why = why_not.get(s) or (None if s in REPUBLISHABLE else "members this schema does not know")
      if why is None: replay.append(s)
      else: self.left_out.setdefault(why, []).append(s)
    self.services, self.replay = tuple(replay), frozenset(replay)
    self.fps = DEFAULT_FPS

  def why_unserved(self) -> str:
    return "; ".join(f"{cam}: {why}" for cam, why in self.unserved.items())

  def _scan(self) -> tuple[list[str], EncodeIndex, dict[int, str], list[str]]:
    """Services in the logs, where the cameras' frames are, each camera's sensor (from its first state), and what was
    wrong with the logs (cut short, say)."""
    seen, index, sensor, lr = {}, EncodeIndex(), {}, LogReader(self.files)
    for ev in lr:
      w = ev.which()
      if not index.add(ev) and (s := STREAM_OF_STATE.get(w)) is not None and s not in sensor: sensor[s] = str(getattr(ev, w).sensor)
      seen[w] = True
    return list(seen), index, sensor, lr.warnings

  def ticks(self, start: int = 0) -> Iterator[Tick]:
    # messages before the first frame go out with it (the newest of each service), not at their recorded pace; those
    # after a frame wait until all its streams' states were read, then each goes out at its own recorded time
    tick, after, early = None, [], {} if self.streams else None
    def flush() -> Iterator[Tick]:
      if tick is not None: yield tick
      for t, m in after: yield Tick(-1, t, msgs=[m])
    try:
      for dat, ev in LogReader(self.files, sort_by_time=True, log_warnings=False).raw():   # the scan reported what is damaged
        w, t = ev.which(), ev.logMonoTime / 1e9
        if (stream := STREAM_OF_STATE.get(w)) in self.streams:
          st = getattr(ev, w)
          if st.frameId < start: continue
          if tick is not None and (tick.index != st.frameId or stream in tick.frames):
            yield from flush()
            tick, after = None, []
          if (f := self.videos[stream].frame(st.frameId, st.timestampSof)) is None: continue
          if tick is None:
            tick = Tick(st.frameId, t, msgs=list((early or {}).items()))
            early = None
          tick.frames[stream] = lambda out, layout, f=f: fill_frame(f, out, layout)
          tick.states[stream] = st
        elif w in self.replay:
          if early is not None: early[w] = dat
          elif tick is not None: after.append((t, (w, dat)))
          else: yield Tick(-1, t, msgs=[(w, dat)])
      yield from flush()
    finally:
      for v in self.videos.values(): v.close()

# ---- --source parsing
def open_source(specs: list[str], cameras: list[str] | None = None, services: list[str] | None = None, messages_only: bool = False) -> Source:
  """One source from the --source arguments: 'synthetic:SCENE', 'bridge:HOST' (a comma device), '[CAM=]FILE' (one per
  stream, CAM one of road, wide, driver; road if not given), '[CAM=]/dev/videoN', or LOGs (routes, segments or log
  files, one after the other). Specs that do not go together, an unknown camera name and options that do not apply to
  the source: OptionError."""
  if not specs: raise OptionError("no --source given")
  if any(p.startswith("bridge:") for p in specs):
    if len(specs) > 1: raise OptionError(f"--source bridge:HOST is a source of its own, not one of several (got {' '.join(specs)})")
    if cameras or services or messages_only: raise OptionError("--cameras, --services, --messages-only: not for bridge:HOST (it serves what the device sends)")
    from camerad.bridge import BridgeSource
    if not (host := specs[0].split(":", 1)[1]): raise OptionError("--source bridge:HOST: no HOST (the device's address)")
    return BridgeSource(host)
  def split(spec: str) -> tuple[str | None, str]:
    cam, sep, path = spec.partition("=")
    if sep and cam not in STREAMS and "/" not in cam and not os.path.exists(spec):   # CAM=FILE whose CAM is no camera
      raise OptionError(f"--source {spec!r}: unknown camera {cam!r}; expected {', '.join(STREAMS)} (CAM=FILE)")
    return (cam, path) if sep and cam in STREAMS else (None, spec)
  synthetic = (first := specs[0]).startswith("synthetic:")
  if synthetic and len(specs) > 1: raise OptionError(f"a synthetic source serves every camera of its scene; got more sources {specs[1:]}")
  if cameras and not synthetic: raise OptionError("--cameras applies to a synthetic scene; video files and logs serve the cameras they have")
  logs = not synthetic and all(split(p)[0] is None and _is_log(p) for p in specs)
  if (services or messages_only) and not logs:
    raise OptionError(f"--services and --messages-only apply to a LOG source, not to {'a synthetic scene' if synthetic else 'video files or devices'}")
  if synthetic: return SyntheticSource(first.split(":", 1)[1], cameras)
  if logs: return LogSource(specs, services, messages_only)
  files: dict[int, str] = {}
  for spec in specs:
    cam, path = split(spec)
    if spec.startswith("synthetic:") or _is_log(path):
      raise OptionError(f"--source {spec!r}: a synthetic scene or a log is a source of its own, not one of several")
    cam = cam or ("road" if not files else None)
    if cam is None: raise OptionError(f"--source {spec!r}: with several files, name each one's camera: road=FILE, wide=FILE, driver=FILE")
    if STREAMS[cam] in files: raise OptionError(f"--source {spec!r}: camera {cam} given twice")
    files[STREAMS[cam]] = path
  if missing := [p for p in files.values() if not p.startswith("/dev/video") and not os.path.isfile(p)]:   # the specs first: a bad one is a bad option
    raise SourceError(f"--source: no such file {', '.join(map(repr, missing))}")
  devices = [p.startswith("/dev/video") for p in files.values()]
  if any(devices) and not all(devices): raise OptionError("V4L2 devices and video files cannot be mixed in one camerad")
  return VideoSource(files, v4l2=all(devices))

def _is_log(path: str) -> bool:
  """A route or segment folder, a log file, or a route name whose segments sit beside it (each may carry openpilot's
  segment range and mode: ROUTE/2:4/q)."""
  p = parse_identifier(path)[0]
  return p.is_dir() or p.name.startswith(("rlog", "qlog")) or (not p.exists() and any(p.parent.glob(f"{p.name}--*")))
