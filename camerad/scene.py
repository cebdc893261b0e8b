"""Synthetic scene description: a JSON file -> a validated Scene whose parameters are functions of time.

Everything a frame shows and everything its ground truth says follows from the Scene, so the renderer and the
truth can never disagree. The format is documented field by field in docs/SCENES.md.
"""
from __future__ import annotations
import json, math
from dataclasses import dataclass
from pathlib import Path
from typing import Any
import numpy as np
from transformations.model import DM_WIDTH, DM_HEIGHT, dm_warp_matrix
from modelrt.constants import X_IDXS
from transformations.camera import DEFAULT_SENSOR, CAM_HEIGHT, CameraConfig, camera_config

SCENES_DIR = Path(__file__).parent / 'scenes'
CAMERAS = ('road', 'wide', 'driver')

class SceneError(ValueError):
  """A scene file that does not follow docs/SCENES.md; the message names the field (dotted path)."""

class Track:
  """A value over time: a constant, or keyframes [[t, v], ...] (numbers: piecewise-linear, held constant outside
  the keys; booleans: a step, each key holds until the next), optionally repeating every `period` seconds."""
  def __init__(self, times: list[float], values: list[float], step: bool, period: float | None = None):
    self.t, self.v, self.step, self.period = np.array(times, dtype=np.float64), np.array(values, dtype=np.float64), step, period

  def _local(self, t: float) -> float: return t % self.period if self.period else t

  def __call__(self, t: float) -> float:
    t = self._local(t)
    if self.step: return float(self.v[max(np.searchsorted(self.t, t, side='right') - 1, 0)])
    return float(np.interp(t, self.t, self.v))

  def slope(self, t: float) -> float:
    """d/dt of a piecewise-linear track (0 outside the keys and for steps); at a key, the segment after it."""
    t = self._local(t)
    i = np.searchsorted(self.t, t, side='right') - 1
    if self.step or i < 0 or i >= len(self.t) - 1: return 0.0
    return float((self.v[i + 1] - self.v[i]) / (self.t[i + 1] - self.t[i]))

  def integral(self, t: float) -> float:
    """Integral from 0 to t (t >= 0), exact for the piecewise-linear function."""
    if self.step: raise TypeError("integral of a step track")
    if self.period:
      n, r = divmod(t, self.period)
      return n * self._integral(self.period) + self._integral(r)
    return self._integral(t)

  def _integral(self, t: float) -> float:
    ts = np.concatenate([[0.0], self.t[(self.t > 0) & (self.t < t)], [t]])
    vs = np.interp(ts, self.t, self.v)
    return float(np.sum((vs[1:] + vs[:-1]) * np.diff(ts)) / 2)

# ---- validation: each section is {field: (kind, default)}; kind is 'track', 'flag' (a boolean track), a python
# type, a tuple of allowed strings, or a nested section dict. A default of REQUIRED makes the field mandatory.
REQUIRED = object()

def _path(path: str, key: str) -> str: return f"{path}.{key}" if path else key

def _number(v: Any, path: str) -> float:
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
    raise SceneError(f"{path}: expected a number, got {v!r}")
  return float(v)

def _track(v: Any, path: str, flag: bool) -> Track:
  want = 'true/false' if flag else 'a number'
  def value(x, p):
    if flag:
      if not isinstance(x, bool): raise SceneError(f"{p}: expected true/false, got {x!r}")
      return float(x)
    return _number(x, p)
  period = None
  if isinstance(v, dict):
    if set(v) - {'keys', 'period'} or 'keys' not in v:
      raise SceneError(f"{path}: a repeating track is {{\"keys\": [[t, value], ...], \"period\": seconds}}, got keys {sorted(v)}")
    if 'period' in v:
      period = _number(v['period'], f"{path}.period")
      if period <= 0: raise SceneError(f"{path}.period: expected > 0, got {period}")
    v = v['keys']
  if not isinstance(v, list): return Track([0.0], [value(v, path)], flag)
  if not v: raise SceneError(f"{path}: expected {want} or keyframes [[t, value], ...], got an empty list")
  times, values = [], []
  for i, kv in enumerate(v):
    p = f"{path}[{i}]"
    if not isinstance(kv, list) or len(kv) != 2: raise SceneError(f"{p}: expected a keyframe [t, value], got {kv!r}")
    t = _number(kv[0], f"{p}[0]")
    if t < 0 or (times and t < times[-1]): raise SceneError(f"{p}[0]: keyframe times must be >= 0 and non-decreasing, got {t}")
    times.append(t); values.append(value(kv[1], f"{p}[1]"))
  return Track(times, values, flag, period)

