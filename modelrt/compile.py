"""modeld-compile: capture, validate and save model artifacts ahead of time, so the daemons only load and replay.

Per family it identifies the models' I/O contract, captures and checks every JIT, then writes DIR/<family>/ atomically;
an unchanged build is skipped. HELP says each step, docs/RUNTIME.md the format.
"""
from __future__ import annotations
import argparse, contextlib, hashlib, json, os, pathlib, signal, sys, time
from dataclasses import dataclass
from collections.abc import Callable, Iterator
import numpy as np
from tinygrad import Tensor, TinyJit, Device, dtypes
from tinygrad.helpers import Context, tqdm   # tinygrad's own bar: the base install has no tqdm
from tinygrad.uop.ops import Ops
from msgq.visionipc.layout import NV12Layout
from transformations.model import MODEL_WIDTH, MODEL_HEIGHT, DM_WIDTH, DM_HEIGHT
from modelrt.modeldef import ModelDef
from modelrt.contracts import CONTRACTS, FAMILY_MODELS, ContractError, Model, identify
from modelrt.replay import TensorSpec, Replay, buffer_of, camera_tensor
from modelrt.runner import IMG_QUEUE_SHAPE, aligned_empty, host_tensor, zero_tensor
from modelrt import artifact, internals, weights
from modelrt.artifact import save_jit, load_verified, write_artifact, load_artifact, ArtifactError, warp_name, FORMAT_VERSION
from modelrt.schedule import scheduled, vector_width

HELP = """modeld-compile: capture, validate and save model artifacts ahead of time, so the daemons only load and replay.

Per family (road: vision + policy, dm: driver monitoring) it first identifies the I/O contract the models follow
from their own metadata (inputs, output width, output_slices; see modelrt.contracts) and refuses models that follow
none, naming every mismatch. Then it captures one warp JIT per camera buffer layout and one JIT per model, checks
each one (the three JIT stages run, replays match an eager run, every input changes the output, the pickle reloads
and replays bit-identically) and only then writes DIR/<family>/ atomically. A build is addressed by the hash of its
sources, contract, options, layouts and tinygrad/target versions: an unchanged build is skipped.
"""

class ValidationError(RuntimeError):
  """A captured JIT failed a check; nothing was written."""

# ***** the captured functions. Every per-frame value is a Tensor argument (never a closure), the layout is baked in *****

def road_warp_fn(layout: NV12Layout, device: str) -> Callable:
  from modelrt.warp import road_warp, update_img_queue
  def warp(queue: Tensor, frame: Tensor, transform: Tensor) -> Tensor:
    img = update_img_queue(queue, road_warp(frame.to(device), transform.to(device), layout))
    Tensor.realize(queue, img)
    return img
  return warp

def dm_warp_fn(layout: NV12Layout, device: str) -> Callable:
  from modelrt.warp import dm_warp
  def warp(frame: Tensor, transform: Tensor) -> Tensor: return dm_warp(frame.to(device), transform.to(device), layout).contiguous().realize()
  return warp

def model_fn(md: ModelDef, device: str) -> Callable:
  def run(**inputs: Tensor) -> Tensor: return md.fn(**{k: v.to(device) for k, v in inputs.items()}).cast(dtypes.float32).contiguous().realize()
  return run

# ***** inputs. kind: 'camera' (from_blob over a ringbuffer), 'host' (numpy shared through an NPY tensor),
# 'device' (a device buffer another JIT wrote), 'state' (a device buffer the JIT updates in place, owned by the runner) *****

@dataclass(frozen=True)
class InputPlan:
  name: str
  shape: tuple[int, ...]
  dtype: str
  kind: str
  layout: NV12Layout | None = None

def _random(p: InputPlan, rng: np.random.Generator) -> np.ndarray:
  if p.dtype == 'uint8': return rng.integers(0, 256, p.shape, dtype=np.uint8)
  return rng.standard_normal(p.shape).astype(p.dtype)

