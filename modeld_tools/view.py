"""modeld-view: what the models see, on rerun, live from a stack or from a route: each camera's picture with the model's
path, lane lines, road edges and lead projected in (projection.py), the driver's face and states, desire and meta, time
series of latency, drops, speeds and awareness, on timelines by frame id and by log time (mono_time, from the route's
start). Pictures are downscaled: live, the camera's NV12 decimated; from a route, JPEG (docs/VIEW.md: the cost)."""
from __future__ import annotations
import argparse, io, os, socket, subprocess, sys, tempfile, threading, time
from collections import Counter
from pathlib import Path
from urllib.parse import quote
import numpy as np
from service.extras import needs_extra
with needs_extra('modeld-view', 'view'):
  import av  # noqa: F401  (projection.nv12_to_rgb and oproute.video decode with it)
  import rerun as rr
  import rerun.blueprint as rrb
  from PIL import Image
from cereal.services import CAMERAS, STREAM_OF_STATE, CAMERA_OF_STREAM
from modeld.desire import Desire
from dmonitoringd.fill_msgs import awareness
from modelrt.constants import DESIRE_LEN
from modeld_tools.projection import GREEN, RED, Scaled, calibration, decimation, driver_data, face, nv12_decimate, nv12_to_rgb, prob_colour, road
from transformations.camera import CAM_HEIGHT, CameraConfig, camera_config, camera_for, sensor_name

PROG = 'modeld-view'
SERVICES = ['modelV2', 'driverStateV2', 'driverMonitoringState', 'liveCalibration', 'carState', *(c.state for c in CAMERAS.values())]
STATE_CAMERA = {s: CAMERA_OF_STREAM[st] for s, st in STREAM_OF_STATE.items()}
DESIRES = {v: k for k, v in vars(Desire).items() if not k.startswith('_')}
BLUE, GREY = (60, 140, 255), (150, 150, 150)
JPEG_QUALITY = 80      # a route's pictures (live ones are NV12 unless --quality is given)
REF_WIDTH = 640        # px: line widths are set for a picture this wide and scale with it
KEEP_EOF = 100         # end-of-frame times kept per camera (a driver output's frame age)
BIND = '127.0.0.1'     # every server this tool starts listens here only: a remote viewer comes through an SSH tunnel
GRPC_PORT, WEB_PORT = 9876, 9090   # rerun's own defaults
START_TIMEOUT = 20.    # s for a viewer or web server started here to listen
DISCONNECT_TIMEOUT = 10.   # s for the viewer to take what was sent, at the end
POLL_S = 0.02          # live: an idle look at the sockets waits this long before the next (less than a frame at 20 Hz: none skipped)
SERIES = {'timing/modelV2': ['modelV2 execution (ms)', 'modelV2 frame age (ms)', 'frameDropPerc (%)'],   # several series an entity: one log call
          'timing/driverStateV2': ['driverStateV2 execution (ms)', 'driverStateV2 frame age (ms)'],
          'speed/model': ['model velocity', 'lead (prob >= 0.5)'], 'speed/vEgo': ['vEgo (carState)'], 'monitoring/awareness': ['awareness'],
          'monitoring/driver': ['face prob', 'blink prob', 'phone prob'], 'model/meta': ['engagedProb', 'brake disengage', 'gas disengage', 'steer override'],
          'model/desire': [f"desire {DESIRES.get(i, i)}" for i in range(DESIRE_LEN)]}

