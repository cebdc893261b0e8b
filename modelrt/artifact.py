"""Compiled model artifacts: pickled captured JITs plus a JSON manifest, verified before anything is unpickled.

ARTIFACTS ARE CODE: unpickling runs code. Load only artifacts you built (modeld-compile) or trust. The hashes catch
corruption, truncation and mismatched builds; they are no defence against someone who can rewrite the manifest too.
Format and checks: docs/RUNTIME.md."""
from __future__ import annotations
import dataclasses, hashlib, importlib.metadata, io, json, os, pathlib, pickle, platform, shlex, shutil
from dataclasses import MISSING
from typing import Any
from collections.abc import Callable
from tinygrad import Device, TinyJit
from tinygrad.device import Buffer
from tinygrad.uop.ops import UOp, Ops, ParamArg
from cereal.services import CAMERA_OF_STREAM
from service.owned import NotOwnedError, check_code
from msgq.visionipc import DRIVER
from msgq.visionipc.layout import NV12Layout
from modelrt.replay import Replay, TensorSpec, is_count
from modelrt.contracts import CONTRACTS, FAMILY_MODELS, Contract, lookup

FORMAT_VERSION = 2   # 2: the manifest names the models' I/O contract
FAMILIES = tuple(FAMILY_MODELS)
MANIFEST = 'manifest.json'
_BIN_ALIGN = 64

class ArtifactError(RuntimeError):
  """The artifact cannot be used on this machine; the message says why and how to rebuild it."""

def tinygrad_version() -> str: return importlib.metadata.version('tinygrad')

# cpuinfo names of instruction-set extensions. The clang CPU backend compiles with -march=native, so generated code may
# use any of these that the build machine has; a machine without one would die of SIGILL mid-frame.
_X86_ISA = {'mmx', 'sse', 'sse2', 'pni', 'ssse3', 'sse4_1', 'sse4_2', 'sse4a', 'avx', 'avx2', 'fma', 'fma4', 'xop', 'tbm', 'f16c',
            'bmi1', 'bmi2', 'abm', 'popcnt', 'movbe', 'aes', 'vaes', 'pclmulqdq', 'vpclmulqdq', 'sha_ni', 'adx', 'rdrand', 'rdseed',
            'cx8', 'cx16', 'lahf_lm', 'cmov', 'fxsr', 'xsave', 'xsaveopt', 'xsavec', 'xsaves', 'gfni', 'clflushopt', 'clwb', 'clzero',
            'rdpid', 'movdiri', 'movdir64b', 'serialize', 'avx_vnni', 'avx_vnni_int8', 'avx_ifma', 'avx_ne_convert', 'fsgsbase',
            'prfchw', '3dnowprefetch', 'wbnoinvd', 'invpcid', 'pku'}

def cpu_features(cpuinfo: str | None = None) -> list[str]:
  """Instruction-set features of this CPU (x86: the ISA flags of /proc/cpuinfo; arm: all 'Features')."""
  if cpuinfo is None:
    try: cpuinfo = pathlib.Path('/proc/cpuinfo').read_text()
    except OSError: return []
  for line in cpuinfo.splitlines():
    key, _, val = line.partition(':')
    if key.strip() in ('flags', 'Features'):
      flags = set(val.split())
      return sorted(f for f in flags if key.strip() == 'Features' or f in _X86_ISA or f.startswith(('avx512', 'amx')))
  return []

def target(device: str) -> dict[str, Any]:
  """What compiled code is tied to: the device, its compiler arch, and for the CPU the instruction-set features."""
  try:
    device = Device.canonicalize(device)
    arch = getattr(Device[device], 'arch', None)
  except Exception as e:   # an unknown name, a backend whose library or hardware is not here: tinygrad raises anything
    raise ArtifactError(f"tinygrad device {device!r} cannot be opened on this machine: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}") from None
  return {'device': device, 'arch': arch, 'machine': platform.machine(),
          'cpu_features': cpu_features() if device.split(':')[0] == 'CPU' else []}

