"""Every replay of a captured JIT, in one place: each input checked against the spec recorded at build time (a TinyJit
compares only a view/dtype/device signature: a 1-D buffer of another length would replay silently, or be read past
its end), the JIT's own kernels launched with their arguments bound once (tinygrad's per-call exec path costs 15-20 us
a kernel), optionally shared out to threads, and the output copied out before the next replay writes over it. Camera
buffers enter as from_blob tensors, cached per ring slot (CameraTensors). docs/RUNTIME.md says more."""
from __future__ import annotations
import ctypes, functools, weakref
from typing import Protocol
from dataclasses import MISSING, dataclass, asdict, fields
import numpy as np
from tinygrad import Tensor, dtypes
from tinygrad.device import Buffer
from tinygrad.dtype import DTYPES_DICT, DType
from tinygrad.engine.jit import JitError
from tinygrad.engine.realize import ExecContext, get_call_arg_uops, get_runtime, pm_exec
from tinygrad.helpers import disable_gc
from tinygrad.uop.ops import Ops, UOp, buffers
from msgq.visionipc.layout import NV12Layout
from modelrt import threads
from modelrt.profile import call_name
from modelrt.threads import Plan
from modelrt.internals import copy_input, from_np_dtype, prepare_jit_inputs, to_np_dtype, written_uops

ALIGN = 64   # bytes: from_blob's kernels need 16 (clang's CPU kernels segfault on less); a cache line to be safe

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
    return cls(name, np.dtype(to_np_dtype(t.dtype)).name, tuple(t.shape), str(t.device), t.nbytes(), layout)
  @functools.cached_property
  def tg_dtype(self) -> DType: return from_np_dtype(np.dtype(self.dtype))
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
  if t.dtype != spec.tg_dtype: bad('dtype', spec.dtype, np.dtype(to_np_dtype(t.dtype)).name if to_np_dtype(t.dtype) else t.dtype)
  if t.shape != spec.shape: bad('shape', spec.shape, t.shape)
  if t.device != spec.device: bad('device', spec.device, t.device)
  if (buf := buffer_of(t)) is None: bad('a contiguous realized buffer', '', f"a lazy or strided view {t.uop.op}")
  if buf.nbytes != spec.nbytes: bad('byte length', spec.nbytes, buf.nbytes)

class _Launch:
  """One CPU kernel: its function, one argument tuple per thread index, and which arguments are JIT inputs."""
  def __init__(self, call: UOp):
    ast, args = call.src[0], get_call_arg_uops(call)
    rt, self.name = get_runtime('CPU', ast), call_name(call)
    self.fxn = rt.fxn
    self.args = [ctypes.c_uint64(0 if b.op is Ops.PARAM else b.buffer.ensure_allocated().get_buf('CPU').va_addr)
                 for b in (args[i] for i in ast.arg.globals)]
    self.args += [ctypes.c_uint64(v or 0) for v in ast.arg.vals({})]
    self.slots = [(j, args[i].arg.slot) for j, i in enumerate(ast.arg.globals) if args[i].op is Ops.PARAM]   # (argument, input)
    self.inputs = [(self.args[j], slot) for j, slot in self.slots]
    (threads, *_), _ = ast.arg.launch_dims({})
    core = rt.runtimevars.get('core_id')
    self.launches = [tuple(ctypes.c_uint64(t) if j == core else a for j, a in enumerate(self.args)) for t in range(threads)] \
      if core is not None else [tuple(self.args)] * threads

  def __call__(self, addrs: list[int]) -> None:
    self.bind_inputs(addrs)
    for args in self.launches: self.fxn(*args)

  def bind_inputs(self, addrs: list[int]) -> None:
    for a, slot in self.inputs: a.value = addrs[slot]

  def native(self) -> tuple[int, list[list[int]], list[tuple[int, int]]]:
    """What a threads.Plan takes of this kernel: its address, each launch's arguments, where its inputs go."""
    return ctypes.cast(self.fxn, ctypes.c_void_p).value, [[a.value for a in launch] for launch in self.launches], self.slots

