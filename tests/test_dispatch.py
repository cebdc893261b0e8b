"""HostReplay: the captured JIT's own kernels launched with bound arguments give the JIT's outputs bit for bit."""
import os
os.environ.setdefault('DEV', 'CPU')
import numpy as np
from tinygrad import Tensor, TinyJit
from modelrt.dispatch import HostReplay
from modelrt.runner import aligned_empty, camera_tensor, host_tensor

def test_host_replay_matches_the_jit_with_changing_pointers_and_host_inputs():
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
      replay = replay or HostReplay(twin)
      got = replay(frame=camera_tensor(b.ctypes.data, b.nbytes), scale=host_tensor(scale), state=twin_state).numpy()
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
  replay = HostReplay(jit)
  replay.bind()   # ahead of the first replay (a worker getting ready), which then replays as bound
  assert any(type(s).__name__ == '_Launch' for s in replay.steps)
  for i in range(3):   # the same Tensors every frame, as the daemons keep them: new bytes, new outputs
    buf[:], scale[0] = i + 1, 2 + i
    np.testing.assert_array_equal(replay(frame=frame, scale=s).numpy(), np.full(16, 16 * (i + 1) * (2 + i), np.float32))
  assert len(replay._checked) == 1
  with pytest.raises(JitError, match='args mismatch'): replay(frame=frame, scale=host_tensor(np.ones(1, np.float64)))
  ref = weakref.ref(frame.uop)
  del frame
  gc.collect()
  assert ref() is None, "HostReplay keeps a from_blob input alive past its last Tensor"

def test_threads_share_a_kernels_launches_bit_for_bit():
  """threads=N runs each kernel's launches (here a matmul in 8, as modeld-compile schedules it) on N threads: the
  outputs are threads=1's bit for bit, with the inputs bound anew each replay; a count below 1 is refused."""
  import pytest
  from tinygrad.helpers import Context
  from modelrt.schedule import scheduled
  rng = np.random.default_rng(0)
  w = Tensor(rng.standard_normal((96, 256)).astype(np.float32)).realize()
  def fn(x: Tensor) -> Tensor: return (x.to('CPU').reshape(64, 96) @ w).relu().contiguous().realize()
  xs = [rng.standard_normal(64 * 96).astype(np.float32) for _ in range(4)]
  with Context(PARALLEL=0), scheduled('CPU', 16):
    jit = TinyJit(fn)
    for a in xs[:3]: jit(x=host_tensor(a))
  replay, outs = HostReplay(jit), {}
  for n in (1, 2, 3, 1):
    replay.threads = n
    outs[n] = [replay(x=host_tensor(a)).numpy().copy() for a in xs]
  assert max(len(s.launches) for s in replay.steps if type(s).__name__ == '_Launch') == 8
  for n in (2, 3):
    for a, b in zip(outs[1], outs[n]): np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(outs[2][0], np.maximum(xs[0].reshape(64, 96) @ w.numpy(), 0), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="threads: expected a count >= 1, got 0"): replay.threads = 0
