"""ONNX file -> ModelDef, with tinygrad's own ONNX reader (no onnx package at run time) and openpilot's conventions:
one flat float output cut by `output_slices`, which ships as a base64 pickled {name: slice} in the model's
metadata_props. What is read here (input names, shapes and dtypes, the output width, the slices) is what
modelrt.contracts.identify checks against the known contracts."""
from __future__ import annotations
import base64, contextlib, dataclasses, functools, io, pathlib, pickle
from collections.abc import Callable, Iterator
from tinygrad import Tensor
from tinygrad.helpers import Context
from tinygrad.nn.onnx import OnnxPBParser, WireType, onnx_ops
from tinygrad.uop.ops import Ops, UOp
from modelrt.internals import onnx_field_end, onnx_fields, onnx_runner, to_np_dtype
import numpy as np
from modelrt.artifact import sha256_file
from modelrt.contracts import FAMILY_MODELS
from modelrt.modeldef import ModelDef

MODELS = tuple(k for ms in FAMILY_MODELS.values() for k in ms)

class OnnxImportError(ValueError): pass

class _SliceUnpickler(pickle.Unpickler):
  # the metadata is a pickle inside a file we may not have made: allow the dict of slices it should be, nothing else
  def find_class(self, module, name):
    if (module, name) == ('builtins', 'slice'): return slice
    raise pickle.UnpicklingError(f"output_slices may only hold slices, found {module}.{name}")

def metadata_props(path: str | pathlib.Path) -> dict[str, str]:
  """ModelProto.metadata_props (field 14), which tinygrad's parser skips; the graph is skipped by a seek, not read."""
  p = OnnxPBParser(path, load_external_data=False)
  r, props = p.reader, {}
  for fid, wire_type in onnx_fields(p, r.len):
    if fid != 14 or wire_type != WireType.LENGTH_DELIMITED: r.skip_field(wire_type); continue
    entry = {}
    for efid, ewt in onnx_fields(p, onnx_field_end(p)):
      if efid in (1, 2): entry[efid] = r.read_string()
      else: r.skip_field(ewt)
    props[entry.get(1, '')] = entry.get(2, '')
  return props

def parse_output_slices(b64: str, n_out: int) -> dict[str, slice]:
  # openpilot's files hold MIME base64 (a line break every 76 characters): b64decode skips the line breaks
  try: slices = _SliceUnpickler(io.BytesIO(base64.b64decode(b64))).load()
  except Exception as e: raise OnnxImportError(f"output_slices metadata is not a base64 pickled dict of slices ({e})") from None
  if not isinstance(slices, dict) or not slices or not all(isinstance(k, str) and isinstance(v, slice) for k, v in slices.items()):
    raise OnnxImportError(f"output_slices must be a non-empty {{str: slice}}, got {type(slices).__name__}")
  def bound(x, default: int) -> int | None:   # None and negative bounds count from the end, as numpy indexes with them
    return default if x is None else None if not isinstance(x, int) or isinstance(x, bool) else x + n_out if x < 0 else x
  out = {}
  for k, s in slices.items():
    # openpilot's exports write such bounds: the policy's unused tail is 'pad': slice(-2, None)
    start, stop = bound(s.start, 0), bound(s.stop, n_out)
    if s.step not in (None, 1) or start is None or stop is None or not 0 <= start < stop <= n_out:
      raise OnnxImportError(f"output slice {k!r} = {s} is not a plain range within the model's {n_out} outputs")
    out[k] = slice(start, stop)
  return out

def _ends_in_reduce(u: UOp) -> bool:
  """Whether u's kernel, as the scheduler would fuse it, has a reduction (a Conv or Gemm output, bias and
  activation included): the walk stops at buffers and at what is already its own kernel."""
  stack, seen = [u], set()
  while stack:
    if (x := stack.pop()) in seen: continue
    seen.add(x)
    if x.op is Ops.REDUCE: return True
    if x.op not in (Ops.BUFFER, Ops.CONTIGUOUS, Ops.COPY, Ops.AFTER): stack.extend(x.src)
  return False

def _concat(*xs: Tensor, axis: int) -> Tensor:
  # A reduction fused with a concat computes into the concat's padded shape, which breaks its loops: the driver model's
  # last conv concatenated with the 3 calibration values (24576 + 3 outputs) ran 2.5x slower than on its own.
  return Tensor.cat(*(x.contiguous() if _ends_in_reduce(x.uop) else x for x in xs), dim=axis)

def _channels_last(x: Tensor) -> Tensor:
  # a conv's output stored NHWC: its kernel stores, and the next conv loads, vectors along the channels (modelrt.schedule)
  return x.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2) if x.ndim == 4 and _ends_in_reduce(x.uop) else x

def _relu(x: Tensor) -> Tensor: return _channels_last(x.relu())

WINOGRAD_MODES = ('rule', 'all', 'off')
WINOGRAD_MIN_PIXELS = 32 * 32   # the rule: Winograd where a conv's image has at least this many pixels, whatever the batch:
                                # a batched build's rows must match the one-frame model's (bench/layers.py, docs/PERFORMANCE.md)
_winograd_rule = False

