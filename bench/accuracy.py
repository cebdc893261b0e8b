#!/usr/bin/env python3
"""Accuracy of the reference models over the shipped synthetic scenes, run as the daemons run them (tests/evaluate.py),
against the targets the tests hold; HELP says what it prints, docs/REFERENCE_MODELS.md has the figures.

  DEV=CPU python bench/accuracy.py [--frames N]
"""
import argparse, pathlib, sys
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import numpy as np
from camerad.scene import load_scene
from modelrt.constants import X_IDXS, T_IDXS, FRAME_SKIP
from modelrt.contracts import ROAD_V0_11_1
from dmonitoringd.policy import face_pose
from tests.evaluate import run_road, run_dm

HELP = """Accuracy of the reference models over the shipped synthetic scenes, run as the daemons run them without their
processes (tests/evaluate.py: render -> RoadRunner / DMRunner on the daemons' artifact -> parse). Prints per-quantity
errors (mean, p95, max) next to the target the tests hold, the median time of a runner's frame, and last the worst
relative error (error / target; <= 1 meets every target).

  DEV=CPU python bench/accuracy.py [--frames N]
"""

NEAR = (X_IDXS >= 10) & (X_IDXS <= 50)
PLAN = ROAD_V0_11_1.plan
ROAD_SCENES, DM_SCENES = ('straight', 'curve', 'lead_braking', 'lane_change'), ('driver_distracted', 'driver_blinking')

def truth_lines(r): return np.array([l['y'] for l in r['truth']['road']['lane_lines']])

DESIRES = {'none': 0, 'laneChangeLeft': 3, 'laneChangeRight': 4}

def road_errors(rs: list[dict]) -> dict[str, tuple[np.ndarray, float, str]]:
  """quantity -> (errors, target, unit). Lane lines and edges skip the frames where a line is within 0.1 m of the
  ego: which lane the ego is in is a coin toss there (the truth switches lanes when the line is at y = 0)."""
  e: dict[str, list] = {k: [] for k in ('ego lane lines 10-50 m', 'adjacent lane lines 10-50 m', 'road edges 10-50 m', 'lead distance',
                                       'lead lateral', 'lead prob without lead', 'lead speed (error/std)', 'ego speed', 'path curvature',
                                       'desire state wrong')}
  for i, r in enumerate(rs):
    tr, lines = r['truth'], truth_lines(r)
    # lane change under way: the ego drifts across its lane faster than 0.3 m/s (over 0.4 s, as the policy looks)
    if i >= 8:
      d = tr['road']['ego_offset'] - rs[i - 8]['truth']['road']['ego_offset']
      w = tr['road']['lane_width']
      rate = (d - w * np.round(d / w)) / (8 / 20)
      want = 'laneChangeRight' if rate > 0.3 else 'laneChangeLeft' if rate < -0.3 else 'none'
      e['desire state wrong'].append(float(r['desire_state'].argmax() != DESIRES[want]))
    if np.abs(lines[1:3, 0]).min() < 0.1: continue
    err = np.abs(r['lane_lines'][:, :, 0] - lines)[:, NEAR].max(1)
    e['ego lane lines 10-50 m'] += list(err[1:3])
    e['adjacent lane lines 10-50 m'] += [err[i] for i in (0, 3) if tr['road']['lane_lines'][i]['present']]
    edges = np.array([x['y'] for x in tr['road']['road_edges']])
    e['road edges 10-50 m'] += list(np.abs(r['road_edges'][:, :, 0] - edges)[:, NEAR].max(1))
    lead = tr['lead']
    if lead['present'] and lead.get('in_ego_lane', True) and 10 <= lead['x'] <= 80:
      e['lead distance'].append(abs(r['lead'][0, 0, 0] - lead['x']) / lead['x'])
      e['lead lateral'].append(abs(r['lead'][0, 0, 1] - lead['y']))
      e['lead speed (error/std)'].append(abs(r['lead'][0, 0, 2] - lead['v']) / r['lead_std'][0, 0, 2])
    elif not lead['present']: e['lead prob without lead'].append(r['lead_prob'][0])
    e['ego speed'].append(abs(r['plan'][0, PLAN['velocity']][0] - tr['v_ego']) / tr['v_ego'])
    if tr['road']['curvature']:
      v = r['plan'][0, PLAN['velocity']][0]
      yaw_rate = np.interp(5.0, T_IDXS, r['plan'][:, PLAN['orientationRate']][:, 2])
      e['path curvature'].append(abs(yaw_rate / v - tr['road']['curvature']) / tr['road']['curvature'])
  targets = {'ego lane lines 10-50 m': (0.15, 'm'), 'adjacent lane lines 10-50 m': (0.15, 'm'), 'road edges 10-50 m': (0.25, 'm'),
             'lead distance': (0.10, 'rel'), 'lead lateral': (0.3, 'm'), 'lead prob without lead': (0.1, ''), 'lead speed (error/std)': (3.0, 'sigma'),
             'ego speed': (0.10, 'rel'), 'path curvature': (0.10, 'rel'), 'desire state wrong': (0.05, 'frames')}
  return {k: (np.array(v), *targets[k]) for k, v in e.items() if v}

