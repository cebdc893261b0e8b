"""Weight-only work happens once, at build time: a captured JIT keeps only the calls its inputs feed, and the artifact
stores what the others computed (modelrt/weights.py)."""
import json
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit
from tinygrad.helpers import Context
from modelrt import weights
from modelrt.artifact import load_verified, sha256_file
from modelrt.compile import InputPlan, build_jit

WINO_BYTES = 16 * 16 * 36 * 4   # the weight's Winograd transform (6x6 taps)

@pytest.fixture
def shared_weight():
  """A weight used twice: a stride-2 convolution (direct), then a Winograd one. tinygrad's own prune keeps the weight as
  'needed' once the first reads it, so the transform of the second ran on every replay."""
  w = Tensor(np.random.default_rng(0).standard_normal((16, 16, 3, 3)).astype(np.float32) / 12).realize()
  def fn(x: Tensor) -> Tensor:
    y = x.conv2d(w, stride=2, padding=1).relu()
    with Context(WINO=1): return y.conv2d(w, padding=1).relu().contiguous().realize()
  return fn

def test_tinygrads_own_prune_leaves_a_weight_transform_in_every_replay(shared_weight):
  """What the build fixes, shown on tinygrad's capture: weight_only names the transform a replay would run."""
  jit, x = TinyJit(shared_weight, prune=True), Tensor.ones(1, 16, 32, 64).contiguous().realize()
  for _ in range(3): jit(x)
  assert len(weights.weight_only(jit.captured)) == 1, weights.weight_only(jit.captured)

def test_a_build_stores_the_transformed_weights_and_replays_only_what_its_inputs_feed(shared_weight, tmp_path):
  """build_jit captures with the data-flow prune: the loaded JIT runs no call on stored weights alone, its .bin holds
  the transformed weight, and its replays equal the eager function's."""
  entry = build_jit('m', shared_weight, [InputPlan('x', (1, 16, 32, 64), 'float32', 'device')], 'CPU', tmp_path)
  jit = load_verified(tmp_path, entry, {f: sha256_file(tmp_path / f) for f in (entry['file'], entry['weights'])}, 'rebuild')
  assert weights.weight_only(jit.captured) == []
  assert WINO_BYTES in [n for _, n in entry['buffers']], json.dumps(entry['buffers'])
  x = Tensor(np.random.default_rng(1).standard_normal((1, 16, 32, 64)).astype(np.float32)).realize()
  np.testing.assert_allclose(jit(x=x).numpy(), shared_weight(x).numpy(), rtol=1e-5, atol=1e-6)
