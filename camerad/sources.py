"""Frame sources for camerad: synthetic scenes, video files, V4L2 devices and recorded logs.

A source has `streams` ({VisionIPC stream: (width, height)}), `sensor` ({stream: ImageSensor name}), `fps` (its
nominal rate) and `ticks()`: a finite iterator of Ticks in source order. A tick carries, per stream, a function that
writes the frame as NV12 into a flat buffer of any layout, plus messages to publish just before the frames.
Problems a source meets while running (undecodable packets, frames missing from a recording) are counted in
`skipped` with the reason; problems found while opening are SourceErrors that name the file and what was wrong.
"""
from __future__ import annotations
import itertools, os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator
import av
import numpy as np
from cereal import messaging
from cereal.services import CAMERA_STATE_SERVICES
from msgq.visionipc import DRIVER, ROAD, WIDE_ROAD, NV12Layout
from camerad.render import SceneRenderer, nv12_planes
from camerad.scene import SceneError, load_scene
from tools.logreader import VIDEO_NAMES, LogReader, segment_dirs

STREAMS = {"road": ROAD, "wide": WIDE_ROAD, "driver": DRIVER}
CAMERA_OF = {v: k for k, v in STREAMS.items()}
STATE_STREAM = {svc: s for s, svc in CAMERA_STATE_SERVICES.items()}
# what modeld and dmonitoringd publish: a log replay leaves these to the running daemons
DAEMON_OUTPUTS = ("modelV2", "drivingModelData", "cameraOdometry", "driverStateV2", "driverMonitoringState")
MAX_BAD_PACKETS = 100     # consecutive undecodable packets before a video counts as undecodable, not merely damaged
DEFAULT_FPS = 20.0

class SourceError(Exception): pass

Fill = Callable[[np.ndarray, NV12Layout], None]

@dataclass
class Tick:
  index: int                # the frame's position in the source (scene frame, video frame, recorded frame id)
  t: float                  # source time, seconds: drives real-time pacing
  frames: dict[int, Fill] = field(default_factory=dict)      # stream -> writes the frame into a buffer
  msgs: list[tuple[str, object]] = field(default_factory=list)   # (service, builder or raw bytes), sent before the frames
  states: dict[int, object] = field(default_factory=dict)    # stream -> recorded FrameData to extend (log replay)

