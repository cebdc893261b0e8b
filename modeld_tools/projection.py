"""Model outputs as camera pixels, shared by modeld-overlay (drawn into an MP4) and modeld-view (logged to rerun).

Road outputs go through transformations.camera's camera_from_calib with the calibration in force, driver outputs
through transformations.model's dm_warp_matrix: the geometry the daemons and the synthetic scenes use. A camera config
of a scaled picture (Scaled: the stream's, scaled and shifted) gives that picture's pixels."""
from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING
import numpy as np
from transformations.model import DM_HEIGHT, DM_WIDTH, dm_warp_matrix
from modelrt.constants import X_IDXS
from transformations.camera import CAM_HEIGHT, CameraConfig, camera_from_calib
from msgq.visionipc.layout import NV12Layout
if TYPE_CHECKING: import av

CAR_HALF_WIDTH = 0.9       # m: the path is as wide as a car, the lead box too
LEAD_HEIGHT = 1.5          # m
LEAD_MIN_PROB = 0.3        # leads get a box from this probability on
FACE_BOX = 0.3             # face box side, fraction of the driver model frame's height
GREEN, YELLOW, RED = (40, 220, 80), (250, 210, 40), (240, 50, 40)

def nv12_frame(buf: np.ndarray, layout: NV12Layout) -> av.VideoFrame:
  """An NV12 buffer of `layout` as a PyAV frame: over the buffer itself when its planes follow each other (no copy; keep
  the buffer while the frame lives), else with the planes copied in."""
  import av
  l = layout
  if l.uv_offset == l.stride * l.height:
    return av.VideoFrame.from_numpy_buffer(buf[:l.stride * l.height * 3 // 2].reshape(-1, l.stride), format='nv12', width=l.width)
  f, (y, uv) = av.VideoFrame(l.width, l.height, 'nv12'), l.y_uv(buf)
  for plane, src in zip(f.planes, (y, uv.reshape(l.height // 2, l.width))):
    np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[:src.shape[0], :src.shape[1]] = src
  return f

def nv12_to_rgb(buf: np.ndarray, layout: NV12Layout, size: tuple[int, int] | None = None) -> np.ndarray:
  """(h, w, 3) uint8 RGB of an NV12 buffer of `layout`, converted by FFmpeg as a decoded video frame would be; scaled
  to size (width, height) in the same pass when given."""
  f = nv12_frame(buf, layout)
  if size is None or size == (layout.width, layout.height): return f.to_ndarray(format='rgb24')
  # one thread: FFmpeg's own slice threads cost half as much CPU again as the scaling itself, for a frame this small
  return f.reformat(width=size[0], height=size[1], format='rgb24', interpolation='FAST_BILINEAR', threads=1).to_ndarray()

def decimation(full: tuple[int, int], k: int) -> tuple[int, int, int]:
  """(width, height, first pixel) of a stream of size `full` decimated by k: every k-th pixel of every k-th row from
  the first, the middle of its k x k block, at most full // k (even: NV12)."""
  return full[0] // k // 2 * 2, full[1] // k // 2 * 2, (k - 1) // 2

def nv12_decimate(buf: np.ndarray, layout: NV12Layout, k: int) -> np.ndarray:
  """A packed NV12 picture of an NV12 buffer of `layout` decimated by k (decimation() gives its size), from the Y and
  UV planes by numpy: no scaler, no colour conversion (the viewer converts it). A copy: the buffer may be reused."""
  w, h, o = decimation((layout.width, layout.height), k)
  y, uv = layout.y_uv(buf)
  out = np.empty(w * h * 3 // 2, np.uint8)
  out[:w * h].reshape(h, w)[:] = y[o:o + h * k:k, o:o + w * k:k]
  c = round((o + k / 2 - 0.5) / 2)   # the chroma sample nearest the middle of the picture's 2x2 block
  out[w * h:].reshape(h // 2, w // 2, 2)[:] = uv[c::k, c::k][:h // 2, :w // 2]
  return out

@dataclass(frozen=True)
class Scaled(CameraConfig):
  """The geometry of a picture made from a camera's stream (base): a stream pixel (u, v) is the picture's
  (u * sx + tx, v * sy + ty); width and height are the picture's."""
  base: CameraConfig | None = None
  sx: float = 1.
  sy: float = 1.
  tx: float = 0.
  ty: float = 0.

  @property
  def intrinsics(self) -> np.ndarray:
    return (np.array([[self.sx, 0, self.tx], [0, self.sy, self.ty], [0, 0, 1]]) @ self.base.intrinsics).astype(np.float32)

def prob_colour(p: float) -> tuple[int, int, int]:
  """Red at 0, yellow at 0.5, green at 1."""
  p = float(np.clip(p, 0, 1))
  a, b, t = (RED, YELLOW, p * 2) if p < 0.5 else (YELLOW, GREEN, p * 2 - 1)
  return tuple(int(round(x + (y - x) * t)) for x, y in zip(a, b))

def calibration(msg, prev: tuple[tuple, float] | None) -> tuple[tuple, float]:
  """(rpy, height) in force after a liveCalibration message: its own where it has them, else what was in force."""
  rpy = tuple(msg.rpyCalib) if len(msg.rpyCalib) == 3 else (prev or ((0., 0., 0.),))[0]
  return rpy, float(msg.height[0]) if len(msg.height) else CAM_HEIGHT

@functools.lru_cache(maxsize=16)   # a frame projects a dozen lines with one calibration, which changes rarely
def _camera_from_calib(rpy: tuple[float, ...], cam: CameraConfig) -> np.ndarray: return camera_from_calib(rpy, cam).T

def project(points: np.ndarray, rpy, cam: CameraConfig) -> tuple[np.ndarray, np.ndarray]:
  """Calibrated-frame points (N, 3) -> camera pixels (N, 2) and a mask of the points in front of the camera."""
  p = np.asarray(points, np.float64) @ _camera_from_calib(tuple(map(float, rpy)), cam)
  ok = p[:, 2] > 1e-3
  uv = p[:, :2] / np.where(ok, p[:, 2], 1.0)[:, None]
  lim = 8 * max(cam.width, cam.height)   # far outside the frame: clamp, so drawing libraries get sane numbers
  return np.clip(uv, -lim, lim), ok

@dataclass
class Lead:
  x: float; y: float; v: float; prob: float
  box: np.ndarray | None   # (2, 2) pixel corners (top left, bottom right) of a car's size at its place; None when not drawn

@dataclass
class Road:
  """What a modelV2 shows in a road (or wide) camera's pixels."""
  lanes: list[tuple[np.ndarray, float]]   # each lane line's pixels in front of the camera, its probability
  edges: list[np.ndarray]
  path: np.ndarray | None                 # the planned path, a car wide: left side out, right side back (a polygon)
  lead: Lead | None                       # leadsV3[0]

def road(md, rpy, height: float, cam: CameraConfig) -> Road:
  near = X_IDXS >= 1.0   # the first grid point is the camera itself
  def lines(ls) -> list[np.ndarray | None]:
    out = []
    for l in ls:
      if len(l.y) != len(X_IDXS): out.append(None); continue
      z = np.asarray(l.z) if len(l.z) == len(X_IDXS) else np.full(len(X_IDXS), height)
      uv, ok = project(np.stack([X_IDXS, np.asarray(l.y), z], 1)[near], rpy, cam)
      out.append(uv[ok])
    return out
  lanes = [(uv, float(p)) for uv, p in zip(lines(md.laneLines), md.laneLineProbs) if uv is not None]
  path, pos = None, md.position
  if len(pos.x) > 1 and len(pos.x) == len(pos.y) == len(pos.z):
    # the plan is the car's path at its origin: on the road, camera height below (z down)
    x, y, z = np.asarray(pos.x), np.asarray(pos.y), np.asarray(pos.z) + height
    keep = x >= 1.0
    if keep.sum() >= 2:
      left, okl = project(np.stack([x, y - CAR_HALF_WIDTH, z], 1)[keep], rpy, cam)
      right, okr = project(np.stack([x, y + CAR_HALF_WIDTH, z], 1)[keep], rpy, cam)
      ok = okl & okr
      if 2 * ok.sum() >= 3: path = np.concatenate([left[ok], right[ok][::-1]])
  lead = None
  if len(md.leadsV3) and len((l := md.leadsV3[0]).x):
    x, y, prob = float(l.x[0]), float(l.y[0]) if len(l.y) else 0., float(l.prob)
    lead = Lead(x, y, float(l.v[0]) if len(l.v) else 0., prob, None)
    if prob >= LEAD_MIN_PROB and x > 1.0:
      w, h = CAR_HALF_WIDTH, height
      uv, ok = project(np.array([[x, y - w, h], [x, y + w, h], [x, y + w, h - LEAD_HEIGHT], [x, y - w, h - LEAD_HEIGHT]]), rpy, cam)
      if ok.all(): lead.box = np.stack([uv.min(0), uv.max(0)])
  return Road(lanes, [e for e in lines(md.roadEdges) if e is not None], path, lead)

@dataclass
class Face:
  box: np.ndarray                                # (2, 2) pixel corners (top left, bottom right)
  eyes: list[tuple[float, float, float, bool]]   # left, right: x, y, radius, open (not blinking)

def driver_data(ds, dms):
  """(right-hand drive, the DriverData of the driver's side): dmonitoringd's isRHD where known, else the model's own."""
  rhd = dms.isRHD if dms is not None else ds.wheelOnRightProb > 0.5
  return rhd, ds.rightDriverData if rhd else ds.leftDriverData

def face(d, cam: CameraConfig) -> Face | None:
  """The face box of a DriverData in the driver camera's pixels, the eyes on its upper third; None without a position."""
  if len(d.facePosition) != 2: return None
  mx, my = (d.facePosition[0] + 0.5) * DM_WIDTH, (d.facePosition[1] + 0.5) * DM_HEIGHT
  half = FACE_BOX * DM_HEIGHT / 2
  c = dm_warp_matrix(cam).astype(np.float64) @ np.array([[mx - half, my - half, 1], [mx + half, my + half, 1]]).T
  (x0, x1), (y0, y1) = c[0] / c[2], c[1] / c[2]
  r, ey = (x1 - x0) * 0.06, y0 + (y1 - y0) * 0.38
  eyes = [(x0 + (x1 - x0) * f, ey, r, eye * (1 - blink) > 0.5)
          for f, eye, blink in ((0.32, d.leftEyeProb, d.leftBlinkProb), (0.68, d.rightEyeProb, d.rightBlinkProb))]
  return Face(np.array([[x0, y0], [x1, y1]]), eyes)
