"""Running a daemon (modeld, dmonitoringd) as a real child process against a real camera server and real sockets.

The test process is the camera (VisionIpcServer), the car (PubMaster) and the service manager (NOTIFY_SOCKET): tests wait
on the daemon's STATUS= counts and its messages, never on sleeps or log text. The child's stderr shows when a test fails.
"""
import os, re, signal, socket, subprocess, sys, tempfile, threading, time
import numpy as np
from cereal import messaging
from cereal.services import CAMERA_STATE_SERVICES, DMONITORINGD_INPUTS, DMONITORINGD_OUTPUTS, MODELD_INPUTS, MODELD_OUTPUTS
from msgq.visionipc import DRIVER, ROAD, WIDE_ROAD, VisionIpcServer
from msgq.visionipc.layout import NV12Layout
from tests.artifacts import LAYOUT, REPO

FRAME_NS = 50_000_000   # 20 Hz
BASE_INSTALL = {'tinygrad', 'capnp', 'zmq', 'numpy', 'setproctitle'}   # pyproject's dependencies, by the names they import as

def beyond_base_install(modules: list[str]) -> set[str]:
  """The third-party packages among a process's modules that a plain `pip install .` (no extras) lacks."""
  ours = {p.rstrip('*') for p in re.findall(r'"(\w+)\*"', (REPO / 'pyproject.toml').read_text())}
  top = {m.split('.')[0] for m in modules}
  return {m for m in top - set(sys.stdlib_module_names) - BASE_INSTALL - ours if not m.startswith('_') and m != 'cython_runtime'}

class Notify:
  """A service manager's notify socket: a real AF_UNIX datagram socket the child writes to."""
  def __init__(self, abstract: bool = False):
    self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
      name = f"op-notify-{os.getpid()}-{time.monotonic_ns()}"
      self.sock.bind('\0' + name)
      self.addr = '@' + name
    else:
      self.dir = tempfile.TemporaryDirectory()
      self.addr = os.path.join(self.dir.name, 'notify')
      self.sock.bind(self.addr)
    self.messages: list[str] = []

  def _recv(self, deadline: float) -> str | None:
    """The next datagram (kept in self.messages), or None at the deadline."""
    self.sock.settimeout(max(0.01, deadline - time.monotonic()))
    try: self.messages.append(msg := self.sock.recv(4096).decode())
    except TimeoutError: return None
    return msg

  def wait(self, pattern: str, timeout: float) -> list[str]:
    """Every datagram so far, up to and including the first that has a line matching the regex `pattern` (from its start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (msg := self._recv(deadline)) is not None:
      if any(re.match(pattern, l) for l in msg.splitlines()): return self.messages
    raise TimeoutError(f"no {pattern} on the notify socket within {timeout} s; got {self.messages}")

  def count(self, key: str) -> int:
    """The counter `key`'s total in the newest STATUS= so far (0 before it is counted)."""
    return max((int(m[1]) for msg in self.messages for m in re.finditer(rf'^STATUS=.* \| totals .*\b{key}=(\d+)\b', msg, re.M)), default=0)

  def wait_count(self, key: str, total: int, timeout: float = 10.) -> None:
    """Block until the STATUS= totals counted `key` `total` times. Run the daemon with --stats-interval 0 to get a
    STATUS= per loop turn, so a frame's counts arrive right after its frame."""
    deadline = time.monotonic() + timeout
    while (n := self.count(key)) < total:
      if time.monotonic() >= deadline: raise TimeoutError(f"{key} counted {n} of {total} times within {timeout} s")
      self._recv(deadline)

  def close(self) -> None: self.sock.close()

