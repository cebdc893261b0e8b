"""Replay of a captured JIT with its CPU kernel launches bound once.

tinygrad's replay sends every call of the JIT through its exec pattern matcher each frame: resolving the buffers,
looking up the compiled program, building ctypes arguments. On the CPU device that is 15-20 us of Python per kernel
here, 3 ms of the reference vision model's 134 kernels. HostReplay does that work once, at load: each kernel
becomes its compiled function with a prebuilt argument list (the fixed buffers' addresses, its thread index), and a
replay only writes the input buffers' addresses into those lists and calls the functions in the JIT's order. Calls
that are not CPU kernels (the copies of host inputs to the device) still run through tinygrad's exec path. tinygrad's
signature check of the inputs (a graph rewrite per input: 0.2-0.3 ms a call) runs once per set of input UOps: UOps
are interned and immutable, so the same ones pass the same check again.
The kernels, buffers, launches and their order are the captured JIT's own, so the outputs are bit-identical
(modeld-compile replays every artifact it writes through this and compares). With threads=N a kernel's launches
(tinygrad cuts a CPU kernel into launches that write disjoint outputs) are shared out to N threads, the kernels still
one after another: ctypes lets go of the GIL for the call.
"""
from __future__ import annotations
import ctypes, threading, weakref
from tinygrad import Tensor
from tinygrad.engine.jit import JitError, _copy_input, _prepare_jit_inputs
from tinygrad.engine.realize import ExecContext, get_call_arg_uops, get_runtime, pm_exec
from tinygrad.helpers import disable_gc
from tinygrad.uop.ops import Ops, UOp

class _Launch:
  """One CPU kernel: its function, one argument tuple per thread index, and which arguments are JIT inputs."""
  def __init__(self, call: UOp):
    ast, args = call.src[0], get_call_arg_uops(call)
    rt = get_runtime('CPU', ast)
    self.fxn = rt.fxn
    self.args = [ctypes.c_uint64(0 if b.op is Ops.PARAM else b.buffer.ensure_allocated().get_buf('CPU').va_addr)
                 for b in (args[i] for i in ast.arg.globals)]
    self.args += [ctypes.c_uint64(v or 0) for v in ast.arg.vals({})]
    self.inputs = [(self.args[j], args[i].arg.slot) for j, i in enumerate(ast.arg.globals) if args[i].op is Ops.PARAM]
    (threads, *_), _ = ast.arg.launch_dims({})
    core = rt.runtimevars.get('core_id')
    self.launches = [tuple(ctypes.c_uint64(t) if j == core else a for j, a in enumerate(self.args)) for t in range(threads)] \
      if core is not None else [tuple(self.args)] * threads

  def __call__(self, addrs: list[int]) -> None:
    self.bind_inputs(addrs)
    for args in self.launches: self.fxn(*args)

  def bind_inputs(self, addrs: list[int]) -> None:
    for a, slot in self.inputs: a.value = addrs[slot]

class _Team:
  """n - 1 daemon threads that run, with the calling thread, their share of each multi-launch kernel of a replay's plan:
  [(steps the caller runs alone first, the kernel whose launches are shared)], a barrier after each shared kernel."""
  def __init__(self, n: int):
    self.n, self.plan, self.start, self.done, self.lock = n, [], threading.Barrier(n), threading.Barrier(n), threading.Lock()
    for i in range(1, n): threading.Thread(target=self._work, args=(i,), daemon=True, name=f'replay-{i}').start()

  def _work(self, i: int) -> None:
    try:
      while True:
        self.start.wait()   # a replay: its plan is set
        for k, (alone, launch) in enumerate(self.plan):
          if alone and k: self.start.wait()   # the caller ran steps of its own since the last shared kernel
          for args in launch.launches[i::self.n]: launch.fxn(*args)
          self.done.wait()
    except threading.BrokenBarrierError: pass   # the caller failed mid-replay and dropped this team

  def run(self, plan: list, tail: list, step) -> None:
    with self.lock:   # replays in other threads wait their turn
      self.plan = plan
      try:
        for k, (alone, launch) in enumerate(plan):
          for s in alone: step(s)
          if not k or alone: self.start.wait()
          for args in launch.launches[::self.n]: launch.fxn(*args)
          self.done.wait()
        for s in tail: step(s)
      except BaseException:
        self.start.abort()
        self.done.abort()
        raise

