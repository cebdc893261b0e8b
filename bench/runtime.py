#!/usr/bin/env python3
"""Model runtime benchmark, in four parts; ratios only compare numbers measured in this run on this machine.

1. the small test models in a 1928x1208 artifact; 2. warps and reference models against their targets; 3. real-size
models (onnx, random weights) against onnxruntime, with a per-kernel profile; 4. a --reference build. docs/PERFORMANCE.md.
usage: bench/runtime.py [--beam 2] [--parts small,reference,realsize,build] [--threads 1,2,4,8]"""
import argparse, os, pathlib, subprocess, sys, tempfile, time
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
os.environ.setdefault('DEV', 'CPU')
import numpy as np

CACHE = REPO / '.cache'
TARGETS = {'road warps': 2.2e-3, 'reference vision': 4e-3}

def ms(x: float) -> str: return f"{x * 1e3:.2f} ms"
def pct(ts, q) -> float: return float(np.percentile(ts, q))

def interleaved(fns: dict, blocks: int = 6, per_block: int = 10) -> dict[str, list[float]]:
  """Seconds per call of each function, in alternating blocks (each block after a warm-up call) so all see the same
  machine load."""
  ts: dict[str, list[float]] = {k: [] for k in fns}
  for _ in range(blocks):
    for k, f in fns.items():
      f()
      for _ in range(per_block):
        t = time.perf_counter(); f(); ts[k].append(time.perf_counter() - t)
  return ts

def ort_session(path: pathlib.Path, threads: int = 1):
  import onnxruntime as ort
  so = ort.SessionOptions()
  so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
  return ort.InferenceSession(str(path), so)

def random_feed(sess, rng: np.random.Generator) -> dict[str, np.ndarray]:
  return {i.name: (rng.integers(0, 256, i.shape, dtype=np.uint8) if 'int8' in i.type else rng.standard_normal(i.shape).astype(np.float32))
          for i in sess.get_inputs()}

# ***** 1. the small test models *****

def small_models() -> None:
  from tinygrad import Device
  from tests.onnx_models import vision_onnx, policy_onnx
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

    # guard overhead as the runner pays it (warp: checks; models: checks + host copy) vs the bare replay (the same
    # launches without checks or copy) + device sync, interleaved so both see the same machine load
    dev = Device[runner.artifact.manifest['target']['device']]
    frame = runner.cameras.get(bufs[0], runner.warps['img'])
    cases = {'warp': (runner.warps['img'], {'queue': runner.queues['img'], 'frame': frame, 'transform': runner.transforms['img'][1]})}
    big = {'queue': runner.queues['big_img'], 'frame': frame, 'transform': runner.transforms['big_img'][1]}
    cases['vision'] = (runner.vision, {'img': runner.warps['img'].run(cases['warp'][1], copy=False), 'big_img': runner.warps['big_img'].run(big, copy=False)})
    cases['policy'] = (runner.policy, {'features_buffer': runner.features_buffer[1], 'desire_pulse': runner.desire_pulse[1],
                                       'traffic_convention': runner.traffic_convention[1]})
    med = {}
    for name, (g, kw) in cases.items():
      bare, guarded = [], []
      for _ in range(40):
        t = time.perf_counter(); g._launch(kw); dev.synchronize(); bare.append(time.perf_counter() - t)
        t = time.perf_counter(); g.run(kw, copy=name != 'warp'); dev.synchronize(); guarded.append(time.perf_counter() - t)
      med[name] = b, gd = pct(bare[5:], 50), pct(guarded[5:], 50)
      print(f"{name}: bare replay {ms(b)}, guarded {ms(gd)}, ratio {gd / b:.3f}")
    print(f"guarded/bare over the three JITs: {sum(g for _, g in med.values()) / sum(b for b, _ in med.values()):.3f} (target <= 1.05)")

    t_ort = 0.
    rng = np.random.default_rng(0)
    for name in ('vision', 'policy'):
      sess = ort_session(onnx[name])
      feed = random_feed(sess, rng)
      ts = interleaved({name: lambda sess=sess, feed=feed: sess.run(None, feed)}, blocks=4)[name]
      print(f"onnxruntime 1 thread {name}: p50 {ms(pct(ts, 50))}")
      t_ort += pct(ts, 50)
    print(f"tinygrad/onnxruntime (small test models: vision + policy, guarded, 1 core): {(med['vision'][1] + med['policy'][1]) / t_ort:.2f}")