class Daemon:
  """The daemon as a child process (python -m NAME) with its stderr collected."""
  def __init__(self, module: str, artifacts, *args: str, notify: Notify | None = None, env: dict | None = None, modules_file=None):
    """modules_file: the child writes the names of every module it imported there when it exits (python -m MODULE, run
    under a wrapper that dumps sys.modules in os._exit: the daemon's own code is unchanged)."""
    env = {**os.environ, 'DEV': 'CPU', 'PARALLEL': '0', **(env or {})}
    if notify is not None: env['NOTIFY_SOCKET'] = notify.addr
    argv = [module, '--artifacts', str(artifacts), '--log-level', 'DEBUG', *args]
    if modules_file is None: self.cmd = [sys.executable, '-m', *argv]
    else:
      # the daemons end with os._exit (no atexit): the dump runs just before it
      wrapper = (f"import os, runpy, sys; _exit = os._exit\n"
                 f"def dump(code): open({str(modules_file)!r}, 'w').write(' '.join(sys.modules)); _exit(code)\n"
                 f"os._exit = dump; sys.argv = {argv!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
      self.cmd = [sys.executable, '-c', wrapper]
    self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    self.lines: list[str] = []
    self.lock = threading.Lock()
    self.reader = threading.Thread(target=self._read, daemon=True)
    self.reader.start()

  def _read(self) -> None:
    for line in self.proc.stderr:
      with self.lock: self.lines.append(line.rstrip('\n'))

  def stderr(self) -> str:
    with self.lock: return '\n'.join(self.lines)

  def stop(self, timeout: float = 5.) -> tuple[int, float]:
    """SIGTERM; (exit code, seconds until it exited)."""
    t0 = time.monotonic()
    if self.proc.poll() is None: self.proc.send_signal(signal.SIGTERM)
    try: rc = self.proc.wait(timeout)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      rc = self.proc.wait()
    dt = time.monotonic() - t0
    self.reader.join(2)
    print(f"--- {' '.join(self.cmd[:3])}... exited {rc} after SIGTERM in {dt:.2f} s; stderr:\n{self.stderr()}")   # shown when a test fails
    return rc, dt

def start_daemon(name: str, artifacts, *args, abstract: bool = False, **kw) -> tuple[Daemon, Notify]:
  """A daemon with 1 s stats, started and READY (its stderr in the error if it never gets there)."""
  notify = Notify(abstract=abstract)
  d = Daemon(name, artifacts, '--stats-interval', '1', *args, notify=notify, **kw)
  try: notify.wait('READY=1', 90)
  except TimeoutError:
    d.stop()
    raise AssertionError(f"{name} not ready; stderr:\n{d.stderr()}") from None
  return d, notify

class Camera:
  """A camera process in the test: VisionIPC buffers for the given streams plus their camera-state messages."""
  def __init__(self, streams: dict[int, NV12Layout], name: str = 'camerad', buffers: int = 8, sensor: str = 'ar0231'):
    self.layouts, self.sensor = streams, sensor
    self.server = VisionIpcServer(name)
    for s, l in streams.items(): self.server.create_buffers_with_sizes(s, buffers, l.width, l.height, l.size, l.stride, l.uv_offset)
    self.server.start_listener()
    self.pm = messaging.PubMaster([CAMERA_STATE_SERVICES[s] for s in streams])
    rng = np.random.default_rng(0)
    self.images = {s: rng.integers(0, 256, l.size, dtype=np.uint8) for s, l in streams.items()}

  def send(self, frame_id: int, streams=None, published: dict | None = None) -> int:
    """Frame `frame_id` (timestampSof = frame_id * 50 ms) on the given streams (default all): the camera-state message,
    then the buffer, as openpilot's daemon test does. Returns timestampEof. published: gets {stream: monotonic ns} of
    each frame's publish (the buffer already filled: what a camera's send costs beyond is its own copy)."""
    sof = frame_id * FRAME_NS
    eof = sof + FRAME_NS
    for s in (self.layouts if streams is None else streams):
      msg = messaging.new_message(svc := CAMERA_STATE_SERVICES[s])
      cs = getattr(msg, svc)
      cs.frameId, cs.timestampSof, cs.timestampEof, cs.sensor = frame_id, sof, eof, self.sensor
      self.pm.send(svc, msg)
      buf = self.server.get_free_buffer(s)
      np.copyto(buf.array, self.images[s])
      if published is not None: published[s] = time.monotonic_ns()
      self.server.publish(s, buf, frame_id, sof, eof)
    return eof

  def close(self) -> None:
    self.pm.close()
    self.server.close()

class Collector:
  """Every Event of some services, in arrival order (not conflated)."""
  def __init__(self, services: list[str]):
    self.socks = {s: messaging.sub_sock(s, timeout=50) for s in services}
    self.msgs: dict[str, list] = {s: [] for s in services}

  def poll(self) -> None:
    for s, sock in self.socks.items(): self.msgs[s] += messaging.drain_sock(sock)

  def wait(self, service: str, count: int, timeout: float = 10.) -> list:
    """Block until `count` Events of `service` have arrived in total; returns them all."""
    deadline = time.monotonic() + timeout
    while len(self.msgs[service]) < count:
      if time.monotonic() > deadline: raise TimeoutError(f"{len(self.msgs[service])} of {count} {service} messages within {timeout} s")
      if (dat := self.socks[service].receive()) is not None: self.msgs[service].append(messaging.log_from_bytes(dat))
    return self.msgs[service]

  def close(self) -> None:
    for s in self.socks.values(): s.close()

class Harness:
  """A model daemon driven as openpilot's own harnesses drive modeld (its modeld test, its process replay): the camera
  server, a publisher of every input and a subscriber of every output made first; the daemon started; every input
  waited for until it has a reader (PubMaster.wait_for_readers_to_update: no READY=1, which openpilot's harnesses do
  not read); each output received from once, as process replay does to let its sockets reconnect (on shm the daemon's
  newer publishers evicted them); then frames, each camera's state message before its frame (Camera.send)."""
  def __init__(self, module: str, artifacts, streams: list[int], inputs: list[str], outputs: list[str], *args: str):
    self.camera = Camera({s: LAYOUT for s in streams})
    self.pm = messaging.PubMaster([s for s in inputs if s not in self.camera.pm.sock])
    self.inputs = {s: self.camera.pm if s in self.camera.pm.sock else self.pm for s in inputs}
    self.outputs = {s: messaging.sub_sock(s, timeout=100) for s in outputs}
    self.notify = Notify()
    self.daemon = Daemon(module, artifacts, '--stats-interval', '0', *args, notify=self.notify)   # a STATUS= per loop turn
    self.started = time.monotonic()

  def wait_for_readers(self, timeout: float = 60.) -> float:
    """Seconds from the start until every input had a reader; AssertionError (with the daemon's stderr) if one has none."""
    for s, pm in self.inputs.items():
      assert pm.wait_for_readers_to_update(s, timeout), f"no reader on {s} within {timeout} s; stderr:\n{self.daemon.stderr()}"
    took = time.monotonic() - self.started
    for sock in self.outputs.values(): sock.receive(non_blocking=True)
    return took

  def answer(self, service: str, timeout: float = 10.):
    """The next message on an output, or None when none comes within `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if (dat := self.outputs[service].receive()) is not None: return messaging.log_from_bytes(dat)
    return None

  def close(self) -> tuple[int, float]:
    """The daemon stopped (SIGTERM: its exit code and seconds to exit), then everything else closed."""
    try: return self.daemon.stop()
    finally:
      for s in self.outputs.values(): s.close()
      self.pm.close(); self.camera.close(); self.notify.close()

  def frame_one(self, timeout: float = 10.) -> tuple[float, float | None]:
    """Readers awaited, then frame 1 on every camera: (seconds from the start to the readers, to frame 1's answer on the
    first output, or None if it did not come within `timeout` s)."""
    readers = self.wait_for_readers()
    self.camera.send(1)
    msg, out = self.answer(next(iter(self.outputs)), timeout), None
    if msg is not None:
      out = time.monotonic() - self.started
      assert getattr(msg, msg.which()).frameId == 1, f"frame 1 answered as {getattr(msg, msg.which()).frameId}"
    return readers, out

def road_harness(artifacts) -> Harness: return Harness('modeld', artifacts, [ROAD, WIDE_ROAD], list(MODELD_INPUTS), list(MODELD_OUTPUTS))
def driver_harness(artifacts) -> Harness:
  return Harness('dmonitoringd', artifacts, [DRIVER], list(DMONITORINGD_INPUTS), list(DMONITORINGD_OUTPUTS))