class Source:
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
    try: self.scene = load_scene(scene)
    except (OSError, SceneError) as e: raise SourceError(f"synthetic scene {scene!r}: {e}") from None
    cams = cameras or list(self.scene.cameras)
    if bad := [c for c in cams if c not in self.scene.cameras]:
      raise SourceError(f"synthetic scene {scene!r}: cameras {bad} not in the scene's {list(self.scene.cameras)}")
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
def fill_frame(frame: av.VideoFrame, out: np.ndarray, layout: NV12Layout) -> None:
  """Write a decoded frame into an NV12 buffer of `layout`: planar 4:2:0 straight from the decoder's planes (Y copied,
  U and V interleaved in place), anything else through PyAV's reformat to NV12 first."""
  if (frame.width, frame.height) != (layout.width, layout.height):
    raise ValueError(f"frame is {frame.width}x{frame.height}, the stream's buffers are {layout.width}x{layout.height}")
  y, u, v = nv12_planes(out, layout)
  def plane(i: int, h: int, w: int) -> np.ndarray:
    p = frame.planes[i]
    return np.frombuffer(p, np.uint8).reshape(-1, p.line_size)[:h, :w]
  h, w = layout.height, layout.width
  if frame.format.name != "yuv420p": frame = frame.reformat(format="nv12")
  y[...] = plane(0, h, w)
  if frame.format.name == "nv12":
    uv = plane(1, h // 2, w)
    u[...], v[...] = uv[:, 0::2], uv[:, 1::2]
  else:
    u[...], v[...] = plane(1, h // 2, w // 2), plane(2, h // 2, w // 2)

class VideoDecoder:
  """Decoded frames of one video file or V4L2 device. Damaged packets are skipped and counted; so many in a row that
  nothing decodes is a SourceError."""
  def __init__(self, path: str, skipped: Counter, fmt: str | None = None, options: dict | None = None):
    self.path, self.skipped = path, skipped
    try:
      self.container = av.open(path, format=fmt, options=options or {})
    except (av.FFmpegError, OSError) as e: raise SourceError(f"{path}: cannot open as video ({e})") from None
    if not self.container.streams.video:
      self.container.close()
      raise SourceError(f"{path}: no video stream (streams: {[s.type for s in self.container.streams] or 'none'})")
    self.stream = st = self.container.streams.video[0]
    st.thread_type = "AUTO"
    self.width, self.height = st.codec_context.width, st.codec_context.height
    if self.width <= 0 or self.height <= 0 or self.width % 2 or self.height % 2:
      self.container.close()
      raise SourceError(f"{path}: video is {self.width}x{self.height}; NV12 buffers need a positive even width and height")
    rate = st.average_rate or st.guessed_rate or st.base_rate
    self.fps = float(rate) if rate and 0 < float(rate) < 1000 else DEFAULT_FPS

  def frames(self) -> Iterator[av.VideoFrame]:
    bad = 0
    packets = self.container.demux(self.stream)
    while True:
      try: packet = next(packets)
      except StopIteration: break
      except av.FFmpegError as e:   # a container cut short or damaged past repair: the frames so far are all there is
        self.skipped[f"{self.path}: unreadable from here ({e})"] += 1
        break
      try: decoded = packet.decode()
      except av.FFmpegError as e:
        bad += 1
        self.skipped[f"{self.path}: undecodable packet ({type(e).__name__})"] += 1
        if bad >= MAX_BAD_PACKETS: raise SourceError(f"{self.path}: {bad} packets in a row failed to decode ({e})") from None
        continue
      for frame in decoded:
        bad = 0
        if (frame.width, frame.height) != (self.width, self.height):
          self.skipped[f"{self.path}: frame of {frame.width}x{frame.height} in a {self.width}x{self.height} stream"] += 1
          continue
        yield frame

  def close(self) -> None: self.container.close()

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
    except SourceError:
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
        if i >= start: yield Tick(i, i / self.fps, {s: (lambda out, layout, f=f: fill_frame(f, out, layout)) for s, f in frames.items()})
    finally:
      for d in decs.values(): d.close()

  def close(self) -> None:
    if self._decs:
      for d in self._decs.values(): d.close()

# ---- recorded logs (tools/record.py)
class LogSource(Source):
  """A route, segment or log file of modeld-record. Recorded messages are republished (as recorded, byte for byte)
  at their recorded pace, except the daemons' outputs unless asked for. Cameras recorded as video are served
  again: each recorded camera state whose frame is in the video becomes a frame (its state re-sent with this run's
  timestamps); a state whose frame is missing is skipped and counted. Camera states without video are republished."""
  def __init__(self, path: str, services: list[str] | None = None):
    super().__init__()
    self.path = path
    try:
      self.segments = segment_dirs(path) if Path(path).is_dir() else []
      LogReader(path)   # a path that is no log fails here, not on the first tick
    except (OSError, ValueError) as e: raise SourceError(f"log {path!r}: {e}") from None
    self.videos: dict[int, list[Path]] = {}
    for cam, name in VIDEO_NAMES.items():
      if files := [d / name for d in self.segments if (d / name).is_file()]: self.videos[STREAMS[cam]] = files
    self.streams, self.sensor = {}, {}
    for s, files in self.videos.items():
      d = VideoDecoder(str(files[0]), self.skipped)
      self.streams[s] = (d.width, d.height)
      d.close()
    recorded = self._recorded_services()
    self.replay = [s for s in recorded if (s in services if services else s not in DAEMON_OUTPUTS)
                   and STATE_STREAM.get(s) not in self.streams]
    self.services = tuple(self.replay)
    self.fps = DEFAULT_FPS

  def _recorded_services(self) -> list[str]:
    """Services in the log; also each video stream's sensor, from its first camera state."""
    seen = {}
    for ev in LogReader(self.path, sort_by_time=False):
      if (w := ev.which()) not in seen and (s := STATE_STREAM.get(w)) in self.streams: self.sensor[s] = str(getattr(ev, w).sensor)
      seen[w] = True
    if missing := [CAMERA_OF[s] for s in self.streams if s not in self.sensor]:
      raise SourceError(f"log {self.path!r}: {', '.join(missing)} video recorded without its camera-state service, "
                        f"so its frames have no timing: record {', '.join(CAMERA_STATE_SERVICES[STREAMS[c]] for c in missing)} too")
    return list(seen)

  def _frames(self, stream: int) -> Iterator[av.VideoFrame]:
    for path in self.videos[stream]:
      try: d = VideoDecoder(str(path), self.skipped)
      except SourceError as e:
        self.skipped[str(e)] += 1
        continue
      try: yield from d.frames()
      finally: d.close()

  def ticks(self, start: int = 0) -> Iterator[Tick]:
    videos = {s: self._frames(s) for s in self.streams}
    pending: dict[int, av.VideoFrame | None] = dict.fromkeys(self.streams)
    def frame_for(stream: int, frame_id: int) -> av.VideoFrame | None:
      """The video frame whose pts is frame_id; frames before it are recorded frames without a state: passed over."""
      f = pending[stream]
      while f is None or f.pts < frame_id:
        if (f := next(videos[stream], None)) is None: break
      pending[stream] = f
      return f if f is not None and f.pts == frame_id else None

    # messages before the first frame go out with it (the newest of each service), not at their recorded pace
    tick, after, early = None, [], {} if self.streams else None
    def flush() -> Iterator[Tick]:
      if tick is not None: yield tick
      if after: yield Tick(-1, after[0][0], msgs=[m for _, m in after])
    for dat, ev in LogReader(self.path).raw():
      w, t = ev.which(), ev.logMonoTime / 1e9
      if (stream := STATE_STREAM.get(w)) in self.streams:
        st = getattr(ev, w)
        if st.frameId < start: continue
        if tick is not None and (tick.index != st.frameId or stream in tick.frames):
          yield from flush()
          tick, after = None, []
        if (f := frame_for(stream, st.frameId)) is None:
          self.skipped[f"{CAMERA_OF[stream]} frame missing from the video"] += 1
          continue
        if tick is None:
          tick = Tick(st.frameId, t, msgs=list((early or {}).items()))
          early = None
        tick.frames[stream] = lambda out, layout, f=f: fill_frame(f, out, layout)
        tick.states[stream] = st
      elif w in self.replay:
        if early is not None: early[w] = dat
        elif tick is not None: after.append((t, (w, dat)))   # goes right after the frame it follows (all its streams)
        else: yield Tick(-1, t, msgs=[(w, dat)])
    yield from flush()

# ---- --source parsing
def open_source(specs: list[str], cameras: list[str] | None = None, services: list[str] | None = None) -> Source:
  """One source from the --source arguments: 'synthetic:SCENE', '[CAM=]FILE' (one per stream, CAM one of road, wide,
  driver; road if not given), '[CAM=]/dev/videoN', or a LOG (route folder, segment folder, rlog.zst)."""
  if not specs: raise SourceError("no --source given")
  first = specs[0]
  if first.startswith("synthetic:"):
    if len(specs) > 1: raise SourceError(f"a synthetic source serves every camera of its scene; got more sources {specs[1:]}")
    return SyntheticSource(first.split(":", 1)[1], cameras)
  def split(spec: str) -> tuple[str | None, str]:
    cam, sep, path = spec.partition("=")
    return (cam, path) if sep and cam in STREAMS else (None, spec)
  if len(specs) == 1 and split(first)[0] is None and _is_log(first): return LogSource(first, services)
  files: dict[int, str] = {}
  for spec in specs:
    cam, path = split(spec)
    if spec.startswith("synthetic:") or _is_log(path):
      raise SourceError(f"--source {spec!r}: a synthetic scene or a log is a source of its own, not one of several")
    cam = cam or ("road" if not files else None)
    if cam is None: raise SourceError(f"--source {spec!r}: with several files, name each one's camera: road=FILE, wide=FILE, driver=FILE")
    if STREAMS[cam] in files: raise SourceError(f"--source {spec!r}: camera {cam} given twice")
    if not path.startswith("/dev/video") and not os.path.isfile(path): raise SourceError(f"--source {spec!r}: no such file {path!r}")
    files[STREAMS[cam]] = path
  devices = [p.startswith("/dev/video") for p in files.values()]
  if any(devices) and not all(devices): raise SourceError("V4L2 devices and video files cannot be mixed in one camerad")
  return VideoSource(files, v4l2=all(devices))

def _is_log(path: str) -> bool:
  p = Path(path)
  return p.is_dir() or p.name.startswith("rlog")