# ***** 2. warps and reference models against the targets *****

def reference() -> None:
  from tinygrad import Device
  from tests.artifacts import build
  from msgq.visionipc.layout import NV12Layout
  from modelrt.artifact import load_artifact
  from modelrt.runner import RoadRunner, DMRunner, HostBuf
  from transformations.model import road_warp_matrix, dm_warp_matrix
  from transformations.camera import camera_for

  layout = NV12Layout.aligned(1928, 1208)
  t = time.perf_counter()
  art = build(CACHE / 'bench-reference', (layout,), models='reference')
  print(f"reference artifact (modeld-compile --reference, {layout}): {time.perf_counter() - t:.1f} s (cached when unchanged)")
  road, dm = RoadRunner(load_artifact(art, 'road'), layout, layout), DMRunner(load_artifact(art, 'dm'), layout)
  rng = np.random.default_rng(0)
  bufs = [HostBuf(layout, rng.integers(0, 256, layout.size, dtype=np.uint8), s, 0) for s in range(3)]
  road.set_transforms(road_warp_matrix((0.01, 0.02, -0.015), camera_for('ar0231', 'road', 1928, 1208)),
                      road_warp_matrix((0.01, 0.02, -0.015), camera_for('ar0231', 'wide', 1928, 1208), wide=True))
  road.warmup(), dm.warmup()
  dm.transform[0][:] = dm_warp_matrix(camera_for('ar0231', 'driver', 1928, 1208))
  dev = Device[road.artifact.manifest['target']['device']]
  frames = {k: road.cameras.get(b, road.warps[k]) for k, b in zip(('img', 'big_img'), bufs)}
  warp_in = {k: {'queue': road.queues[k], 'frame': frames[k], 'transform': road.transforms[k][1]} for k in road.warps}
  imgs = {k: road.warps[k].run(warp_in[k], copy=False) for k in road.warps}
  dframe = dm.cameras.get(bufs[2], dm.warp)
  dm_img = dm.warp.run({'frame': dframe, 'transform': dm.transform[1]}, copy=False)
  cases = {'road warp (img)': (road.warps['img'], warp_in['img']), 'wide road warp (big_img)': (road.warps['big_img'], warp_in['big_img']),
           'reference vision': (road.vision, imgs), 'reference policy': (road.policy, {'features_buffer': road.features_buffer[1],
           'desire_pulse': road.desire_pulse[1], 'traffic_convention': road.traffic_convention[1]}),
           'driver warp': (dm.warp, {'frame': dframe, 'transform': dm.transform[1]}), 'reference DM': (dm.model, {'input_img': dm_img, 'calib': dm.calib[1]})}
  p50 = {}
  print("guarded replay (modelrt.replay: checks, kernels, output copy) vs tinygrad's own replay of the same JIT, interleaved:")
  for name, (g, kw) in cases.items():
    # a warp's output stays on the device for the model; a model's is copied out
    out = (lambda g=g, kw=kw: (g.run(kw, copy=False), dev.synchronize())) if 'warp' in name else (lambda g=g, kw=kw: g.run(kw))
    ts = interleaved({'ours': out, 'tinygrad': lambda g=g, kw=kw: (g.jit(**kw), dev.synchronize())})
    p50[name] = pct(ts['ours'], 50)
    print(f"  {name:26s} p50 {ms(p50[name])}, p99 {ms(pct(ts['ours'], 99))}; tinygrad's replay p50 {ms(pct(ts['tinygrad'], 50))} "
          f"({pct(ts['tinygrad'], 50) / p50[name]:.1f}x)")
  warps = p50['road warp (img)'] + p50['wide road warp (big_img)']
  for what, got in (('road warps', warps), ('reference vision', p50['reference vision'])):
    print(f"{what}: p50 {ms(got)}{' together' if what == 'road warps' else ''} (target < {ms(TARGETS[what])}): "
          f"{'met' if got < TARGETS[what] else 'NOT met'}")