def _bindable(call: UOp) -> bool:
  """A kernel on the CPU device (clang or LLVM code), its only variable the thread index, each argument an input or
  a fixed buffer (no view of an input)."""
  ast = call.src[0]
  if ast.op is not Ops.PROGRAM or call.src[1].device != 'CPU' or any(v.expr != 'core_id' for v in ast.arg.vars): return False
  args = get_call_arg_uops(call)
  if any(b.op is not Ops.PARAM and any(x.op is Ops.PARAM for x in b.toposort()) for b in (args[i] for i in ast.arg.globals)): return False
  return not get_runtime('CPU', ast).lvp

class Replay:
  """A captured JIT loaded from an artifact, with the input specs it was captured for. run() is a frame's replay: every
  input checked (InputSpecError naming it), the kernels launched, and a fresh flat numpy copy of the output returned;
  copy=False returns the JIT's own output Tensor instead, valid until its next replay, to feed another replay. The
  launches are bound at the first run (or at bind()); a JIT with no CPU kernel replays through tinygrad's own path.
  threads: how many threads share each kernel's launches (a process keeps one team of threads per count, for all its
  replays: they take turns)."""
  def __init__(self, name: str, jit, inputs: list[TensorSpec], threads: int = 1):
    self.name, self.jit, self.inputs, self.steps, self.threads = name, jit, {s.name: s for s in inputs}, None, threads
    self._checked: dict[tuple, tuple] = {}   # ids of the input UOps -> (weak refs to them, var values): passed tinygrad's check
    ret = jit.captured.ret
    self._out = None if ret is None else (buffer_of(ret), to_np_dtype(ret.dtype))

  @property
  def threads(self) -> int: return self._threads
  @threads.setter
  def threads(self, n: int) -> None:
    if type(n) is not int or n < 1: raise ValueError(f"threads: expected a count >= 1, got {n!r}")
    self._threads, self._plan = n, None

  def check(self, inputs: dict[str, Tensor]) -> None:
    """InputSpecError unless the inputs are exactly those the JIT was captured for."""
    if inputs.keys() != self.inputs.keys():
      raise InputSpecError(f"{self.name}: expected inputs {sorted(self.inputs)}, got {sorted(inputs)}")
    for k, t in inputs.items(): check_input(self.inputs[k], t)

  def run(self, inputs: dict[str, Tensor], copy: bool = True) -> np.ndarray | Tensor | None:
    self.check(inputs)
    out = self._launch(inputs)
    if not copy: return out
    assert self._out is not None, f"{self.name} returns nothing"
    buf, dt = self._out   # the memoryview copy is ~30x cheaper than Tensor.numpy()
    return np.frombuffer(buf.as_memoryview(allow_zero_copy=True), dtype=dt).copy()

  def bind(self) -> None:
    """Bind the launches now (the first replay does it otherwise: links the JIT, 0.1-0.3 s for a model)."""
    if self.steps is None:
      cap = self.jit.captured
      self.steps = [_Launch(c) if _bindable(c) else c for c in cap.linear.src]
      written_uops(cap)   # a cached property: the first replay's other one-time cost

  def _signature(self, inputs: dict[str, Tensor]) -> tuple[list[UOp], dict]:
    """The input buffers' UOps and the variable values, through tinygrad's own signature check (JitError) once per set
    of input UOps: UOps are interned and immutable, so the same ones pass the same check again."""
    uops = [t.uop for _, t in sorted(inputs.items())]
    hit = self._checked.get(key := tuple(map(id, uops)))
    if hit is not None and all(r() is u for r, u in zip(hit[0], uops)): return [u.base for u in uops], hit[1]
    cap = self.jit.captured
    input_uops, var_vals, names, info = prepare_jit_inputs((), inputs)
    if names != cap.expected_names or info != cap.expected_input_info:
      raise JitError(f"args mismatch in JIT: expected {cap.expected_names} {cap.expected_input_info}, got {names} {info}")
    # weak refs: a camera buffer's from_blob UOp must not outlive its mapping here; a dead one's id may come back
    if len(self._checked) >= 64: self._checked.clear()
    self._checked[key] = ([weakref.ref(u) for u in uops], var_vals)
    return input_uops, var_vals

  def _split(self) -> list[tuple[list, Plan | None]]:
    """The steps as [(steps the caller runs alone, a Plan of the kernels after them)]."""
    out, alone, kernels = [], [], []
    for s in self.steps + [None]:
      if isinstance(s, _Launch): kernels.append(s)
      elif kernels or s is None:
        out, alone, kernels = out + [(alone, Plan([k.native() for k in kernels], [k.name for k in kernels]) if kernels else None)], [], []
      if s is not None and not isinstance(s, _Launch): alone.append(s)
    return out

  def thread_times(self, inputs: dict[str, Tensor]) -> list[tuple[str, np.ndarray]]:
    """One replay (threads > 1) timed per kernel the team runs: (name, ns of each thread in its launches, then the
    kernel's own up to the barrier after it); the difference is what a thread waited at that barrier."""
    if self.threads == 1: raise ValueError(f"{self.name}: thread_times needs threads > 1")
    self.check(inputs)
    timed: list[tuple[Plan, np.ndarray]] = []
    self._launch(inputs, timed)
    return [(name, t) for plan, times in timed for name, t in zip(plan.names, times)]

  @disable_gc()
  def _launch(self, inputs: dict[str, Tensor], timed: list | None = None) -> Tensor | None:
    """The captured kernels, their buffers and order, so the outputs are the JIT's own bit for bit; calls that are not
    CPU kernels (copies of host inputs to the device) through tinygrad's exec path. timed: gets (plan, times) of
    each plan the team runs (thread_times)."""
    cap = self.jit.captured
    self.bind()
    if not any(isinstance(s, _Launch) for s in self.steps): return self.jit(**inputs)
    input_uops, var_vals = self._signature(inputs)
    input_uops = [copy_input(u) if u in written_uops(cap) else u for u in input_uops]
    addrs = [u.buffer.get_buf('CPU').va_addr if u.buffer.device == 'CPU' else 0 for u in input_uops]
    ctx = None
    def step(s):
      nonlocal ctx
      if isinstance(s, _Launch): s(addrs)
      else: pm_exec.rewrite(s, ctx := ctx or ExecContext(var_vals, tuple(input_uops), update_stats=False, jit=True))
    if self.threads == 1:
      for s in self.steps: step(s)
      return cap.ret
    if self._plan is None: self._plan = self._split()
    team = threads.team(self.threads)
    for alone, plan in self._plan:
      for s in alone: step(s)
      if plan is not None:
        plan.set(addrs)
        if timed is not None: timed.append((plan, np.zeros((len(plan.steps), self.threads + 1), np.uint64)))
        team.run(plan, timed[-1][1] if timed else None)
    return cap.ret