class View:
  """Logs pictures and messages into a rerun recording. Outputs are projected into each camera's picture (about
  `width` wide, 0: full size) with the calibration in force and the camera's sensor. Messages without a frame id
  (carState) sit on the frame timeline at the newest road frame, driverMonitoringState at its driverStateV2's frame.
  `quality`: JPEG quality of RGB pictures scaled to `width` (0: raw RGB); None: NV12 pictures, the stream decimated
  by the whole factor nearest its width / `width` (live: no scaler, no encoder; the viewer converts them)."""
  def __init__(self, rec: rr.RecordingStream, cameras: list[str], width: int, quality: int | None, t0: int, calib: tuple | None = None):
    self.rec, self.cameras, self.width, self.quality, self.t0 = rec, cameras, width, quality, t0
    self.laid_out, self.named = False, set()
    self.calib = calib or ((0., 0., 0.), CAM_HEIGHT)
    self.sensor: dict[str, str] = {}
    self.full: dict[str, tuple[int, int]] = {}           # camera -> stream size, once a picture came
    self.eof: dict[str, dict[int, int]] = {c: {} for c in CAMERAS}
    self.road_fid, self.driver_fid, self.ds, self.dms = None, None, None, None
    self.counts: Counter = Counter()
    self.cams: dict[tuple, Scaled] = {}

  def at(self, frame_id: int | None, mono_ns: int) -> None:
    if frame_id is None: self.rec.disable_timeline('frame')
    else: self.rec.set_time('frame', sequence=frame_id)
    self.rec.set_time('mono_time', duration=(mono_ns - self.t0) / 1e9)

  def size(self, full: tuple[int, int]) -> tuple[int, int]:
    """The picture's size for a stream of size `full`: `width` wide (never wider than the stream), even."""
    w = full[0] if not self.width or self.width >= full[0] else self.width
    return w, max(2, round(full[1] * w / full[0] / 2) * 2)

  def factor(self, full: tuple[int, int]) -> int:
    """NV12 pictures: the decimation of a stream of size `full`, the whole factor nearest its width / `width`."""
    return max(1, round(full[0] / self.width)) if self.width else 1

  def cam(self, camera: str) -> CameraConfig:
    """The geometry of the camera's picture: its sensor's at the stream's size, scaled as the picture is."""
    key = (camera, self.sensor.get(camera, ''), self.full.get(camera))
    if (c := self.cams.get(key)) is None:
      sensor = sensor_name(key[1], None, key[2])
      full = key[2] or ((base := camera_config(sensor, camera)).width, base.height)
      stream = camera_for(sensor, camera, *full)
      if self.quality is None:
        w, h, o = decimation(full, k := self.factor(full))
        sx = sy = 1 / k
        tx = ty = 0.5 - (o + 0.5) / k   # picture pixel j is the stream's k j + o (pixel centres at + 0.5)
      else:
        (w, h), tx, ty = self.size(full), 0., 0.   # FFmpeg's scaler lines up the pictures' edges
        sx, sy = w / full[0], h / full[1]
      c = self.cams[key] = Scaled(w, h, stream.focal_length * sx, stream, sx, sy, tx, ty)
    return c

  def layout(self) -> None:
    """The views, each camera's bounded by its picture: sent once every camera's size is known (or at the end)."""
    cams = {c: self.cam(c) for c in self.cameras}
    self.rec.send_blueprint(blueprint({c: (k.width, k.height) for c, k in cams.items()}))
    self.laid_out = True

  def picture(self, camera: str, frame_id: int, eof: int, pic: np.ndarray, full: tuple[int, int]) -> None:
    """A camera's frame at its frame id and end of exposure: RGB at size(full), or with quality None packed NV12
    (nv12_decimate by factor(full))."""
    self.full[camera] = full
    if not self.laid_out and all(c in self.full for c in self.cameras): self.layout()
    self.at(frame_id, eof)
    if self.quality is None:
      w, h, _ = decimation(full, self.factor(full))
      self.rec.log(f'{camera}/image', rr.Image(bytes=pic, width=w, height=h, pixel_format=rr.PixelFormat.NV12))
    elif self.quality:
      b = io.BytesIO()
      Image.fromarray(pic).save(b, format='JPEG', quality=self.quality)
      self.rec.log(f'{camera}/image', rr.EncodedImage(contents=b.getvalue(), media_type='image/jpeg'))
    else: self.rec.log(f'{camera}/image', rr.Image(pic))
    self.counts[camera] += 1

  def scalar(self, path: str, v: float | list[float]) -> None:
    """A point of each of the entity's series (SERIES names them; NaN: none this time)."""
    if path not in self.named:
      self.rec.log(path, rr.SeriesLines(names=SERIES[path]), static=True)
      self.named.add(path)
    self.rec.log(path, rr.Scalars(v))

  def event(self, ev) -> None:
    w, t = ev.which(), ev.logMonoTime
    if w == 'liveCalibration': self.calib = calibration(ev.liveCalibration, self.calib)
    elif w in STATE_CAMERA:
      cam, fd = STATE_CAMERA[w], getattr(ev, w)
      self.sensor[cam] = str(fd.sensor)
      (eofs := self.eof[cam])[fd.frameId] = fd.timestampEof
      if len(eofs) > KEEP_EOF: del eofs[next(iter(eofs))]
      if cam == 'road': self.road_fid = fd.frameId
    elif w == 'carState':
      self.at(self.road_fid, t)
      self.scalar('speed/vEgo', ev.carState.vEgo)
    elif w == 'modelV2': self.model(ev.modelV2, t)
    elif w == 'driverStateV2': self.driver(ev.driverStateV2, t)
    elif w == 'driverMonitoringState': self.monitoring(ev.driverMonitoringState, t)
    else: return
    self.counts[w] += 1

  def model(self, md, t: int) -> None:
    rpy, height = self.calib
    for camera, fid in (('road', md.frameId), ('wide', md.frameIdExtra)):
      if camera == 'wide' and camera not in self.full: continue   # no wide picture to draw on
      self.at(fid, t)
      g, px = road(md, rpy, height, cam := self.cam(camera)), cam.width / REF_WIDTH
      self.rec.log(f'{camera}/lanes', rr.LineStrips2D([uv for uv, _ in g.lanes], radii=[px * (0.6 + 2.4 * p) for _, p in g.lanes],
                                                      colors=[(*prob_colour(p), int(90 + 165 * p)) for _, p in g.lanes]))
      self.rec.log(f'{camera}/edges', rr.LineStrips2D(g.edges, radii=1.5 * px, colors=[(*RED, 200)]))
      self.rec.log(f'{camera}/path', rr.LineStrips2D([np.concatenate([g.path, g.path[:1]])] if g.path is not None else [],
                                                     radii=px, colors=[(*BLUE, 220)]))
      if (box := g.lead) is not None and box.box is not None:
        self.rec.log(f'{camera}/lead', rr.Boxes2D(array=box.box.reshape(4), array_format=rr.Box2DFormat.XYXY, radii=1.5 * px,
                                                  colors=[prob_colour(box.prob)], labels=[f"{box.x:.0f} m  {box.prob:.2f}"]))
      else: self.rec.log(f'{camera}/lead', rr.Clear(recursive=False))
    self.at(md.frameId, t)
    age = (t - md.timestampEof) / 1e6 if md.timestampEof else np.nan
    self.scalar('timing/modelV2', [md.modelExecutionTime * 1e3, age, md.frameDropPerc])
    lead = md.leadsV3[0] if len(md.leadsV3) and len(md.leadsV3[0].x) else None
    self.scalar('speed/model', [md.velocity.x[0] if len(md.velocity.x) else np.nan,
                                lead.v[0] if lead is not None and lead.prob >= 0.5 and len(lead.v) else np.nan])
    meta, ds = md.meta, list(md.meta.desireState)
    if len(ds) == DESIRE_LEN: self.scalar('model/desire', ds)
    dp = meta.disengagePredictions
    first = lambda xs: f"{xs[0]:.2f}" if len(xs) else '-'
    probs = [xs[0] if len(xs := getattr(dp, n)) else np.nan for n in ('brakeDisengageProbs', 'gasDisengageProbs', 'steerOverrideProbs')]
    self.scalar('model/meta', [meta.engagedProb, *probs])
    desire = max(range(len(ds)), key=ds.__getitem__) if ds else None
    rows = [('frame', f"{md.frameId} (wide {md.frameIdExtra})"), ('confidence', str(md.confidence)),
            ('lane lines', ' '.join(f"{p:.2f}" for p in md.laneLineProbs)),
            ('lead', f"{lead.x[0]:.1f} m {lead.v[0] if len(lead.v) else 0:.1f} m/s p {lead.prob:.2f}" if lead else '-'),
            ('desire', f"{DESIRES.get(desire, desire)} {ds[desire]:.2f}" if desire is not None else '-'),
            ('engaged', f"{meta.engagedProb:.2f}"), ('lane change', f"{meta.laneChangeState} {meta.laneChangeDirection}"),
            ('hard brake', 'PREDICTED' if meta.hardBrakePredicted else 'no'),
            ('disengage', f"brake {first(dp.brakeDisengageProbs)} gas {first(dp.gasDisengageProbs)} steer {first(dp.steerOverrideProbs)}"),
            ('curvature', f"{md.action.desiredCurvature:+.4f} 1/m"), ('acceleration', f"{md.action.desiredAcceleration:+.2f} m/s²"),
            ('execution', f"{md.modelExecutionTime * 1e3:.1f} ms"), ('drops', f"{md.frameDropPerc:.1f} %")]
    self.rec.log('text/model', table(rows))

  def driver(self, ds, t: int) -> None:
    self.driver_fid, self.ds = ds.frameId, ds
    self.at(ds.frameId, t)
    eof = self.eof['driver'].get(ds.frameId)
    self.scalar('timing/driverStateV2', [ds.modelExecutionTime * 1e3, np.nan if eof is None else (t - eof) / 1e6])
    _, d = driver_data(ds, self.dms)
    px = (cam := self.cam('driver')).width / REF_WIDTH
    if (f := face(d, cam)) is not None:
      self.rec.log('driver/face', rr.Boxes2D(array=f.box.reshape(4), array_format=rr.Box2DFormat.XYXY, radii=1.5 * px,
                                             colors=[prob_colour(d.faceProb) if d.faceProb > 0.5 else GREY], labels=[f"face {d.faceProb:.2f}"]))
      self.rec.log('driver/eyes', rr.Points2D([(x, y) for x, y, _, _ in f.eyes], radii=[r for _, _, r, _ in f.eyes],
                                              colors=[GREEN if is_open else RED for *_, is_open in f.eyes]))
    else:
      self.rec.log('driver/face', rr.Clear(recursive=False))
      self.rec.log('driver/eyes', rr.Clear(recursive=False))
    self.scalar('monitoring/driver', [d.faceProb, (d.leftBlinkProb + d.rightBlinkProb) / 2, d.phoneProb])
    if self.dms is None: self.states()   # no dmonitoringd policy (yet): the model's states alone

  def monitoring(self, dms, t: int) -> None:
    self.dms = dms
    self.at(self.driver_fid, t)
    self.scalar('monitoring/awareness', awareness(dms))
    self.states()

  def states(self) -> None:
    """The driver's states in words: the newest driverStateV2 with the driverMonitoringState that followed it."""
    if (ds := self.ds) is None: return
    rhd, d = driver_data(ds, self.dms)
    eye = lambda p, b: f"{'open' if p * (1 - b) > 0.5 else 'CLOSED'} {p:.2f} blink {b:.2f}"
    rows = [('frame', f"{ds.frameId} ({'RHD' if rhd else 'LHD'})"),
            ('face', f"{d.faceProb:.2f} " + (f"({d.facePosition[0]:+.2f}, {d.facePosition[1]:+.2f})" if len(d.facePosition) == 2 else '')),
            ('left eye', eye(d.leftEyeProb, d.leftBlinkProb)), ('right eye', eye(d.rightEyeProb, d.rightBlinkProb)),
            ('phone', f"{'YES' if d.phoneProb > 0.5 else 'no'} ({d.phoneProb:.2f})"), ('sunglasses', f"{d.sunglassesProb:.2f}")]
    if (m := self.dms) is not None:
      rows += [('awareness', f"{awareness(m):.2f} ({m.activePolicy})"), ('alert', str(m.alertLevel)),
               ('distracted', 'YES' if m.visionPolicyState.isDistracted else 'no'), ('face detected', 'yes' if m.visionPolicyState.faceDetected else 'no')]
    rows.append(('execution', f"{ds.modelExecutionTime * 1e3:.1f} ms"))
    self.rec.log('text/driver', table(rows))