def _check(obj: Any, spec: dict, path: str) -> dict:
  """Validate one section against its spec and fill defaults; returns {field: parsed value}."""
  if not isinstance(obj, dict): raise SceneError(f"{path or 'scene'}: expected an object, got {type(obj).__name__}")
  unknown = sorted(set(obj) - set(spec))
  if unknown: raise SceneError(f"{_path(path, unknown[0])}: unknown field; known fields here: {', '.join(spec)}")
  out = {}
  for key, (kind, default) in spec.items():
    p = _path(path, key)
    if key not in obj:
      if default is REQUIRED: raise SceneError(f"{p}: missing required field")
      if isinstance(kind, dict) and default is not None: out[key] = _check({}, kind, p)
      elif kind in ('track', 'flag') and default is not None: out[key] = Track([0.0], [float(default)], kind == 'flag')
      else: out[key] = default
      continue
    v = obj[key]
    if kind in ('track', 'flag'): out[key] = _track(v, p, kind == 'flag')
    elif isinstance(kind, dict): out[key] = _check(v, kind, p)
    elif isinstance(kind, tuple):
      if v not in kind: raise SceneError(f"{p}: expected one of {', '.join(map(repr, kind))}, got {v!r}")
      out[key] = v
    elif kind is float: out[key] = _number(v, p)
    elif kind is int:
      if isinstance(v, bool) or not isinstance(v, int): raise SceneError(f"{p}: expected an integer, got {v!r}")
      out[key] = v
    elif kind is bool:
      if not isinstance(v, bool): raise SceneError(f"{p}: expected true/false, got {v!r}")
      out[key] = v
    elif kind is str:
      if not isinstance(v, str): raise SceneError(f"{p}: expected a string, got {v!r}")
      out[key] = v
    elif kind == 'rpy':
      if not isinstance(v, list) or len(v) != 3: raise SceneError(f"{p}: expected [roll, pitch, yaw] in radians, got {v!r}")
      out[key] = tuple(_number(x, f"{p}[{i}]") for i, x in enumerate(v))
    elif kind == 'intrinsics':
      out[key] = {cam: _check(c, INTRINSICS, _path(p, cam)) for cam, c in _check_keys(v, CAMERAS, p).items()}
    elif kind == 'lines':
      if not isinstance(v, list): raise SceneError(f"{p}: expected a list of line paint objects, got {v!r}")
      out[key] = [_check(x, LINE, f"{p}[{i}]") for i, x in enumerate(v)]
    else: raise AssertionError(kind)
  return out

def _check_keys(v: Any, allowed: tuple, path: str) -> dict:
  if not isinstance(v, dict): raise SceneError(f"{path}: expected an object, got {v!r}")
  for k in v:
    if k not in allowed: raise SceneError(f"{_path(path, k)}: unknown field; known fields here: {', '.join(allowed)}")
  return v

INTRINSICS = {'width': (int, REQUIRED), 'height': (int, REQUIRED), 'focal_length': (float, REQUIRED)}
LINE = {'color': (('white', 'yellow'), 'white'), 'dashed': (bool, False), 'dash_length': (float, 3.0),
        'dash_gap': (float, 9.0), 'width': (float, 0.15)}
ROAD = {'lane_width': ('track', 3.7), 'ego_offset': ('track', 0.0), 'curvature': ('track', 0.0), 'speed': ('track', 25.0),
        'lanes_left': (int, 1), 'lanes_right': (int, 1), 'lines': ('lines', None), 'shoulder': (float, 0.8)}
LEAD = {'present': ('flag', True), 'distance': ('track', REQUIRED), 'offset': ('track', 0.0),
        'width': (float, 1.8), 'height': (float, 1.5)}
LIGHTING = {'brightness': ('track', 1.0), 'noise': (float, 2.0)}
FACE = {'present': ('flag', True), 'x': ('track', None), 'y': ('track', 0.45), 'size': ('track', 0.4),
        'yaw': ('track', 0.0), 'pitch': ('track', 0.0), 'roll': ('track', 0.0)}