# ***** 3. real-size models *****

def _fc(nodes: list, weights: dict, x: str, name: str, n_in: int, n_out: int, rng, relu: bool = True) -> int:
  """A fully connected layer as PyTorch exports nn.Linear (Gemm, the weight (out, in) transposed); its FLOPs."""
  from onnx import helper
  weights[f'{name}_w'] = (rng.standard_normal((n_out, n_in)) * np.sqrt(2 / n_in)).astype(np.float32)
  nodes.append(helper.make_node('Gemm', [x, f'{name}_w'], [f'{name}_m' if relu else name], transB=1))
  if relu: nodes.append(helper.make_node('Relu', [f'{name}_m'], [name]))
  return 2 * n_in * n_out

def _convs(nodes: list, weights: dict, x: str, name: str, layers: list, h: int, w: int, rng) -> tuple[str, int, int, int, int]:
  """Conv + Relu layers (cin, cout, kernel, stride), He-initialised; (output, channels, height, width, FLOPs)."""
  from onnx import helper
  flops = 0
  for i, (cin, cout, k, s) in enumerate(layers):
    weights[f'{name}_w{i}'] = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (cin * k * k))).astype(np.float32)
    weights[f'{name}_b{i}'] = np.zeros(cout, np.float32)
    pad = (k - 1) // 2 if k % 2 else 0
    h, w = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
    nodes += [helper.make_node('Conv', [x, f'{name}_w{i}', f'{name}_b{i}'], [f'{name}_c{i}'], kernel_shape=[k, k], strides=[s, s], pads=[pad] * 4),
              helper.make_node('Relu', [f'{name}_c{i}'], [f'{name}_r{i}'])]
    x, flops = f'{name}_r{i}', flops + 2 * cin * k * k * cout * h * w
  return x, layers[-1][1], h, w, flops

# per camera image: (1, 12, 128, 256) -> (1, 512, 4, 8); both flattened into a 512-wide hidden layer, then the outputs
VISION_CONVS = [(12, 48, 3, 2), (48, 64, 3, 2), (64, 64, 3, 1), (64, 128, 3, 2), (128, 128, 3, 1), (128, 256, 3, 2), (256, 256, 3, 1),
                (256, 512, 3, 2), (512, 512, 3, 1)]
# the 1440x960 Y plane: a 4x4 patch stem, then stride-2 convolutions to (1, 256, 8, 12); with calib into a 256-wide layer
DM_CONVS = [(1, 16, 4, 4), (16, 32, 3, 2), (32, 64, 3, 2), (64, 128, 3, 2), (128, 256, 3, 2), (256, 256, 3, 2)]

def realsize_vision_onnx(path: pathlib.Path) -> tuple[pathlib.Path, int, int]:
  """The release's vision I/O and output_slices with a real-size network; (path, parameters, FLOPs a frame)."""
  from onnx import helper, TensorProto
  from tests.onnx_models import save_model, release_layout, KNOWN_SLICES
  from modelrt.contracts import ROAD_V0_11_1
  m, rng = ROAD_V0_11_1.vision, np.random.default_rng(0)
  slices, bias = release_layout(m, KNOWN_SLICES['vision'], {})
  nodes, weights, flops, feats = [], {'scale': np.array(1 / 255, np.float32)}, 0, []
  for k in ('img', 'big_img'):
    nodes += [helper.make_node('Cast', [k], [f'{k}_f'], to=TensorProto.FLOAT), helper.make_node('Mul', [f'{k}_f', 'scale'], [f'{k}_s'])]
    x, c, h, w, f = _convs(nodes, weights, f'{k}_s', k, VISION_CONVS, 128, 256, rng)
    nodes.append(helper.make_node('Flatten', [x], [f'{k}_flat']))
    feats.append(f'{k}_flat')
    flops += f
  nodes.append(helper.make_node('Concat', feats, ['feat'], axis=1))
  flops += _fc(nodes, weights, 'feat', 'hidden', 2 * c * h * w, 512, rng) + _fc(nodes, weights, 'hidden', 'taps', 512, bias.size, rng, relu=False)
  save_model(path, nodes, {k: (i.shape, i.dtype) for k, i in m.inputs.items()}, bias, weights, slices)
  return path, sum(v.size for v in weights.values()) + bias.size, flops