def table(rows: list[tuple[str, str]]) -> rr.TextDocument:
  return rr.TextDocument('| | |\n|---|---|\n' + '\n'.join(f"| {k} | {v} |" for k, v in rows), media_type=rr.MediaType.MARKDOWN)

def blueprint(sizes: dict[str, tuple[int, int]]) -> rrb.Blueprint:
  """The cameras (the first large, each view bounded by its picture), the values in words, the time series."""
  pics = [rrb.Spatial2DView(origin=c, name=f"{c} camera", visual_bounds=rrb.VisualBounds2D(x_range=[0, w], y_range=[0, h]))
          for c, (w, h) in sizes.items()]
  texts = rrb.Vertical(rrb.TextDocumentView(origin='text/model', name='model'), rrb.TextDocumentView(origin='text/driver', name='driver'))
  series = rrb.Vertical(rrb.TimeSeriesView(origin='timing', name='timing (ms, %)'), rrb.TimeSeriesView(origin='speed', name='speeds (m/s)'),
                        rrb.TimeSeriesView(origin='monitoring', name='driver monitoring'), rrb.TimeSeriesView(origin='model', name='desire and meta'))
  return rrb.Blueprint(rrb.Horizontal(rrb.Vertical(pics[0], rrb.Horizontal(*pics[1:]), row_shares=[3, 2]) if len(pics) > 1 else pics[0],
                                      texts, series, column_shares=[5, 2, 3]), collapse_panels=True)