@contextlib.contextmanager
def winograd(mode: str) -> Iterator[None]:
  """Convolutions of ONNX models run in this context (modeld-compile's --winograd): 'all' dense 3x3 stride-1 ones as
  Winograd F(4x4, 3x3) (tinygrad's WINO), 'rule' those of at least WINOGRAD_MIN_PIXELS, 'off' none."""
  global _winograd_rule
  if mode not in WINOGRAD_MODES: raise ValueError(f"winograd: expected one of {WINOGRAD_MODES}, got {mode!r}")
  saved, _winograd_rule = _winograd_rule, mode == 'rule'
  try:
    with Context(WINO=int(mode == 'all')): yield
  finally: _winograd_rule = saved

def _conv(X: Tensor, W: Tensor, B: Tensor | None = None, group: int = 1, **kw) -> Tensor:
  # Under WINO=1 tinygrad computes a 3x3 stride-1 convolution as Winograd F(4x4, 3x3), but only for the int stride 1,
  # where ONNX gives lists: those of dense 2-D convolutions are made ints. Grouped (depthwise) ones keep their lists
  # and stay direct: their transforms cost more than the multiplies they save. By the rule, WINO is set per conv.
  X = _channels_last(X)   # a conv's input straight from another conv (no activation between): NHWC too
  if group == 1 and W.ndim == 4:
    for k in ('strides', 'dilations'):
      if isinstance(v := kw.get(k), (list, tuple)) and all(x == 1 for x in v): kw[k] = 1
    if _winograd_rule:
      with Context(WINO=int(X.shape[2] * X.shape[3] >= WINOGRAD_MIN_PIXELS)): return onnx_ops['Conv'](X, W, B, group=group, **kw)
  return onnx_ops['Conv'](X, W, B, group=group, **kw)

OPS = {**onnx_ops, 'Concat': _concat, 'Conv': _conv, 'Relu': _relu}

def _batched_ops(n: int) -> dict:
  """OPS for the graph on n frames: a Reshape to one row of what has n (a shape the export wrote with its batch of 1)
  keeps the n rows. Whether the graph then keeps the frames apart, the build checks (each row against the model alone)."""
  def reshape(data: Tensor, shape: list[int], allowzero: int = 0) -> Tensor:
    return OPS['Reshape'](data, [n, *shape[1:]] if shape and shape[0] == 1 and data.shape[0] == n else shape, allowzero)
  return {**OPS, 'Reshape': reshape}

def load_onnx(path: str | pathlib.Path, model: str) -> ModelDef:
  """An openpilot-convention ONNX model ('vision', 'policy' or 'dm') as a ModelDef with the graph's own inputs
  (names, shapes, dtypes), output width and output_slices. Whether they follow a known contract is checked later."""
  path = pathlib.Path(path)
  if model not in MODELS: raise ValueError(f"model must be one of {list(MODELS)}, got {model!r}")
  try: graph = OnnxPBParser(path).parse()['graph']
  except Exception as e: raise OnnxImportError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
  runner = onnx_runner(graph)
  runner.onnx_ops = OPS
  done = set()   # constant weights stored output channels (a matmul's columns) innermost, read through a view
  for n in runner.graph_nodes:
    if (name := n.inputs[1] if len(n.inputs) > 1 else '') in done or not isinstance(w := runner.graph_values.get(name), Tensor): continue
    if n.op == 'Conv' and n.opts.get('group', 1) == 1 and w.ndim == 4: perm = (1, 2, 3, 0)
    elif n.op == 'Gemm' and n.opts.get('transB', 0) and w.ndim == 2: perm = (1, 0)
    else: continue
    runner.graph_values[name] = w.permute(perm).contiguous().realize().permute(tuple(perm.index(i) for i in range(len(perm))))
    done.add(name)
  inputs = {k: (tuple(v.shape), np.dtype(n).name if (n := to_np_dtype(v.dtype)) is not None else v.dtype.name) for k, v in runner.graph_inputs.items()}
  if len(runner.graph_outputs) != 1: raise OnnxImportError(f"{path}: expected one output vector, the model has {list(runner.graph_outputs)}")
  oshape = graph['output'][0]['parsed_type'].shape
  if len(oshape) != 2 or oshape[0] != 1 or not isinstance(oshape[1], int):
    raise OnnxImportError(f"{path}: output must be (1, N), the model has {oshape}")
  if 'output_slices' not in (props := metadata_props(path)): raise OnnxImportError(f"{path}: no output_slices in metadata_props")
  slices = parse_output_slices(props['output_slices'], oshape[1])
  out_name = runner.graph_outputs[0]
  def fn(**inputs: Tensor) -> Tensor: return runner(inputs)[out_name].cast('float32')
  @functools.cache   # one runner per batch: a capture reuses the constants (shapes) its first run computed
  def batch_fn(n: int) -> Callable[..., Tensor]:
    # a runner of its own (its cache of constants the graph computes, such as shapes, holds the batch's), the weights shared
    b = onnx_runner(graph)
    b.graph_values, b.onnx_ops = {k: runner.graph_values[k] for k in b.graph_values}, _batched_ops(n)   # the weights as stored above
    b.graph_inputs = {k: dataclasses.replace(v, shape=(n, *v.shape[1:])) for k, v in runner.graph_inputs.items()}
    return lambda **inputs: b(inputs)[out_name].cast('float32')
  return ModelDef(model, inputs, slices, oshape[1], fn, sha256_file(path), batch_fn)