def _transform(rng: np.random.Generator, out_w: int, out_h: int, layout: NV12Layout) -> np.ndarray:
  """A plausible model->camera map: scale to the frame, a few pixels of random shift and shear."""
  m = np.array([[layout.width / out_w, 0, 0], [0, layout.height / out_h, 0], [0, 0, 1]], np.float32)
  return m + np.array([[.05, .02, 4], [.01, .05, 3], [0, 0, 0]], np.float32) * rng.standard_normal((3, 3)).astype(np.float32)

class Feed:
  """One set of inputs for a JIT. Keeps the numpy arrays under camera and host tensors alive as long as it lives."""
  def __init__(self, plans: list[InputPlan], device: str, rng: np.random.Generator, transform_size: tuple[int, int] | None = None):
    self.arrays, self.tensors = {}, {}
    for p in plans:
      if p.kind == 'state': continue
      if p.kind == 'camera':
        a = aligned_empty(p.layout.size)
        a[:] = rng.integers(0, 256, a.shape, dtype=np.uint8)
        self.arrays[p.name], self.tensors[p.name] = a, camera_tensor(a.ctypes.data, a.nbytes)
      elif p.kind == 'host':
        a = _transform(rng, *transform_size, next(q.layout for q in plans if q.kind == 'camera')) if p.name == 'transform' else _random(p, rng)
        self.arrays[p.name], self.tensors[p.name] = a, host_tensor(a)
      else: self.tensors[p.name] = Tensor(_random(p, rng), device=device).realize()

def new_state(plans: list[InputPlan], device: str) -> dict[str, Tensor]:
  return {p.name: Tensor.zeros(*p.shape, dtype=p.dtype, device=device).contiguous().realize() for p in plans if p.kind == 'state'}

def road_warp_plans(layout: NV12Layout) -> list[InputPlan]:
  return [InputPlan('queue', IMG_QUEUE_SHAPE, 'uint8', 'state'), InputPlan('frame', (layout.size,), 'uint8', 'camera', layout),
          InputPlan('transform', (3, 3), 'float32', 'host')]
def dm_warp_plans(layout: NV12Layout) -> list[InputPlan]:
  return [InputPlan('frame', (layout.size,), 'uint8', 'camera', layout), InputPlan('transform', (3, 3), 'float32', 'host')]
def model_plans(md: ModelDef, model: Model) -> list[InputPlan]:
  """md's inputs; those the contract says a warp JIT writes are device buffers, the rest host inputs."""
  return [InputPlan(k, tuple(shape), dt, 'device' if model.inputs[k].warped else 'host') for k, (shape, dt) in md.inputs.items()]

# ***** capture and validation *****

def matches_eager(got: np.ndarray, want: np.ndarray) -> bool:
  """Integer outputs (warps) bit-identical; float outputs within rtol 1e-5, atol 1e-6, since a BEAM build may order
  a reduction differently from the eager kernels. (A reloaded pickle must equal the original JIT bit for bit.)"""
  if got.shape != want.shape: return False
  return np.array_equal(got, want) if got.dtype.kind in 'iub' else np.allclose(got, want, rtol=1e-5, atol=1e-6)

def reloaded(d: pathlib.Path, name: str, entry: dict, specs: list[TensorSpec]) -> Replay:
  """A JIT build_jit saved in d, loaded as the runtime loads it."""
  files = {f: artifact.sha256_file(d / f) for f in (entry['file'], entry['weights'])}
  return Replay(name, load_verified(d, entry, files, 'modeld-compile'), specs)

def _row(t: Tensor, i: int, kind: str) -> Tensor:
  """Row i of a batch's input, as an input of the model on one frame: a host input shared with numpy, else on t's device."""
  a = np.ascontiguousarray(t.numpy()[i:i + 1])
  return host_tensor(a) if kind == 'host' else Tensor(a, device=t.device).realize()

def _out(ret) -> np.ndarray: return (ret if isinstance(ret, np.ndarray) else ret.numpy()).reshape(-1).copy()