# ---- where the recording goes: a file, rerun's web viewer served here, or its native viewer

def rerun_binary() -> str:
  import rerun_cli
  if not (exe := Path(rerun_cli.__file__).parent / 'rerun').is_file():
    raise SystemExit(f"{PROG}: expected rerun's viewer at {exe} (part of rerun-sdk), found nothing: reinstall 'tinymodeld[view]'")
  return str(exe)

# a connection to 127.0.0.1 reaches a listener on these addresses, as /proc/net/tcp and tcp6 write them: 127.0.0.1,
# 0.0.0.0, and IPv6's any address, plain and IPv4-mapped, and ::ffff:127.0.0.1
REACHED = {'0100007F', '00000000', '0' * 32, '0' * 16 + 'FFFF0000' + '0' * 8, '0' * 16 + 'FFFF0000' + '0100007F'}

def listeners(port: int) -> list[tuple[int, int]]:
  """(uid, socket inode) of every TCP socket listening where a connection to 127.0.0.1:port arrives, whoever's."""
  out = []
  for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    try: rows = Path(table).read_text().splitlines()[1:]
    except FileNotFoundError: continue   # no IPv6
    for w in map(str.split, rows):
      addr, _, hexport = w[1].partition(':')
      if w[3] == '0A' and int(hexport, 16) == port and addr in REACHED: out.append((int(w[7]), int(w[9])))
  return out

