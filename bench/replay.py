#!/usr/bin/env python3
"""Route replay benchmark: an openpilot route through camerad --lockstep and both daemons, against bare model replays.

Writes a route of the shipped synthetic scene (road, wide road and driver at 1928x1208, HEVC, with its camera states,
EncodeIdx, carState and liveCalibration events) with the project's route writer, builds the reference artifact for its
buffers, then measures in one run:
- bare replays in this process: RoadRunner.run and DMRunner.run on host buffers (guard, warps, models, copy-out);
- the lockstep replay: `camerad --source ROUTE --lockstep` with modeld and dmonitoringd as real processes, frames/s
  from camerad's own count (HEVC decoding, buffer fills, messages, both daemons, the lockstep round trip).
The last line is the lockstep rate over the slower bare replay's rate (1.0: replay costs nothing beyond the models).

usage: bench/replay.py [--frames 200] [--scene straight]
"""
import argparse, os, pathlib, re, subprocess, sys, tempfile, time, uuid
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
os.environ.setdefault('DEV', 'CPU')
os.environ['OPENPILOT_PREFIX'] = f"bench{uuid.uuid4().hex[:8]}"
import numpy as np

def write_route(path: pathlib.Path, scene_name: str, frames: int) -> None:
  from camerad.render import SceneRenderer
  from camerad.scene import load_scene
  from cereal import messaging
  from cereal.services import CAMERAS
  from msgq.visionipc.layout import NV12Layout
  from oproute.video import KEYFRAME_FLAG, HevcWriter, picture
  from oproute.writer import RouteWriter
  scene, route = load_scene(scene_name), RouteWriter(path)
  route.open_segment(0)
  cams = {c: (r := SceneRenderer(scene, c, NV12Layout.packed(scene.cameras[c].width, scene.cameras[c].height)),
              HevcWriter(route.segment_dir(0) / CAMERAS[c].video, r.layout.width, r.layout.height)) for c in ('road', 'wide', 'driver')}
  t0 = time.monotonic_ns()
  def index(c: str, encoded) -> None:
    for e in encoded:
      msg = messaging.new_message(svc := CAMERAS[c].encode_idx, logMonoTime=e.timestamp_eof + 1)
      ei = getattr(msg, svc)
      ei.frameId, ei.type, ei.encodeId, ei.segmentNum, ei.segmentId, ei.segmentIdEncode = e.frame_id, 'fullHEVC', e.index, 0, e.index, e.index
      ei.timestampSof, ei.timestampEof, ei.len, ei.flags = e.timestamp_sof, e.timestamp_eof, e.size, KEYFRAME_FLAG if e.keyframe else 0
      route.write(0, svc, msg.to_bytes())
  for i in range(frames):
    t, truth = t0 + i * 50_000_000, scene.truth(i % scene.n_frames)
    cs = messaging.new_message('carState', logMonoTime=t)
    cs.carState.vEgo = cs.carState.vEgoRaw = truth['v_ego']
    route.write(0, 'carState', cs.to_bytes())
    if i % 5 == 0:
      cal = messaging.new_message('liveCalibration', logMonoTime=t)
      cal.liveCalibration.rpyCalib, cal.liveCalibration.calStatus = list(scene.calib), 'calibrated'
      route.write(0, 'liveCalibration', cal.to_bytes())
    for c, (r, w) in cams.items():
      st = messaging.new_message(CAMERAS[c].state, logMonoTime=t + 1)
      s = getattr(st, CAMERAS[c].state)
      s.frameId, s.timestampSof, s.timestampEof, s.sensor = i, t, t + 1, scene.sensor
      route.write(0, CAMERAS[c].state, st.to_bytes())
      index(c, w.write(picture(r.render(i % scene.n_frames), r.layout), i, t, t + 1))
  for c, (_, w) in cams.items(): index(c, w.close())
  route.close()

def bare_rates(art: pathlib.Path, layout, n: int = 40) -> dict[str, float]:
  """Frames/s of bare RoadRunner / DMRunner replays on host buffers (after warm-up)."""
  from msgq.visionipc import ROAD, WIDE_ROAD, DRIVER
  from modelrt.artifact import load_artifact
  from modelrt.runner import RoadRunner, DMRunner, HostBuf
  rng = np.random.default_rng(0)
  bufs = {s: [HostBuf(layout, rng.integers(0, 256, layout.size, dtype=np.uint8), s, i) for i in range(4)] for s in (ROAD, WIDE_ROAD, DRIVER)}
  road, dm = RoadRunner(load_artifact(art, 'road'), layout, layout), DMRunner(load_artifact(art, 'dm'), layout)
  road.set_transforms(np.eye(3), np.eye(3))
  road.warmup(), dm.warmup()
  desire, traffic, out = np.zeros(8, np.float32), np.array([1, 0], np.float32), {}
  for name, run in (('modeld', lambda i: road.run(bufs[ROAD][i % 4], bufs[WIDE_ROAD][i % 4], desire, traffic)),
                    ('dmonitoringd', lambda i: dm.run(bufs[DRIVER][i % 4], np.zeros(3, np.float32), np.eye(3)))):
    t = time.perf_counter()
    for i in range(n): run(i)
    out[name] = n / (time.perf_counter() - t)
  return out

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--frames', type=int, default=200)
  ap.add_argument('--scene', default='straight')
  args = ap.parse_args()
  from msgq.visionipc.layout import NV12Layout
  layout = NV12Layout.packed(1928, 1208)
  art = REPO / '.cache' / 'bench-replay'
  t = time.perf_counter()
  subprocess.run([sys.executable, '-m', 'modelrt.compile', '--reference', '--camera', str(layout), '--out', str(art), '--quiet'], check=True, cwd=REPO)
  print(f"reference artifact for {layout}: {time.perf_counter() - t:.1f} s (cached after the first build)")
  with tempfile.TemporaryDirectory() as d:
    route = pathlib.Path(d) / 'route'
    t = time.perf_counter()
    write_route(route, args.scene, args.frames)
    print(f"route of {args.frames} frames x 3 cameras written (render + HEVC encode): {time.perf_counter() - t:.1f} s")
    bare = bare_rates(art, layout)
    for k, v in bare.items(): print(f"bare replay {k}: {v:.1f} frames/s")
    env = {**os.environ, 'PARALLEL': '0'}
    daemons = [subprocess.Popen([sys.executable, '-m', m, '--artifacts', str(art)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for m in ('modeld', 'dmonitoringd')]
    try:
      r = subprocess.run([sys.executable, '-m', 'camerad', '--source', str(route), '--lockstep', '--lockstep-timeout', '120'], cwd=REPO,
                         env=env, capture_output=True, text=True)
    finally:
      for p in daemons:
        p.terminate()
        p.wait(20)
  m = re.search(r"served (\d+) frames in ([\d.]+) s", r.stderr)
  if r.returncode != 0 or m is None: sys.exit(f"camerad failed ({r.returncode}):\n{r.stderr[-2000:]}")
  lockstep = int(m.group(1)) / float(m.group(2))
  print(f"lockstep replay (camerad + modeld + dmonitoringd, {m.group(1)} frames): {lockstep:.1f} frames/s")
  print(f"lockstep replay / slower bare replay ({min(bare, key=bare.get)}): {lockstep / min(bare.values()):.2f}")

if __name__ == '__main__':
  main()
