"""The guarded JIT (modelrt.guard): each test shows the bare TinyJit behaviour the guard exists for, then the guard."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes
from modelrt.guard import GuardedJit, TensorSpec, InputSpecError
from modelrt.runner import aligned_empty, camera_tensor, host_tensor

N = 64

def make_jit():
  """frame (N,) uint8 from_blob + scale (1,) float32 host input -> (N//2,) float32."""
  @TinyJit
  def f(frame: Tensor, scale: Tensor) -> Tensor:
    return (frame[:N // 2].cast(dtypes.float32) * scale.to(frame.device)[0] + frame[N // 2:N].cast(dtypes.float32)).contiguous().realize()
  return f

def frame(n=N, seed=0):
  a = aligned_empty(n)
  a[:] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
  return a, camera_tensor(a.ctypes.data, n)

@pytest.fixture(scope='module')
def jit():
  f, keep = make_jit(), []
  scale = np.array([2.], np.float32)
  for i in range(3):   # run, capture, replay
    a, t = frame(seed=i)
    keep.append(a)
    f(frame=t, scale=host_tensor(scale))
  specs = [TensorSpec('frame', 'uint8', (N,), 'CPU', N, '32x2:32:64:96'), TensorSpec('scale', 'float32', (1,), 'NPY', 4)]
  return f, GuardedJit('tiny', f, specs), scale

def expected(a, s): return a[:N // 2].astype(np.float32) * s + a[N // 2:N]

def test_guard_runs_matching_inputs(jit):
  f, g, scale = jit
  a, t = frame(seed=7)
  np.testing.assert_array_equal(g(frame=t, scale=host_tensor(scale)), expected(a, 2.))

def test_1d_length_change_bare_jit_misses_it_guard_catches_it(jit):
  f, g, scale = jit
  a, t = frame(n=2 * N, seed=3)
  # the bare JIT replays a longer 1-D buffer silently (its signature has no length); a shorter one would read past the end
  out = f(frame=t, scale=host_tensor(scale)).numpy()
  np.testing.assert_array_equal(out, expected(a, 2.))
  with pytest.raises(InputSpecError, match=r"input 'frame': expected shape \(64,\), got \(128,\)"):
    g(frame=t, scale=host_tensor(scale))
  _, short = frame(n=N // 2, seed=4)
  with pytest.raises(InputSpecError, match="'frame'"): g(frame=short, scale=host_tensor(scale))

@pytest.mark.parametrize('bad, msg', [
  (lambda: Tensor(np.zeros(N, np.int8), device='CPU').realize(), r"expected dtype uint8, got int8"),
  (lambda: Tensor(np.zeros((2, N // 2), np.uint8), device='CPU').realize(), r"expected shape \(64,\), got \(2, 32\)"),
  (lambda: Tensor(np.zeros(N, np.uint8), device='NPY'), r"expected device CPU, got NPY"),
  (lambda: Tensor(np.zeros(2 * N, np.uint8), device='CPU').realize()[::2], r"expected a contiguous realized buffer"),
  (lambda: Tensor(np.zeros(2 * N, np.uint8), device='CPU').realize()[:N], r"expected a contiguous realized buffer"),
  (lambda: Tensor.zeros(N, dtype=dtypes.uint8, device='CPU'), r"expected a contiguous realized buffer"),
  (lambda: np.zeros(N, np.uint8), r"expected a Tensor"),
])
def test_guard_refuses(jit, bad, msg):
  f, g, scale = jit
  with pytest.raises(InputSpecError, match=msg): g(frame=bad(), scale=host_tensor(scale))

def test_guard_refuses_missing_and_extra_inputs(jit):
  f, g, scale = jit
  with pytest.raises(InputSpecError, match=r"expected inputs \['frame', 'scale'\], got \['frame'\]"): g(frame=frame()[1])
  with pytest.raises(InputSpecError, match=r"got \['extra', 'frame', 'scale'\]"):
    g(frame=frame()[1], scale=host_tensor(scale), extra=frame()[1])

def test_held_output_overwritten_by_next_replay_unless_copied(jit):
  f, g, scale = jit
  a1, t1 = frame(seed=11)
  a2, t2 = frame(seed=12)
  held = f(frame=t1, scale=host_tensor(scale))
  first = held.numpy().copy()
  f(frame=t2, scale=host_tensor(scale))
  assert not np.array_equal(held.numpy(), first)             # the bare JIT returns the same Tensor every replay: overwritten
  np.testing.assert_array_equal(held.numpy(), expected(a2, 2.))
  c1 = g(frame=t1, scale=host_tensor(scale))
  g(frame=t2, scale=host_tensor(scale))
  np.testing.assert_array_equal(c1, expected(a1, 2.))        # the guard's copy is not

def test_new_pointer_and_inplace_edits_are_seen(jit):
  f, g, scale = jit
  a1, t1 = frame(seed=21)
  a2, t2 = frame(seed=22)
  np.testing.assert_array_equal(g(frame=t1, scale=host_tensor(scale)), expected(a1, 2.))
  np.testing.assert_array_equal(g(frame=t2, scale=host_tensor(scale)), expected(a2, 2.))   # another buffer: its data
  a1[:] = 5                                                                                  # zero-copy: edits are seen
  s = host_tensor(scale)
  scale[0] = 3.
  np.testing.assert_array_equal(g(frame=t1, scale=s), expected(a1, 3.))
  scale[0] = 2.

def test_spec_json_round_trip():
  s = TensorSpec('frame', 'uint8', (N,), 'CPU', N, '32x2:32:64:96')
  assert TensorSpec.from_json(s.to_json()) == s
  t = Tensor(np.zeros((2, 3), np.float32), device='CPU').realize()
  assert TensorSpec.of('x', t) == TensorSpec('x', 'float32', (2, 3), 'CPU', 24)
