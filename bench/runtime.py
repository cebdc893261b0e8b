#!/usr/bin/env python3
"""Model runtime benchmark: artifact load, first frame, steady replay, guard overhead, and onnxruntime as the baseline.

Builds small ONNX models with openpilot v0.11.1's I/O and a few MB of weights (tests/onnx_models.py, dense) into a
temporary artifact for a 1928x1208 camera, then prints one measurement per line; the last line is tinygrad/onnxruntime for the same models.
Ratios only compare numbers measured in this run on this machine.
"""
import pathlib, subprocess, sys, tempfile, time
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / 'tests')]
import numpy as np

def ms(x: float) -> str: return f"{x * 1e3:.2f} ms"
def pct(ts, q) -> float: return float(np.percentile(ts, q))

def main() -> None:
  t0 = time.perf_counter()
  from tinygrad import Device
  Device[Device.DEFAULT]
  print(f"tinygrad import + {Device.DEFAULT} device start: {ms(time.perf_counter() - t0)} (once per process, before any model)")
  from onnx_models import vision_onnx, policy_onnx
  from msgq.visionipc.layout import NV12Layout
  from modelrt.onnx_import import load_onnx
  from modelrt.compile import build_family
  from modelrt.artifact import load_artifact
  from modelrt.runner import RoadRunner, HostBuf
  from modelrt.constants import DESIRE_LEN

  layout = NV12Layout.aligned(1928, 1208)
  with tempfile.TemporaryDirectory() as d:
    d = pathlib.Path(d)
    onnx = {'vision': vision_onnx(d / 'vision.onnx', dense=True), 'policy': policy_onnx(d / 'policy.onnx', dense=True)}
    t = time.perf_counter()
    build_family(d / 'art', 'road', {k: load_onnx(p, k) for k, p in onnx.items()}, [layout], progress=False)
    print(f"build road artifact ({layout}): {time.perf_counter() - t:.1f} s")

    # peak memory of a load, in a fresh process: reset the RSS high-water mark (Linux clear_refs 5) after the device start.
    # Baseline: the same two JITs as one plain in-band pickle (tinygrad's own format), loaded with pickle.load.
    import pickle
    a = load_artifact(d / 'art', 'road')
    (d / 'plain.pkl').write_bytes(pickle.dumps([a.models[k].jit for k in ('vision', 'policy')], protocol=5))
    del a
    def peak(load: str) -> tuple[float, float]:
      code = (f"import sys, pickle; sys.path.insert(0, {str(REPO)!r}); from tinygrad import Device; Device[Device.DEFAULT]; "
              f"from modelrt.artifact import load_artifact; import modelrt.runner; "
              f"kb = lambda k: int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith(k))); "
              f"open('/proc/self/clear_refs', 'w').write('5'); r0 = kb('VmRSS:'); "
              f"a = {load}; print((kb('VmHWM:') - r0) / 1024, (kb('VmRSS:') - r0) / 1024)")
      return tuple(map(float, subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.split()))
    (ours, kept), (plain, _) = peak(f"load_artifact({str(d / 'art')!r}, 'road')"), peak(f"pickle.load(open({str(d / 'plain.pkl')!r}, 'rb'))")
    model_mb = sum((d / 'art' / 'road' / f'{k}.bin').stat().st_size for k in ('vision', 'policy')) / 2**20
    print(f"loading vision + policy ({model_mb:.1f} MB of buffers): RSS +{kept:.1f} MB after, peak +{ours:.1f} MB; "
          f"plain pickle.load peak +{plain:.1f} MB; ratio {ours / plain:.2f}")

    t = time.perf_counter()
    runner = RoadRunner(load_artifact(d / 'art', 'road'), layout, None)
    t_load = time.perf_counter() - t
    print(f"artifact load (verify + unpickle, 2 warps + vision + policy): {ms(t_load)}")

    bufs = [HostBuf(layout, np.random.default_rng(i).integers(0, 256, layout.size, dtype=np.uint8), 0, i) for i in range(4)]
    desire, traffic = np.zeros(DESIRE_LEN, np.float32), np.array([1, 0], np.float32)
    s = np.array([[1928 / 512, 0, 0], [0, 1208 / 256, 0], [0, 0, 1]], np.float32)
    runner.set_transforms(s, s)
    t = time.perf_counter()
    runner.run(bufs[0], bufs[0], desire, traffic)
    t_first = time.perf_counter() - t
    print(f"first frame after load: {ms(t_first)}; load + first frame: {ms(t_load + t_first)}")

    ts = []
    for i in range(60):
      t = time.perf_counter()
      runner.run(bufs[i % 4], bufs[i % 4], desire, traffic)
      ts.append(time.perf_counter() - t)
    ts = ts[10:]
    print(f"steady frame (2 warps + vision + policy, guarded, copied out): p50 {ms(pct(ts, 50))}, p99 {ms(pct(ts, 99))}")

    # guard overhead as the runner pays it (warp: checks; models: checks + host copy) vs the bare replay + device sync,
    # interleaved so both see the same machine load
    dev = Device[runner.artifact.manifest['target']['device']]
    frame = runner.cameras.get(bufs[0], layout)
    cases = {'warp': (runner.warps['img'], {'queue': runner.queues['img'], 'frame': frame, 'transform': runner.transforms['img'][1]})}
    cases['vision'] = (runner.vision, {'img': runner.warps['img'].replay(**cases['warp'][1]),
                                       'big_img': runner.warps['big_img'].replay(queue=runner.queues['big_img'], frame=frame, transform=runner.transforms['big_img'][1])})
    cases['policy'] = (runner.policy, {'features_buffer': runner.features_buffer[1], 'desire_pulse': runner.desire_pulse[1],
                                       'traffic_convention': runner.traffic_convention[1]})
    med = {}
    for name, (g, kw) in cases.items():
      bare, guarded = [], []
      for _ in range(40):
        t = time.perf_counter(); g.jit(**kw); dev.synchronize(); bare.append(time.perf_counter() - t)
        t = time.perf_counter(); g.replay(**kw); g.copy_out() if name != 'warp' else dev.synchronize(); guarded.append(time.perf_counter() - t)
      med[name] = b, gd = pct(bare[5:], 50), pct(guarded[5:], 50)
      print(f"{name}: bare replay {ms(b)}, guarded {ms(gd)}, ratio {gd / b:.3f}")
    print(f"guarded/bare over the three JITs: {sum(g for _, g in med.values()) / sum(b for b, _ in med.values()):.3f} (target <= 1.05)")

    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    t_ort = 0.
    rng = np.random.default_rng(0)
    for name in ('vision', 'policy'):
      sess = ort.InferenceSession(str(onnx[name]), so)
      feed = {i.name: (rng.integers(0, 256, i.shape, dtype=np.uint8) if 'int8' in i.type else rng.standard_normal(i.shape).astype(np.float32))
              for i in sess.get_inputs()}
      for _ in range(5): sess.run(None, feed)
      ts = []
      for _ in range(40):
        t = time.perf_counter(); sess.run(None, feed); ts.append(time.perf_counter() - t)
      print(f"onnxruntime 1 thread {name}: p50 {ms(pct(ts, 50))}")
      t_ort += pct(ts, 50)
    print(f"tinygrad/onnxruntime (vision + policy, guarded, 1 core): {(med['vision'][1] + med['policy'][1]) / t_ort:.2f}")

if __name__ == '__main__': main()
