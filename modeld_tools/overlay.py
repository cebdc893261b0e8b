"""modeld-overlay: draw model outputs onto camera frames, from a recorded route or a live stack, as PNGs or an MP4.
Road and wide cameras: lane lines and edges (by probability), the planned path, the lead's box at its distance and a
panel of timings, drops and confidence; the driver camera: the face box, eyes, phone and awareness. Every point is
projected by projection.py with the calibration in force, the geometry the daemons and the synthetic scenes use."""
from __future__ import annotations
import argparse, os, sys, time
from dataclasses import dataclass
from collections.abc import Iterator
import numpy as np
from service.extras import needs_extra
from service.owned import private_umask
with needs_extra('modeld-overlay', 'tools'):
  from PIL import Image, ImageDraw, ImageFont
from cereal.services import CAMERAS
from dmonitoringd.fill_msgs import awareness
from transformations.camera import DEFAULT_SENSOR, camera_for, sensor_name, CAM_HEIGHT, CameraConfig, camera_config
from modeld_tools.projection import GREEN, RED, YELLOW, calibration, driver_data, face, nv12_to_rgb, prob_colour, road
from msgq.visionipc.layout import NV12Layout

KEEP_FRAMES = 20           # live: camera frames kept (copied) while their outputs are awaited: 1 s at 20 Hz
WHITE, BLUE, GREY = (255, 255, 255), (60, 140, 255), (150, 150, 150)
CONFIDENCE_COLOURS = {'green': GREEN, 'yellow': YELLOW, 'red': RED}

@dataclass
class FrameMsgs:
  """What is drawn on one frame: the messages about it and the calibration in force."""
  frame_id: int
  model: object = None          # modelV2 (road, wide)
  driver: object = None         # driverStateV2
  dm_state: object = None       # driverMonitoringState
  rpy: tuple = (0., 0., 0.)
  height: float = CAM_HEIGHT
  sensor: str = DEFAULT_SENSOR
  cam: CameraConfig | None = None       # the scene's camera, when the frames come from a scene

class Painter:
  def __init__(self, img: Image.Image):
    self.img = img
    self.scale = max(img.width / 1164, 0.35)   # line widths and fonts grow with the frame
    self.layer = Image.new('RGBA', img.size, (0, 0, 0, 0))
    self.draw = ImageDraw.Draw(self.layer)
    self.font = ImageFont.load_default(size=max(10, int(18 * self.scale)))
    self.panel: list[tuple[str, tuple]] = []

  def px(self, w: float) -> int: return max(1, int(round(w * self.scale)))

  def line(self, uv: np.ndarray, colour, width: float, alpha: int = 255) -> None:
    if len(uv) >= 2: self.draw.line([tuple(p) for p in uv], fill=(*colour, alpha), width=self.px(width), joint='curve')

  def text(self, xy, s: str, colour=WHITE) -> None:
    self.draw.text(xy, s, fill=(*colour, 255), font=self.font, stroke_width=max(1, self.px(1.5)), stroke_fill=(0, 0, 0, 255))

  def finish(self) -> Image.Image:
    if self.panel:   # the panel: one line per entry, top left, on a dark band
      lh = self.font.size + self.px(4)
      w = max(self.draw.textlength(s, font=self.font) for s, _ in self.panel) + self.px(16)
      self.draw.rectangle((0, 0, w, lh * len(self.panel) + self.px(10)), fill=(0, 0, 0, 140))
      for i, (s, c) in enumerate(self.panel): self.text((self.px(8), self.px(5) + i * lh), s, c)
    return Image.alpha_composite(self.img.convert('RGBA'), self.layer).convert('RGB')

def draw_road(p: Painter, m: FrameMsgs, cam: CameraConfig) -> None:
  md, g = m.model, road(m.model, m.rpy, m.height, cam)
  for uv, prob in g.lanes: p.line(uv, prob_colour(prob), 2 + 6 * prob, alpha=int(90 + 165 * prob))
  for uv in g.edges: p.line(uv, RED, 4, alpha=200)
  if g.path is not None: p.draw.polygon([tuple(q) for q in g.path], fill=(*BLUE, 70), outline=(*BLUE, 200))
  conf = str(md.confidence)
  p.panel += [(f"frame {md.frameId}  exec {md.modelExecutionTime * 1e3:.1f} ms  drops {md.frameDropPerc:.1f} %", WHITE),
              (f"confidence {conf}", CONFIDENCE_COLOURS.get(conf, WHITE)),
              ("lanes " + " ".join(f"{q:.2f}" for q in md.laneLineProbs), WHITE)]
  if (lead := g.lead) is not None:
    p.panel.append((f"lead {lead.x:.1f} m  v {lead.v:.1f} m/s  prob {lead.prob:.2f}", prob_colour(lead.prob)))
    if lead.box is not None:
      (x0, y0), (x1, y1) = lead.box
      p.draw.rectangle((x0, y0, x1, y1), outline=(*prob_colour(lead.prob), 255), width=p.px(4))
      p.text((x0, y1 + p.px(4)), f"{lead.x:.0f} m  {lead.prob:.2f}", prob_colour(lead.prob))

