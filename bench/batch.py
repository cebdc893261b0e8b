#!/usr/bin/env python3
"""Batch benchmark, in three parts (ratios compare numbers of one run; docs/PERFORMANCE.md, docs/BATCH.md): workers,
modeld-batch with 1 then 2 workers; models, the real-size models on N frames at once against one at a time and
onnxruntime at N, interleaved; frames, modeld-batch --batch-frames N on one worker with the real-size models.

usage: bench/batch.py [--parts workers,models,frames] [--batches 2,4,8] [--routes 3] [--segments 2] [--frames 40]"""
import argparse, json, os, pathlib, subprocess, sys, tempfile, time
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
os.environ.setdefault('DEV', 'CPU')
import numpy as np
from routes import bare_rates, write_route

CACHE = REPO / '.cache' / 'bench-batch'

def run_batch(routes: list[pathlib.Path], art: pathlib.Path, out: pathlib.Path, workers: int, *extra: str) -> dict:
  """The job's summary (its times: wall_s, ray_s, start_s, job_s)."""
  r = subprocess.run([sys.executable, '-m', 'modeld_batch', *map(str, routes), '--artifacts', str(art), '--out', str(out), '--workers', str(workers),
                      *extra, '--quiet'], cwd=REPO, capture_output=True, text=True, env={**os.environ, 'RAY_AUTH_MODE': 'disabled'})
  if r.returncode != 0: sys.exit(f"modeld-batch failed ({r.returncode}):\n{r.stderr[-2000:]}")
  return json.loads((out / 'summary.json').read_text())

