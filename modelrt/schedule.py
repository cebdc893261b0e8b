"""Kernel options from shapes, without timing anything: a sum of products whose weight is read contiguously along an
output axis (a channels-last conv's output channels, a matmul's columns) gets that axis in vectors of the CPU's width,
a block of another output axis as independent accumulators, its innermost reduction unrolled, and its outermost
output axis cut into launches. The same model gives the same kernels on every machine of an ISA."""
from __future__ import annotations
import contextlib, dataclasses, functools, os
from collections.abc import Callable, Iterator
from tinygrad.codegen.opt import Opt, OptOps, KernelOptError
from tinygrad.dtype import dtypes
from tinygrad.helpers import Context, getenv
from tinygrad.uop.ops import Ops, UOp
from modelrt import internals

BLOCK = 8       # accumulator vectors per kernel iteration: enough independent FMA chains to hide their latency
LAUNCHES = 16   # a scheduled kernel's launches (tinygrad's THREAD opt): what `--threads N` shares out; NUM_CPU_THREADS in a build

# clang makes 256-bit vectors on most AVX-512 CPUs (-march=native) and then leaves a kernel's 16-wide loops split or
# scalar (batched frames worst): the kernels written for 16 lanes ask for 512-bit ones (docs/PERFORMANCE.md)
WIDE = 'prefer-vector-width=512'

def vector_width(features: list[str]) -> int:
  """float32 lanes of the widest vector registers the instruction-set features (modelrt.artifact.cpu_features) give."""
  return 16 if 'avx512f' in features else 8 if 'avx' in features else 4

def _stride(idx: UOp, rng: UOp) -> int | None:
  """rng's coefficient in a linear index expression: 0 when absent, None when it enters other than linearly."""
  if rng not in idx.backward_slice_with_self: return 0
  s = 0
  for t in idx.split_uop(Ops.ADD):
    if t is rng: s += 1
    elif t.op is Ops.MUL and rng in t.src and (c := t.src[1 - t.src.index(rng)]).op is Ops.CONST: s += c.arg
    elif rng in t.backward_slice_with_self: return None
  return s