def draw_driver(p: Painter, m: FrameMsgs, cam: CameraConfig) -> None:
  ds, dms = m.driver, m.dm_state
  rhd, d = driver_data(ds, dms)
  p.panel.append((f"frame {ds.frameId}  exec {ds.modelExecutionTime * 1e3:.1f} ms  {'RHD' if rhd else 'LHD'}  "
                  f"wheel on right {ds.wheelOnRightProb:.2f}", WHITE))
  p.panel.append((f"face {d.faceProb:.2f}", prob_colour(d.faceProb)))
  if (f := face(d, cam)) is not None:
    (x0, y0), (x1, y1) = f.box
    p.draw.rectangle((x0, y0, x1, y1), outline=(*(GREEN if d.faceProb > 0.5 else GREY), 255), width=p.px(4))
    for ex, ey, r, is_open in f.eyes:   # a filled dot when open, a bar when closed (blinking)
      if is_open: p.draw.ellipse((ex - r, ey - r, ex + r, ey + r), fill=(*GREEN, 230))
      else: p.draw.line((ex - 1.5 * r, ey, ex + 1.5 * r, ey), fill=(*RED, 255), width=p.px(4))
    p.text((x0, y1 + p.px(4)), f"face {d.faceProb:.2f}", GREEN if d.faceProb > 0.5 else GREY)
  p.panel.append((f"eyes L {d.leftEyeProb:.2f} (blink {d.leftBlinkProb:.2f})  R {d.rightEyeProb:.2f} (blink {d.rightBlinkProb:.2f})", WHITE))
  p.panel.append((f"phone {d.phoneProb:.2f}  sunglasses {d.sunglassesProb:.2f}", RED if d.phoneProb > 0.5 else WHITE))
  if dms is not None:
    a = awareness(dms)
    p.panel.append((f"awareness {a:.2f}{'  DISTRACTED' if dms.visionPolicyState.isDistracted else ''}", prob_colour(a)))
    w, h = p.img.size
    bar = (p.px(10), h - p.px(26), p.px(10) + (w // 3), h - p.px(10))
    p.draw.rectangle(bar, outline=(*WHITE, 200), width=p.px(2))
    p.draw.rectangle((bar[0], bar[1], bar[0] + a * (bar[2] - bar[0]), bar[3]), fill=(*prob_colour(a), 200))

def render(rgb: np.ndarray, m: FrameMsgs, camera: str) -> Image.Image:
  """The frame with m's outputs drawn on it."""
  img = Image.fromarray(rgb)
  cam = camera_for(sensor_name(m.sensor, None, (img.width, img.height)), camera, img.width, img.height, m.cam)   # the daemons' geometry
  p = Painter(img)
  if camera == 'driver':
    if m.driver is not None: draw_driver(p, m, cam)
  elif m.model is not None: draw_road(p, m, cam)
  return p.finish()

# ---- inputs: (frame messages, RGB frame) pairs

def route_msgs(route: str, camera: str) -> tuple[dict[int, FrameMsgs], object]:
  """Per frame id, the route's outputs for that camera's frames and the calibration in force when they came (frames
  before the route's first liveCalibration get that first one: a recording often starts between two); and the
  camera's video in the route (oproute.video.CameraVideo), or None."""
  from collections import Counter
  from oproute import LogReader, log_files
  from oproute.video import CameraVideo, EncodeIndex
  files, index = log_files(route, 'a'), EncodeIndex()
  state_svc, out, uncalibrated = CAMERAS[camera].state, {}, []
  calib, sensor, last_driver = None, None, None
  def frame(fid: int) -> FrameMsgs:
    if fid not in out:
      out[fid] = FrameMsgs(fid, sensor=sensor or DEFAULT_SENSOR)
      if calib is None: uncalibrated.append(out[fid])
      else: out[fid].rpy, out[fid].height = calib
    return out[fid]
  for ev in LogReader(files, sort_by_time=True):
    w = ev.which()
    if index.add(ev): continue
    if w == 'liveCalibration':
      calib = calibration(ev.liveCalibration, calib)
      for m in uncalibrated: m.rpy, m.height = calib
      uncalibrated.clear()
    elif w == state_svc:
      if sensor is None:   # frames before the first camera state: the camera as it first shows
        for m in out.values(): m.sensor = str(getattr(ev, w).sensor)
      sensor = str(getattr(ev, w).sensor)
    elif w == 'modelV2' and camera != 'driver': frame(ev.modelV2.frameId if camera == 'road' else ev.modelV2.frameIdExtra).model = ev.modelV2
    elif w == 'driverStateV2' and camera == 'driver':
      last_driver = ev.driverStateV2.frameId
      frame(last_driver).driver = ev.driverStateV2
    elif w == 'driverMonitoringState' and camera == 'driver' and last_driver is not None:   # it follows its frame's driverStateV2
      frame(last_driver).dm_state = ev.driverMonitoringState
  video = CameraVideo.of(camera, files, index, Counter())
  return {fid: m for fid, m in sorted(out.items()) if (m.driver if camera == 'driver' else m.model) is not None}, video if video and video.files() else None

def route_frames(route: str, camera: str, scene: str | None, frames: int | None, background: str, start: int = 0) -> tuple[int, Iterator]:
  msgs, video = route_msgs(route, camera)
  msgs = {fid: m for fid, m in msgs.items() if fid >= start}
  if not msgs: raise SystemExit(f"modeld-overlay: {route}: no {CAMERAS[camera].answer} "
                                f"messages for the {camera} camera in the route{f' from frame {start} on' if start else ''}")
  ids = list(msgs)[:frames]
  if background == 'auto': background = 'video' if video else 'scene' if scene else 'blank'
  if background == 'video' and not video: raise SystemExit(f"modeld-overlay: {route}: no recorded {camera} video")
  if background == 'scene' and not scene: raise SystemExit("modeld-overlay: --background scene needs --scene")
  sc = None
  if scene:
    from camerad.scene import load_scene
    sc = load_scene(scene)
    for m in msgs.values(): m.cam = sc.cameras[camera]
  def gen():
    if background == 'video':   # the frames that are in the video and have outputs, up to `frames` of them
      n = 0
      try:
        for fid in list(msgs):
          if (f := video.frame(fid)) is not None:
            yield msgs.pop(fid), f.to_ndarray(format='rgb24')
            if (n := n + 1) == frames: return
      finally: video.close()
    elif background == 'scene':
      from camerad.render import SceneRenderer
      cam = sc.cameras[camera]
      layout = NV12Layout.packed(cam.width, cam.height)
      r = SceneRenderer(sc, camera, layout)
      for fid in ids: yield msgs[fid], nv12_to_rgb(r.render(fid % sc.n_frames), layout)
    else:
      for fid in ids:
        m = msgs[fid]
        cam = m.cam or camera_config(sensor_name(m.sensor, None), camera)
        w, h = cam.width, cam.height
        yield m, np.full((h, w, 3), 40, np.uint8)
  return len(ids), gen()

def live_frames(name: str, camera: str, frames: int | None, timeout: float) -> tuple[int | None, Iterator]:
  """Frames of a running stack: each camera frame is kept (copied) until the outputs for its frame id arrive."""
  from cereal.messaging import Poller, log_from_bytes, MalformedMessageError, sub_sock
  from msgq.visionipc import VisionIpcClient
  stream, state_svc = CAMERAS[camera].stream, CAMERAS[camera].state
  deadline = time.monotonic() + timeout
  while stream not in VisionIpcClient.available_streams(name, block=False):
    if time.monotonic() > deadline:
      raise SystemExit(f"modeld-overlay: no camera server {name!r} serving the {camera} camera after {timeout:g} s "
                       f"(is camerad running, with the same OPENPILOT_PREFIX?)")
    time.sleep(0.1)
  services = list(CAMERAS[camera].outputs) if camera == 'driver' else [CAMERAS[camera].answer]   # what is drawn
  services += ['liveCalibration', state_svc]
  poller = Poller()
  socks = [sub_sock(s, poller=poller) for s in services]   # in this order: a driverMonitoringState after its driverStateV2
  client = VisionIpcClient(name, stream, conflate=False)
  client.connect(blocking=True)
  print(f"modeld-overlay: connected to {name!r}, {camera} camera", file=sys.stderr, flush=True)   # from here on no frame is missed
  def gen():
    kept: dict[int, tuple] = {}
    ms: dict[int, FrameMsgs] = {}
    rpy, height, sensor, done, idle, last_driver = (0., 0., 0.), CAM_HEIGHT, DEFAULT_SENSOR, 0, time.monotonic(), None
    try:
      while frames is None or done < frames:
        if (buf := client.recv(timeout_ms=20)) is not None:
          nv12 = np.array(buf.array)   # a copy: the buffer is reused for later frames
          if not buf.overwritten(): kept[buf.frame_id] = (nv12, buf.layout)   # a torn frame is not shown
          del buf
          for old in sorted(kept)[:-KEEP_FRAMES]: del kept[old]
        ready = set(poller.poll(0))
        for sock in (s for s in socks if s in ready):
          while (dat := sock.receive(non_blocking=True)) is not None:
            try: ev = log_from_bytes(dat)
            except MalformedMessageError: continue
            w = ev.which()
            if w == 'liveCalibration': rpy, height = calibration(ev.liveCalibration, (rpy, height))
            elif w == state_svc: sensor = str(getattr(ev, w).sensor)
            elif w == 'driverMonitoringState':   # it carries no frame id: it follows its frame's driverStateV2
              if last_driver is not None: ms.setdefault(last_driver, FrameMsgs(last_driver)).dm_state = ev.driverMonitoringState
            else:
              fid = ev.modelV2.frameIdExtra if w == 'modelV2' and camera == 'wide' else getattr(ev, w).frameId
              if w == 'driverStateV2': last_driver = fid
              setattr(ms.setdefault(fid, FrameMsgs(fid)), 'model' if w == 'modelV2' else 'driver', getattr(ev, w))
        for fid in sorted(ms):
          m = ms[fid]
          ready = m.model is not None or (m.driver is not None and (m.dm_state is not None or fid < max(ms)))
          if ready and fid in kept:
            m.rpy, m.height, m.sensor = rpy, height, sensor
            yield m, nv12_to_rgb(*kept.pop(fid))
            done, idle = done + 1, time.monotonic()
            del ms[fid]
            if frames is not None and done >= frames: return
          elif fid < min(kept, default=fid + 1): del ms[fid]   # its frame is gone
        if time.monotonic() - idle > timeout:
          raise SystemExit(f"modeld-overlay: no {'/'.join(services[:-2])} for the {camera} camera's frames in {timeout:g} s "
                           f"(is {'dmonitoringd' if camera == 'driver' else 'modeld'} running?)")
    finally: client.close()
  return frames, gen()

# ---- outputs

class Writer:
  """PNG frames into a folder (frame_<id>.png), or an H.264 MP4 when the path ends in .mp4."""
  def __init__(self, out: str, fps: float, width: int | None):
    self.out, self.fps, self.width, self.container, self.count = out, fps, width, None, 0
    self.mp4 = out.lower().endswith('.mp4')
    if not self.mp4: os.makedirs(out, exist_ok=True)

  def write(self, img: Image.Image, frame_id: int) -> None:
    if self.width and img.width != self.width:
      img = img.resize((self.width, max(2, round(img.height * self.width / img.width))), Image.BILINEAR)
    if self.mp4:
      import av
      img = img.crop((0, 0, img.width // 2 * 2, img.height // 2 * 2))   # yuv420p needs even sizes
      if self.container is None:
        os.makedirs(os.path.dirname(os.path.abspath(self.out)), exist_ok=True)
        self.container = av.open(self.out, 'w')
        self.stream = self.container.add_stream('libx264', rate=round(self.fps))
        self.stream.width, self.stream.height, self.stream.pix_fmt = img.width, img.height, 'yuv420p'
        self.stream.options = {'crf': '20', 'preset': 'veryfast'}
      for pkt in self.stream.encode(av.VideoFrame.from_image(img)): self.container.mux(pkt)
    else: img.save(os.path.join(self.out, f"frame_{frame_id:06d}.png"))
    self.count += 1

  def close(self) -> None:
    if self.container is not None:
      for pkt in self.stream.encode(): self.container.mux(pkt)
      self.container.close()

@needs_extra('modeld-overlay', 'tools')   # PyAV, zstandard and tqdm: imported as they are needed
def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog='modeld-overlay', formatter_class=argparse.RawDescriptionHelpFormatter,
                              description='Draw model outputs onto camera frames, from a recorded route or a live stack.\n\n'
                                          "A recorded frame's background: the route's video of that camera where it was recorded; otherwise the synthetic" '\n'
                                          "scene --scene names (frame id = scene frame, as camerad serves it); otherwise a blank canvas of the sensor's" '\n'
                                          "size. Frames are drawn by frame id: in a route whose camera restarted (ids from 0 again) an id's later outputs" '\n'
                                          'are drawn over its first picture; draw such a route in parts (segment ranges) that do not repeat ids.',
                              epilog="""examples:
  modeld-overlay routes/2026-11-30--04-00-00 --out overlay.mp4            the route's road camera, as an MP4
  modeld-overlay ROUTE --camera driver --frames 40 --out frames/           40 PNGs of the driver camera
  modeld-overlay ROUTE --scene lead_braking --out o.mp4                    a route without video, on the scene's frames
  modeld-overlay --live --frames 100 --out live.mp4                        a running stack (same OPENPILOT_PREFIX)

background of a recorded frame (--background auto): the route's video of the camera if recorded, else the synthetic
scene of --scene (camerad's frame id = scene frame), else a blank canvas of the camera sensor's size.""")
  p.add_argument('route', nargs='?', help='route folder or name, segment folder or rlog/qlog file; omit with --live')
  p.add_argument('--live', action='store_true', help='render a running stack (VisionIPC + messages) instead of a route')
  p.add_argument('--camera', choices=list(CAMERAS), default='road', help='camera to draw on (default: road)')
  p.add_argument('--out', default='overlay.mp4', help='an .mp4 file (H.264), or a folder for PNG frames (default: overlay.mp4)')
  p.add_argument('--frames', type=int, metavar='N', help='render at most N frames (live: required to stop without Ctrl-C)')
  p.add_argument('--start', type=int, default=0, metavar='ID', help='route: first frame id to render (default: the first)')
  p.add_argument('--scene', metavar='SCENE', help='synthetic scene the route was recorded from (background when no video)')
  p.add_argument('--background', choices=('auto', 'video', 'scene', 'blank'), default='auto', help='see below (default: auto)')
  p.add_argument('--fps', type=float, default=20., help='MP4 frame rate (default: 20, the camera rate)')
  p.add_argument('--width', type=int, metavar='W', help='scale the output to this width')
  p.add_argument('--name', default='camerad', help='live: VisionIPC server name (default: camerad)')
  p.add_argument('--prefix', metavar='P', help='live: OPENPILOT_PREFIX of the stack (default: the environment\'s)')
  p.add_argument('--timeout', type=float, default=10., help='live: seconds to wait for the camera and the outputs (default: 10)')
  p.add_argument('--quiet', action='store_true', help='no progress bar')
  args = p.parse_args(argv)
  if args.live == (args.route is not None): p.error('give a ROUTE or --live (not both)')
  if args.frames is not None and args.frames < 1: p.error(f"--frames: expected >= 1, got {args.frames}")
  if args.width is not None and args.width < 16: p.error(f"--width: expected >= 16, got {args.width}")
  if args.prefix is not None: os.environ['OPENPILOT_PREFIX'] = args.prefix
  private_umask()   # the pictures show the cabin: this account's alone

  from tqdm import tqdm
  if not args.live:
    from oproute import log_files
    try: log_files(args.route, 'a')
    except (OSError, ValueError) as e: p.error(str(e))
  try:
    if args.live: total, frames = live_frames(args.name, args.camera, args.frames, args.timeout)
    else:
      total, frames = route_frames(args.route, args.camera, args.scene, args.frames, args.background, args.start)
  except (OSError, ValueError) as e:
    print(f"modeld-overlay: {e}", file=sys.stderr)
    return 1
  writer = Writer(args.out, args.fps, args.width)
  try:
    with tqdm(total=total, unit='frame', desc='overlay', disable=args.quiet) as bar:
      for m, rgb in frames:
        writer.write(render(rgb, m, args.camera), m.frame_id)
        bar.update()
  except KeyboardInterrupt: pass
  finally: writer.close()
  if writer.count == 0:
    print("modeld-overlay: no frame rendered", file=sys.stderr)
    return 1
  print(f"modeld-overlay: {writer.count} frames -> {args.out}")
  return 0

if __name__ == '__main__':
  sys.exit(main())