def use_device(device: str) -> str:
  """Make `device` this process's default tinygrad device before any model is loaded (weights go to the default): a
  backend (CPU, CUDA, NV, AMD, QCOM) or an instance of one (CUDA:1; CPU:1, a second CPU device, is no host memory to
  the runtime). DEV in the environment, which child processes read, can name only the backend. Returns it canonical."""
  from tinygrad.helpers import DEV
  device = Device.canonicalize(device)
  backend = device.split(':')[0]
  DEV.value = [dataclasses.replace(DEV.target(backend), device=device), *DEV.value]   # DEV.target: the user's renderer of it
  if os.environ.get('DEV', '').split(':')[0].upper() != backend: os.environ['DEV'] = backend   # DEV=CPU:LLVM stays
  return device

def sha256_file(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    while chunk := f.read(1 << 20): h.update(chunk)
  return h.hexdigest()

# ***** saving *****

def save_jit(jit: TinyJit, out_dir: pathlib.Path, name: str) -> dict[str, Any]:
  """Pickle a captured JIT as NAME.pkl + NAME.bin; returns its manifest entry (file names and buffer offsets)."""
  chunks: list[pickle.PickleBuffer] = []
  data = pickle.dumps(jit, protocol=5, buffer_callback=chunks.append)
  spans, off = [], 0
  with open(out_dir / f'{name}.bin', 'wb') as f:
    for pb in chunks:
      mv = pb.raw()
      f.write(b'\0' * (pad := -off % _BIN_ALIGN))
      f.write(mv)
      spans.append((off + pad, mv.nbytes))
      off += pad + mv.nbytes
  (out_dir / f'{name}.pkl').write_bytes(data)
  return {'file': f'{name}.pkl', 'weights': f'{name}.bin', 'buffers': spans}

# ***** loading *****

class _Pending(bytearray):
  """Stands in for a buffer's contents in the pickle stream; the bytes come from NAME.bin when the Buffer is made."""

class _Unpickler(pickle.Unpickler):
  """Two fixes to a plain pickle.load of a captured JIT:
  - tinygrad 0.14 identifies a buffer by (slot number, size, dtype, device), slot numbers counting from 0 in every
    process, and dedups identical UOps: unpickled as is, a weight buffer and a tensor the loading process made (or
    the same pickle loaded twice) become one buffer. Every BUFFER gets a fresh slot from this process's counter.
  - Buffer contents are read from the weights file straight into the allocated buffer (host-visible memory) or via
    one bytearray, instead of tinygrad's bytes -> bytearray -> buffer copies."""
  def __init__(self, data: bytes, n_buffers: int, fill):
    super().__init__(io.BytesIO(data), buffers=(_Pending() for _ in range(n_buffers)))
    self.slots: dict[int, int] = {}
    self.fill = fill
  def find_class(self, module, name):
    if (module, name) == ('tinygrad.uop.ops', 'UOp'): return self._uop
    if (module, name) == ('tinygrad.device', 'Buffer'): return self._buffer
    return super().find_class(module, name)
  def _uop(self, op, dtype=None, src=(), arg=None, tag=None, metadata=None, _buffer=None):
    if op is Ops.BUFFER and isinstance(arg, ParamArg):
      arg = dataclasses.replace(arg, slot=self.slots.setdefault(arg.slot, next(UOp.unique_num)))
    return UOp(op, dtype, src, arg, tag, metadata, _buffer)
  def _buffer(self, device, size, dtype, opaque=None, options=None, initial_value=None, *rest):
    if not isinstance(initial_value.obj if isinstance(initial_value, memoryview) else initial_value, _Pending):
      return Buffer(device, size, dtype, opaque, options, initial_value, *rest)
    buf = Buffer(device, size, dtype, None, options, None, *rest).allocate()
    self.fill(buf)
    return buf

def _altered(name: str, want: str | None, got: str) -> str:
  return f"{name} does not match its sha256 in the manifest (expected {want[:12] if want else 'none'}..., got {got[:12]}...)"

def _host_view(buf: Buffer) -> memoryview | None:
  """A writable view of the buffer's memory if the CPU can see it (CPU device), else None (e.g. GPU memory)."""
  try: return buf.as_memoryview(force_zero_copy=True)
  except Exception: return None

def load_verified(d: pathlib.Path, entry: dict, files: dict[str, str], rebuild: str) -> TinyJit:
  """Unpickle NAME.pkl from the very bytes whose sha256 was checked; buffer contents stream from NAME.bin into the
  buffers, hashed as they are read, and the load fails unless the whole file's digest matches. Peak memory: the
  weights once (plus the largest buffer once more for a device that is not host-visible)."""
  def bad(msg): return ArtifactError(f"{d}: {msg}. Rebuild with: {rebuild}")
  try: data = (d / entry['file']).read_bytes()
  except OSError as e: raise bad(f"cannot read {entry['file']} ({e.strerror})") from None
  if (got := hashlib.sha256(data).hexdigest()) != files.get(entry['file']): raise bad(_altered(entry['file'], files.get(entry['file']), got))
  try: f = open(d / entry['weights'], 'rb')
  except OSError as e: raise bad(f"cannot read {entry['weights']} ({e.strerror})") from None
  h, spans, pos = hashlib.sha256(), enumerate(entry['buffers']), 0
  def read_into(mv: memoryview) -> None:
    if f.readinto(mv) != mv.nbytes: raise bad(f"{entry['weights']} is shorter than its buffer table (truncated)")
    h.update(mv)
  def fill(buf: Buffer) -> None:
    nonlocal pos
    i, (off, n) = next(spans)   # the unpickler asks for as many buffers as the table lists, no more
    if n != buf.nbytes:
      raise bad(f"{entry['weights']}: buffer table does not match {entry['file']}: buffer {i} of the pickle has {buf.nbytes} bytes, the table says {n}")
    read_into(memoryview(bytearray(off - pos)))
    if (host := _host_view(buf)) is not None: read_into(host)
    else:
      read_into(mv := memoryview(bytearray(n)))
      buf.copy_from(Buffer('PYTHON', buf.size, buf.dtype, opaque=mv))
    pos = off + n
  with f:
    try: jit = _Unpickler(data, len(entry['buffers']), fill).load()
    except ArtifactError: raise
    except Exception as e: raise bad(f"{entry['file']} is not a loadable pickle (truncated or corrupt: {type(e).__name__}: {e})") from None
    while chunk := f.read(1 << 20): h.update(chunk)
  if (got := h.hexdigest()) != files.get(entry['weights']): raise bad(_altered(entry['weights'], files.get(entry['weights']), got))
  return jit

def _is_pair(v: Any) -> bool: return isinstance(v, list) and len(v) == 2 and all(map(is_count, v))
def _is_strs(v: Any) -> bool: return isinstance(v, list) and all(isinstance(x, str) for x in v)

def _check_manifest(m: dict, family: str, bad: Callable[[str], ArtifactError]) -> None:
  """Every field that loading, the runners and the daemons read, present and of its type, before any is used: a damaged
  manifest fails at load naming the field, what was expected and what is there, never later (after a camera connected)
  as a KeyError or TypeError."""
  def malformed(path: tuple[str, ...], want: str, got: Any = MISSING) -> ArtifactError:
    got = 'nothing' if got is MISSING else repr(got) if len(repr(got)) <= 80 else repr(got)[:77] + '...'
    return bad(f"{MANIFEST} field {'.'.join(path)}: expected {want}, got {got}")
  def get(want: str, ok: Callable[[Any], Any], *path: str) -> Any:
    v = m
    for i, k in enumerate(path):
      if not isinstance(v, dict): raise malformed(path[:i], 'an object', v)
      if k not in v: raise malformed(path[:i + 1], want if i == len(path) - 1 else 'an object')
      v = v[k]
    if not ok(v): raise malformed(path, want, v)
    return v
  get('a version', lambda v: isinstance(v, str), 'tinygrad')
  get('a device name', lambda v: isinstance(v, str), 'target', 'device')
  get('an arch name or null', lambda v: v is None or isinstance(v, str), 'target', 'arch')
  get('a list of feature names', _is_strs, 'target', 'cpu_features')
  get('a contract name', lambda v: isinstance(v, str), 'contract')
  get('a command line (a list of strings)', lambda v: _is_strs(v) and v, 'command')
  layouts = get('a list of camera layouts', _is_strs, 'layouts')
  get('{file name: sha256}', lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()), 'files')
  batches = get('a list of frame counts', lambda v: isinstance(v, list) and all(is_count(n) and n > 1 for n in v), 'options', 'batches') \
    if 'batches' in m.get('options', {}) else []
  for name in (*FAMILY_MODELS[family], *map(warp_name, layouts), *(batch_name(k, n) for n in batches for k in FAMILY_MODELS[family])):
    for k in ('file', 'weights'): get('a file name', lambda v: isinstance(v, str), 'jits', name, k)
    get('a list of [offset, size] pairs', lambda v: isinstance(v, list) and all(map(_is_pair, v)), 'jits', name, 'buffers')
    for i, spec in enumerate(get('a list of input specs', lambda v: isinstance(v, list), 'jits', name, 'inputs')):
      try: TensorSpec.from_json(spec)
      except ValueError as e: raise malformed(('jits', name, 'inputs', str(i)), f"an input spec ({e})") from None
  for layout in layouts:   # the runners check every camera buffer against the layout its warp's frame input was captured for
    frame = next((s for s in m['jits'][warp_name(layout)]['inputs'] if s['name'] == 'frame'), {})
    if frame.get('layout') != layout:
      raise malformed(('jits', warp_name(layout), 'inputs', 'frame', 'layout'), f"the camera layout {layout}", frame.get('layout', MISSING))
  for model in FAMILY_MODELS[family]:
    width = get('a shape (a list of sizes)', lambda v: isinstance(v, list) and v and all(map(is_count, v)), 'jits', model, 'output', 'shape')[-1]
    for k in get('{output name: [start, stop]}', lambda v: isinstance(v, dict), 'output_slices', model):
      get(f"[start, stop] within the output's {width} values", lambda v, w=width: _is_pair(v) and v[0] <= v[1] <= w, 'output_slices', model, k)

