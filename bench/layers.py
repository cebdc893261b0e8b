#!/usr/bin/env python3
"""Winograd against direct, one 3x3 stride-1 conv + ReLU at a time (after a 1x1 conv), built as modeld-compile builds
it (ONNX's Conv, stored weights, the shape schedule, weight-only work run once at capture), both interleaved, per
batch. The rule it informs: WINOGRAD_MIN_PIXELS.

usage: bench/layers.py [--batches 1,8] [--rounds 5]"""
import argparse, os, pathlib, sys
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
os.environ.setdefault('DEV', 'CPU')
import numpy as np

# (channels, height, width): the real-size models' 3x3 stride-1 layers and their neighbours in size
LAYERS = [(8, 128, 256), (16, 128, 256), (64, 64, 128), (128, 64, 128), (64, 32, 64), (128, 32, 64), (256, 32, 64), (64, 24, 48),
          (64, 16, 32), (128, 16, 32), (256, 16, 32), (512, 8, 16), (256, 8, 16), (512, 4, 8)]

def layer(c: int, h: int, w: int, n: int, mode: str):
  """The layer's Replay and inputs, built with --winograd `mode` ('all' or 'off')."""
  from tinygrad import Tensor, TinyJit
  from modelrt import internals, weights
  from modelrt.artifact import cpu_features
  from modelrt.onnx_import import OPS, winograd
  from modelrt.replay import Replay, TensorSpec
  from modelrt.schedule import scheduled, vector_width
  rng = np.random.default_rng(c * h)
  def stored(a: np.ndarray) -> Tensor: return Tensor(a.transpose(1, 2, 3, 0).copy()).realize().permute(3, 0, 1, 2)   # output channels innermost
  w1, w3 = stored(rng.standard_normal((c, c, 1, 1)).astype(np.float32) / c), stored(rng.standard_normal((c, c, 3, 3)).astype(np.float32) / (3 * c))
  b = Tensor.zeros(c).contiguous().realize()
  def fn(x: Tensor) -> Tensor:
    y = OPS['Relu'](OPS['Conv'](x, w1, b, kernel_shape=[1, 1], strides=[1, 1]))
    return OPS['Relu'](OPS['Conv'](y, w3, b, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])).contiguous().realize()
  x = Tensor(rng.standard_normal((n, c, h, w)).astype(np.float32)).realize()
  jit = TinyJit(fn, prune=True)
  with winograd(mode), scheduled('CPU', vector_width(cpu_features())), \
       internals.wrapped('tinygrad.engine.jit', 'prune_linear', lambda real: weights.prune_linear):
    for _ in range(3): out = jit(x=x)
  assert not (once := weights.weight_only(jit.captured)), f"replays would transform weights: {once}"   # as modeld-compile refuses
  return Replay(f"{c}ch {h}x{w} {mode}", jit, [TensorSpec.of('x', x)]), {'x': x}, out.numpy()

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--batches', default='1,8', help="frames at once (default 1,8)")
  ap.add_argument('--rounds', type=int, default=5)
  args = ap.parse_args()
  from tinygrad.helpers import Context
  from runtime import interleaved, pct
  from modelrt.onnx_import import WINOGRAD_MIN_PIXELS
  print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; the rule: Winograd from {WINOGRAD_MIN_PIXELS} pixels a frame")
  with Context(PARALLEL=0):
    for n in map(int, args.batches.split(',')):
      for c, h, w in LAYERS:
        (gw, iw, ow), (gd, idd, od) = layer(c, h, w, n, 'all'), layer(c, h, w, n, 'off')
        assert np.allclose(ow, od, rtol=1e-4, atol=1e-4 * np.abs(od).max()), (c, h, w, np.abs(ow - od).max())
        ts = interleaved({'wino': lambda g=gw, i=iw: g.run(i), 'direct': lambda g=gd, i=idd: g.run(i)}, blocks=args.rounds, per_block=3)
        wino, direct = pct(ts['wino'], 50), pct(ts['direct'], 50)
        rule = 'winograd' if h * w >= WINOGRAD_MIN_PIXELS else 'direct'
        print(f"N={n} {c:3d}ch {h:3d}x{w:<3d}: Winograd {wino * 1e3:7.2f} ms, direct {direct * 1e3:7.2f} ms, Winograd / direct "
              f"{wino / direct:5.2f}; the rule takes {rule}{'' if (wino < direct) == (rule == 'winograd') else ' (the other was faster)'}; "
              f"load average {os.getloadavg()[0]:.2f}", flush=True)

if __name__ == '__main__':
  main()