def realsize_dm_onnx(path: pathlib.Path) -> tuple[pathlib.Path, int, int]:
  """The release's driver-monitoring I/O and output_slices with a real-size network; (path, parameters, FLOPs)."""
  from onnx import helper, TensorProto
  from tests.onnx_models import save_model, release_layout, KNOWN_SLICES
  from modelrt.contracts import DM_V0_11_1
  m, rng = DM_V0_11_1.dm, np.random.default_rng(1)
  slices, bias = release_layout(m, KNOWN_SLICES['dm'], {})
  weights = {'scale': np.array(1 / 255, np.float32), 'shape': np.array([1, 1, 960, 1440], np.int64)}
  nodes = [helper.make_node('Cast', ['input_img'], ['img_f'], to=TensorProto.FLOAT), helper.make_node('Mul', ['img_f', 'scale'], ['img_s']),
           helper.make_node('Reshape', ['img_s', 'shape'], ['img'])]
  x, c, h, w, flops = _convs(nodes, weights, 'img', 'dm', DM_CONVS, 960, 1440, rng)
  nodes += [helper.make_node('Flatten', [x], ['flat']), helper.make_node('Cast', ['calib'], ['calib_f'], to=TensorProto.FLOAT),
            helper.make_node('Concat', ['flat', 'calib_f'], ['feat'], axis=1)]
  flops += _fc(nodes, weights, 'feat', 'hidden', c * h * w + 3, 256, rng) + _fc(nodes, weights, 'hidden', 'taps', 256, bias.size, rng, relu=False)
  save_model(path, nodes, {k: (i.shape, i.dtype) for k, i in m.inputs.items()}, bias, weights, slices)
  return path, sum(v.size for v in weights.values()) + bias.size, flops

def fma_peak(width: int, chains: int = 12) -> float:
  """One core's float32 FMA throughput in GFLOP/s: `chains` independent chains of `width`-lane FMAs, compiled with the
  clang and flags tinygrad's CPU kernels get (-O2 -march=native), the best of 7 timings."""
  import ctypes
  src = (f"typedef float v __attribute__((vector_size({width * 4})));\nfloat run(long n) {{\n"
         f"  v {', '.join(f'a{i} = (v){{}} + {i + 1}.0f' for i in range(chains))}, m = (v){{}} + 0.999f, c = (v){{}} + 0.001f;\n"
         f"  for (long i = 0; i < n; i++) {{ {' '.join(f'a{i} = a{i} * m + c;' for i in range(chains))} }}\n"
         f"  v s = {' + '.join(f'a{i}' for i in range(chains))};\n  float t = 0;\n  for (int i = 0; i < {width}; i++) t += s[i];\n  return t;\n}}\n")
  with tempfile.TemporaryDirectory() as d:
    (c := pathlib.Path(d) / 'fma.c').write_text(src)
    subprocess.run(['clang', '-O2', '-march=native', '-ffp-contract=fast', '-shared', '-fPIC', '-o', str(c.with_suffix('.so')), str(c)], check=True)
    lib = ctypes.CDLL(str(c.with_suffix('.so')))
  lib.run.argtypes, lib.run.restype = [ctypes.c_long], ctypes.c_float
  n, best = 2_000_000, float('inf')
  for _ in range(7):
    t = time.perf_counter()
    lib.run(n)
    best = min(best, time.perf_counter() - t)
  return n * chains * width * 2 / best / 1e9

# the real-size builds: (BEAM, --winograd, --schedule); 'tinygrad': its own kernel heuristics, the importer as now
BUILDS = {'tinygrad': (0, 'off', 'tinygrad'), 'default': (0, 'rule', 'shape'), 'best': (None, 'rule', 'shape')}