@dataclasses.dataclass
class Artifact:
  dir: pathlib.Path
  family: str
  manifest: dict[str, Any]
  models: dict[str, Replay] = dataclasses.field(default_factory=dict)   # loaded by load_artifact; warps load per camera

  @property
  def layouts(self) -> list[str]: return list(self.manifest['layouts'])
  @property
  def contract(self) -> Contract: return lookup(self.family, self.manifest['contract'])
  def output_slices(self, model: str) -> dict[str, slice]:
    return {k: slice(*v) for k, v in self.manifest['output_slices'][model].items()}
  @property
  def batches(self) -> list[int]: return [1, *self.manifest['options'].get('batches', [])]
  def rebuild_command(self, extra_layout: str | None = None, extra_batch: int | None = None) -> str:
    return _rebuild(self.manifest, self.dir, extra_layout, extra_batch)

  def load_batch(self, model: str, n: int) -> Replay:
    """A fresh instance of `model` on n frames at once (its inputs and output with n rows); ArtifactError naming the
    command that builds it where this artifact has no batch of n."""
    if n not in self.batches:
      raise ArtifactError(f"{self.dir}: no batch of {n} frames (this artifact has {', '.join(map(str, self.batches))}). "
                          f"Build it with: {self.rebuild_command(extra_batch=n)}")
    return self.load_jit(batch_name(model, n))

  def load_jit(self, name: str) -> Replay:
    """A fresh, verified instance of one captured JIT (its own buffers: loading twice gives two independent JITs)."""
    entry = self.manifest['jits'][name]
    jit = load_verified(self.dir, entry, self.manifest['files'], self.rebuild_command())
    return Replay(name, jit, [TensorSpec.from_json(s) for s in entry['inputs']])

  def warp_name(self, layout: str) -> str:
    if layout not in self.manifest['layouts']:
      raise ArtifactError(f"{self.dir}: no warp compiled for camera layout {layout} (this artifact serves {', '.join(self.layouts)}). "
                          f"Build it with: {self.rebuild_command(layout)}")
    return warp_name(layout)