def median_run(ss: list[dict]) -> dict: return sorted(ss, key=lambda s: s['job_s'])[len(ss) // 2]
def times(ss: list[dict]) -> str: return ', '.join(f"{s['job_s']:.1f}" for s in ss)

def workers(args) -> None:
  """modeld-batch with 1 worker, then 2, alternating --repeats times each (the median counts), the reference models."""
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
      s = median_run(ss)
      frames, busy = sum(r['frames'] for r in s['routes']), sum(r['wall_s'] for r in s['routes'])
      rates[w], whole[w] = n / s['job_s'] * 60, n / s['wall_s'] * 60
      print(f"{w} worker{'s' if w > 1 else ''}: {rates[w]:.1f} segments/min ({n} segments in {s['job_s']:.1f} s, after Ray's start-up "
            f"{s['ray_s']:.1f} s and the workers' {s['start_s']:.1f} s; {s['wall_s']:.1f} s in all), {frames / busy:.1f} frames/s per worker; "
            f"median of {len(ss)} runs ({times(ss)} s)")
    print(f"bare replays in this process: modeld {bare['modeld']:.1f} frames/s, dmonitoringd {bare['dmonitoringd']:.1f} frames/s, "
          f"both in turn {1 / (1 / bare['modeld'] + 1 / bare['dmonitoringd']):.1f} frames/s")
  print(f"segments/min, 2 workers / 1 worker: {rates[2] / rates[1]:.2f} (target >= 1.7 on 2 cores); "
        f"over the whole runs, start-ups included: {whole[2] / whole[1]:.2f}")

# ***** the real-size models on N frames at once *****

def onnx_batched(src: pathlib.Path, n: int) -> pathlib.Path:
  """src's model with a batch of n: its inputs' and output's first axis n, and a Reshape to a shape of one row (as an
  export writes it) to n rows; what onnxruntime runs at n."""
  import onnx
  m = onnx.load(src)
  for v in (*m.graph.input, *m.graph.output): v.type.tensor_type.shape.dim[0].dim_value = n
  shapes = {node.input[1] for node in m.graph.node if node.op_type == 'Reshape'}
  for t in m.graph.initializer:
    if t.name in shapes and (a := onnx.numpy_helper.to_array(t)).size and a[0] == 1:
      t.CopyFrom(onnx.numpy_helper.from_array(np.concatenate([[n], a[1:]]).astype(a.dtype), t.name))
  onnx.save(m, out := src.with_name(f"{src.stem}_b{n}.onnx"))
  return out

def realsize_artifacts(batches: list[int], layout) -> tuple[pathlib.Path, dict[str, pathlib.Path]]:
  """Both families of the real-size models (bench/runtime.py's networks), the default build with these batches, for
  this layout; and the ONNX files, by model."""
  from runtime import realsize_vision_onnx, realsize_dm_onnx
  from tests.onnx_models import policy_onnx
  from modelrt.onnx_import import load_onnx
  from modelrt.compile import build_family
  (src := CACHE / 'onnx').mkdir(parents=True, exist_ok=True)
  onnx = {'vision': realsize_vision_onnx(src / 'vision.onnx')[0], 'policy': policy_onnx(src / 'policy.onnx', dense=True),
          'dm': realsize_dm_onnx(src / 'dm.onnx')[0]}
  for family, models in (('road', ('vision', 'policy')), ('dm', ('dm',))):
    t = time.perf_counter()
    _, built = build_family(CACHE / 'art', family, {k: load_onnx(onnx[k], k) for k in models}, [layout], batches=tuple(batches))
    print(f"real-size {family} artifact with batches {batches}: {'built in' if built else 'up to date,'} {time.perf_counter() - t:.1f} s")
  return CACHE / 'art', onnx

def models(args) -> None:
  """Each family's models on n frames at once (one batched replay of each), interleaved with the same at one frame and
  with onnxruntime (1 thread) on the same models rewritten for n; frames/s per core from the p50s."""
  from tinygrad import Tensor
  from msgq.visionipc.layout import NV12Layout
  from modelrt.artifact import load_artifact
  from modelrt.contracts import FAMILY_MODELS
  from runtime import interleaved, ort_session, pct
  art_dir, onnx = realsize_artifacts(args.batches, NV12Layout.packed(1928, 1208))
  ns, rng, per_frame = [1, *args.batches], np.random.default_rng(0), {}
  for family in ('road', 'dm'):
    art, fns = load_artifact(art_dir, family), {}
    for n in ns:
      replays, feeds, sessions = {}, {}, {}
      for k in FAMILY_MODELS[family]:
        sessions[k] = sess = ort_session(onnx[k] if n == 1 else onnx_batched(onnx[k], n))
        feeds[k] = {i.name: (rng.integers(0, 256, i.shape, dtype=np.uint8) if 'int8' in i.type else rng.standard_normal(i.shape).astype(np.float32))
                    for i in sess.get_inputs()}
        replays[k] = g = art.load_batch(k, n)
        inputs = {name: Tensor(feeds[k][name], device=g.inputs[name].device).realize() for name in g.inputs}
        want = sess.run(None, feeds[k])[0].reshape(-1)
        err = float(np.abs(g.run(inputs) - want).max() / np.abs(want).max())
        print(f"{k} at {n}: max |diff| to onnxruntime at {n} {err:.1e} of its largest output ({'within' if err <= 1e-4 else 'NOT within'} 1e-4)")
        replays[k] = (g, inputs)
      fns[f'tinygrad {n}'] = lambda rs=replays: [g.run(i) for g, i in rs.values()]
      fns[f'onnxruntime {n}'] = lambda ss=sessions, fs=feeds: [s.run(None, fs[k]) for k, s in ss.items()]
    ts = interleaved(fns, blocks=args.rounds, per_block=3)
    print(f"{family} ({' + '.join(FAMILY_MODELS[family])}), one thread, interleaved; load average {os.getloadavg()[0]:.2f}:")
    for n in ns:
      for who in ('tinygrad', 'onnxruntime'):
        per_frame[family, who, n] = t = pct(ts[f'{who} {n}'], 50) / n
        print(f"  {who:11s} N={n}: p50 {pct(ts[f'{who} {n}'], 50) * 1e3:8.2f} ms a batch, {t * 1e3:7.2f} ms a frame, {1 / t:6.1f} frames/s per core")
  print(f"both families (a frame: vision + policy + driver monitoring), frames/s per core; load average {os.getloadavg()[0]:.2f}:")
  def rate(who: str, n: int) -> float: return 1 / (per_frame['road', who, n] + per_frame['dm', who, n])
  for n in ns:
    print(f"  N={n}: tinygrad {rate('tinygrad', n):6.1f} ({rate('tinygrad', n) / rate('tinygrad', 1):.2f}x one at a time), "
          f"onnxruntime at N={n} {rate('onnxruntime', n):6.1f}: tinygrad / onnxruntime {rate('tinygrad', n) / rate('onnxruntime', n):.2f}")
  if (top := ns[-1]) > 1:
    r = rate('tinygrad', top) / rate('tinygrad', 1)
    print(f"models, N={top} / N=1 frames/s per core: {r:.2f} (target >= 2.5: {'met' if r >= 2.5 else 'NOT met'})")

def frames(args) -> None:
  """modeld-batch --batch-frames N on one worker (one core) over the same routes, N = 1 and each batch, the real-size
  models; each setting --repeats times in turn, the median counts. Frames/s per core: frames over the segments' time."""
  from msgq.visionipc.layout import NV12Layout
  art, _ = realsize_artifacts(args.batches, NV12Layout.packed(1928, 1208))
  ns = [1, *args.batches]
  with tempfile.TemporaryDirectory() as d:
    d = pathlib.Path(d)
    routes = [d / f"route{i}" for i in range(max(ns) // args.segments + 1)]
    for r in routes: write_route(r, 'straight', args.frames, args.segments)
    runs: dict[int, list[dict]] = {n: [] for n in ns}
    for i in range(args.repeats):
      for n in ns: runs[n].append(run_batch(routes, art, d / f"out{n}-{i}", 1, '--batch-frames', str(n)))
    rate = {}
    for n, ss in runs.items():
      s = median_run(ss)
      rate[n] = sum(r['frames'] for r in s['routes']) / s['job_s']
      print(f"--batch-frames {n}: {rate[n]:.2f} frames/s per core ({sum(r['frames'] for r in s['routes'])} frames of "
            f"{len(routes) * args.segments} segments in {s['job_s']:.1f} s on one worker; runs {times(ss)} s), "
            f"{rate[n] / rate[1]:.2f}x --batch-frames 1")
  print(f"modeld-batch, --batch-frames {ns[-1]} / 1 frames/s per core: {rate[ns[-1]] / rate[1]:.2f} (target >= 2.5: "
        f"{'met' if rate[ns[-1]] / rate[1] >= 2.5 else 'NOT met'}); load average {os.getloadavg()[0]:.2f}")

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--parts', default='workers,models,frames', help="comma list of: workers, models, frames (default: all)")
  ap.add_argument('--batches', default='2,4,8', help="frames at once to measure besides one (default 2,4,8)")
  ap.add_argument('--routes', type=int, default=3, help="workers: routes")
  ap.add_argument('--segments', type=int, default=2, help="segments per route")
  ap.add_argument('--frames', type=int, default=40, help='frames per segment')
  ap.add_argument('--repeats', type=int, default=3, help='runs of each modeld-batch setting, in turn (the median counts)')
  ap.add_argument('--rounds', type=int, default=4, help="models: interleaved rounds")
  args = ap.parse_args()
  args.batches = sorted({int(n) for n in args.batches.split(',')} - {1})
  print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
  for part in args.parts.split(','): {'workers': workers, 'models': models, 'frames': frames}[part](args)

if __name__ == '__main__':
  main()
