#!/usr/bin/env python3
"""Route replay benchmark: an openpilot route through camerad --lockstep and both daemons, against bare model replays.

On a route of a shipped synthetic scene (1928x1208 HEVC); the last line is the lockstep rate over the slower bare
replay's rate (1.0: replay costs nothing beyond the models). docs/PERFORMANCE.md says what each side covers.
usage: bench/replay.py [--frames 200] [--scene straight]"""
import argparse, os, pathlib, re, subprocess, sys, tempfile, time, uuid
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
os.environ.setdefault('DEV', 'CPU')
os.environ['OPENPILOT_PREFIX'] = f"bench{uuid.uuid4().hex[:8]}"
from routes import bare_rates, write_route

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