PHONE = {'present': ('flag', False), 'dx': (float, 0.65), 'dy': (float, 0.05), 'width': (float, 0.25), 'height': (float, 0.45)}
DRIVER = {'wheel': (('left', 'right'), 'left'), 'face': (FACE, {}), 'eyes_closed': ('flag', False), 'phone': (PHONE, {})}
SCENE = {'name': (str, ''), 'description': (str, ''), 'sensor': (str, DEFAULT_SENSOR), 'intrinsics': ('intrinsics', {}),
         'height': (float, CAM_HEIGHT), 'calib': ('rpy', (0.0, 0.0, 0.0)), 'fps': (float, 20.0), 'duration': (float, None),
         'frames': (int, None), 'seed': (int, 0), 'road': (ROAD, {}), 'lead': (LEAD, None), 'lighting': (LIGHTING, {}),
         'driver': (DRIVER, {})}

@dataclass(frozen=True)
class Scene:
  """A validated scene. road, lead, lighting and driver are the parsed sections of the file (docs/SCENES.md) with
  defaults filled in; their tracks are callables of time in seconds."""
  name: str
  sensor: str
  cameras: dict[str, CameraConfig]
  height: float
  calib: tuple[float, float, float]
  fps: float
  n_frames: int
  seed: int
  road: dict
  lead: dict | None
  lighting: dict
  driver: dict

  def time(self, frame: int) -> float: return frame / self.fps

  def lines(self) -> list[dict]:
    """Paint of every line from the leftmost to the rightmost (lanes_left + lanes_right + 2 of them)."""
    return self.road['lines']

  def line_k(self) -> range:
    """Line indices: line k sits at y = (k - 1/2) * lane_width - ego_offset; the ego's starting lane lies between 0 and 1."""
    return range(-self.road['lanes_left'], self.road['lanes_right'] + 2)

  def truth(self, frame: int) -> dict:
    """Ground truth of one frame, JSON-able (see docs/SCENES.md, "Ground truth")."""
    t = self.time(frame)
    r = self.road
    w, off, c, v = r['lane_width'](t), r['ego_offset'](t), r['curvature'](t), r['speed'](t)
    x = X_IDXS.astype(np.float64)
    bend = c * x * x / 2
    ego_lane = math.floor(off / w + 0.5)
    ks = self.line_k()
    def line(k): return {'y': ((k - 0.5) * w - off + bend).round(4).tolist(), 'present': k in ks}
    edges = [(ks[0] - 0.5) * w - off - r['shoulder'], (ks[-1] - 0.5) * w - off + r['shoulder']]
    road = {'lane_lines': [line(ego_lane + i) for i in (-1, 0, 1, 2)],
            'road_edges': [{'y': (e + bend).round(4).tolist()} for e in edges],
            'z': self.height, 'lane_width': w, 'ego_offset': off - ego_lane * w, 'curvature': c, 'ego_lane': ego_lane}
    return {'frame': frame, 't': round(t, 6), 'calib': list(self.calib), 'v_ego': v, 'a_ego': r['speed'].slope(t),
            'road': road, 'lead': self.lead_state(t), 'driver': self.driver_state(t)}

  def lead_state(self, t: float) -> dict:
    """present, x (m ahead of the camera to the lead's rear), y (m right of the camera, calibrated frame), v, v_rel,
    and whether its centre is inside the ego's lane at that distance."""
    ld, r = self.lead, self.road
    if ld is None or not ld['present'](t): return {'present': False}
    x, v_rel, w, off = ld['distance'](t), ld['distance'].slope(t), r['lane_width'](t), r['ego_offset'](t)
    y_lane0 = ld['offset'](t)   # relative to the centre of the ego's starting lane
    return {'present': True, 'x': x, 'y': y_lane0 - off + r['curvature'](t) * x * x / 2, 'v': r['speed'](t) + v_rel, 'v_rel': v_rel,
            'in_ego_lane': abs(y_lane0 - math.floor(off / w + 0.5) * w) < w / 2, 'width': ld['width'], 'height': ld['height']}

  def driver_state(self, t: float) -> dict:
    d, f = self.driver, self.driver['face']
    cam = self.cameras['driver']
    out = {'wheel_on_right': d['wheel'] == 'right', 'eyes_closed': bool(d['eyes_closed'](t)),
           'phone': bool(d['phone']['present'](t)), 'face': {'present': bool(f['present'](t))}}
    if out['face']['present']:
      u, v = f['x'](t) * cam.width, f['y'](t) * cam.height
      mu, mv, mw = (float(a) for a in np.linalg.inv(dm_warp_matrix(cam).astype(np.float64)) @ [u, v, 1.0])
      size_px = f['size'](t) * cam.height
      out['face'].update({'camera_px': [u, v], 'camera_norm': [f['x'](t), f['y'](t)], 'model_px': [mu / mw, mv / mw],
                          'position': [mu / mw / DM_WIDTH - 0.5, mv / mw / DM_HEIGHT - 0.5],
                          'size_px': size_px, 'model_size_px': size_px / float(dm_warp_matrix(cam)[0, 0]),
                          'yaw': f['yaw'](t), 'pitch': f['pitch'](t), 'roll': f['roll'](t)})
    return out