def sockets_of(pid: int) -> set[int]:
  """The inodes of the sockets process pid holds open."""
  out = set()
  for fd in os.listdir(f"/proc/{pid}/fd"):
    try: link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except FileNotFoundError: continue   # closed meanwhile
    if link.startswith('socket:['): out.add(int(link[8:-1]))
  return out

def not_ours(port: int, uid: int) -> SystemExit:
  from service.owned import account
  return SystemExit(f"{PROG}: {BIND}:{port} is taken by a listener of {account(uid)} that {PROG} did not start: nothing is sent to it (the "
                    f"stream carries the cabin camera). --connect {port} sends to it if it is your rerun viewer; --port 0 (and --web-port 0) "
                    f"start one on a free port")

def free_port() -> int:
  with socket.socket() as s:
    s.bind((BIND, 0))
    return s.getsockname()[1]

def start_rerun(args: list[str], ports: list[int], what: str, detach: bool) -> subprocess.Popen:
  """rerun's CLI with args, once it listens on every port, which must be free: the listeners are checked to be its own
  sockets (another account's, bound between the check and rerun's start, would get the stream). Its output goes to a
  file, shown if it fails to start."""
  for port in ports:
    if held := listeners(port): raise not_ours(port, held[0][0])
  log = tempfile.TemporaryFile()
  p = subprocess.Popen([rerun_binary(), *args], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=detach)
  deadline = time.monotonic() + START_TIMEOUT
  while not all(held := [listeners(port) for port in ports]):
    if (rc := p.poll()) is not None or time.monotonic() > deadline:
      if rc is None: p.kill()
      log.seek(0)
      raise SystemExit(f"{PROG}: {what} did not start: expected it listening on {BIND}:{', '.join(map(str, ports))} within {START_TIMEOUT:g} s, "
                       f"it {f'exited with {rc}' if rc is not None else 'did not (killed)'}; its output: {log.read().decode(errors='replace')[-2000:]}")
    time.sleep(0.05)
  mine = sockets_of(p.pid)
  for port, socks in zip(ports, held):
    if other := [uid for uid, inode in socks if inode not in mine]:
      p.kill()
      raise not_ours(port, other[0])
  return p

def grpc_url(port: int) -> str: return f"rerun+http://{BIND}:{port}/proxy"

def connect_url(where: str) -> str:
  """--connect's viewer: a port of 127.0.0.1, or a rerun URL."""
  if where.isdigit(): return grpc_url(int(where))
  if not where.startswith(('rerun://', 'rerun+http://', 'rerun+https://')):
    raise ValueError(f"--connect: expected a port or a URL rerun+http://HOST:PORT/proxy, got {where!r}")
  return where

def web_url(port: int, web_port: int) -> str:
  """The web viewer's address, showing what the gRPC server on `port` holds."""
  return f"http://{BIND}:{web_port}/?url={quote(grpc_url(port), safe='')}"

def serve_web(port: int, web_port: int, memory_limit: str) -> tuple[subprocess.Popen, int, int]:
  """rerun's gRPC server and web viewer, both on 127.0.0.1 (rerun's own serve functions bind every interface)."""
  port, web_port = port or free_port(), web_port or free_port()
  return start_rerun(['--serve-web', '--bind', BIND, '--port', str(port), '--web-viewer-port', str(web_port),
                      '--server-memory-limit', memory_limit], [port, web_port], "rerun's web viewer", detach=False), port, web_port

