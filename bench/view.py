#!/usr/bin/env python3
"""modeld-view's CPU cost live, at 20 Hz with three cameras (the demo's 1928x1208 scene served by this process, with
outputs from its truth), per picture mode, the modes interleaved over --rounds: its CPU and its rerun server's as
fractions of a core, the share of frames it logged (a viewer that cannot keep up skips some), its CPU per frame and what
every frame takes; last, the default (NV12 decimated) against the others, per frame.   usage: bench/view.py [--seconds 8]"""
import argparse, os, pathlib, re, signal, subprocess, sys, time, uuid
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
import numpy as np
from bench.daemons import pace, proc_stats
os.environ['OPENPILOT_PREFIX'] = f"benchview{uuid.uuid4().hex[:8]}"   # after bench.daemons, which sets its own
from camerad.render import SceneRenderer
from camerad.scene import parse_scene
from cereal import messaging
from cereal.services import CAMERAS
from modeld_tools.demo import DEMO_SCENE
from modelrt.constants import T_IDXS, X_IDXS
from msgq import remove_stack
from msgq.visionipc import NV12Layout
from tests.daemon_harness import Camera

DEFAULT = 'NV12, 642 wide (default)'
MODES = {'raw RGB, full size': ['--width', '0', '--quality', '0'], 'JPEG q80, full size': ['--width', '0', '--quality', '80'],
         'JPEG q80, 640 wide (--quality 80)': ['--quality', '80'], DEFAULT: []}
SETTLE_S = 3

def outputs(pm: messaging.PubMaster, scene, fid: int) -> None:
  """modelV2 (lane lines, edges, plan, lead), driverStateV2 and driverMonitoringState of the frame, from the truth."""
  t = scene.truth(fid % scene.n_frames)
  m = messaging.new_message('modelV2')
  md = m.modelV2
  md.frameId = md.frameIdExtra = fid
  for dst, src in ((md.init('laneLines', 4), t['road']['lane_lines']), (md.init('roadEdges', 2), t['road']['road_edges'])):
    for l, s in zip(dst, src): l.x, l.y, l.z = X_IDXS.tolist(), s['y'], [scene.height] * len(X_IDXS)
  md.laneLineProbs = [0.4, 0.95, 0.95, 0.4]
  md.position.x, md.position.y, md.position.z = (T_IDXS * t['v_ego']).tolist(), [0.] * len(T_IDXS), [0.] * len(T_IDXS)
  md.meta.desireState = [1.] + [0.] * 7
  if t['lead']['present']:
    lead = md.init('leadsV3', 3)[0]
    lead.prob, lead.x, lead.y, lead.v = 0.9, [t['lead']['x']] * 6, [t['lead']['y']] * 6, [t['lead']['v']] * 6
  pm.send('modelV2', m)
  m = messaging.new_message('driverStateV2')
  ds = m.driverStateV2
  ds.frameId = fid
  for dd in (ds.leftDriverData, ds.rightDriverData):
    dd.facePosition, dd.faceProb, dd.leftEyeProb, dd.rightEyeProb = t['driver']['face'].get('position', [0., 0.]), 0.97, 0.9, 0.9
  pm.send('driverStateV2', m)
  pm.send('driverMonitoringState', messaging.new_message('driverMonitoringState'))

def run(mode: list[str], cam: Camera, pm, scene, seconds: float) -> tuple[float, float, float]:
  """(modeld-view's CPU, rerun server's CPU, the share of the frames sent it logged) while the stack runs at 20 Hz."""
  view = subprocess.Popen([sys.executable, '-m', 'modeld_tools.view', '--live', '--web', '--port', '0', '--web-port', '0', *mode],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  try:
    assert 'web viewer' in view.stdout.readline()
    server = int(open(f'/proc/{view.pid}/task/{view.pid}/children').read().split()[0])
    t0, n = time.monotonic_ns(), int((SETTLE_S + seconds) * 20)
    for i in range(1, n + 1):
      pace(t0, i)
      cam.send(i)
      outputs(pm, scene, i)
      if i % 5 == 0:
        (c := messaging.new_message('liveCalibration')).liveCalibration.rpyCalib = list(scene.calib)
        pm.send('liveCalibration', c)
      if i == SETTLE_S * 20: cpu0, tc = (proc_stats(view.pid)[0], proc_stats(server)[0]), time.monotonic()
    cpu = ((proc_stats(view.pid)[0] - cpu0[0]) / (dt := time.monotonic() - tc), (proc_stats(server)[0] - cpu0[1]) / dt)
  finally:
    view.send_signal(signal.SIGINT)
    out = view.communicate(timeout=30)[0]
  return *cpu, int(re.search(r"(\d+) pictures", out).group(1)) / (3 * n)

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--seconds', type=float, default=8., help='measured seconds per mode and round (after 3 s of settling)')
  ap.add_argument('--rounds', type=int, default=2, help='rounds of all the modes, one after the other (default: 2)')
  args = ap.parse_args()
  scene = parse_scene(DEMO_SCENE, 'demo')
  layouts = {c: NV12Layout.packed(scene.cameras[c].width, scene.cameras[c].height) for c in ('road', 'wide', 'driver')}
  cam = Camera({CAMERAS[c].stream: l for c, l in layouts.items()}, sensor=scene.sensor)
  for c, l in layouts.items(): cam.images[CAMERAS[c].stream] = np.array(SceneRenderer(scene, c, l).render(60))
  pm = messaging.PubMaster(['modelV2', 'driverStateV2', 'driverMonitoringState', 'liveCalibration'])
  print(f"modeld-view --live --web, 20 Hz, road + wide + driver at {layouts['road'].width}x{layouts['road'].height}, {args.seconds:g} s per mode, "
        f"{args.rounds} rounds; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
  res: dict[str, list] = {name: [] for name in MODES}
  try:
    for r in range(args.rounds):
      for name, mode in MODES.items():
        res[name].append(v_s_pics := run(mode, cam, pm, scene, args.seconds))
        print(f"  round {r + 1}: {name:26s} " + row(*v_s_pics), flush=True)
  finally:
    cam.close()
    pm.close()
    remove_stack()   # this run's sockets
  print(f"load average {os.getloadavg()[0]:.2f}; over the {args.rounds} rounds:")
  mean = {name: np.mean(rs, 0) for name, rs in res.items()}
  for name, m in mean.items(): print(f"  {name:35s} " + row(*m))
  per_frame = {name: v / pics for name, (v, _, pics) in mean.items()}
  print('ratios, modeld-view\'s CPU per frame logged: ' + ', '.join(f"default / {name} = {per_frame[DEFAULT] / c:.2f}"
                                                                    for name, c in per_frame.items() if name != DEFAULT))

def row(v: float, s: float, pics: float) -> str:
  return (f"modeld-view {v:5.2f} core, rerun's server {s:5.2f} core; {pics * 100:3.0f} % of the frames logged, "
          f"{v / (pics * 60) * 1e3:5.1f} ms of CPU per frame: {v / pics:4.2f} core for all")

if __name__ == '__main__':
  main()