def dm_errors(rs: list[dict]) -> dict[str, tuple[np.ndarray, float, str]]:
  e: dict[str, list] = {k: [] for k in ('face position', 'face yaw', 'face pitch', 'blink wrong', 'phone wrong', 'wheel side wrong')}
  for r in rs:
    d = r['truth']['driver']
    s = r['rhd' if d['wheel_on_right'] else 'lhd']
    f = d['face']
    e['face position'].append(np.hypot(*((s['face_position'] - f['position']) * (1440, 960))) / 1440)
    calib = r['truth']['calib']   # the orientation as openpilot's monitoring reads it: the scene's turn, negated, less the calibration
    pitch, yaw = face_pose(s['face_orientation'], s['face_position'], calib)
    e['face pitch'].append(abs(pitch + calib[1] + f['pitch']))
    e['face yaw'].append(abs(yaw + calib[2] + f['yaw']))
    e['blink wrong'].append(float((min(s['left_blink_prob'], s['right_blink_prob']) > 0.5) != d['eyes_closed']))
    e['phone wrong'].append(float((s['using_phone_prob'] > 0.5) != d['phone']))
    e['wheel side wrong'].append(float((r['wheel_on_right_prob'] > 0.5) != d['wheel_on_right']))
  targets = {'face position': (0.05, 'of width'), 'face yaw': (0.1, 'rad'), 'face pitch': (0.1, 'rad'), 'blink wrong': (0.05, 'frames'),
             'phone wrong': (0.05, 'frames'), 'wheel side wrong': (0.05, 'frames')}
  return {k: (np.array(v), *targets[k]) for k, v in e.items()}

def main() -> int:
  ap = argparse.ArgumentParser(description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--frames', type=int, default=0, help="frames per scene (default: the whole scene)")
  args = ap.parse_args()
  worst, times = (0.0, ''), {'road': [], 'driver': []}
  def report(scene: str, errs: dict):
    nonlocal worst
    for k, (v, target, unit) in errs.items():
      # fractions of frames wrong are judged as a rate, everything else per frame
      rel = v.mean() / target if unit == 'frames' else v.max() / target
      print(f"{scene:18s} {k:28s} n={len(v):3d} mean {v.mean():8.4f} p95 {np.percentile(v, 95):8.4f} max {v.max():8.4f} "
            f"target {target:g} {unit:8s} rel {rel:5.2f}")
      if rel > worst[0]: worst = (rel, f"{scene}: {k}")
  for name in ROAD_SCENES:
    sc = load_scene(name)
    n = min(args.frames or sc.n_frames, sc.n_frames)
    # judged from frame FRAME_SKIP on: before it the model's older image is the zeros a camera session starts from
    report(name, road_errors(rs := run_road(sc, range(FRAME_SKIP, n))))
    times['road'] += [r['run_time'] for r in rs]
  for name in DM_SCENES:
    sc = load_scene(name)
    report(name, dm_errors(rs := run_dm(sc, range(min(args.frames or sc.n_frames, sc.n_frames)))))
    times['driver'] += [r['run_time'] for r in rs]
  for k, ts in times.items():
    print(f"{k} frame median {np.median(ts) * 1e3:6.2f} ms (n={len(ts)}: the runner's warps, model replays and output copy)")
  print(f"worst relative error (error / target): {worst[0]:.2f} ({worst[1]})")
  return 0

if __name__ == '__main__': sys.exit(main())