def native_viewer(port: int) -> None:
  """A new rerun native viewer listening on `port` of 127.0.0.1, which outlives this tool."""
  if not (os.environ.get('DISPLAY') or os.environ.get('WAYLAND_DISPLAY')):
    raise SystemExit(f"{PROG}: no display (DISPLAY and WAYLAND_DISPLAY are unset) for rerun's native viewer: give --web to "
                     f"view in a browser (README.md: from another machine), or --save FILE.rrd")
  start_rerun(['--bind', BIND, '--port', str(port), '--expect-data-soon'], [port], "rerun's viewer", detach=True)

# ---- what is logged: a route, or a live stack

def route_logs(route: str) -> list[Path]:
  """The log files of a route, a segment, or a modeld-batch output (OUT holding one route: OUT/<route>)."""
  from oproute import log_files
  try: return log_files(route, 'a')
  except FileNotFoundError:
    if not (p := Path(route)).is_dir(): raise
    inner = sorted(d for d in p.iterdir() if d.is_dir() and any(s.is_dir() and s.name.startswith(f"{d.name}--") for s in d.iterdir()))
    if len(inner) == 1: return log_files(inner[0], 'a')
    if inner: raise FileNotFoundError(f"{route}: holds {len(inner)} routes ({', '.join(d.name for d in inner)}): name one, as {inner[0]}") from None
    raise

def scan_route(files: list[Path]) -> tuple[int, tuple | None, dict]:
  """(first log time, first calibration, {camera: its CameraVideo}) of a route."""
  from oproute import LogReader
  from oproute.video import CameraVideo, EncodeIndex
  index, t0, calib = EncodeIndex(), None, None
  for ev in LogReader(files, sort_by_time=True):
    index.add(ev)
    t0 = ev.logMonoTime if t0 is None else min(t0, ev.logMonoTime)
    if calib is None and ev.which() == 'liveCalibration' and len(ev.liveCalibration.rpyCalib) == 3: calib = calibration(ev.liveCalibration, None)
  if t0 is None: raise ValueError(f"{files[0].parent}: no events in {', '.join(f.name for f in files)}")
  videos = {c: v for c in CAMERAS if (v := CameraVideo.of(c, files, index, Counter())) is not None and v.files()}
  return t0, calib, videos

def log_route(view: View, files: list[Path], videos: dict, stop) -> None:
  """Every event of the route in log order; each camera's recorded frames at their EncodeIdx events. Frames before the
  route's first calibration are drawn with it (a recording often starts between two)."""
  from oproute import LogReader
  from oproute.video import ENCODE_IDX_OF, VideoError
  for cam, v in videos.items():   # each stream's size before its first picture: an answer may be logged before its frame's EncodeIdx
    try: view.full[cam] = v.size()
    except VideoError: pass
  for ev in LogReader(files, sort_by_time=True):
    if stop: break
    if (cam := ENCODE_IDX_OF.get(ev.which())) is None: view.event(ev)
    elif cam in videos and (e := getattr(ev, ev.which())).type == 'fullHEVC' and (f := videos[cam].frame(e.frameId, e.timestampSof)) is not None:
      w, h = view.size((f.width, f.height))
      view.picture(cam, e.frameId, e.timestampEof or ev.logMonoTime, f.reformat(width=w, height=h, format='rgb24', interpolation='FAST_BILINEAR').to_ndarray(),
                   (f.width, f.height))
  for v in videos.values(): v.close()

def served(name: str) -> list[str]:
  from msgq.visionipc import VisionIpcClient
  return [CAMERA_OF_STREAM[s] for s in sorted(VisionIpcClient.available_streams(name, block=False)) if s in CAMERA_OF_STREAM]