def default_lines(lanes_left: int, lanes_right: int) -> list[dict]:
  """Outer lines solid, lines between lanes dashed, all white."""
  n = lanes_left + lanes_right + 2
  return [_check({'dashed': 0 < i < n - 1}, LINE, '') for i in range(n)]

def parse_scene(obj: Any, name: str = '') -> Scene:
  s = _check(obj, SCENE, '')
  if (s['duration'] is None) == (s['frames'] is None): raise SceneError("scene: give exactly one of 'duration' (seconds) or 'frames'")
  if s['fps'] <= 0: raise SceneError(f"fps: expected > 0, got {s['fps']}")
  n_frames = s['frames'] if s['frames'] is not None else round(s['duration'] * s['fps'])
  if n_frames <= 0: raise SceneError(f"scene: expected at least one frame, got {n_frames}")
  if s['seed'] < 0: raise SceneError(f"seed: expected an integer >= 0, got {s['seed']}")
  if s['height'] <= 0: raise SceneError(f"height: expected > 0 (metres above the road), got {s['height']}")
  try: cameras = {c: camera_config(s['sensor'], c) for c in CAMERAS}
  except KeyError as e: raise SceneError(f"sensor: {e.args[0]}") from None
  for cam, o in s['intrinsics'].items():
    if o['width'] <= 0 or o['height'] <= 0 or o['width'] % 2 or o['height'] % 2 or o['focal_length'] <= 0:
      raise SceneError(f"intrinsics.{cam}: expected a positive even width and height and focal_length > 0, got {o}")
    cameras[cam] = CameraConfig(o['width'], o['height'], o['focal_length'])
  road = s['road']
  if road['lanes_left'] < 0 or road['lanes_right'] < 0: raise SceneError("road.lanes_left/lanes_right: expected >= 0")
  n_lines = road['lanes_left'] + road['lanes_right'] + 2
  if road['lines'] is None: road['lines'] = default_lines(road['lanes_left'], road['lanes_right'])
  elif len(road['lines']) != n_lines:
    raise SceneError(f"road.lines: expected {n_lines} lines (lanes_left + lanes_right + 2, left to right), got {len(road['lines'])}")
  for i, ln in enumerate(road['lines']):
    for k in ('dash_length', 'dash_gap', 'width'):
      if ln[k] <= 0: raise SceneError(f"road.lines[{i}].{k}: expected > 0, got {ln[k]}")
  for path, tr in (('road.lane_width', road['lane_width']), ('driver.face.size', s['driver']['face']['size']),
                   ('lighting.brightness', s['lighting']['brightness'])):
    if (tr.v <= 0).any(): raise SceneError(f"{path}: expected values > 0, got {tr.v.min()}")
  if s['lighting']['noise'] < 0: raise SceneError(f"lighting.noise: expected >= 0, got {s['lighting']['noise']}")
  face = s['driver']['face']
  if face['x'] is None: face['x'] = Track([0.0], [0.62 if s['driver']['wheel'] == 'right' else 0.38], False)
  return Scene(s['name'] or name, s['sensor'], cameras, s['height'], s['calib'], s['fps'], n_frames, s['seed'],
               road, s['lead'], s['lighting'], s['driver'])

def shipped_scenes() -> list[str]:
  """The names of the scenes in camerad/scenes/, what a bare name in load_scene picks from."""
  return sorted(p.stem for p in SCENES_DIR.glob('*.json'))

def scene_path(path: str | Path) -> Path:
  """The file of a scene: the path given, or for a bare name ('straight') that is no file, the shipped scene's."""
  p = Path(path)
  return SCENES_DIR / f"{p.name}.json" if not p.suffix and not p.exists() else p

def load_scene(path: str | Path) -> Scene:
  """Load a scene file; a bare name ('straight') means a shipped scene in camerad/scenes/."""
  p = scene_path(path)
  try: obj = json.loads(p.read_text())
  except json.JSONDecodeError as e: raise SceneError(f"{p}: not valid JSON ({e})") from None
  try: return parse_scene(obj, p.stem)
  except SceneError as e: raise SceneError(f"{p}: {e}") from None