def build_jit(name: str, fn: Callable, plans: list[InputPlan], device: str, out_dir: pathlib.Path, seed: int = 0,
              transform_size: tuple[int, int] | None = None, single: Replay | None = None) -> dict:
  """Capture fn as a JIT, validate it, save it to out_dir; returns its manifest entry. Raises ValidationError.
  single: the model on one frame, where fn is it on a batch (its inputs' first axis): each row of a replay must match
  single's replay of that row's inputs (matches_eager), whatever the other rows hold."""
  rng = np.random.default_rng(seed)
  feeds = [Feed(plans, device, rng, transform_size) for _ in range(5)]
  def fail(msg): raise ValidationError(f"{name}: {msg}")
  def run(f, feed, state, **change):
    kw = {**feed.tensors, **change, **state}
    return _out(f.run(kw) if isinstance(f, Replay) else f(**kw))
  def zero(state):
    for t in state.values(): zero_tensor(t)

  # the three stages (run, capture, replay) and more replays, against an eager run of the same frames from the same state
  jit, js, es = TinyJit(fn, prune=True), new_state(plans, device), new_state(plans, device)
  with internals.wrapped('tinygrad.engine.jit', 'prune_linear', lambda real: weights.prune_linear): got = [run(jit, f, js) for f in feeds]
  if jit.captured is None or jit.cnt != len(feeds): fail(f"did not go through the three JIT stages (cnt={jit.cnt})")
  if calls := weights.weight_only(jit.captured):
    fail(f"a replay would compute {', '.join(calls)} from stored weights alone, on every frame: weight-only work must be done once, at capture")
  want = [run(fn, f, es) for f in feeds]
  for i, (g, w) in enumerate(zip(got, want)):
    if not matches_eager(g, w): fail(f"call {i} (stage {min(i, 2)}) differs from the eager run: "
                                     f"{f'max |diff| {np.abs(g.astype(np.float64) - w).max()}' if g.shape == w.shape else f'shape {g.shape} vs {w.shape}'}")
  if (ret := jit.captured.ret) is None or buffer_of(ret) is None: fail("must return one realized contiguous Tensor")
  if any(np.array_equal(got[i], got[i + 1]) for i in range(len(got) - 1)): fail("different inputs gave the same output")

  # round trip through the pickle the runtime loads, with the runtime's loader and guard
  entry = save_jit(jit, out_dir, name)
  specs = [TensorSpec.of(p.name, feeds[0].tensors[p.name] if p.kind != 'state' else js[p.name], str(p.layout) if p.layout else None) for p in plans]
  loaded = reloaded(out_dir, name, entry, specs)
  ls = new_state(plans, device)
  zero(js)
  for i, f in enumerate(feeds):
    a, b = run(loaded, f, ls), run(jit, f, js)
    if not np.array_equal(a, b): fail(f"the reloaded pickle gives different outputs on frame {i}")
    if not matches_eager(a, want[i]): fail(f"the reloaded pickle differs from the eager run on frame {i}")
  for f in feeds[:2] if single else ():   # a batch: each row as the model alone computes it
    rows = run(loaded, f, ls).reshape(plans[0].shape[0], -1)
    for i, row in enumerate(rows):
      alone = single.run({p.name: _row(f.tensors[p.name], i, p.kind) for p in plans})
      if not matches_eager(row, alone):
        fail(f"row {i} of a batch of {len(rows)} differs from the model run on that frame alone (max |diff| "
             f"{np.abs(row.astype(np.float64) - alone).max()}): the model mixes the frames of a batch")
  # every input is live: changing only it changes the output (a Python scalar or closure would have been frozen)
  for p in plans:
    if p.kind == 'state': continue
    zero(ls)
    base = run(loaded, feeds[0], ls)
    zero(ls)
    if np.array_equal(base, run(loaded, feeds[0], ls, **{p.name: feeds[1].tensors[p.name]})):
      fail(f"changing input {p.name!r} does not change the output (captured as a constant?)")
  entry.update(inputs=[s.to_json() for s in specs], output={'dtype': got[0].dtype.name, 'shape': list(ret.shape)})
  return entry

# ***** families *****

