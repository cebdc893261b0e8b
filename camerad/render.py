"""Scene renderers: road, wide road and driver camera frames written as NV12 straight into a caller's buffer.

A frame depends on its number only, never on the frames rendered before it (what is kept between frames only saves
work). The projection is transformations.camera.camera_from_calib, nothing else. docs/SCENES.md: radiometry, speed.
"""
from __future__ import annotations
import json, math
from pathlib import Path
from typing import IO
import numpy as np
from msgq.visionipc.layout import NV12Layout
from transformations.camera import camera_from_calib
from camerad.scene import CAMERAS, Scene

X_MAX = 250.0          # metres: paint is drawn up to here; ground beyond it, up to the horizon, is haze
N_NOISE = 4            # pre-rendered noise variants per background; each frame picks one (seeded)
# (Y, U, V) of each surface, before lighting; the same numbers are documented in docs/SCENES.md
SKY, HAZE, ASPHALT, GRASS = (190, 140, 120), (150, 128, 128), (100, 128, 128), (70, 112, 118)
PAINT = {'white': (230, 128, 128), 'yellow': (205, 80, 150)}
LEAD_BODY, LEAD_LIGHT = (30, 128, 128), (90, 100, 200)
CABIN, SKIN, EYE, EYELID, PHONE = (60, 128, 128), (160, 110, 155), (25, 128, 128), (105, 110, 150), (235, 160, 100)
TEXTURE = 3.0          # Y amplitude of the static asphalt/grass/cabin texture (8-px blocks)

