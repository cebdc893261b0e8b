"""modelrt.replay: each check shows the bare TinyJit behaviour the replay's checks exist for, then the checks; the kernels
launched with bound arguments give the JIT's outputs bit for bit, on one thread or several."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes
from modelrt.replay import InputSpecError, Replay, TensorSpec, camera_tensor
from modelrt.runner import aligned_empty, host_tensor

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
  return f, Replay('tiny', f, specs), scale

def expected(a, s): return a[:N // 2].astype(np.float32) * s + a[N // 2:N]

def test_guard_runs_matching_inputs(jit):
  f, g, scale = jit
  a, t = frame(seed=7)
  np.testing.assert_array_equal(g.run(dict(frame=t, scale=host_tensor(scale))), expected(a, 2.))

def test_1d_length_change_bare_jit_misses_it_guard_catches_it(jit):
  f, g, scale = jit
  a, t = frame(n=2 * N, seed=3)
  # the bare JIT replays a longer 1-D buffer silently (its signature has no length); a shorter one would read past the end
  out = f(frame=t, scale=host_tensor(scale)).numpy()
  np.testing.assert_array_equal(out, expected(a, 2.))
  with pytest.raises(InputSpecError, match=r"input 'frame': expected shape \(64,\), got \(128,\)"):
    g.run(dict(frame=t, scale=host_tensor(scale)))
  _, short = frame(n=N // 2, seed=4)
  with pytest.raises(InputSpecError, match="'frame'"): g.run(dict(frame=short, scale=host_tensor(scale)))

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
  with pytest.raises(InputSpecError, match=msg): g.run(dict(frame=bad(), scale=host_tensor(scale)))

def test_guard_refuses_missing_and_extra_inputs(jit):
  f, g, scale = jit
  with pytest.raises(InputSpecError, match=r"expected inputs \['frame', 'scale'\], got \['frame'\]"): g.run(dict(frame=frame()[1]))
  with pytest.raises(InputSpecError, match=r"got \['extra', 'frame', 'scale'\]"):
    g.run(dict(frame=frame()[1], scale=host_tensor(scale), extra=frame()[1]))

def test_held_output_overwritten_by_next_replay_unless_copied(jit):
  f, g, scale = jit
  a1, t1 = frame(seed=11)
  a2, t2 = frame(seed=12)
  held = f(frame=t1, scale=host_tensor(scale))
  first = held.numpy().copy()
  f(frame=t2, scale=host_tensor(scale))
  assert not np.array_equal(held.numpy(), first)             # the bare JIT returns the same Tensor every replay: overwritten
  np.testing.assert_array_equal(held.numpy(), expected(a2, 2.))
  c1 = g.run(dict(frame=t1, scale=host_tensor(scale)))
  g.run(dict(frame=t2, scale=host_tensor(scale)))
  np.testing.assert_array_equal(c1, expected(a1, 2.))        # the guard's copy is not

def test_new_pointer_and_inplace_edits_are_seen(jit):
  f, g, scale = jit
  a1, t1 = frame(seed=21)
  a2, t2 = frame(seed=22)
  np.testing.assert_array_equal(g.run(dict(frame=t1, scale=host_tensor(scale))), expected(a1, 2.))
  np.testing.assert_array_equal(g.run(dict(frame=t2, scale=host_tensor(scale))), expected(a2, 2.))   # another buffer: its data
  a1[:] = 5                                                                                  # zero-copy: edits are seen
  s = host_tensor(scale)
  scale[0] = 3.
  np.testing.assert_array_equal(g.run(dict(frame=t1, scale=s)), expected(a1, 3.))
  scale[0] = 2.

def test_spec_json_round_trip():
  s = TensorSpec('frame', 'uint8', (N,), 'CPU', N, '32x2:32:64:96')
  assert TensorSpec.from_json(s.to_json()) == s
  t = Tensor(np.zeros((2, 3), np.float32), device='CPU').realize()
  assert TensorSpec.of('x', t) == TensorSpec('x', 'float32', (2, 3), 'CPU', 24)

def test_bound_launches_match_the_jit_with_changing_pointers_and_host_inputs():
  # a camera-like from_blob input (a new pointer each frame), a host (NPY) input written in place, device state the
  # JIT updates in place, a multi-kernel body with a reduction
  state = Tensor.zeros(64).contiguous().realize()
  def fn(frame: Tensor, scale: Tensor, state: Tensor) -> Tensor:
    x = frame.to('CPU').cast('float32').reshape(64, 16).sum(1) * scale.to('CPU')[0]
    state.assign(state * 0.5 + x).realize()
    return (state + x.max()).contiguous().realize()
  jit, twin = TinyJit(fn), TinyJit(fn)
  scale = np.ones(1, np.float32)
  bufs = [aligned_empty(1024) for _ in range(3)]
  twin_state = Tensor.zeros(64).contiguous().realize()
  replay = None
  for i in range(8):
    b = bufs[i % 3]
    b[:] = np.random.default_rng(i).integers(0, 256, 1024, dtype=np.uint8)
    scale[0] = 1 + i
    want = jit(frame=camera_tensor(b.ctypes.data, b.nbytes), scale=host_tensor(scale), state=state).numpy()
    if twin.captured is None: got = twin(frame=camera_tensor(b.ctypes.data, b.nbytes), scale=host_tensor(scale), state=twin_state).numpy()
    else:
      kw = dict(frame=camera_tensor(b.ctypes.data, b.nbytes), scale=host_tensor(scale), state=twin_state)
      replay = replay or Replay('twin', twin, [TensorSpec.of(k, t) for k, t in kw.items()])
      got = replay.run(kw)
    np.testing.assert_array_equal(got, want)
  assert replay is not None and any(type(s).__name__ == '_Launch' for s in replay.steps)

def test_the_signature_check_is_kept_once_per_set_of_inputs_and_holds_no_input():
  import gc, weakref
  import pytest
  from tinygrad.engine.jit import JitError
  def fn(frame: Tensor, scale: Tensor) -> Tensor: return (frame.to('CPU').cast('float32').reshape(16, 16).sum(1) * scale.to('CPU')[0]).realize()
  jit = TinyJit(fn)
  buf, scale = aligned_empty(256), np.ones(1, np.float32)
  frame, s = camera_tensor(buf.ctypes.data, buf.nbytes), host_tensor(scale)
  for _ in range(2): jit(frame=frame, scale=s)
  replay = Replay('f', jit, [TensorSpec.of('frame', frame), TensorSpec.of('scale', s)])
  replay.bind()   # ahead of the first replay (a worker getting ready), which then replays as bound
  assert any(type(s).__name__ == '_Launch' for s in replay.steps)
  for i in range(3):   # the same Tensors every frame, as the daemons keep them: new bytes, new outputs
    buf[:], scale[0] = i + 1, 2 + i
    np.testing.assert_array_equal(replay.run(dict(frame=frame, scale=s)), np.full(16, 16 * (i + 1) * (2 + i), np.float32))
  assert len(replay._checked) == 1
  with pytest.raises(InputSpecError, match='expected dtype float32, got float64'): replay.run(dict(frame=frame, scale=host_tensor(np.ones(1, np.float64))))
  with pytest.raises(JitError, match='args mismatch'): replay._launch(dict(frame=frame, scale=host_tensor(np.ones(1, np.float64))))   # tinygrad's own, behind
  ref = weakref.ref(frame.uop)
  del frame
  gc.collect()
  assert ref() is None, "the replay keeps a from_blob input alive past its last Tensor"

def test_threads_share_a_kernels_launches_bit_for_bit():
  """threads=N runs each kernel's launches (here a matmul in LAUNCHES, as modeld-compile schedules it) on N threads,
  natively: the outputs are threads=1's bit for bit, with the inputs bound anew each replay, whether N divides the
  launches or not; thread_times gives each thread's time in each kernel; a count below 1 is refused."""
  import pytest
  from tinygrad.helpers import Context
  from modelrt.schedule import LAUNCHES, scheduled
  rng = np.random.default_rng(0)
  w = Tensor(rng.standard_normal((96, 256)).astype(np.float32)).realize()
  def fn(x: Tensor) -> Tensor: return (x.to("CPU").reshape(256, 96) @ w).relu().contiguous().realize()
  xs = [rng.standard_normal(256 * 96).astype(np.float32) for _ in range(4)]
  with Context(PARALLEL=0), scheduled('CPU', 16):
    jit = TinyJit(fn)
    for a in xs[:3]: jit(x=host_tensor(a))
  replay, outs = Replay('mm', jit, [TensorSpec.of('x', host_tensor(xs[0]))]), {}
  for n in (1, 2, 3, 1):
    replay.threads = n
    outs[n] = [replay.run(dict(x=host_tensor(a))) for a in xs]
  assert max(len(s.launches) for s in replay.steps if type(s).__name__ == '_Launch') == LAUNCHES
  for n in (2, 3):
    for a, b in zip(outs[1], outs[n]): np.testing.assert_array_equal(a, b)
  replay.threads = 3
  (name, t), = [row for row in replay.thread_times(dict(x=host_tensor(xs[0]))) if row[0].startswith('r_')]   # the matmul
  assert t.shape == (4,) and t[-1] >= t[:-1].max() > 0, t   # each thread's time in it, within the kernel's own
  with pytest.raises(ValueError, match="thread_times needs threads > 1"):
    replay.threads = 1
    replay.thread_times(dict(x=host_tensor(xs[0])))
  np.testing.assert_allclose(outs[2][0], np.maximum(xs[0].reshape(256, 96) @ w.numpy(), 0).reshape(-1), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="threads: expected a count >= 1, got 0"): replay.threads = 0