def code_sources() -> dict[str, bytes]:
  """{module: source} of the code a build's programs are made from: every module of this package (the captured
  functions, the warps, the ONNX lowering, the casts ModelDef.fed inserts, the contracts, constants, the runner's
  queue shape, the reference models), the geometry (transformations) and the NV12 layouts the warps bake in. Whole
  packages, not a list of modules, so that no dependency can be left out; an edit that changes no program only costs
  a rebuild."""
  root = pathlib.Path(__file__).resolve().parents[1]
  files = {'.'.join(p.relative_to(root).with_suffix('').parts): p for pkg in ('modelrt', 'transformations') for p in (root / pkg).rglob('*.py')}
  files[NV12Layout.__module__] = pathlib.Path(sys.modules[NV12Layout.__module__].__file__)
  return {name: p.read_bytes() for name, p in files.items()}

def code_sha256() -> str:
  """sha256 over code_sources(), each module's name and size before its source: a change to any is a new build."""
  h = hashlib.sha256()
  for name, src in sorted(code_sources().items()):
    h.update(f"{name}\0{len(src)}\0".encode())
    h.update(src)
  return h.hexdigest()

def shape_schedulable(device: str) -> bool:
  """Whether the shape schedule applies: the device compiles with clang (modelrt.schedule writes its CPU kernels)."""
  from tinygrad.renderer.cstyle import ClangRenderer
  return isinstance(Device[device].renderer, ClangRenderer)

def check_schedule(schedule: str, device: str) -> None:
  """ValueError naming why `schedule` cannot build for `device`."""
  if schedule not in ('shape', 'tinygrad'): raise ValueError(f"schedule must be 'shape' or 'tinygrad', got {schedule!r}")
  if schedule == 'shape' and not shape_schedulable(device):
    raise ValueError(f"schedule 'shape' writes clang CPU kernels, {device} compiles with {type(Device[device].renderer).__name__}: "
                     "build it with schedule 'tinygrad' (--beam N searches on top)")