def warp_name(layout: str) -> str: return 'warp_' + layout.replace(':', '_')
def batch_name(model: str, n: int) -> str: return model if n == 1 else f'{model}_b{n}'   # the JIT of a model on n frames at once

def read_manifest(path: str | os.PathLike, family: str) -> Artifact:
  """DIR/<family> as its manifest describes it, nothing loaded and no file hashed: the manifest's format and family,
  every field the runners read (and a road vision hidden_state of the policy's feature width), a contract this
  version knows. What a machine that does not run the models checks (modeld-batch's driver); ArtifactError if not."""
  if family not in FAMILIES: raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
  d = pathlib.Path(path) / family
  trusted(d.parent, d, d / MANIFEST)
  try: m = json.loads((d / MANIFEST).read_text())
  except FileNotFoundError:
    raise ArtifactError(f"{d}: no {MANIFEST}; build the {family} artifact with modeld-compile --out {path} (see modeld-compile --help)") from None
  except (OSError, ValueError) as e: raise ArtifactError(f"{d / MANIFEST}: unreadable ({e}); rebuild it with modeld-compile") from None
  bad = _complaint(d, m)
  if not isinstance(m, dict) or m.get('format') != FORMAT_VERSION:
    raise bad(f"format version {m.get('format') if isinstance(m, dict) else None!r}, this loader reads {FORMAT_VERSION}")
  if m.get('family') != family: raise bad(f"holds family {m.get('family')!r}, expected {family!r}")
  _check_manifest(m, family, bad)
  if m['contract'] not in CONTRACTS[family]: raise bad(f"its models follow contract {m['contract']!r}, which this version does not know")
  if family == 'road':   # the road runner feeds hidden_state back to the policy every frame: no other width can run
    width = lookup(family, m['contract']).policy.inputs['features_buffer'].shape[-1]
    start, stop = m['output_slices']['vision'].get('hidden_state', [0, 0])
    if stop - start != width:
      raise ArtifactError(f"{d}: vision output 'hidden_state': expected {width} values (the policy's features), got {stop - start}. "
                          f"Rebuild with a vision model in openpilot's output layout: {_rebuild(m, d)}")
  return Artifact(d, family, m)