def cpu_line() -> str:
  """The CPU's model and the instruction-set features the shape schedule reads (modelrt.artifact.cpu_features)."""
  from modelrt.artifact import cpu_features
  model = next((l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith(('model name', 'Model'))), 'unknown')
  feats = cpu_features()
  isa = 'AVX-512' if 'avx512f' in feats else 'AVX2' if 'avx2' in feats else 'AVX' if 'avx' in feats else 'NEON' if 'asimd' in feats else 'SSE'
  vec = ', '.join(f for f in feats if f.startswith(('avx', 'fma', 'asimd', 'sve')))
  return f"CPU: {model}, {isa} ({vec}), {len(os.sched_getaffinity(0))} cores free to this process"

def realsize(beam: int, counts: list[int]) -> None:
  from tinygrad import Tensor
  from tests.onnx_models import policy_onnx
  from msgq.visionipc.layout import NV12Layout
  from modelrt.onnx_import import load_onnx
  from modelrt.compile import build_family
  from modelrt.artifact import load_artifact, cpu_features
  from modelrt.schedule import vector_width
  from modelrt.profile import kernel_profile, format_profile, format_thread_times

  width = vector_width(cpu_features())
  peak = fma_peak(width)
  mhz = next((float(l.split(':')[1]) for l in open('/proc/cpuinfo') if l.startswith('cpu MHz')), 0.)
  print(f"one core's FMA peak, measured: {peak:.1f} GFLOP/s ({width}-lane vectors"
        + (f"; {peak / mhz * 1e3:.1f} FLOP a cycle at the {mhz:.0f} MHz /proc/cpuinfo gives" if mhz else '') + ")")
  layout = NV12Layout.aligned(1928, 1208)
  (src := CACHE / 'bench-realsize' / 'onnx').mkdir(parents=True, exist_ok=True)
  models = {'vision': realsize_vision_onnx(src / 'vision.onnx'), 'dm': realsize_dm_onnx(src / 'dm.onnx')}
  for k, (_, params, flops) in models.items():
    print(f"real-size {k}: {params / 1e6:.1f} M parameters, {flops / 1e9:.2f} GFLOP a frame")
  families = {'road': {'vision': load_onnx(models['vision'][0], 'vision'), 'policy': load_onnx(policy_onnx(src / 'policy.onnx', dense=True), 'policy')},
              'dm': {'dm': load_onnx(models['dm'][0], 'dm')}}
  rng = np.random.default_rng(0)
  for family, model in (('road', 'vision'), ('dm', 'dm')):
    sess = ort_session(models[model][0])
    feed = random_feed(sess, rng)
    want = sess.run(None, feed)[0][0]
    runs, fns = {}, {}
    for name, (b, wino, schedule) in BUILDS.items():
      b = beam if b is None else b
      out = CACHE / 'bench-realsize' / f"{schedule}-beam{b}-winograd-{wino}"
      t = time.perf_counter()
      _, built = build_family(out, family, families[family], [layout], beam=b, winograd=wino, schedule=schedule)
      art = load_artifact(out, family)
      took = f"built now in {time.perf_counter() - t:.1f} s" if built else f"cached, built in {art.manifest.get('build_seconds', '?')} s"
      g = art.models[model]
      inputs = {k: Tensor(v, device=g.inputs[k].device).realize() for k, v in feed.items()}
      err = float(np.abs(g.run(inputs) - want).max() / np.abs(want).max())
      print(f"real-size {model} {name} (BEAM={b}, --winograd {wino}, --schedule {schedule}; {took}): max |diff| to onnxruntime "
            f"{err:.1e} of its largest output ({'within' if err <= 1e-4 else 'NOT within'} 1e-4)")
      runs[name] = g, inputs
      fns[name] = lambda g=g, inputs=inputs: g.run(inputs)
    for n in counts:   # the default build on n threads, each its own load (its own buffers), against onnxruntime on as many
      if n == 1: continue
      (g2 := load_artifact(CACHE / 'bench-realsize' / 'shape-beam0-winograd-rule', family).models[model]).threads = n
      fns[f'default, {n} threads'] = lambda g=g2, inputs=runs['default'][1]: g.run(inputs)
      np.testing.assert_array_equal(fns[f'default, {n} threads'](), fns['default']())   # bit for bit one thread's
      runs[f'default, {n} threads'] = g2, runs['default'][1]
    for n in counts:
      se = ort_session(models[model][0], n)
      fns[f'onnxruntime, {n} thread{"s" * (n > 1)}'] = lambda se=se, feed=feed: se.run(None, feed)
    ts = interleaved(fns, blocks=6, per_block=5)
    p50 = {k: pct(v, 50) for k, v in ts.items()}
    print(f"real-size {model}, guarded replay against onnxruntime, interleaved (p50 / p99):")
    for k, v in ts.items(): print(f"  {k:26s} {ms(p50[k])} / {ms(pct(v, 99))}")
    ort1 = p50['onnxruntime, 1 thread']
    for k, target in (('tinygrad', None), ('default', 3.0), ('best', 2.0 if model == 'vision' else None)):
      r = p50[k] / ort1
      print(f"  {k} / onnxruntime 1 thread: {r:.2f}" + (f" (target <= {target}: {'met' if r <= target else 'NOT met'})" if target else ''))
    for n in counts[1:]:
      mine, ort = p50[f'default, {n} threads'], p50[f'onnxruntime, {n} threads']
      met = f" (target <= 2.0: {'met' if mine / ort <= 2.0 else 'NOT met'})" if n == 8 else ''
      print(f"  {n} threads: default {mine / p50['default']:.2f} of its 1 thread (onnxruntime {ort / ort1:.2f} of its own); "
            f"default / onnxruntime at {n} threads: {mine / ort:.2f}{met}")
    if len(counts) > 1:
      g, inputs = runs[f'default, {counts[-1]} threads']
      print(f"real-size {model} default on {counts[-1]} threads: top 12 kernels, each thread's ms in its launches and the share of "
            f"the kernel's time the threads waited at its barrier (median of 10 replays):")
      print('\n'.join('  ' + l for l in format_thread_times([g.thread_times(inputs) for _ in range(10)], 12)))
    for name in ('tinygrad', 'default'):
      print(f"real-size {model} {name}: top 12 kernels (each launched alone, tinygrad's FLOP and byte estimates, fraction of the FMA peak):")
      print('\n'.join('  ' + l for l in format_profile(kernel_profile(runs[name][0].jit, runs[name][1], runs=3), 12, peak)))