_teams: dict[int, _Team] = {}
_teams_lock = threading.Lock()

def _team(n: int) -> _Team:
  with _teams_lock:
    if (t := _teams.get(n)) is None or t.start.broken: t = _teams[n] = _Team(n)
    return t

def _bindable(call: UOp) -> bool:
  """A kernel on the CPU device (clang or LLVM code), its only variable the thread index, each argument an input or
  a fixed buffer (no view of an input)."""
  ast = call.src[0]
  if ast.op is not Ops.PROGRAM or call.src[1].device != 'CPU' or any(v.expr != 'core_id' for v in ast.arg.vars): return False
  args = get_call_arg_uops(call)
  if any(b.op is not Ops.PARAM and any(x.op is Ops.PARAM for x in b.toposort()) for b in (args[i] for i in ast.arg.globals)): return False
  return not get_runtime('CPU', ast).lvp

class HostReplay:
  """A captured TinyJit whose CPU kernels launch without tinygrad's per-call exec path. Called like the JIT (keyword
  Tensor inputs, returns the captured output Tensor). The launches are bound at the first call (or at `bind()`), so
  the JIT is not linked (`captured.linear`) before its first replay, as with tinygrad's own; a JIT with no CPU kernel
  replays as is. threads: how many threads share a kernel's launches (a process keeps one team of threads per count,
  for all its replays: they take turns)."""
  def __init__(self, jit, threads: int = 1):
    self.jit, self.steps, self.threads = jit, None, threads
    self._checked: dict[tuple, tuple] = {}   # ids of the input UOps -> (weak refs to them, var values): passed the check

  @property
  def threads(self) -> int: return self._threads
  @threads.setter
  def threads(self, n: int) -> None:
    if type(n) is not int or n < 1: raise ValueError(f"threads: expected a count >= 1, got {n!r}")
    self._threads, self._plan = n, None

  def _inputs(self, inputs: dict[str, Tensor]) -> tuple[list[UOp], dict]:
    """The input buffers' UOps and the variable values, checked against the captured signature (JitError if not)."""
    uops = [t.uop for _, t in sorted(inputs.items())]
    hit = self._checked.get(key := tuple(map(id, uops)))
    if hit is not None and all(r() is u for r, u in zip(hit[0], uops)): return [u.base for u in uops], hit[1]
    cap = self.jit.captured
    input_uops, var_vals, names, info = _prepare_jit_inputs((), inputs)
    if names != cap.expected_names or info != cap.expected_input_info:
      raise JitError(f"args mismatch in JIT: expected {cap.expected_names} {cap.expected_input_info}, got {names} {info}")
    # weak refs: a camera buffer's from_blob UOp must not outlive its mapping here; a dead one's id may come back
    if len(self._checked) >= 64: self._checked.clear()
    self._checked[key] = ([weakref.ref(u) for u in uops], var_vals)
    return input_uops, var_vals

  def bind(self) -> None:
    """Bind the launches now (the first replay does it otherwise: links the JIT, 0.1-0.3 s for a model)."""
    if self.steps is None:
      cap = self.jit.captured
      self.steps = [_Launch(c) if _bindable(c) else c for c in cap.linear.src]
      cap._written_uops   # noqa: B018 (a cached property: the first replay's other one-time cost)

  def _split(self) -> tuple[list, list]:
    """The steps as [(steps run alone, a kernel of several launches)] and the steps after the last such kernel."""
    plan, alone = [], []
    for s in self.steps:
      if isinstance(s, _Launch) and len(s.launches) > 1: plan, alone = plan + [(alone, s)], []
      else: alone.append(s)
    return plan, alone

  @disable_gc()
  def __call__(self, **inputs: Tensor):
    cap = self.jit.captured
    self.bind()
    if not any(isinstance(s, _Launch) for s in self.steps): return self.jit(**inputs)
    input_uops, var_vals = self._inputs(inputs)
    input_uops = [_copy_input(u) if u in cap._written_uops else u for u in input_uops]
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
    for s in self.steps:
      if isinstance(s, _Launch): s.bind_inputs(addrs)
    _team(self.threads).run(*self._plan, step)
    return cap.ret
