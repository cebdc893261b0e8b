"""The layers point one way: every import of every module of the project, read from its source, goes to its own layer
or one below (docs/ARCHITECTURE.md draws them), and no daemon imports the other."""
import ast
from pathlib import Path
import pytest

REPO = Path(__file__).resolve().parents[1]
# bottom up; a module belongs to the layer of its longest listed prefix
LAYERS = [
  ("messaging", ["msgq", "cereal", "service"]),
  ("geometry", ["transformations"]),
  ("routes", ["oproute"]),
  ("model runtime", ["modelrt"]),
  ("camera sources", ["camerad"]),
  ("daemons", ["modeld_common", "modeld", "dmonitoringd"]),
  ("tools", ["modeld_tools", "modeld_batch"]),
  ("tests and benchmarks", ["tests", "bench", "scripts"]),   # not installed: nothing above may import them
]
APART = [("modeld", "dmonitoringd")]   # same layer, but neither imports the other

def layer(module: str) -> int | None:
  best = max(((len(p), i) for i, (_, ps) in enumerate(LAYERS) for p in ps if module == p or module.startswith(p + ".")), default=None)
  return None if best is None else best[1]

def package(module: str) -> str:
  return next((p for _, ps in LAYERS for p in sorted(ps, key=len, reverse=True) if module == p or module.startswith(p + ".")), module)

def modules() -> dict[str, Path]:
  out = {}
  for _, ps in LAYERS:
    for p in ps:
      top = REPO / p.split(".")[0]
      for f in top.rglob("*.py"):
        name = ".".join(f.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        out[name] = f
  return out

def imports(path: Path, name: str) -> list[tuple[int, str]]:
  """(line, module) of every import in the file, relative ones resolved, anywhere in it (function bodies too)."""
  out = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import): out += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level: base = ".".join(name.split(".")[:-node.level] + ([base] if base else []))
      out += [(node.lineno, f"{base}.{a.name}" if layer(f"{base}.{a.name}") is not None and layer(base) is None else base) for a in node.names]
  return out

MODULES = modules()

@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name):
  mine = layer(name)
  for line, imp in imports(MODULES[name], name):
    if (theirs := layer(imp)) is None: continue   # the standard library and third parties
    where = f"{MODULES[name].relative_to(REPO)}:{line} ({LAYERS[mine][0]}) imports {imp} ({LAYERS[theirs][0]})"
    assert theirs <= mine, where
    assert (package(name), package(imp)) not in APART + [(b, a) for a, b in APART], where

def test_every_package_has_a_layer():
  """A new top-level package must be placed in LAYERS (and in docs/ARCHITECTURE.md)."""
  import tomllib
  found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
  assert sorted(p.rstrip("*") for p in found) == sorted({p.split(".")[0] for _, ps in LAYERS[:-1] for p in ps})

def test_a_back_edge_is_caught(tmp_path):
  """The check itself: a runtime module importing a daemon would be reported."""
  f = tmp_path / "x.py"
  f.write_text("import numpy\nfrom modeld.model import RoadModel\nfrom tests.onnx_models import KNOWN\n")
  assert [(l, m) for l, m in imports(f, "modelrt.x") if layer(m) is not None and layer(m) > layer("modelrt.x")] == [
    (2, "modeld.model"), (3, "tests.onnx_models")]

ROOT = {".ci", ".gitignore", "LICENSE", "Makefile", "README.md", "pyproject.toml", "requirements.lock", "bench", "docs",
        "scripts", "systemd", "tests"}

def test_root_holds_only_the_known_layout():
  """Nothing a run leaves behind (logs, pid files) is committed at the root: each entry is a package or a known file."""
  import subprocess
  tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
  if not tracked: pytest.skip("not a git checkout")
  known = ROOT | {p.split(".")[0] for _, ps in LAYERS[:-1] for p in ps}
  stray = sorted({f.split("/")[0] for f in tracked} - known)
  assert not stray, f"files at the root outside the known layout: {stray}; .gitignore what a run writes, or add a " \
                    "new entry to ROOT (and to docs/ARCHITECTURE.md)"

def test_module_docstrings_are_brief():
  """A module's docstring says what and why in at most 5 lines; figures go to docs/, history to the commit messages."""
  long = []
  for path in sorted(modules().values()):
    body = ast.parse(path.read_text(), str(path)).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
      if (n := body[0].end_lineno - body[0].lineno + 1) > 5: long.append(f"{path.relative_to(REPO)}: {n} lines")
  assert not long, f"module docstrings over 5 lines: {long}"