def trusted(*paths: pathlib.Path) -> None:
  """ArtifactError unless each path that exists can be changed by its owner alone, us or root (owned.check_code)."""
  for p in paths:
    try:
      if p.exists(): check_code(str(p), 'artifact file' if p.is_file() else 'artifact folder')
    except NotOwnedError as e: raise ArtifactError(f"{e}. An artifact is code: keep it writable by its owner alone") from None

def _rebuild(m, d: pathlib.Path, extra_layout: str | None = None, extra_batch: int | None = None) -> str:
  """The command that built the artifact in d (DIR/<family>), writing to DIR: a copied or moved artifact is rebuilt
  where it is loaded from, not where it was first built."""
  if not (isinstance(m, dict) and _is_strs(m.get('command'))): return 'modeld-compile (see --help)'
  cmd = list(m['command'])
  if '--out' in cmd[:-1]: cmd[cmd.index('--out') + 1] = str(d.parent)
  return shlex.join(cmd + (['--camera', extra_layout] if extra_layout is not None else []) + (['--batch', str(extra_batch)] if extra_batch else []))
def _complaint(d: pathlib.Path, m) -> Callable[[str], ArtifactError]: return lambda msg: ArtifactError(f"{d}: {msg}. Rebuild with: {_rebuild(m, d)}")

def load_artifact(path: str | os.PathLike, family: str, device: str | None = None) -> Artifact:
  """Open DIR/<family>: its manifest checked (read_manifest), then that this machine can run it (tinygrad version,
  device, CPU features) and that every file matches its sha256, then the model JITs loaded. Each pickle is hashed on
  the very bytes unpickled."""
  art = read_manifest(path, family)
  d, m, bad = art.dir, art.manifest, _complaint(art.dir, art.manifest)
  if m['tinygrad'] != (tv := tinygrad_version()): raise bad(f"built with tinygrad {m['tinygrad']}, this is tinygrad {tv}")
  # every file hashed before the device is opened (picking tinygrad's default device compiles a test program, about a
  # second): a damaged install fails at once; the model files are hashed again on the very bytes loaded
  for fn, digest in m['files'].items():
    if not (d / fn).is_file(): raise bad(f"{fn} is missing")
    trusted(d / fn)
    if (got := sha256_file(d / fn)) != digest: raise bad(_altered(fn, digest, got))
  here = target(device or Device.DEFAULT)
  if m['target']['device'] != here['device']: raise bad(f"built for device {m['target']['device']}, this process uses {here['device']}")
  if m['target']['arch'] != here['arch']: raise bad(f"built for {here['device']} arch {m['target']['arch']}, this one is {here['arch']}")
  if missing := sorted(set(m['target']['cpu_features']) - set(here['cpu_features'])):
    raise bad(f"compiled for CPU instruction-set features this machine lacks: {' '.join(missing)}")
  art.models = {k: art.load_jit(k) for k in FAMILY_MODELS[family]}
  return art

