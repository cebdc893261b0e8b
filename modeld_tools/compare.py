"""Model outputs of two routes, compared per field: what modeld-replay reports against a route's logged outputs.

Outputs are taken per frameId (route_outputs), flattened per field and compared by their largest difference (difference).
"""
from __future__ import annotations
from dataclasses import dataclass, field
from collections.abc import Callable
import numpy as np
from cereal.services import STREAM_OF_STATE
from oproute import LogReader, log_files

def _xyz(d) -> list: return [d.x, d.y, d.z]
def _sides(ds, f: Callable) -> list: return [f(ds.leftDriverData), f(ds.rightDriverData)]

# service -> field -> the values compared
FIELDS: dict[str, dict[str, Callable]] = {
  "modelV2": {
    "position": lambda m: _xyz(m.position),
    "laneLines": lambda m: [[l.y, l.z] for l in m.laneLines],
    "laneLineProbs": lambda m: m.laneLineProbs,
    "roadEdges": lambda m: [[l.y, l.z] for l in m.roadEdges],
    "leadsV3": lambda m: [[l.x, l.y, l.v, l.a] for l in m.leadsV3],
    "leadsV3.prob": lambda m: [l.prob for l in m.leadsV3],
    "action": lambda m: [m.action.desiredCurvature, m.action.desiredAcceleration],
  },
  "driverStateV2": {
    "faceOrientation": lambda d: _sides(d, lambda s: s.faceOrientation),
    "facePosition": lambda d: _sides(d, lambda s: s.facePosition),
    "faceProb": lambda d: _sides(d, lambda s: s.faceProb),
    "eyes": lambda d: _sides(d, lambda s: [s.leftEyeProb, s.rightEyeProb, s.leftBlinkProb, s.rightBlinkProb]),
    "wheelOnRightProb": lambda d: d.wheelOnRightProb,
  },
}

def _flat(v) -> np.ndarray:
  """Nested lists / capnp lists of numbers -> one flat float64 array (ragged nesting is flattened in order)."""
  if isinstance(v, (int, float, np.floating)): return np.array([v], np.float64)
  parts = [_flat(x) for x in v]
  return np.concatenate(parts) if parts else np.zeros(0)

def route_outputs(route, services=tuple(FIELDS)) -> tuple[dict[str, dict[int, dict[str, np.ndarray]]], dict[str, dict[int, int]]]:
  """({service: {frameId: {field: values}}}, {camera-state service: {frameId: frameIdSensor}}) of a route's logs: an
  output per frame (modelV2 and driverStateV2 by their frameId), each field a flat float array (_flat)."""
  out: dict = {s: {} for s in services}
  sources: dict = {}
  for ev in LogReader(log_files(route, "a")):
    w = ev.which()
    if w in out:
      m = getattr(ev, w)
      out[w][m.frameId] = {k: _flat(f(m)) for k, f in FIELDS[w].items()}
    elif w in STREAM_OF_STATE:
      st = getattr(ev, w)
      sources.setdefault(w, {})[st.frameId] = st.frameIdSensor
  return out, sources

@dataclass
class FieldDiff:
  service: str
  field: str
  frames: int = 0                       # compared
  missing: int = 0                      # in the reference, not in the new outputs
  extra: int = 0                        # in the new outputs, not in the reference
  max: float = 0.
  mean: float = 0.                      # of each frame's largest difference
  worst: list[tuple[float, int]] = field(default_factory=list)   # (difference, reference frame id), largest first

def difference(x: np.ndarray, y: np.ndarray) -> float:
  """Largest |x - y|. Values equal on both sides (NaN included) differ by 0; a NaN on one side only, or another shape,
  differs by inf, so a model that starts to output NaN fails any tolerance."""
  if x.shape != y.shape: return float("inf")
  with np.errstate(invalid="ignore"): d = np.where((x == y) | (np.isnan(x) & np.isnan(y)), 0., np.abs(x - y))
  return float(np.nan_to_num(d, nan=np.inf).max(initial=0.))

def compare(ref: dict, new: dict, top: int = 5) -> list[FieldDiff]:
  """Per service and field, the differences of new against ref (both {service: {frame: {field: values}}})."""
  diffs = []
  for svc, fields in FIELDS.items():
    a, b = ref.get(svc, {}), new.get(svc, {})
    common = sorted(a.keys() & b.keys())
    for f in fields:
      per_frame = []
      for fid in common: per_frame.append((difference(a[fid][f], b[fid][f]), fid))
      d = np.array([p for p, _ in per_frame])
      diffs.append(FieldDiff(svc, f, len(common), len(a.keys() - b.keys()), len(b.keys() - a.keys()), float(d.max(initial=0.)),
                             float(d.mean()) if len(d) else 0., sorted(per_frame, reverse=True)[:top]))
  return diffs

def table(diffs: list[FieldDiff]) -> str:
  rows = [f"{'field':34s} {'frames':>7s} {'missing':>8s} {'extra':>6s} {'max diff':>11s} {'mean diff':>11s}  worst frame"]
  for d in diffs:
    worst = f"{d.worst[0][1]}" if d.worst and d.worst[0][0] > 0 else "-"
    rows.append(f"{d.service + '.' + d.field:34s} {d.frames:7d} {d.missing:8d} {d.extra:6d} {d.max:11.4g} {d.mean:11.4g}  {worst}")
  return "\n".join(rows)