def _texture(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
  """Mild static texture: blocks of 8 px, uniform in [-TEXTURE, TEXTURE]."""
  blocks = rng.uniform(-TEXTURE, TEXTURE, ((h + 7) // 8, (w + 7) // 8)).astype(np.float32)
  return np.repeat(np.repeat(blocks, 8, 0), 8, 1)[:h, :w]

def _u8(x: np.ndarray) -> np.ndarray: return np.clip(np.rint(x), 0, 255).astype(np.uint8)

def _spans(y: np.ndarray, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, val: np.ndarray):
  """Blend value `val` over [lo, hi] (pixel coordinates, pixel i covers [i-.5, i+.5]) in each given row of plane y,
  weighted by how much of each pixel the span covers."""
  w = y.shape[1]
  c0 = np.clip(np.floor(lo + 0.5), 0, w - 1).astype(np.int64)
  c1 = np.clip(np.floor(hi + 0.5), 0, w - 1).astype(np.int64)
  n = c1 - c0 + 1
  idx = np.repeat(np.arange(len(n)), n)
  cols = c0[idx] + np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
  cov = np.clip(np.minimum(cols + 0.5, hi[idx]) - np.maximum(cols - 0.5, lo[idx]), 0.0, 1.0)
  r = rows[idx]
  old = y[r, cols].astype(np.float64)
  y[r, cols] = _u8(old + cov * (val[idx] - old))

def _ranges(rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(row, column) of every column in [lo, hi) of each given row (lo <= hi, integers)."""
  n = hi - lo
  idx = np.repeat(np.arange(len(n)), n)
  return rows[idx], lo[idx] + np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)

class _Grass:
  """A background whose columns left of `left` and from `right` on are grass, per row from row0 on, kept up to date
  by rewriting only the pixels that change sides. road and grass: (h, w) or (h, w, channels) uint8 backgrounds."""
  def __init__(self, road: np.ndarray, grass: np.ndarray, row0: int):
    self.road, self.grass, self.row0, self.out = road, grass, row0, road.copy()
    n, w = road.shape[0] - row0, road.shape[1]
    self.left, self.right = np.zeros(n, np.int64), np.full(n, w, np.int64)

  def update(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    rows = np.arange(len(left))
    r, c = zip(*(_ranges(rows, np.minimum(a, b), np.maximum(a, b)) for a, b in ((self.left, left), (self.right, right))))
    r, c = np.concatenate(r), np.concatenate(c)
    off = ((c < left[r]) | (c >= right[r])).reshape(-1, *(1,) * (self.out.ndim - 2))
    r = r + self.row0
    self.out[r, c] = np.where(off, self.grass[r, c], self.road[r, c])
    self.left, self.right = left, right
    return self.out

def _window(plane: np.ndarray, scale: int, x0: float, x1: float, y0: float, y1: float):
  """The part of a plane (sampled every `scale` camera pixels) around the camera-pixel box [x0, x1] x [y0, y1]:
  (slices into the plane, camera-pixel coordinates of its columns' and rows' sample centres)."""
  rows, cols = plane.shape
  c0, c1 = max(math.floor(x0 / scale) - 1, 0), min(math.ceil(x1 / scale) + 1, cols - 1)
  r0, r1 = max(math.floor(y0 / scale) - 1, 0), min(math.ceil(y1 / scale) + 1, rows - 1)
  centre = (scale - 1) / 2
  return (slice(r0, r1 + 1), slice(c0, c1 + 1)), np.arange(c0, c1 + 1) * scale + centre, np.arange(r0, r1 + 1) * scale + centre

class SceneRenderer:
  """Renders one camera of a scene into NV12 buffers of `layout` (width and height must be the camera's)."""
  def __init__(self, scene: Scene, camera: str, layout: NV12Layout):
    if camera not in scene.cameras: raise ValueError(f"camera: expected one of {', '.join(scene.cameras)}, got {camera!r}")
    cam = scene.cameras[camera]
    if (layout.width, layout.height) != (cam.width, cam.height):
      raise ValueError(f"{camera} camera of sensor {scene.sensor} is {cam.width}x{cam.height}, layout is {layout.width}x{layout.height}")
    self.scene, self.camera, self.layout, self.cam = scene, camera, layout, cam
    rng = np.random.default_rng([scene.seed, CAMERAS.index(camera)])
    (self._init_driver if camera == 'driver' else self._init_road)(rng)

  def truth(self, frame: int) -> dict: return self.scene.truth(frame)

  def render(self, frame: int, out: np.ndarray | None = None) -> np.ndarray:
    """Write frame `frame` into `out` (a flat uint8 buffer of self.layout; allocated when None) and return it."""
    if frame < 0: raise ValueError(f"frame: expected >= 0, got {frame}")
    if out is None: out = np.zeros(self.layout.size, dtype=np.uint8)
    y, uv = self.layout.y_uv(out)
    t = self.scene.time(frame)
    k = int(np.random.default_rng([self.scene.seed, frame]).integers(N_NOISE))
    (self._render_driver if self.camera == 'driver' else self._render_road)(t, k, y, uv)
    b = self.scene.lighting['brightness'](t)
    if b != 1.0: y[...] = _u8(np.arange(256) * b)[y]
    return out

  def _backgrounds(self, rng: np.random.Generator, bases: list[np.ndarray], texture: np.ndarray) -> list[list[np.ndarray]]:
    """N_NOISE noise variants of each float Y background (variant k has the same noise in every background)."""
    noises = [rng.standard_normal(texture.shape, dtype=np.float32) * np.float32(self.scene.lighting['noise']) for _ in range(N_NOISE)]
    return [[_u8(base + texture + n) for n in noises] for base in bases]

  # ---- road and wide road
  def _init_road(self, rng: np.random.Generator):
    sc, cam = self.scene, self.cam
    h, w = cam.height, cam.width
    self.M = camera_from_calib(sc.calib, cam)
    self.Minv = np.linalg.inv(self.M)
    # classes at Y pixel centres and at UV sample centres (the middle of each 2x2 block)
    def classes(us, vs):   # 0 sky, 1 haze, 2 ground within X_MAX
      dx, dz = (self.Minv[i, 0] * us[None, :] + (self.Minv[i, 1] * vs + self.Minv[i, 2])[:, None] for i in (0, 2))
      with np.errstate(divide='ignore', invalid='ignore'):
        x = sc.height * dx / dz
      ground = (dz > 0) & (x > 0)
      return ground.astype(np.uint8) + (ground & (x <= X_MAX))
    cls = classes(np.arange(w, dtype=np.float64), np.arange(h, dtype=np.float64))
    cls_uv = classes(np.arange(w // 2) * 2 + 0.5, np.arange(h // 2) * 2 + 0.5)
    def plane(cl, surfaces, ch): return np.array([s[ch] for s in surfaces], np.float32)[cl]
    tex = _texture(rng, h, w) * (cls == 2)
    ground_rows = np.nonzero((cls == 2).any(1))[0]
    self.row0 = int(ground_rows[0]) if len(ground_rows) else h
    self.row0_uv = self.row0 // 2
    bg_road, bg_grass = self._backgrounds(rng, [plane(cls, (SKY, HAZE, ASPHALT), 0), plane(cls, (SKY, HAZE, GRASS), 0)], tex)
    self.bg_y = [_Grass(r, g, self.row0) for r, g in zip(bg_road, bg_grass)]   # per noise variant
    self.bg_uv = _Grass(*(_u8(np.stack([plane(cls_uv, surfaces, ch) for ch in (1, 2)], -1)) for surfaces in ((SKY, HAZE, ASPHALT), (SKY, HAZE, GRASS))),
                        self.row0_uv)
    # per-row camera rays: ray(u) = a * u + b[:, row], in the calibrated frame
    self.a = self.Minv[:, 0]
    self.b = self.Minv[:, 1:2] * np.arange(self.row0, h)[None, :] + self.Minv[:, 2:3]
    self.b_uv = self.Minv[:, 1:2] * (np.arange(self.row0_uv, h // 2) * 2 + 0.5)[None, :] + self.Minv[:, 2:3]

  def _cross(self, b: np.ndarray, yk: np.ndarray, c: float) -> tuple[np.ndarray, np.ndarray]:
    """For each lateral offset yk (L,) and each row (rays a*u + b[:, row]), the column u where the row meets the
    road curve y = yk + c*x^2/2 (z = height), and the distance x there; NaN where the row does not meet it.
    With X = h*dx/dz, Y = h*dy/dz the curve is h*dy*dz - (c*h^2/2)*dx^2 - yk*dz^2 = 0: a quadratic in u."""
    hgt, C = self.scene.height, c * self.scene.height ** 2 / 2
    (ax, ay, az), (bx, by, bz) = self.a, b
    yk = np.asarray(yk, dtype=np.float64)[:, None]
    al = hgt * ay * az - C * ax * ax - yk * az * az
    be = hgt * (ay * bz + by * az) - 2 * C * ax * bx - 2 * yk * az * bz
    ga = hgt * by * bz - C * bx * bx - yk * bz * bz
    with np.errstate(divide='ignore', invalid='ignore'):
      q = -0.5 * (be + np.copysign(np.sqrt(be * be - 4 * al * ga), be))
      best_u, best_x = np.full(q.shape, np.nan), np.full(q.shape, np.inf)
      for u in (ga / q, q / al):   # the stable pair of roots; q/al is the far one (infinite when al == 0)
        dz = az * u + bz
        x = hgt * (ax * u + bx) / dz
        ok = np.isfinite(u) & (dz > 0) & (x > 0) & (x < best_x)
        best_u, best_x = np.where(ok, u, best_u), np.where(ok, x, best_x)
    return best_u, np.where(np.isfinite(best_u), best_x, np.nan)

  def _render_road(self, t: float, k: int, y: np.ndarray, uv: np.ndarray):
    sc, r = self.scene, self.scene.road
    w_lane, off, c = r['lane_width'](t), r['ego_offset'](t), r['curvature'](t)
    ks = np.array(sc.line_k(), dtype=np.float64)
    lines_y = (ks - 0.5) * w_lane - off
    edges = np.array([lines_y[0] - r['shoulder'], lines_y[-1] + r['shoulder']])
    # grass beyond the road edges, row by row: pixel columns (Y: at x = c; UV: at x = 2c + 0.5) left of the left edge
    # or right of the right one (none where a row does not meet the edge)
    for out, bg, b, scale, offset in ((y, self.bg_y[k], self.b, 1, 0.0), (uv, self.bg_uv, self.b_uv, 2, 0.5)):
      (el, er), _ = self._cross(b, edges, c)
      w = out.shape[1]
      left = np.clip(np.ceil((np.nan_to_num(el, nan=-np.inf) - offset) / scale), 0, w).astype(np.int64)
      right = np.clip(np.floor((np.nan_to_num(er, nan=np.inf) - offset) / scale) + 1, 0, w).astype(np.int64)
      out[...] = bg.update(left, right)
    u, v = uv[..., 0], uv[..., 1]
    # paint: each line's borders where they cross the top, middle and bottom of each row (the union, so a line
    # nearly parallel to the rows stays connected), dashes by the distance at the line's centre
    s = r['speed'].integral(t)
    half = np.array([ln['width'] / 2 for ln in sc.lines()])
    for plane_set, b, r0, chroma in (((y,), self.b, self.row0, False), ((u, v), self.b_uv, self.row0_uv, True)):
      _, xc = self._cross(b, lines_y, c)
      dv = self.Minv[:, 1:2] * (1.0 if chroma else 0.5)
      ends = [self._cross(bb, lines_y + sgn * half, c)[0] for bb in (b - dv, b, b + dv) for sgn in (-1, 1)]
      lo, hi = np.fmin.reduce(ends), np.fmax.reduce(ends)
      if chroma: lo, hi = (lo - 0.5) / 2, (hi - 0.5) / 2
      for i, ln in enumerate(sc.lines()):
        if chroma and ln['color'] == 'white': continue   # white paint is neutral, like the asphalt under it
        on = np.isfinite(xc[i]) & (xc[i] < X_MAX) & (hi[i] >= -0.5) & (lo[i] <= plane_set[0].shape[1] - 0.5)
        if ln['dashed']: on &= np.nan_to_num(xc[i] + s) % (ln['dash_length'] + ln['dash_gap']) < ln['dash_length']
        rows = np.nonzero(on)[0]
        for ch, p in enumerate(plane_set):
          _spans(p, rows + r0, lo[i][rows], hi[i][rows], np.full(len(rows), float(PAINT[ln['color']][ch + chroma])))
    self._draw_lead(t, y, u, v)

  def _draw_lead(self, t: float, y: np.ndarray, u: np.ndarray, v: np.ndarray):
    lead = self.scene.lead_state(t)
    if not lead['present'] or lead['x'] < 1.0: return
    hgt, D, yl, hw, lh = self.scene.height, lead['x'], lead['y'], lead['width'] / 2, lead['height']
    corners = self.M @ np.array([[D, yl + sy, hgt - sz] for sy in (-hw, hw) for sz in (0, lh)]).T
    px = corners[:2] / corners[2]
    for plane_set, scale in (((y,), 1), ((u, v), 2)):
      sl, us, vs = _window(plane_set[0], scale, px[0].min(), px[0].max(), px[1].min(), px[1].max())
      d = [self.Minv[i, 0] * us[None, :] + self.Minv[i, 1] * vs[:, None] + self.Minv[i, 2] for i in range(3)]
      with np.errstate(divide='ignore', invalid='ignore'):
        ly, lz = D * d[1] / d[0] - yl, D * d[2] / d[0]
      body = (d[0] > 0) & (np.abs(ly) <= hw) & (lz >= hgt - lh) & (lz <= hgt)
      light = body & (np.abs(ly) >= hw - 0.35) & (lz >= hgt - 1.1) & (lz <= hgt - 0.85)
      for ch, p in enumerate(plane_set):
        ch += scale - 1
        p[sl][body] = LEAD_BODY[ch]
        p[sl][light] = LEAD_LIGHT[ch]

  # ---- driver
  def _init_driver(self, rng: np.random.Generator):
    h, w = self.cam.height, self.cam.width
    self.bg_cabin, = self._backgrounds(rng, [np.full((h, w), CABIN[0], np.float32)], _texture(rng, h, w))
    self.uv_cabin = np.full((h // 2, w // 2, 2), CABIN[1:], np.uint8)

  def _render_driver(self, t: float, k: int, y: np.ndarray, uv: np.ndarray):
    y[...] = self.bg_cabin[k]
    uv[...] = self.uv_cabin
    u, v = uv[..., 0], uv[..., 1]
    d, f = self.scene.driver, self.scene.driver['face']
    if not f['present'](t): return
    W, H = self.cam.width, self.cam.height
    cx, cy, fh = f['x'](t) * W, f['y'](t) * H, f['size'](t) * H
    a, b = 0.375 * fh, 0.5 * fh
    yaw, pitch, roll = f['yaw'](t), f['pitch'](t), f['roll'](t)
    closed = d['eyes_closed'](t)
    ex, ey = 0.6 * a * math.sin(yaw), -0.15 * b + 0.6 * b * math.sin(pitch)
    eye_b = max(0.015 * b, 1.0) if closed else 0.08 * b
    ph = d['phone']
    for plane_set, scale in (((y,), 1), ((u, v), 2)):
      sl, us, vs = _window(plane_set[0], scale, cx - b, cx + b, cy - b, cy + b)
      du, dv = us[None, :] - cx, vs[:, None] - cy
      p, q = math.cos(roll) * du + math.sin(roll) * dv, -math.sin(roll) * du + math.cos(roll) * dv   # face-local, rolled
      face = (p / a) ** 2 + (q / b) ** 2 <= 1
      eyes = np.zeros_like(face)
      for side in (-1, 1): eyes |= ((p - side * 0.4 * a - ex) / (0.17 * a)) ** 2 + ((q - ey) / eye_b) ** 2 <= 1
      eyes &= face
      for ch, pl in enumerate(plane_set):
        ch += scale - 1
        pl[sl][face] = SKIN[ch]
        pl[sl][eyes] = (EYELID if closed else EYE)[ch]
      if ph['present'](t):
        pcx, pcy, pw2, ph2 = cx + ph['dx'] * fh, cy + ph['dy'] * fh, ph['width'] * fh / 2, ph['height'] * fh / 2
        sl, us, vs = _window(plane_set[0], scale, pcx - pw2, pcx + pw2, pcy - ph2, pcy + ph2)
        m = (np.abs(us[None, :] - pcx) <= pw2) & (np.abs(vs[:, None] - pcy) <= ph2)
        for ch, pl in enumerate(plane_set): pl[sl][m] = PHONE[ch + scale - 1]

def write_truth(scene: Scene, out: str | Path | IO[str], frames: int | None = None) -> int:
  """Write the ground truth of frames 0..frames-1 (default: the whole scene) as JSON lines; returns the count."""
  n = scene.n_frames if frames is None else frames
  f = open(out, 'w') if isinstance(out, (str, Path)) else out
  try:
    for i in range(n): f.write(json.dumps(scene.truth(i)) + '\n')
  finally:
    if f is not out: f.close()
  return n
