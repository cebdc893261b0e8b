"""Each tinygrad internal the runtime relies on (modelrt/internals.py) exists in the installed tinygrad, named in a
failure with what the runtime uses it for; and no module but internals.py reaches for a private tinygrad name."""
import ast, importlib, importlib.metadata, inspect
from pathlib import Path
import pytest
from modelrt import internals

REPO = Path(__file__).resolve().parents[1]

@pytest.mark.parametrize("module, name", list(internals.USED), ids=[f"{m}.{n}" for m, n in internals.USED])
def test_each_internal_exists(module, name):
  obj = importlib.import_module(module)
  for part in name.split("."):
    ok = hasattr(obj, part) or part in getattr(obj, "__annotations__", {})   # a dataclass field without a default
    assert ok, f"tinygrad {importlib.metadata.version('tinygrad')} has no {module}.{name}, which the runtime uses for " \
               f"{internals.USED[(module, name)]}: adapt modelrt/internals.py (and its callers) to this version"
    obj = getattr(obj, part, None)
  if internals.USED[(module, name)].startswith("wrapped:"): assert callable(obj), f"{module}.{name}: expected a function to wrap, got {obj!r}"

def test_uops_and_buffers_pickle_as_the_artifact_loader_rebuilds_them():
  from tinygrad import Tensor
  from tinygrad.device import Buffer
  from tinygrad.uop.ops import UOp
  fn, args = Tensor.empty(4, device="CPU").realize().uop.base.__reduce__()
  assert fn is UOp and len(args) in (len(internals.UOP_ARGS), len(internals.UOP_ARGS) + 1), \
    f"UOp.__reduce__: expected {internals.UOP_ARGS} (+ a Buffer), got {len(args)} arguments"
  params = tuple(inspect.signature(Buffer.__init__).parameters)[1:len(internals.BUFFER_ARGS) + 1]
  assert params == internals.BUFFER_ARGS, f"Buffer.__init__: expected parameters {internals.BUFFER_ARGS} first, got {params}"

def test_only_internals_reaches_for_private_tinygrad_names():
  """A `from tinygrad... import _name` or a `._name` read of a tinygrad object anywhere but internals.py would be a
  use no upgrade check sees (attribute reads are found by the private names internals.USED lists)."""
  private = {n.split(".")[-1] for _, n in internals.USED if n.split(".")[-1].startswith("_")}
  found = []
  dirs = ("modelrt", "modeld", "modeld_common", "dmonitoringd", "modeld_batch", "modeld_tools", "camerad", "bench", "tests")
  for f in sorted(p for d in dirs for p in (REPO / d).rglob("*.py")):
    if f.name in ("internals.py", "test_internals.py"): continue
    for node in ast.walk(ast.parse(f.read_text(), str(f))):
      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tinygrad") and any(a.name.startswith("_") for a in node.names):
        found.append(f"{f.relative_to(REPO)}:{node.lineno} imports {[a.name for a in node.names if a.name.startswith('_')]}")
      if isinstance(node, ast.Attribute) and node.attr in private: found.append(f"{f.relative_to(REPO)}:{node.lineno} reads .{node.attr}")
  assert not found, f"private tinygrad names outside modelrt/internals.py: {found}"