def log_live(view: View, name: str, until: float | None, stop) -> None:
  """A running stack until `until` (monotonic) or stop: each camera's newest frame (conflating VisionIPC clients: the
  camera never waits for this tool) and every message of SERVICES."""
  from cereal.messaging import MalformedMessageError, log_from_bytes, sub_sock
  from msgq.visionipc import VisionIpcClient
  socks = [sub_sock(s) for s in SERVICES]
  clients: dict[str, VisionIpcClient] = {}
  connected, next_look = set(), 0.
  try:
    while not stop and (until is None or time.monotonic() < until):
      if time.monotonic() >= next_look:   # new streams, a camera server that restarted
        for cam in served(name):
          if cam not in clients: clients[cam] = VisionIpcClient(name, CAMERAS[cam].stream, conflate=True)
        for c in clients.values():
          if not c.is_connected() and c.connect(blocking=False): c.release_old_mappings()
        if (now := {cam for cam, c in clients.items() if c.is_connected()}) != connected:
          connected = now
          if connected and not view.laid_out: view.cameras = [c for c in CAMERAS if c in connected]   # the layout shows these
          print(f"{PROG}: {f'connected to {name!r}: ' + ', '.join(sorted(connected)) if connected else f'no camera server {name!r}'} "
                f"(OPENPILOT_PREFIX={os.environ.get('OPENPILOT_PREFIX', '')!r})", file=sys.stderr, flush=True)
        next_look = time.monotonic() + 1.
      idle = True
      for cam, c in clients.items():
        if c.is_connected() and (buf := c.recv(timeout_ms=0)) is not None:
          full, idle = (buf.width, buf.height), False
          pic = nv12_decimate(buf.array, buf.layout, view.factor(full)) if view.quality is None else nv12_to_rgb(buf.array, buf.layout, view.size(full))
          if not buf.overwritten(): view.picture(cam, buf.frame_id, buf.timestamp_eof, pic, full)   # a torn frame is not shown
          del buf
      for sock in socks:
        while (dat := sock.receive(non_blocking=True)) is not None:
          idle = False
          try: view.event(log_from_bytes(dat))
          except MalformedMessageError: view.counts['malformed'] += 1
      if idle: time.sleep(POLL_S)   # a Poller's wake-ups cost more CPU than looking at each socket every few ms
  finally:
    for c in clients.values(): c.close()
    for s in socks: s.close()