def build_time() -> None:
  """modeld-compile --reference for the demo's two layouts, with an empty compile cache (a new CACHEDB)."""
  with tempfile.TemporaryDirectory() as d:
    t = time.perf_counter()
    subprocess.run([sys.executable, '-m', 'modelrt.compile', '--reference', '--camera', '1928x1208', '--camera', '1928x1208:aligned', '--out',
                    f'{d}/art', '--quiet'], check=True, cwd=REPO, env={**os.environ, 'CACHEDB': f'{d}/cache.db'}, stdout=subprocess.DEVNULL)
    took = time.perf_counter() - t
  print(f"modeld-compile --reference (both families, 2 layouts), empty compile cache: {took:.1f} s (target < 60 s: {'met' if took < 60 else 'NOT met'}); "
        f"load average {os.getloadavg()[0]:.2f}")

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--beam', type=int, default=2, help="BEAM width of the real-size builds (searched once per machine, then cached; default 2)")
  ap.add_argument('--parts', default='small,reference,realsize,build', help="comma list of: small, reference, realsize, build (default: all)")
  ap.add_argument('--threads', metavar='LIST', help="thread counts of the real-size runs, ours and onnxruntime's (default: 1, 2, 4, 8 up to "
                  "the cores free to this process)")
  args = ap.parse_args()
  t0 = time.perf_counter()
  from tinygrad import Device
  Device[Device.DEFAULT]
  print(f"tinygrad import + {Device.DEFAULT} device start: {ms(time.perf_counter() - t0)} (once per process, before any model); "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
  print(cpu_line())
  free = len(os.sched_getaffinity(0))
  counts = sorted({int(n) for n in args.threads.split(',')} | {1}) if args.threads else [n for n in (1, 2, 4, 8) if n <= free]
  parts = args.parts.split(',')
  if 'small' in parts: small_models()
  if 'reference' in parts: reference()
  if 'realsize' in parts: realsize(args.beam, counts)
  if 'build' in parts: build_time()

if __name__ == '__main__': main()