class CameraBuffer(Protocol):
  """What the runners read of a camera buffer: where it is, which ring slot of which stream, and its NV12 layout."""
  addr: int
  idx: int
  stream: int
  width: int
  height: int
  stride: int
  uv_offset: int
  size: int

def camera_tensor(addr: int, size: int) -> Tensor:
  """Zero-copy uint8 view of a camera buffer. It does not keep the memory alive: the mapping must outlive it."""
  return Tensor.from_blob(addr, (size,), dtype=dtypes.uint8, device='CPU')

class CameraTensors:
  """from_blob tensors over camera buffers, cached by (stream, buffer index). They do not keep the mapping alive:
  release() must run before the camera client unmaps its buffers. Passed to the JITs as arguments, never captured."""
  def __init__(self, layouts: list[str]):
    self.layouts, self._cache = layouts, {}

  def get(self, buf: CameraBuffer, warp: Replay) -> Tensor:
    """The `frame` input of `warp` over this buffer, once the buffer is checked against the layout that warp was
    captured for (its input spec in the artifact) and for a from_blob-safe alignment: CameraLayoutError if not."""
    # the buffer's fields, formatted as a layout (a buffer is not one, and may hold fields no layout accepts)
    if (got := NV12Layout.__str__(buf)) != (want := warp.inputs['frame'].layout):
      raise CameraLayoutError(f"camera stream {buf.stream} buffer {buf.idx}: expected layout {want}, got {got}; "
                              f"a new camera layout needs a new runner (artifact serves {', '.join(self.layouts)})")
    if buf.addr % ALIGN: raise CameraLayoutError(f"camera stream {buf.stream} buffer {buf.idx}: address {buf.addr:#x} is not {ALIGN}-byte aligned")
    if buf.idx < 0: return camera_tensor(buf.addr, buf.size)
    hit = self._cache.get(key := (buf.stream, buf.idx))
    if hit is None or hit[0] != buf.addr: self._cache[key] = hit = (buf.addr, camera_tensor(buf.addr, buf.size))
    return hit[1]

  def release(self) -> None: self._cache.clear()
