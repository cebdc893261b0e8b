"""Per-kernel profile of a captured JIT: each of its device calls run on its own, timed, on the JIT's own buffers.

What the next optimisation step needs to see: where a replay's time goes (kernel name, its share, achieved GFLOP/s
and GB/s from tinygrad's own estimates), and how many calls it dispatches. Runs outside the JIT's replay path,
after a replay (so the intermediate buffers hold real data); the replay itself is unchanged."""
from __future__ import annotations
import re, time
import numpy as np
from dataclasses import dataclass
from tinygrad import Device, Tensor, TinyJit
from tinygrad.engine.realize import ExecContext, pm_exec, get_call_name, get_call_arg_uops, estimate_uop
from tinygrad.uop.ops import Ops, UOp, sym_infer
from modelrt.internals import prepare_jit_inputs

@dataclass(frozen=True)
class KernelTime:
  name: str
  seconds: float   # median over the runs
  flops: float     # tinygrad's estimate for one run
  bytes: float

  @property
  def gflops(self) -> float: return self.flops / self.seconds / 1e9 if self.seconds else 0.0
  @property
  def gbps(self) -> float: return self.bytes / self.seconds / 1e9 if self.seconds else 0.0

def _calls(linear: UOp) -> list[UOp]:
  """The device calls of a linear, graph batches opened up."""
  out = []
  for c in linear.src:
    if c.src[0].op is Ops.CUSTOM_FUNCTION and c.src[0].arg == 'graph': out += _calls(c.src[0].src[0])
    else: out.append(c)
  return out

def call_name(call: UOp) -> str:
  try: return re.sub(r'\x1b\[[0-9;]*m', '', get_call_name(call, get_call_arg_uops(call)))   # without its colours
  except NotImplementedError: return str(call.src[0].op)

def kernel_profile(jit: TinyJit, inputs: dict[str, Tensor], runs: int = 5) -> list[KernelTime]:
  """Every call of a captured TinyJit (`jit.captured`) timed `runs` times on these inputs (the JIT's input names),
  in call order. The JIT must have replayed once on inputs like these."""
  if jit.captured is None: raise ValueError("kernel_profile: the JIT has not been captured")
  input_uops, var_vals, _, _ = prepare_jit_inputs((), inputs)
  calls = _calls(jit.captured.linear)
  ctx = ExecContext(var_vals, tuple(input_uops), update_stats=False, jit=True, wait=True)
  devices = {d for c in calls for d in ((c.src[1].device,) if isinstance(c.src[1].device, str) else c.src[1].device)}
  times: list[list[float]] = [[] for _ in calls]
  for _ in range(runs):
    for i, c in enumerate(calls):
      t = time.perf_counter()
      pm_exec.rewrite(c, ctx)
      for d in devices: Device[d].synchronize()
      times[i].append(time.perf_counter() - t)
  out = []
  for c, ts in zip(calls, times):
    est = estimate_uop(c)
    out.append(KernelTime(call_name(c), sorted(ts)[len(ts) // 2], float(sym_infer(est.ops, var_vals)), float(sym_infer(est.mem, var_vals))))
  return out

def format_profile(ks: list[KernelTime], top: int = 10, peak_gflops: float | None = None) -> list[str]:
  """The `top` most expensive calls as table lines, with the total and the number of calls; with peak_gflops (one
  core's), each one's fraction of it too."""
  total, flops = sum(k.seconds for k in ks), sum(k.flops for k in ks)
  def peak(g: float) -> str: return f" {g / peak_gflops * 100:5.1f}%" if peak_gflops else ''
  lines = [f"{'kernel':40s} {'ms':>8s} {'share':>6s} {'GFLOP/s':>8s} {'GB/s':>7s}" + (f" {'peak':>6s}" if peak_gflops else '')]
  for k in sorted(ks, key=lambda k: -k.seconds)[:top]:
    lines.append(f"{k.name[:40]:40s} {k.seconds * 1e3:8.3f} {k.seconds / total * 100:5.1f}% {k.gflops:8.1f} {k.gbps:7.1f}{peak(k.gflops)}")
  lines.append(f"{'all ' + str(len(ks)) + ' calls, each run alone':40s} {total * 1e3:8.3f} 100.0% {flops / total / 1e9:8.1f} {'':7s}"
               f"{peak(flops / total / 1e9)}")
  return lines

def format_thread_times(replays: list[list[tuple[str, np.ndarray]]], top: int = 10) -> list[str]:
  """Replay.thread_times of several replays as table lines: the `top` kernels by median time, each thread's median ms
  in its launches, and the share of the kernel's time the threads waited at its barrier on average; then the totals."""
  names = [name for name, _ in replays[0]]
  med = np.median(np.stack([np.stack([t for _, t in r]) for r in replays]).astype(np.float64) / 1e6, axis=0)   # (kernels, threads + 1)
  def idle(m: np.ndarray) -> float: return 1 - m[:-1].mean() / m[-1] if m[-1] else 0.
  def line(name: str, m: np.ndarray) -> str: return f"{name[:40]:40s} {m[-1]:7.3f} " + ' '.join(f"{x:6.3f}" for x in m[:-1]) + f" {idle(m) * 100:5.1f}%"
  lines = [f"{'kernel':40s} {'ms':>7s} " + ' '.join(f"{'t' + str(i):>6s}" for i in range(med.shape[1] - 1)) + f" {'idle':>6s}"]
  lines += [line(names[i], med[i]) for i in np.argsort(-med[:, -1])[:top]]
  return lines + [line(f"all {len(names)} kernels", med.sum(0))]
