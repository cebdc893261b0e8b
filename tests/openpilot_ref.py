"""openpilot's own schema and LogReader, from the openpilot-logging package, as the reference the tests compare with.

openpilot_logging.cereal first tries `from cereal import log`, which in this environment finds the project's own
cereal: a test built on it would compare the project with itself. So its .capnp files are loaded by path into a
parser of their own, and its LogReader runs in a child process where no `cereal` package can be imported."""
from __future__ import annotations
import os, pickle, subprocess, sys, sysconfig
from pathlib import Path
import capnp
import openpilot_logging

SCHEMA_DIR = Path(openpilot_logging.__file__).parent / "cereal"
_parser = capnp.SchemaParser()   # its own parser: openpilot's files have the same ids as the project's
log = _parser.load(str(SCHEMA_DIR / "log.capnp"), imports=[str(SCHEMA_DIR)])
car = _parser.load(str(SCHEMA_DIR / "car.capnp"), imports=[str(SCHEMA_DIR)])

_CHILD = r"""
import importlib.util, pickle, sys
assert importlib.util.find_spec('cereal') is None, 'a cereal package is importable: openpilot_logging would use it'
from openpilot_logging.logreader import LogReader
from openpilot_logging.cereal import log
out = []
for path in sys.argv[1:]:
  out.append([(ev.which(), ev.logMonoTime, ev.as_builder().to_bytes()) for ev in LogReader(path)])
sys.stdout.buffer.write(pickle.dumps(out))
"""

def logreader_events(paths: list[str | os.PathLike], cwd: str | os.PathLike) -> list[list[tuple[str, int, bytes]]]:
  """openpilot's LogReader over each log file: per file, (which, logMonoTime, the event re-serialized) per event.
  It runs without site processing (so the project's editable install is invisible), in cwd (an empty folder)."""
  env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
  r = subprocess.run([sys.executable, "-S", "-c", _CHILD, *map(str, paths)], cwd=cwd, env=env, capture_output=True, timeout=120)
  assert r.returncode == 0, r.stderr.decode()[-3000:]
  return pickle.loads(r.stdout)

def canonical(dat: bytes) -> bytes:
  """An event's bytes as openpilot's schema re-serializes them (what logreader_events returns for the same event)."""
  with log.Event.from_bytes(dat) as ev: return ev.as_builder().to_bytes()
