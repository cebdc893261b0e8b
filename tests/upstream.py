"""openpilot's own msgq (commaai/msgq, C++ with Cython bindings) for the interop tests: built from the source folder
OPENPILOT_MSGQ_SRC names, and run in child processes that see it and not the project.
built() builds it once per source (in .cache/openpilot-msgq/), or skips the test without a source (as on a user's machine);
Upstream(built, func, *args) runs a test file's function in a child whose `import msgq` is openpilot's.
"""
import fcntl, functools, hashlib, inspect, json, os, queue, shutil, subprocess, sys, sysconfig, tempfile, threading
from pathlib import Path
import pytest
from tests.artifacts import REPO

ENV = 'OPENPILOT_MSGQ_SRC'
CACHE = REPO / '.cache' / 'openpilot-msgq'
BUILT = ('msgq/ipc_pyx.so', 'msgq/visionipc/visionipc_pyx.so')   # what the build makes (the C++ test runner is skipped: --minimal)
SKIP_DIRS = {'.git', '.venv', '__pycache__'}
SKIP_SUFFIXES = {'.so', '.o', '.os', '.a', '.pyc', '.dblite'}   # a source folder that was built in place: its outputs are not sources
MARK = '\x1eupstream '   # starts the child's protocol lines on stdout, among openpilot's own prints ("Killing old publisher: ...")

def source_files(src: Path) -> list[Path]:
  """The source's files, relative to it, sorted: what is hashed and copied."""
  out = []
  for root, dirs, files in os.walk(src):
    dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
    out += [(Path(root) / f).relative_to(src) for f in files if Path(f).suffix not in SKIP_SUFFIXES]
  return sorted(out)

def source_key(src: Path) -> str:
  """A short hash of the source's files (names and bytes) and of this interpreter's extension ABI."""
  h = hashlib.sha256(sys.implementation.cache_tag.encode())
  for f in source_files(src): h.update(f'{f}\0'.encode() + hashlib.sha256((src / f).read_bytes()).digest())
  return h.hexdigest()[:16]

