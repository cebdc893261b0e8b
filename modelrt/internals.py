"""tinygrad's internals the runtime relies on, each reached for here and nowhere else: private functions and
attributes, the constructor arguments the artifact loader rebuilds UOps and Buffers from, and the functions a build
wraps while it runs. A tinygrad upgrade starts here: tests/test_internals.py checks each against the installed
tinygrad and names what is missing."""
from __future__ import annotations
import contextlib, importlib
from collections.abc import Callable, Iterator
from typing import Any
from tinygrad.dtype import _from_np_dtype as from_np_dtype, _to_np_dtype as to_np_dtype   # noqa: F401 (re-exported)
from tinygrad.engine.jit import _copy_input as copy_input, _prepare_jit_inputs as prepare_jit_inputs   # noqa: F401 (re-exported)
from tinygrad.schedule.memory import _collect_bufs as collect_bufs   # noqa: F401 (re-exported)

# (module, name): what the runtime uses it for. Every private name below, and every function wrapped().
USED: dict[tuple[str, str], str] = {
  ('tinygrad.dtype', '_to_np_dtype'): "numpy dtypes of tensors (input specs, output copies)",
  ('tinygrad.dtype', '_from_np_dtype'): "tinygrad dtypes of input specs",
  ('tinygrad.engine.jit', '_prepare_jit_inputs'): "the JIT's own input signature check, before a replay",
  ('tinygrad.engine.jit', '_copy_input'): "inputs a JIT writes, copied before a replay as tinygrad's replay does",
  ('tinygrad.engine.jit', 'CapturedJit._written_uops'): "which inputs a JIT writes",
  ('tinygrad.helpers', '_db_connection'): "tinygrad's compile cache opened for use from any thread (a batch's slots)",
  ('tinygrad.schedule.memory', '_collect_bufs'): "the buffers of a call's argument, as tinygrad's prune reads them",
  ('tinygrad.engine.jit', 'CapturedJit._linear'): "a JIT's calls before linking: the kernels a build counts",
  ('tinygrad.nn.onnx', 'OnnxPBParser._parse_message'): "ONNX metadata_props, which tinygrad's parser skips",
  ('tinygrad.nn.onnx', 'OnnxPBParser._decode_end_pos'): "ONNX metadata_props, which tinygrad's parser skips",
  ('tinygrad.nn.onnx', 'OnnxRunner._init_from_graph'): "an OnnxRunner from a graph already parsed",
  ('tinygrad.uop.ops', 'UOp.unique_num'): "fresh buffer slots for unpickled BUFFER UOps",
  ('tinygrad.codegen.opt.search', 'beam_search'): "wrapped: a build's BEAM progress; the shape schedule's opts before a search",
  ('tinygrad.codegen', 'apply_opts'): "wrapped: the shape schedule reads a kernel as codegen has it when it picks opts",
  ('tinygrad.engine.realize', 'lower_and_compile'): "wrapped: the shape schedule writes its opts into each kernel's AST",
  ('tinygrad.engine.jit', 'prune_linear'): "wrapped: a capture keeps the calls fed by its inputs and runs weight-only work once",
}
UOP_ARGS = ('op', 'dtype', 'src', 'arg', 'tag', 'metadata')   # UOp.__reduce__'s arguments, a realized BUFFER's Buffer after them
BUFFER_ARGS = ('device', 'size', 'dtype', 'opaque', 'options', 'initial_value')   # Buffer.__init__'s first parameters, as pickled

def written_uops(captured) -> set: return captured._written_uops
def calls(captured) -> Any: return captured._linear
def onnx_fields(parser, end: int) -> Iterator[tuple[int, int]]: return parser._parse_message(end)
def onnx_field_end(parser) -> int: return parser._decode_end_pos()

def onnx_runner(graph: dict):
  """An OnnxRunner over a graph already parsed (OnnxRunner(path) would parse the file a second time)."""
  from tinygrad.nn.onnx import OnnxRunner
  runner = OnnxRunner.__new__(OnnxRunner)
  runner._init_from_graph(graph)
  return runner

def compile_cache_for_threads() -> None:
  """tinygrad's compile cache usable from every thread of this process: its sqlite connection serves only the thread
  that opened it, and a batch's slots (modelrt.batch) compile on theirs, one at a time (their lock). Opened again,
  as tinygrad opens it, with that check off."""
  import sqlite3
  import tinygrad.helpers as h
  real, h._db_connection = sqlite3.connect, None
  sqlite3.connect = lambda *a, **kw: real(*a, **kw, check_same_thread=False)
  try: h.db_connection()
  finally: sqlite3.connect = real

@contextlib.contextmanager
def wrapped(module: str, name: str, wrapper: Callable[[Callable], Callable]) -> Iterator[None]:
  """module.name is wrapper(the real one) in this context (tinygrad looks these up at each call)."""
  assert (module, name) in USED, f"{module}.{name} is not in USED"
  m = importlib.import_module(module)
  real = getattr(m, name)
  setattr(m, name, wrapper(real))
  try: yield
  finally: setattr(m, name, real)
