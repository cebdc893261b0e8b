"""needs_extra(): around what a command imports from an extra of the install (its module's imports, or its main), so
the base install (`pip install .`, the daemons alone) answers with the pip line that adds the extra and exit 2, as a
usage error, instead of a traceback."""
from __future__ import annotations
import contextlib, importlib.util, sys
from collections.abc import Iterator

PROJECT = "tinymodeld"   # the distribution name in pyproject.toml, what `pip install` takes
_guards = 0              # needs_extra blocks entered and not left

@contextlib.contextmanager
def needs_extra(prog: str, extra: str) -> Iterator[None]:
  """A `with` block (or a decorator) around what command `prog` imports from extra `extra` of the install. A third-party
  module missing altogether ends the command with exit 2, naming the module and the pip line that installs the extra.
  Only the outermost block answers: a command importing another's module (modeld-replay camerad's) names itself and
  its own extra. A missing module of the project itself, or inside a package that is there, is no missing extra but a
  broken install: that goes up as it is."""
  global _guards
  _guards += 1
  try: yield
  except ModuleNotFoundError as e:
    top = (e.name or "").partition(".")[0]
    if _guards > 1 or not top or importlib.util.find_spec(top) is not None: raise
    print(f"{prog}: needs {top}, which this install lacks: pip install '{PROJECT}[{extra}]'", file=sys.stderr)
    raise SystemExit(2) from None
  finally: _guards -= 1
