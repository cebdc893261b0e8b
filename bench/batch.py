#!/usr/bin/env python3
"""Batch benchmark: modeld-batch on a local Ray with 1 worker, then 2, over the same routes of the shipped synthetic
scene, alternating, --repeats times each (the median counts): segments/min over the segments' time, the start-ups, each
worker's frames/s beside the bare replays of both models, and the 2-worker/1-worker ratio (docs/BATCH.md).

usage: bench/batch.py [--routes 3] [--segments 2] [--frames 40] [--repeats 3]"""
import argparse, json, os, pathlib, subprocess, sys, tempfile, time
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
os.environ.setdefault('DEV', 'CPU')
from routes import bare_rates, write_route

def run_batch(routes: list[pathlib.Path], art: pathlib.Path, out: pathlib.Path, workers: int) -> dict:
  """The job's summary (its times: wall_s, ray_s, start_s, job_s)."""
  r = subprocess.run([sys.executable, '-m', 'modeld_batch', *map(str, routes), '--artifacts', str(art), '--out', str(out), '--workers', str(workers),
                      '--quiet'], cwd=REPO, capture_output=True, text=True, env={**os.environ, 'RAY_AUTH_MODE': 'disabled'})
  if r.returncode != 0: sys.exit(f"modeld-batch failed ({r.returncode}):\n{r.stderr[-2000:]}")
  return json.loads((out / 'summary.json').read_text())

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--routes', type=int, default=3)
  ap.add_argument('--segments', type=int, default=2)
  ap.add_argument('--frames', type=int, default=40, help='frames per segment')
  ap.add_argument('--repeats', type=int, default=3, help='runs of each setting, alternating (the median counts)')
  args = ap.parse_args()
  from msgq.visionipc.layout import NV12Layout
  layout = NV12Layout.packed(1928, 1208)
  art = REPO / '.cache' / 'bench-replay'
  subprocess.run([sys.executable, '-m', 'modelrt.compile', '--reference', '--camera', str(layout), '--out', str(art), '--quiet'], check=True, cwd=REPO)
  with tempfile.TemporaryDirectory() as d:
    d = pathlib.Path(d)
    t = time.perf_counter()
    routes = [d / f"route{i}" for i in range(args.routes)]
    for r in routes: write_route(r, 'straight', args.frames, args.segments)
    n = args.routes * args.segments
    print(f"{args.routes} routes x {args.segments} segments x {args.frames} frames x 3 cameras written: {time.perf_counter() - t:.1f} s")
    bare = bare_rates(art, layout)
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for i in range(args.repeats):
      for w in runs: runs[w].append(run_batch(routes, art, d / f"out{w}-{i}", w))
    rates, whole = {}, {}
    for w, ss in runs.items():
      s = sorted(ss, key=lambda s: s['job_s'])[len(ss) // 2]   # the median run
      times = ', '.join(f"{x['job_s']:.1f}" for x in ss)
      frames, busy = sum(r['frames'] for r in s['routes']), sum(r['wall_s'] for r in s['routes'])
      rates[w], whole[w] = n / s['job_s'] * 60, n / s['wall_s'] * 60
      print(f"{w} worker{'s' if w > 1 else ''}: {rates[w]:.1f} segments/min ({n} segments in {s['job_s']:.1f} s, after Ray's start-up "
            f"{s['ray_s']:.1f} s and the workers' {s['start_s']:.1f} s; {s['wall_s']:.1f} s in all), {frames / busy:.1f} frames/s per worker; "
            f"median of {len(ss)} runs ({times} s)")
    print(f"bare replays in this process: modeld {bare['modeld']:.1f} frames/s, dmonitoringd {bare['dmonitoringd']:.1f} frames/s, "
          f"both in turn {1 / (1 / bare['modeld'] + 1 / bare['dmonitoringd']):.1f} frames/s")
  print(f"segments/min, 2 workers / 1 worker: {rates[2] / rates[1]:.2f} (target >= 1.7 on 2 cores); "
        f"over the whole runs, start-ups included: {whole[2] / whole[1]:.2f}")

if __name__ == '__main__':
  main()