@functools.cache
def build(src: Path) -> Path:
  """Build openpilot's msgq from `src` into CACHE/<key>/ (a copy: the source may be read-only) with scons and Cython from
  this venv; once per key, whoever takes the lock first builds, the others then find it built."""
  out = CACHE / (key := source_key(src))
  if all((out / f).exists() for f in BUILT): return out
  CACHE.mkdir(parents=True, exist_ok=True)
  with open(CACHE / f'{key}.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if all((out / f).exists() for f in BUILT): return out
    tmp = CACHE / f'{key}.tmp'
    shutil.rmtree(tmp, ignore_errors=True)
    for f in source_files(src):
      (tmp / f).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src / f, tmp / f)
      (tmp / f).chmod(0o644 | (tmp / f).stat().st_mode & 0o111)   # a read-only source's copy stays writable (removable)
    env = {**os.environ, 'PATH': f'{Path(sys.executable).parent}{os.pathsep}{os.environ.get("PATH", "")}'}   # cythonize of this venv
    cmd = [sys.executable, '-m', 'SCons', f'-j{min(os.cpu_count() or 1, 8)}', '--minimal']
    r = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
    if r.returncode != 0 or not all((tmp / f).exists() for f in BUILT):
      raise RuntimeError(f"building openpilot's msgq from {src} failed ({' '.join(cmd)} in {tmp}, exit {r.returncode}; it needs g++ "
                         f"and Python's headers):\n{(r.stdout + r.stderr)[-4000:]}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
  return out

def source() -> Path:
  """OPENPILOT_MSGQ_SRC as a checked folder; skips the test when it is unset."""
  if not (src := os.environ.get(ENV)):
    pytest.skip(f"{ENV} is not set: point it at a checkout of openpilot's msgq (git clone https://github.com/commaai/msgq) to test "
                f"interoperability with it, e.g. {ENV}=$HOME/msgq make test")
  if not (Path(src) / 'SConstruct').is_file() or not (Path(src) / 'msgq' / 'ipc_pyx.pyx').is_file():
    pytest.fail(f"{ENV}={src}: not a commaai/msgq checkout (no SConstruct, msgq/ipc_pyx.pyx)")
  return Path(src).resolve()

def built() -> Path:
  """openpilot's msgq built (the folder to put first on PYTHONPATH), or the test skipped when OPENPILOT_MSGQ_SRC is unset."""
  src = source()
  try: return build(src)
  except RuntimeError as e: pytest.fail(str(e))

def make_stack_dir() -> None:
  """openpilot's msgq opens /dev/shm/msgq_<OPENPILOT_PREFIX>/<endpoint> without making the folder (ours makes it)."""
  if p := os.environ.get('OPENPILOT_PREFIX'): os.makedirs(f'/dev/shm/msgq_{p}', mode=0o775, exist_ok=True)

# ---- the child's side of the protocol (shipped to it as source) ----

def tell(obj) -> None:
  """Child: send a JSON value to the test (one line on stdout, after MARK)."""
  sys.stdout.write(MARK + json.dumps(obj) + '\n')
  sys.stdout.flush()

def listen():
  """Child: the next JSON value the test said (one line on stdin); None once the test closed it."""
  return json.loads(line) if (line := sys.stdin.readline()) else None

class Upstream:
  """openpilot's side in a child process: `func`, a top-level function of a test file (shipped as its source, so it imports
  what it uses itself), called with JSON-able `args`; or `func` a snippet of code (`args` as JSON in sys.argv[1]).
  Its `import msgq` is openpilot's build; the project, its cereal and its editable install are not on its path
  (python -S, PYTHONPATH = the build, then this venv's site-packages for numpy, pycapnp, openpilot_logging). It has the
  test's OPENPILOT_PREFIX. The child tell()s, the test hear()s; the test say()s, the child listen()s. Everything else it
  prints is kept for failure messages (output())."""
  def __init__(self, build_dir: Path, func, *args):
    make_stack_dir()
    preamble = (f"import json, sys\nMARK = {MARK!r}\n{inspect.getsource(tell)}\n{inspect.getsource(listen)}\n"
                f"import importlib.util, msgq\nassert msgq.__file__.startswith({str(build_dir)!r}), msgq.__file__\n"
                f"assert importlib.util.find_spec('cereal') is None and importlib.util.find_spec('modeld') is None, 'the project is visible'\n")
    body = func if isinstance(func, str) else f"{inspect.getsource(func)}\n{func.__name__}(*json.loads(sys.argv[1]))\n"
    code = f"{preamble}\n{body}"
    path = os.pathsep.join(dict.fromkeys([str(build_dir), sysconfig.get_path('purelib'), sysconfig.get_path('platlib')]))
    env = {**os.environ, 'PYTHONPATH': path, 'PYTHONUNBUFFERED': '1'}
    self.name, self.lines, self.said = getattr(func, '__name__', 'snippet'), [], queue.Queue()
    self.proc = subprocess.Popen([sys.executable, '-S', '-B', '-P', '-c', code, json.dumps(args)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tempfile.gettempdir())
    self.readers = [threading.Thread(target=self._read, args=(f, f is self.proc.stdout), daemon=True) for f in (self.proc.stdout, self.proc.stderr)]
    for t in self.readers: t.start()

  def _read(self, f, protocol: bool) -> None:
    for line in f:
      if protocol and line.startswith(MARK): self.said.put(json.loads(line[len(MARK):]))
      else: self.lines.append(line.rstrip('\n'))
    if protocol: self.said.put(EOFError)

  def output(self) -> str: return '\n'.join(self.lines)

  def hear(self, timeout: float = 20):
    """The child's next tell(); fails (with its output) if it exits or says nothing within `timeout` s."""
    try: obj = self.said.get(timeout=timeout)
    except queue.Empty: raise AssertionError(f"upstream {self.name} said nothing within {timeout} s; its output:\n{self.output()}") from None
    if obj is EOFError:
      self.proc.wait(5)
      for t in self.readers: t.join(2)
      raise AssertionError(f"upstream {self.name} exited ({self.proc.returncode}) before saying anything more; its output:\n{self.output()}")
    return obj

  def say(self, obj) -> None:
    self.proc.stdin.write(json.dumps(obj) + '\n')
    self.proc.stdin.flush()

  def wait(self, timeout: float = 20) -> int:
    """Its exit code (stdin closed first: its listen() returns None)."""
    if not self.proc.stdin.closed: self.proc.stdin.close()
    try: return self.proc.wait(timeout)
    except subprocess.TimeoutExpired: raise AssertionError(f"upstream {self.name} still runs after {timeout} s; its output:\n{self.output()}") from None

  def close(self) -> None:
    """Kill it if it still runs (a child that serves until told otherwise), after its output is read to the end."""
    if self.proc.poll() is None: self.proc.kill()
    self.proc.wait(5)
    for t in self.readers: t.join(5)
    for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr): f.close()

  def __enter__(self): return self
  def __exit__(self, *exc) -> None: self.close()

# openpilot's test files run unchanged, loaded by path: pytest and unittest discovery would put the source folder, which
# holds an unbuilt `msgq` package, ahead of the project's
RUNNER = """
import importlib.util, json, os, sys, unittest, msgq
assert msgq.__file__.startswith(sys.argv[1]), msgq.__file__
suite = unittest.TestSuite()
for path in sys.argv[2:]:
  spec = importlib.util.spec_from_file_location("openpilot_" + os.path.basename(path).removesuffix(".py"), path)
  spec.loader.exec_module(mod := importlib.util.module_from_spec(spec))
  suite.addTests(unittest.defaultTestLoader.loadTestsFromModule(mod))
r = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
print(json.dumps({"run": r.testsRun, "failed": [t.id() for t, _ in r.failures + r.errors + r.unexpectedSuccesses], "skipped": len(r.skipped)}))
"""

def run_openpilot_tests(files: list[Path], cwd: Path, env: dict, timeout: float = 120) -> tuple[dict, str]:
  """openpilot's unittest files run against the project's msgq (the project first on PYTHONPATH, no build of openpilot's),
  in `cwd`, without bytecode written next to them. Returns ({run, failed, skipped}, the run's output)."""
  env = {**env, 'PYTHONPATH': str(REPO)}
  r = subprocess.run([sys.executable, '-B', '-P', '-c', RUNNER, str(REPO), *map(str, files)], cwd=cwd, env=env,
                     capture_output=True, text=True, timeout=timeout)
  try: summary = json.loads(r.stdout.strip().splitlines()[-1])
  except (IndexError, ValueError): summary = {'run': 0, 'failed': [f'the run (exit {r.returncode})'], 'skipped': 0}
  return summary, r.stdout + r.stderr
