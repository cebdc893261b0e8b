"""The guarded JIT: every replay of a captured program goes through here.

A captured TinyJit only compares a view/dtype/device signature: a 1-D buffer of another length replays silently
(longer: the captured-length result; shorter: kernels read past its end). So each input is checked against the
spec recorded at build time, outside the JIT, before the replay; and the output is copied to numpy right after,
because the next replay writes into the same buffer.
"""
from __future__ import annotations
import functools
from dataclasses import MISSING, dataclass, asdict, fields
import numpy as np
from tinygrad import Tensor
from tinygrad.device import Buffer
from tinygrad.dtype import DTYPES_DICT, DType, _to_np_dtype, _from_np_dtype
from tinygrad.uop.ops import Ops, buffers
from modelrt.dispatch import HostReplay

class InputSpecError(ValueError):
  """An input that does not match what the JIT was captured for: the frame is skipped, nothing runs."""
class CameraLayoutError(InputSpecError):
  """A camera buffer whose NV12 layout (or alignment) differs from the one the warp was compiled for."""

@dataclass(frozen=True)
class TensorSpec:
  name: str
  dtype: str                  # numpy dtype name
  shape: tuple[int, ...]
  device: str
  nbytes: int
  layout: str | None = None   # NV12 layout of a camera buffer input (a from_blob over the ringbuffer; the runner checks
                              # each buffer against it, and its alignment), else None

  @classmethod
  def of(cls, name: str, t: Tensor, layout: str | None = None) -> TensorSpec:
    return cls(name, np.dtype(_to_np_dtype(t.dtype)).name, tuple(t.shape), str(t.device), t.nbytes(), layout)
  @functools.cached_property
  def tg_dtype(self) -> DType: return _from_np_dtype(np.dtype(self.dtype))
  def to_json(self) -> dict: return asdict(self)
  @classmethod
  def from_json(cls, d: dict) -> TensorSpec:
    """The spec to_json wrote; ValueError saying what is malformed (a damaged manifest), never a later failure."""
    keys = {f.name: f.default is MISSING for f in fields(cls)}
    if not isinstance(d, dict) or not {k for k, required in keys.items() if required} <= d.keys() <= keys.keys():
      raise ValueError(f"expected an object with {', '.join(keys)} (layout optional), got {d!r}")
    for k, ok, what in (('name', isinstance(d['name'], str), 'a string'), ('device', isinstance(d['device'], str), 'a string'),
                        ('dtype', isinstance(d['dtype'], str) and d['dtype'] in _DTYPE_NAMES, 'a numpy dtype name tinygrad has'),
                        ('nbytes', is_count(d['nbytes']), 'a byte count'),
                        ('shape', isinstance(d['shape'], (list, tuple)) and all(map(is_count, d['shape'])), 'a list of sizes'),
                        ('layout', d.get('layout') is None or isinstance(d['layout'], str), 'a camera layout or null')):
      if not ok: raise ValueError(f"{k}: expected {what}, got {d[k]!r}")
    return cls(**{**d, 'shape': tuple(d['shape'])})

def is_count(v) -> bool: return type(v) is int and v >= 0   # a size or offset read from a manifest (bool is no int here)

_DTYPE_NAMES = {np.dtype(t).name for t in np.sctypeDict.values()} & DTYPES_DICT.keys()   # what tg_dtype can convert

def buffer_of(t: Tensor) -> Buffer | None:
  """The Buffer a tensor is exactly (a realized buffer, reshaped at most), else None (a view, or not realized)."""
  u = t.uop
  while u.op is Ops.RESHAPE: u = u.src[0]
  return b if u.op is Ops.BUFFER and (b := buffers.get(u)) is not None and b.is_allocated() else None

def check_input(spec: TensorSpec, t: object) -> None:
  """Raise InputSpecError naming the input, what was expected and what came."""
  def bad(what, want, got): raise InputSpecError(f"input {spec.name!r}: expected {what} {want}, got {got}")
  if not isinstance(t, Tensor): bad('a Tensor', '', type(t).__name__)
  if t.dtype != spec.tg_dtype: bad('dtype', spec.dtype, np.dtype(_to_np_dtype(t.dtype)).name if _to_np_dtype(t.dtype) else t.dtype)
  if t.shape != spec.shape: bad('shape', spec.shape, t.shape)
  if t.device != spec.device: bad('device', spec.device, t.device)
  if (buf := buffer_of(t)) is None: bad('a contiguous realized buffer', '', f"a lazy or strided view {t.uop.op}")
  if buf.nbytes != spec.nbytes: bad('byte length', spec.nbytes, buf.nbytes)

class GuardedJit:
  """A loaded captured JIT with the input specs it was captured for. `replay` checks and returns the JIT's own output
  Tensor (valid until the next replay: for chaining on the device); calling it checks, replays and returns a fresh
  flat numpy copy of the output. Replays run through `dispatch` (modelrt.dispatch.HostReplay: the JIT's own kernels,
  launched without tinygrad's per-call overhead); `jit` is the loaded TinyJit."""
  def __init__(self, name: str, jit, inputs: list[TensorSpec]):
    self.name, self.jit, self.dispatch, self.inputs = name, jit, HostReplay(jit), {s.name: s for s in inputs}
    ret = jit.captured.ret
    self._out = None if ret is None else (buffer_of(ret), _to_np_dtype(ret.dtype))

  def check(self, inputs: dict[str, Tensor]) -> None:
    if inputs.keys() != self.inputs.keys():
      raise InputSpecError(f"{self.name}: expected inputs {sorted(self.inputs)}, got {sorted(inputs)}")
    for k, t in inputs.items(): check_input(self.inputs[k], t)

  def replay(self, **inputs: Tensor) -> Tensor | None:
    self.check(inputs)
    return self.dispatch(**inputs)

  def __call__(self, **inputs: Tensor) -> np.ndarray:
    self.replay(**inputs)
    return self.copy_out()

  def copy_out(self) -> np.ndarray:
    """A host copy of the last replay's output (the memoryview copy is ~30x cheaper than Tensor.numpy())."""
    assert self._out is not None, f"{self.name} returns nothing"
    buf, dt = self._out
    return np.frombuffer(buf.as_memoryview(allow_zero_copy=True), dtype=dt).copy()