def conv_opts(k, width: int, launches: int = LAUNCHES) -> list[Opt]:
  """Opts for a tinygrad Scheduler `k` (codegen.opt.postrange) of a float sum of products, [] if it is none or has
  no output axis along which one operand is contiguous and the other constant (then tinygrad's heuristic schedules it)."""
  if len(reds := k.reduceops) != 1 or reds[0].arg[0] is not Ops.ADD or reds[0].dtype != dtypes.float32 or k.applied_opts: return []
  if len(stores := [x.src[0] for x in k.ast.toposort() if x.op is Ops.STORE]) != 1: return []
  out, loads = stores[0].src[1].get_idx(), [x.src[1].get_idx() for x in reds[0].src[0].toposort() if x.op is Ops.INDEX]
  axes = [k.rngs[i] for i in k.upcastable_dims]
  def dep(r: UOp) -> list[bool]: return [r in i.backward_slice_with_self for i in loads]
  # the vector axis: exactly one operand (the weight) reads it, contiguously, and another operand exists
  vecs = [(r, dep(r).index(True)) for r in axes if sum(dep(r)) == 1 and _stride(loads[dep(r).index(True)], r) == 1 and len(loads) > 1]
  if not vecs: return []
  vec, w = min(vecs, key=lambda v: abs(_stride(out, v[0]) or 1 << 30))
  spatial = [r for r in axes if r is not vec and not dep(r)[w] and any(dep(r))]
  k = k.copy()
  def axis(r: UOp) -> int | None: return next((i for i, x in enumerate(k.rngs) if x.arg[0] == r.arg[0]), None)   # None: upcast whole
  def size(r: UOp) -> int: return 1 if (a := axis(r)) is None else k.full_shape[a]
  def upcast(r: UOp, want: int, pad: bool = True) -> int:
    """Upcast r by want, else by its largest power-of-two divisor of at least want/2, else (pad) padded to want; the amount."""
    if (s := size(r)) <= want: amt = s
    elif (amt := next((a for a in (want, want // 2) if a > 1 and s % a == 0), 0)) == 0:
      if not pad: return 1
      k.apply_opt(Opt(OptOps.PADTO, axis(r), amt := want))
    if amt > 1: k.apply_opt(Opt(OptOps.UPCAST, axis(r), amt))
    return amt
  try:
    if upcast(vec, width, pad=False) < 4: return []
    if not spatial: upcast(vec, 4, pad=False)   # a matrix-vector product: more vectors of outputs for independent chains
    left = BLOCK
    # outputs close together in memory first, but not those contiguous in the output: a store along them defeats the vectors
    for r in sorted(spatial, key=lambda r: ((st := _stride(out, r)) == 1, abs(st or 1 << 30))):
      if left > 1: left //= upcast(r, min(left, 2) if _stride(out, r) == 1 else left)
    if k.unrollable_dims and ((s := k.full_shape[k.unrollable_dims[-1]]) <= 4 or s % 4 == 0):   # a conv's kernel width, else by 4
      k.apply_opt(Opt(OptOps.UNROLL, len(k.unrollable_dims) - 1, 0 if s <= 4 else 4))
    # the output axis left that cuts into the most launches, the outermost of those (not the vector axis: cut, its loads
    # stop vectorizing); the most, not the outermost alone: a first axis of 2 would leave every thread past the second idle
    cuts = [(t, -i, r) for i, r in enumerate(axes) if r is not vec and size(r) > 1 and (t := next((t for t in range(launches, 1, -1) if size(r) % t == 0), 0))]
    if cuts:
      t, _, r = max(cuts, key=lambda c: c[:2])
      k.apply_opt(Opt(OptOps.THREAD, axis(r), t))
  except KernelOptError: return []
  return list(k.applied_opts)

class _Grabbed(Exception): pass

def scheduler(ast: UOp, ren):
  """The tinygrad Scheduler of a kernel AST as its compile sees it: the AST through codegen's own steps up to its
  choice of opts (caught there), then as the Scheduler that choice starts from."""
  import tinygrad.codegen as cg
  from tinygrad.codegen.opt.postrange import Scheduler
  got: list[UOp] = []
  def grab(sink: UOp, *_, **__):
    got.append(sink)
    raise _Grabbed
  with internals.wrapped('tinygrad.codegen', 'apply_opts', lambda real: grab):
    try: cg.full_rewrite_to_sink(ast, ren)
    except _Grabbed: pass
  k = Scheduler(got[0], ren)
  k.convert_loop_to_global()
  return k

@contextlib.contextmanager
def scheduled(device: str, width: int) -> Iterator[None]:
  """Kernels compiled in this context for a clang CPU device get conv_opts: written into each kernel's AST
  (KernelInfo.opts_to_apply, part of its cache key, honoured by the compile workers too) before tinygrad compiles it,
  and under BEAM applied before the search, which goes on from them. Kernels launch in LAUNCHES parts on any machine,
  and loads and stores stay scalar for clang's vectorizer (tinygrad's DMC): tinygrad's float4 loads split the 16-wide
  weight vectors clang would otherwise make (a conv 2.3x slower). 16 lanes on x86: clang is asked for 512-bit vectors."""
  from tinygrad import Device
  from tinygrad.engine.worker import terminate_worker_pool
  from tinygrad.helpers import DEV
  t = Device[device].renderer.target   # a ClangRenderer's: build_family refuses the shape schedule elsewhere
  if width == 16 and t.arch.startswith('x86_64') and WIDE not in t.arch: t = dataclasses.replace(t, arch=f"{t.arch},{WIDE}")
  target = Context(DEV=[t, *DEV.value])   # its renderer compiles with these flags, in the compile workers too (it travels)
  with target: ren = Device[device].renderer
  @functools.cache
  def with_opts(ast: UOp) -> UOp:
    if not any(u.op is Ops.REDUCE for u in ast.toposort()) or not (opts := conv_opts(scheduler(ast, ren), width)): return ast
    return ast.replace(arg=dataclasses.replace(ast.arg, opts_to_apply=tuple(opts)))
  def lower_and_compile(real_lower: Callable) -> Callable:
    return lambda linear: real_lower(with_opts_in(linear))
  def with_opts_in(linear: UOp) -> UOp:
    subs = {c: c.replace(src=(new, *c.src[1:])) for c in linear.toposort() if c.op is Ops.CALL and (a := c.src[0]).op is Ops.SINK and a.tag is None
            and a.arg.opts_to_apply is None and not a.arg.beam and Device[c.device if isinstance(c.device, str) else c.device[0]].renderer is ren
            and (new := with_opts(a)) is not a}
    return linear.substitute(subs) if subs else linear
  def beam_search(real_beam: Callable) -> Callable:
    def search_from_opts(s, *args, **kwargs):
      if (opts := conv_opts(s, width)):
        s = s.copy()
        for o in opts: s.apply_opt(o)
      return real_beam(s, *args, **kwargs)
    return search_from_opts
  def dmc(value: str | None) -> None:   # an environment switch tinygrad reads once per process: compile workers start again
    if value is None: os.environ.pop('DMC', None)
    else: os.environ['DMC'] = value
    getenv.cache_clear()
    terminate_worker_pool()
  saved = os.environ.get('DMC')
  dmc('1')
  try:
    with internals.wrapped('tinygrad.engine.realize', 'lower_and_compile', lower_and_compile), \
         internals.wrapped('tinygrad.codegen.opt.search', 'beam_search', beam_search), Context(NUM_CPU_THREADS=LAUNCHES), target: yield
  finally: dmc(saved)
