"""Weight-only work happens once, at build time: a capture keeps only the calls whose data flows from the JIT's inputs
and runs the rest (transforms of constant weights: Winograd's, a repacking, a folded constant) once, so the artifact
stores their results; weight_only() names any call of a captured JIT that a replay would still run on weights alone."""
from __future__ import annotations
from tinygrad.engine.realize import get_call_arg_uops, get_call_outs_ins
from tinygrad.uop.ops import Ops, ProgramInfo, UOp
from modelrt.internals import collect_bufs
from modelrt.profile import _calls, call_name

def _outs(call: UOp) -> tuple[int, ...] | None:
  """The argument indices a call writes (a kernel's stores, a copy's target); None where tinygrad does not say."""
  if (ast := call.src[0]).op is Ops.SINK: return ProgramInfo.from_sink(ast).outs
  return outs if (outs := get_call_outs_ins(call)[0]) else None

def prune_linear(linear: UOp, needed: set[UOp]) -> tuple[UOp, UOp]:
  """(the calls a replay runs, the calls to run once): a call is kept where one of its buffers is an input or written by
  a kept call, and only what it writes joins them. tinygrad's own prune adds every buffer a kept call touches, the
  weights it reads included: a second use of a weight then ran that weight's transform on every replay."""
  live, kept, once = set(needed), [], []
  for call in linear.src:
    args = [set(collect_bufs(a)) for a in call.src[1:]]
    if not set().union(*args).isdisjoint(live):
      kept.append(call)
      outs = _outs(call)
      live |= set().union(*(args[i] for i in range(len(args)) if outs is None or i in outs))
    else: once.append(call)
  return linear.replace(src=tuple(kept)), linear.replace(src=tuple(once))

def _span(u: UOp) -> tuple[int, int, int] | None:
  """(base buffer, first byte, end) of a call argument's buffer, None for an input (a PARAM)."""
  if u.op is Ops.PARAM: return None
  b = u.buffer
  return id(b.base), b.offset, b.offset + b.nbytes

def weight_only(captured) -> list[str]:
  """The kernels of a captured JIT a replay runs on stored buffers alone (no input, and nothing computed from one in
  this replay, among what they read; no input among what they write): work a build should have done once."""
  live: list[tuple[int, int, int]] = []
  def is_live(s: tuple[int, int, int] | None) -> bool: return s is None or any(b == s[0] and a < s[2] and s[1] < e for b, a, e in live)
  found = []
  for call in _calls(captured.linear):
    args = [_span(a) for a in get_call_arg_uops(call)]
    outs, ins = get_call_outs_ins(call)   # a kernel's or a copy's; none for a call tinygrad says nothing of: all its arguments
    reads, writes = ([args[i] for i in ins], [args[i] for i in outs]) if outs else (args, args)
    if any(map(is_live, reads)) or any(s is None for s in writes): live += [s for s in writes if s is not None]
    else: found.append(call_name(call))
  return found