def write_artifact(out: str | os.PathLike, family: str, build: Callable[[pathlib.Path], dict[str, Any]]) -> pathlib.Path:
  """Build into a temporary sibling directory with `build(tmp_dir) -> manifest`, hash every file into the manifest,
  then swap it in, so a reader never sees a half-written artifact and a failed build leaves the old one in place."""
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  final, tmp, old = out / family, out / f'.{family}.tmp-{os.getpid()}', out / f'.{family}.old-{os.getpid()}'
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir()
  try:
    manifest = build(tmp)
    manifest['files'] = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    if final.exists(): os.rename(final, old)
    os.rename(tmp, final)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
  return final

# ***** which camera layout runs a stream *****

def stream_layouts(arts: dict[str, Artifact], streams: dict[int, tuple[int, int]]) -> dict[int, NV12Layout]:
  """Each stream's buffer layout, one its artifact (arts['road'] for road and wide road, arts['dm'] for driver; loaded
  or only their manifests read) was built for: packed (camerad's default) where the artifact has it, else the first of
  the stream's size in its manifest; among the layouts every stream of that size has, where there are such (camerad
  serves one layout per size). modeld-batch writes its frames in these, modeld-replay and modeld-demo have camerad
  serve them (camerad_layouts), so all run the warps of one layout. ValueError naming the camera, its size, the
  artifact's layouts and the command that adds one, where the artifact has none of that size."""
  fits = {}
  for s, (w, h) in streams.items():
    art = arts['dm' if s == DRIVER else 'road']
    fits[s] = [l for l in map(NV12Layout.parse, art.layouts) if (l.width, l.height) == (w, h)]
    if not fits[s]:
      raise ValueError(f"the {CAMERA_OF_STREAM[s]} camera is {w}x{h}, {art.dir} was built for {', '.join(art.layouts)}; "
                       f"add a layout of that size: {art.rebuild_command(f'{w}x{h}')}")
  out = {}
  for s, (w, h) in streams.items():
    pick = [l for l in fits[s] if all(l in fits[t] for t in streams if streams[t] == (w, h))] or fits[s]
    out[s] = NV12Layout.packed(w, h) if NV12Layout.packed(w, h) in pick else pick[0]
  return out

def camerad_layouts(artifacts: str | os.PathLike, streams: dict[int, tuple[int, int]]) -> list[str]:
  """camerad's --layout options: each stream in the layout modeld-batch runs it in (stream_layouts), one the daemon
  answering it has a warp for. ArtifactError for artifacts that cannot be read; ValueError for a camera size they were
  not built for, or two cameras of one size their artifacts have no common layout for (camerad has one per size)."""
  arts = {f: read_manifest(artifacts, f) for f in {"dm" if s == DRIVER else "road" for s in streams}}
  layouts, by_size = stream_layouts(arts, streams), {}
  for s, l in layouts.items(): by_size.setdefault((l.width, l.height), {})[s] = l
  for (w, h), ls in by_size.items():
    if len(set(ls.values())) > 1:
      raise ValueError(f"camerad serves one layout per camera size, and the artifacts have no common one for {w}x{h}: "
                       f"{', '.join(f'{CAMERA_OF_STREAM[s]} {l}' for s, l in ls.items())}; build both families with the same --camera")
  return [str(l) for ls in by_size.values() for l in set(ls.values())]