def build_family(out: str | os.PathLike, family: str, models: dict[str, ModelDef], layouts: list[NV12Layout], device: str | None = None,
                 beam: int = 0, command: list[str] | None = None, force: bool = False, progress: bool = True,
                 winograd: str = 'rule', schedule: str = 'shape', batches: tuple[int, ...] = ()) -> tuple[pathlib.Path, bool]:
  """Build (or find up to date) OUT/<family>. Returns (artifact dir, whether it was built). Raises ContractError (the
  models follow no known contract) or ValidationError. schedule: 'shape' (conv and matmul kernels scheduled from their
  shapes, modelrt.schedule) or 'tinygrad' (tinygrad's own heuristics for every kernel). winograd: which ONNX
  convolutions run as Winograd, modelrt.onnx_import.winograd's 'rule', 'all' or 'off'. batches: each model also on that
  many frames at once (JIT <model>_b<n>, modelrt.artifact.batch_name), each row checked against the model alone."""
  from tinygrad.engine.worker import terminate_worker_pool
  from modelrt.onnx_import import winograd as winograd_mode
  device = Device.canonicalize(device or Device.DEFAULT)
  if family not in FAMILY_MODELS or set(models) != set(FAMILY_MODELS[family]):
    raise ValueError(f"family {family!r} needs models {FAMILY_MODELS.get(family)}, got {sorted(models)}")
  if not layouts: raise ValueError("at least one camera layout is needed")
  check_schedule(schedule, device)
  if (default := Device.canonicalize(Device.DEFAULT)) != device:
    raise ValueError(f"building for {device}, but the models' weights are on the default device {default}: make {device} the default "
                     "before loading them (modelrt.artifact.use_device; modeld-compile --device does)")
  layouts, batches = list(dict.fromkeys(layouts)), sorted(set(batches) - {1})
  if any(type(n) is not int or n < 1 for n in batches): raise ValueError(f"batches: expected frame counts >= 1, got {batches}")
  contract = identify(family, models)   # before anything is captured: a model of another contract fails in a second
  models = {k: md.fed({n: i.dtype for n, i in contract.models[k].inputs.items()}) for k, md in models.items()}
  command = command or ['modeld-compile', '--family', family, *[a for l in layouts for a in ('--camera', str(l))], '--out', str(out)]
  key = {'format': FORMAT_VERSION, 'family': family, 'contract': contract.name, 'tinygrad': artifact.tinygrad_version(), 'target': artifact.target(device),
         'options': {'beam': beam, 'winograd': winograd, 'schedule': schedule, **({'batches': batches} if batches else {})},
         'sources': {**{k: md.source_sha256 for k, md in models.items()}, 'code': code_sha256(),
                     'contract': hashlib.sha256(repr(contract).encode()).hexdigest()},
         'layouts': sorted(str(l) for l in layouts)}   # the same set of layouts, in any order, is the same build
  build_id = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
  if not force:
    try:
      if load_artifact(out, family, device).manifest.get('build_id') == build_id: return pathlib.Path(out) / family, False
    except ArtifactError: pass

  jobs: list[tuple[str, Callable, list[InputPlan], tuple[int, int] | None]] = []
  for l in layouts:
    if family == 'road': jobs.append((warp_name(str(l)), road_warp_fn(l, device), road_warp_plans(l), (MODEL_WIDTH, MODEL_HEIGHT)))
    else: jobs.append((warp_name(str(l)), dm_warp_fn(l, device), dm_warp_plans(l), (DM_WIDTH, DM_HEIGHT)))
  singles = {}   # a batch's JIT -> its model's, which each of its rows must match
  for n in (1, *batches):
    for k in FAMILY_MODELS[family]:
      md, singles[artifact.batch_name(k, n)] = models[k].batched(n) if n > 1 else models[k], k if n > 1 else None
      jobs.append((artifact.batch_name(k, n), model_fn(md, device), model_plans(md, contract.models[k]), None))

  def build(tmp: pathlib.Path) -> dict:
    jits, t0 = {}, time.monotonic()
    with tqdm(total=len(jobs), desc=family, disable=not progress) as bar, \
         (beam_progress(family, beam, count_kernels(jobs, device)) if beam and progress else contextlib.nullcontext()):
      for i, (name, fn, plans, tsize) in enumerate(jobs):
        bar.set_description(f"{family}: capture+validate {name}")
        single = reloaded(tmp, k, jits[k], list(map(TensorSpec.from_json, jits[k]['inputs']))) if (k := singles.get(name)) else None
        jits[name] = build_jit(name, fn, plans, device, tmp, seed=i, transform_size=tsize, single=single)
        bar.update(1)
    return {**key, 'build_id': build_id, 'build_seconds': round(time.monotonic() - t0, 1), 'command': command, 'jits': jits,
            'output_slices': {k: {n: [s.start, s.stop] for n, s in models[k].output_slices.items()} for k in FAMILY_MODELS[family]}}
  try:
    with Context(BEAM=beam), winograd_mode(winograd), \
         (scheduled(device, vector_width(key['target']['cpu_features'])) if schedule == 'shape' else contextlib.nullcontext()):
      return write_artifact(out, family, build), True
  finally: terminate_worker_pool()   # the compile worker processes must not outlive the build

def count_kernels(jobs: list, device: str) -> int:
  """How many kernels the jobs' JITs run: each one captured without BEAM (what a build does anyway, minus the search)."""
  n = 0
  with Context(BEAM=0):
    for _, fn, plans, tsize in jobs:
      feed, state, jit = Feed(plans, device, np.random.default_rng(0), tsize), new_state(plans, device), TinyJit(fn, prune=True)
      for _ in range(2): jit(**feed.tensors, **state)
      n += len({c.src[0].key for c in internals.calls(jit.captured).src if c.src[0].op is Ops.PROGRAM})
  return n

@contextlib.contextmanager
def beam_progress(family: str, beam: int, kernels: int) -> Iterator[None]:
  """A bar with an ETA over the BEAM searches (minutes, where a build without them takes seconds): tinygrad looks up
  codegen.opt.search.beam_search at every kernel it optimizes, so a counting wrapper sees each one finish (a cached
  search finishes at once)."""
  with tqdm(total=kernels, desc=f"{family}: BEAM={beam} kernel search", unit='kernel') as bar:
    def counting(real: Callable) -> Callable:
      def counted(*args, **kwargs):
        try: return real(*args, **kwargs)
        finally:
          bar.t = max(bar.t, bar.n + 1)   # its total
          bar.update(1)
      return counted
    with internals.wrapped('tinygrad.codegen.opt.search', 'beam_search', counting): yield