@needs_extra(PROG, 'view')
def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__, epilog="""examples:
  modeld-view --live                               the stack of this OPENPILOT_PREFIX in rerun's viewer (needs a display)
  modeld-view --live --web                         in a browser: prints http://127.0.0.1:9090/?url=...
  modeld-view routes/2026-11-30--04-00-00          a route (or a segment, or a modeld-batch output) on its own timeline
  modeld-view ROUTE --save route.rrd               a recording to open later: rerun route.rrd
  modeld-view --live --connect 9876                to the rerun viewer already listening on 127.0.0.1:9876 (yours)

A stack on another machine: run modeld-view --live --web there and tunnel both ports (never serve on 0.0.0.0):
  ssh -L 9090:127.0.0.1:9090 -L 9876:127.0.0.1:9876 HOST   then open the printed URL here""")
  p.add_argument('route', nargs='?', help='route folder or name, segment folder, rlog/qlog file, or modeld-batch output; omit with --live')
  p.add_argument('--live', action='store_true', help='a running stack (VisionIPC frames and messages) instead of a route')
  p.add_argument('--web', action='store_true', help="serve rerun's web viewer on 127.0.0.1 and print its URL")
  p.add_argument('--save', metavar='FILE.rrd', help='write the recording to FILE.rrd (alone: no viewer)')
  p.add_argument('--port', type=int, help="gRPC port of the viewer or server it starts on 127.0.0.1 (default: with --web 9876, rerun's; "
                 "the native viewer any free port, a new viewer each time; 0: any free)")
  p.add_argument('--web-port', type=int, default=WEB_PORT, help="--web: the web viewer's HTTP port on 127.0.0.1 (default: 9090; 0: any free)")
  p.add_argument('--connect', metavar='PORT|URL', help="send to the rerun viewer already listening there (a port of 127.0.0.1, or "
                 "rerun+http://HOST:PORT/proxy) instead of starting one: nothing checks whose it is. Without it, the stream goes only "
                 "to a viewer or server this tool started")
  p.add_argument('--width', type=int, default=REF_WIDTH, metavar='W', help=f'picture width in pixels (default: {REF_WIDTH}; 0: full size); '
                 'live NV12 pictures: the stream decimated by the whole factor nearest its width / W (1928 -> 642)')
  p.add_argument('--quality', type=int, metavar='Q', help='JPEG quality of the pictures, 1-100 (default: 80 from a route; live: NV12 '
                 'pictures, which the viewer converts, unless Q is given); 0 sends raw RGB')
  p.add_argument('--seconds', type=float, metavar='N', help='live: stop after N seconds (default: at Ctrl-C)')
  p.add_argument('--memory-limit', default='1GiB', metavar='M', help="--web: what the server keeps for late viewers, oldest dropped (default: 1GiB)")
  p.add_argument('--name', default='camerad', help='live: VisionIPC server name (default: camerad)')
  p.add_argument('--prefix', metavar='P', help="live: OPENPILOT_PREFIX of the stack (default: the environment's)")
  args = p.parse_args(argv)
  if args.live == (args.route is not None): p.error('give a ROUTE or --live (not both)')
  if args.width < 0 or 0 < args.width < 16: p.error(f"--width: expected 0 or >= 16, got {args.width}")
  if args.quality is not None and not 0 <= args.quality <= 100: p.error(f"--quality: expected 0 (raw) to 100, got {args.quality}")
  if args.seconds is not None and args.seconds <= 0: p.error(f"--seconds: expected > 0, got {args.seconds}")
  for opt in ('port', 'web_port'):
    if not 0 <= (getattr(args, opt) or 0) < 65536: p.error(f"--{opt.replace('_', '-')}: expected a port 0-65535, got {getattr(args, opt)}")
  if args.web and args.connect: p.error('--web serves a viewer of its own: give --web or --connect (not both)')
  try: connect = connect_url(args.connect) if args.connect else None
  except ValueError as e: p.error(str(e))
  if args.prefix is not None: os.environ['OPENPILOT_PREFIX'] = args.prefix

  if args.live:
    t0, calib, what = time.monotonic_ns(), None, f"the stack of OPENPILOT_PREFIX={os.environ.get('OPENPILOT_PREFIX', '')!r}"
    cameras = list(CAMERAS)   # until the camera server says which it serves
  else:
    try:
      files = route_logs(args.route)
      t0, calib, videos = scan_route(files)
    except (OSError, ValueError) as e: p.error(str(e))
    cameras, what = ['road', *(c for c in videos if c != 'road')], args.route

  rec = rr.RecordingStream(PROG)
  rr.set_log_time_enabled(False, rec)   # rerun's own timelines (this process's clock, its call count) would only confuse
  rr.set_log_tick_enabled(False, rec)
  sinks, server, shown = [], None, []
  if args.save:   # the cabin camera: a file of this account's alone (0600, MSGQ_GROUP's too with it), as the stack's own
    from service.owned import open_private
    try: os.close(open_private(args.save, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 'recording'))
    except OSError as e: p.error(f"--save: {e}")
    sinks.append(rr.FileSink(args.save))
    shown.append(args.save)
  if args.web:
    server, port, web_port = serve_web(GRPC_PORT if args.port is None else args.port, args.web_port, args.memory_limit)
    sinks.append(rr.GrpcSink(grpc_url(port)))
    shown.append(url := web_url(port, web_port))
    print(f"{PROG}: rerun's web viewer: {url}", flush=True)
  elif connect:
    sinks.append(rr.GrpcSink(connect))
    shown.append(connect)
  elif not args.save:
    native_viewer(port := args.port or free_port())
    sinks.append(rr.GrpcSink(grpc_url(port)))
    shown.append(f"rerun's viewer on {BIND}:{port}")
  from service import StopFlag
  stop = StopFlag()   # from here on Ctrl-C and SIGTERM end the logging, and what was logged is flushed
  try:
    rec.set_sinks(*sinks)
    rec.send_recording_name(f"live {os.environ.get('OPENPILOT_PREFIX', '')}".strip() if args.live else Path(args.route).name)
    view = View(rec, cameras, args.width, args.quality if args.quality is not None or args.live else JPEG_QUALITY, t0, calib)
    if args.live: log_live(view, args.name, None if args.seconds is None else time.monotonic() + args.seconds, stop)
    else: log_route(view, files, videos, stop)
    if not view.laid_out: view.layout()
    rec.flush()
    c = view.counts
    print(f"{PROG}: {what}: {sum(c[k] for k in CAMERAS)} pictures ({', '.join(f'{k} {c[k]}' for k in CAMERAS if c[k])}), "
          f"{c['modelV2']} modelV2, {c['driverStateV2']} driverStateV2 -> {', '.join(shown)}", flush=True)
    if server is not None and not stop:
      print(f"{PROG}: serving until Ctrl-C", flush=True)
      while not stop and server.poll() is None: time.sleep(0.2)
  finally:
    # the file's footer written, the viewer's connection closed: rerun waits for --connect's address to take what was
    # sent, forever where no rerun answers there
    (closing := threading.Thread(target=rec.disconnect, daemon=True)).start()
    closing.join(DISCONNECT_TIMEOUT)
    if server is not None:
      server.terminate()
      try: server.wait(5)
      except subprocess.TimeoutExpired: server.kill()
    if closing.is_alive():
      print(f"{PROG}: {connect} did not take the recording within {DISCONNECT_TIMEOUT:g} s: is a rerun viewer listening there?", file=sys.stderr, flush=True)
      os._exit(1)   # Python's exit would wait for rerun's connection again
  return 0

if __name__ == '__main__':
  sys.exit(main())
