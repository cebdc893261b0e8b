"""Up to N camera sessions (a batch worker's segments) through one batched build, each on a thread of its own: every
session is a slot with its own warps and frame history (RoadSlot, DMSlot: the runners' interface), and each model runs
once for the frames the slots brought, when every slot in use waits for a model (Batch). Row i of a batch is what the
model computes for slot i's frame alone (modeld-compile checks it, within matches_eager's tolerance)."""
from __future__ import annotations
import contextlib, threading
from collections.abc import Iterator
import numpy as np
from tinygrad import Tensor
from msgq.visionipc.layout import NV12Layout
from modelrt.artifact import Artifact
from modelrt.contracts import FAMILY_MODELS
from modelrt.internals import compile_cache_for_threads
from modelrt.replay import buffer_of
from modelrt.runner import DMRunner, RoadRunner, host_tensor

class Batch:
  """The batched models of both families (`model_b<n>` JITs) with their inputs, n slots, and the rendezvous: a slot's
  runner calls run() under `lock` (one lock for all tinygrad work of the slots), which returns its row once the batch
  ran; the batch runs, for every model some slot waits on, as soon as every slot in use waits."""
  def __init__(self, arts: dict[str, Artifact], n: int, threads: int = 1):
    self.arts, self.n, self.lock = arts, n, threading.Condition()
    compile_cache_for_threads()   # a slot's runner compiles on its own thread (a state buffer's fill)
    self.models = {k: art.load_batch(k, n) for f, art in arts.items() for k in FAMILY_MODELS[f]}
    self.host: dict[tuple[str, str], np.ndarray] = {}   # (model, input) -> the host array an NPY input shares
    self.inputs: dict[str, dict[str, Tensor]] = {}
    for k, m in self.models.items():
      m.threads, self.inputs[k] = threads, {}
      for name, spec in m.inputs.items():
        if spec.device == 'NPY':
          self.host[k, name] = a = np.zeros(spec.shape, spec.dtype)
          self.inputs[k][name] = host_tensor(a)
        else: self.inputs[k][name] = Tensor.zeros(*spec.shape, dtype=spec.tg_dtype, device=spec.device).contiguous().realize()
    self.free, self.active, self.waiting = list(range(n)), 0, 0
    self.pending: dict[str, set[int]] = {}
    self.results: dict[tuple[str, int], np.ndarray | BaseException] = {}

  @contextlib.contextmanager
  def slot(self) -> Iterator[int]:
    """A free slot for one session, in use until the context ends (a batch then no longer waits for it)."""
    with self.lock:
      if not self.free: raise RuntimeError(f"all {self.n} slots of the batch are in use")
      i = self.free.pop(0)
      self.active += 1
    try: yield i
    finally:
      with self.lock:
        self.active -= 1
        self.free.append(i)
        if self.active and self.waiting == self.active: self._run()

  def row(self, model: str, name: str, i: int) -> np.ndarray:
    """Slot i's row of a host input (a view: what the slot writes there, the batch reads)."""
    return self.host[model, name][i:i + 1]

  def put(self, model: str, name: str, i: int, t: Tensor) -> None:
    """t (one frame's device input, a warp's output) into slot i's row of the model's input."""
    dst, src = buffer_of(self.inputs[model][name]), buffer_of(t)
    assert src is not None and src.nbytes * self.n == dst.nbytes, f"{model} input {name}: expected a row of {dst.nbytes // self.n} bytes, got {t}"
    dst.view(src.size, src.dtype, i * src.nbytes).ensure_allocated().copy_from(src)

  def run(self, model: str, i: int) -> np.ndarray:
    """Slot i's output of `model` (its flat vector), once the batch ran. Call with the lock held."""
    self.pending.setdefault(model, set()).add(i)
    self.waiting += 1
    if self.waiting == self.active: self._run()
    while (model, i) not in self.results: self.lock.wait()
    if isinstance(out := self.results.pop((model, i)), BaseException): raise out
    return out

  def _run(self) -> None:
    """Every model some slot waits on, once for all of them; then the slots wake with their rows."""
    for model, rows in self.pending.items():
      try:
        out = self.models[model].run(self.inputs[model]).reshape(self.n, -1)
        self.results.update({(model, i): out[i] for i in rows})
      except Exception as e: self.results.update({(model, i): e for i in rows})   # each waiting slot raises it
    self.pending, self.waiting = {}, 0
    self.lock.notify_all()

class RoadSlot(RoadRunner):
  """A RoadRunner whose vision and policy run in a Batch, as slot i: its policy inputs are its rows of the batch's."""
  def __init__(self, batch: Batch, slot: int, main_layout: NV12Layout, extra_layout: NV12Layout | None = None):
    super().__init__(batch.arts['road'], main_layout, extra_layout)
    self.batch, self.slot = batch, slot
    self.features_buffer, self.desire_pulse, self.traffic_convention = ((batch.row('policy', k, slot), None) for k in
                                                                        ('features_buffer', 'desire_pulse', 'traffic_convention'))
    self.reset()

  def set_threads(self, n: int) -> None:
    for w in self.warps.values(): w.threads = n

  def run(self, *args, **kwargs):
    with self.batch.lock: return super().run(*args, **kwargs)

  def run_vision(self, imgs: dict[str, Tensor]) -> np.ndarray:
    for k, t in imgs.items(): self.batch.put('vision', k, self.slot, t)
    return self.batch.run('vision', self.slot)

  def run_policy(self) -> np.ndarray: return self.batch.run('policy', self.slot)

class DMSlot(DMRunner):
  """A DMRunner whose model runs in a Batch, as slot i: its calib input is its row of the batch's."""
  def __init__(self, batch: Batch, slot: int, layout: NV12Layout):
    super().__init__(batch.arts['dm'], layout)
    self.batch, self.slot, self.calib = batch, slot, (batch.row('dm', 'calib', slot), None)

  def set_threads(self, n: int) -> None: self.warp.threads = n

  def run(self, *args, **kwargs):
    with self.batch.lock: return super().run(*args, **kwargs)

  def run_model(self, img: Tensor) -> np.ndarray:
    self.batch.put('dm', 'input_img', self.slot, img)
    return self.batch.run('dm', self.slot)