def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog='modeld-compile', formatter_class=argparse.RawDescriptionHelpFormatter, description=HELP, epilog="""
examples:
  modeld-compile --reference --camera 1928x1208:aligned --out artifacts
  modeld-compile --vision-onnx driving_vision.onnx --policy-onnx driving_policy.onnx --camera 1928x1208:2048:2490368:3735552 --out artifacts
  modeld-compile --dm-onnx dmonitoring_model.onnx --camera 1928x1208 --out artifacts

Models must follow a known I/O contract ({contracts}: the release's driving_vision.onnx, driving_policy.onnx
and dmonitoring_model.onnx, and the built-in reference models); others are refused, every mismatch named.
The road artifact (DIR/road) serves modeld, the driver monitoring one (DIR/dm) dmonitoringd; both take --artifacts DIR.
A daemon refuses an artifact built for another tinygrad, device, CPU (instruction-set features) or camera layout and
prints the command that rebuilds it. Artifacts are pickles, i.e. code: load only artifacts you built.
Environment: DEV=CPU selects the CPU (clang) backend; PARALLEL=N compile worker processes (stopped when the build ends);
CACHEDB=path moves tinygrad's compile cache.""".format(contracts=', '.join(sorted({n for c in CONTRACTS.values() for n in c}))))
  src = ap.add_argument_group('models (road: --vision-onnx and --policy-onnx; driver monitoring: --dm-onnx; or --reference)')
  src.add_argument('--vision-onnx', type=pathlib.Path, help="openpilot's driving_vision.onnx (inputs img, big_img; output_slices in metadata_props)")
  src.add_argument('--policy-onnx', type=pathlib.Path, help="openpilot's driving_policy.onnx (inputs features_buffer, desire_pulse, traffic_convention)")
  src.add_argument('--dm-onnx', type=pathlib.Path, help="openpilot's dmonitoring_model.onnx (inputs input_img, calib)")
  src.add_argument('--reference', action='store_true', help="build the built-in reference models (modelrt.reference) instead of ONNX files")
  ap.add_argument('--family', choices=artifact.FAMILIES, action='append', help="build only this family (default: all the given models)")
  ap.add_argument('--camera', action='append', required=True, metavar='LAYOUT',
                  help="camera buffer layout to serve, repeatable: WxH (packed NV12), WxH:aligned (openpilot's padding) or "
                       "WxH:stride:uv_offset:size (bytes); each gets its own warp JIT")
  ap.add_argument('--out', required=True, type=pathlib.Path, help="artifact directory (DIR/road, DIR/dm are replaced atomically)")
  ap.add_argument('--device', help=f"tinygrad device to compile for (default: {Device.DEFAULT}, from DEV=)")
  ap.add_argument('--beam', type=int, default=0, metavar='N', help="BEAM kernel search width: slower build (minutes; a bar shows the "
                  "searches with an ETA, and tinygrad caches them per machine), faster replay (default 0: off)")
  ap.add_argument('--winograd', nargs='?', const='all', default='rule', choices=('rule', 'all', 'off'), help="which dense 3x3 "
                  "stride-1 convolutions of ONNX models run as Winograd F(4x4, 3x3) (tinygrad's WINO: fewer multiplies, more memory "
                  "traffic): rule (default) those on images of at least 32x32 pixels a frame, where it was measured faster; all (also a bare "
                  "--winograd); off")
  ap.add_argument('--schedule', choices=('shape', 'tinygrad'), help="shape (the CPU's default): convolution and matmul kernels "
                  "vectorized and register-blocked by rules from their shapes and the CPU's vector width, the same on every machine of "
                  "an ISA; tinygrad (a GPU's default, the only one there): tinygrad's own heuristics for every kernel. --beam searches "
                  "on top of either")
  ap.add_argument('--batch', type=int, action='append', default=[], metavar='N', help="also build each model on N frames at once, "
                  "repeatable: modeld-batch --batch-frames N runs N segments side by side through it (each layer one kernel over the "
                  "N frames: a weight read once for all of them); each row is checked against the model alone")
  ap.add_argument('--force', action='store_true', help="rebuild even when an identical build is already there")
  ap.add_argument('--quiet', action='store_true', help="no progress bar")
  args = ap.parse_args(argv)
  try: layouts = list(dict.fromkeys(NV12Layout.parse(c) for c in args.camera))   # a layout given twice is built once
  except ValueError as e: ap.error(str(e))
  if args.beam < 0: ap.error(f"--beam: expected N >= 0, got {args.beam}")
  if any(n < 1 for n in args.batch): ap.error(f"--batch: expected N >= 1, got {min(args.batch)}")
  batches = sorted(set(args.batch) - {1})
  if args.out.exists() and not args.out.is_dir(): ap.error(f"--out {args.out}: expected a folder for the artifacts, found a file")
  if args.reference and (args.vision_onnx or args.policy_onnx or args.dm_onnx): ap.error("--reference replaces the ONNX files: give one or the other")
  if bool(args.vision_onnx) != bool(args.policy_onnx): ap.error("the road model needs both --vision-onnx and --policy-onnx")
  if not (args.reference or args.vision_onnx or args.dm_onnx): ap.error("nothing to build: give ONNX models or --reference")
  families = [f for f in artifact.FAMILIES if (args.reference or (args.vision_onnx if f == 'road' else args.dm_onnx)) and (not args.family or f in args.family)]
  if not families: ap.error(f"--family {', '.join(args.family)}: no models given for it")
  try: device = artifact.use_device(args.device) if args.device else Device.canonicalize(Device.DEFAULT)
  except Exception as e: ap.error(f"--device {args.device}: {type(e).__name__}: {e}")
  try: artifact.target(device)   # opens it: a backend whose library or hardware is not here is named
  except ArtifactError as e:
    print(f"modeld-compile: error: {e}", file=sys.stderr)
    return 1
  if args.schedule is None: args.schedule = 'shape' if shape_schedulable(device) else 'tinygrad'
  try: check_schedule(args.schedule, device)
  except ValueError as e: ap.error(f"--schedule {args.schedule}: {e}")
  cams = [a for l in layouts for a in ('--camera', str(l))]
  from modelrt.onnx_import import load_onnx, OnnxImportError
  stop = []
  def stopped(signum, _frame):   # SIGTERM as Ctrl-C: the build's temporary folder goes, the artifact stays as it was
    stop.append(signum)
    for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, signal.SIG_IGN)   # once: nothing cuts the clean-up short
    raise KeyboardInterrupt
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, stopped)
  try:
    for family in families:
      if args.reference:
        if family == 'road':
          from modelrt.reference.road import vision_model, policy_model
          models = {'vision': vision_model(), 'policy': policy_model()}
        else:
          from modelrt.reference.dm import dm_model
          models = {'dm': dm_model()}
        srcs = ['--reference']
      else:
        files = {'vision': args.vision_onnx, 'policy': args.policy_onnx} if family == 'road' else {'dm': args.dm_onnx}
        models = {k: load_onnx(p, k) for k, p in files.items()}
        srcs = [a for k, p in files.items() for a in (f'--{k}-onnx', str(p.resolve()))]
      command = ['modeld-compile', *srcs, '--family', family, *cams, '--out', str(args.out.resolve()), '--device', device, '--beam', str(args.beam),
                 '--winograd', args.winograd, '--schedule', args.schedule, *[a for n in batches for a in ('--batch', str(n))]]
      path, built = build_family(args.out, family, models, layouts, device, args.beam, command, args.force, not args.quiet, args.winograd,
                                 args.schedule, batches)
      print(f"{family}: {'built' if built else 'up to date'}: {path} ({', '.join(str(l) for l in layouts)})")
  except (ContractError, ValidationError, OnnxImportError, ArtifactError, OSError) as e:
    print(f"modeld-compile: error: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    print(f"modeld-compile: interrupted; {args.out} keeps what it held before this build", file=sys.stderr)
    return 128 + (stop[0] if stop else signal.SIGINT)
  return 0

if __name__ == '__main__': sys.exit(main())
