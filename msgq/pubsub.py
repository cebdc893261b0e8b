"""openpilot's msgq API (Context, PubSocket, SubSocket, Poller, pub_sock, sub_sock, drain_sock_raw) over two transports.

MSGQ_TRANSPORT picks one per process, read when a socket connects: `zmq` (the default, zmq.py) or `shm` (openpilot's
own shared-memory queues, byte for byte, shm.py). Both keep openpilot's rules; docs/MSGQ.md.
"""
import os, stat, time

TRANSPORTS = ("zmq", "shm")
DEFAULT_SEGMENT = 1 << 20   # bytes of queue of an endpoint outside the services table (openpilot's default)

class IpcError(Exception): pass
class MultiplePublishersError(IpcError): pass

def transport() -> str:
  """The transport MSGQ_TRANSPORT names: 'zmq' (unset or empty too) or 'shm'."""
  if (t := os.environ.get("MSGQ_TRANSPORT") or "zmq") not in TRANSPORTS:
    raise IpcError(f"MSGQ_TRANSPORT must be one of {', '.join(TRANSPORTS)}, got {t!r}")
  return t

def _module(kind: str):
  import importlib
  return importlib.import_module(f"msgq.{kind}")   # only the one used: shm needs libatomic

def prefix() -> str:
  """OPENPILOT_PREFIX: parallel stacks on one machine never see each other's endpoints."""
  p = os.environ.get("OPENPILOT_PREFIX", "")
  if "/" in p or p in (".", ".."): raise IpcError(f"OPENPILOT_PREFIX must be a plain name, got {p!r}")
  return p

def stack_location() -> str:
  """Where this stack (this transport and OPENPILOT_PREFIX) keeps its endpoints, for messages that say where to look."""
  if transport() == "zmq":
    from msgq.zmq import runtime_dir
    return runtime_dir()
  return f"/dev/shm/msgq_{prefix()}/" if prefix() else "/dev/shm/msgq_*"

def remove_stack() -> None:
  """Remove what a private stack (an OPENPILOT_PREFIX of its own) leaves behind on either transport: queue files, socket
  files, locks. Call it once its processes are gone. The default stack is never removed: openpilot's may use it. What
  another account made in their place (a squatter's folder or file, a service account's stack) is left as it is."""
  import glob, shutil
  from msgq.zmq import runtime_dir
  if not (p := prefix()): raise IpcError("remove_stack() needs an OPENPILOT_PREFIX: the default stack is openpilot's too")
  try: places = [f"/dev/shm/msgq_{p}", runtime_dir()]
  except IpcError: places = [f"/dev/shm/msgq_{p}"]   # a runtime directory that is not ours to use
  for f in places + glob.glob(f"/tmp/{glob.escape(p)}_visionipc_*"):
    try: st = os.lstat(f)
    except FileNotFoundError: continue
    if st.st_uid != os.geteuid(): continue
    if stat.S_ISDIR(st.st_mode): shutil.rmtree(f, ignore_errors=True)
    else: os.unlink(f)

def check_endpoint(endpoint: str) -> str:
  if not isinstance(endpoint, str) or not endpoint or "/" in endpoint or endpoint in (".", ".."):
    raise IpcError(f"endpoint must be a plain name, got {endpoint!r}")
  return endpoint

def max_message(segment_size: int) -> int:
  """The largest message an endpoint of this segment size takes, on either transport: three must fit in the segment
  (openpilot's msgq aborts on more)."""
  return (segment_size or DEFAULT_SEGMENT) // 24 * 8 - 8

def fnv1a64(s: str) -> int:
  h = 0xcbf29ce484222325
  for b in s.encode():
    h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
  return h

def tcp_port(endpoint: str, prefix_: str | None = None) -> int:
  """openpilot's port scheme; this stack's prefix (or prefix_) takes part, so parallel stacks do not collide on TCP
  either. openpilot's bridge on a comma device computes its ports from the service name alone: prefix_ ''."""
  return 8023 + fnv1a64((prefix() if prefix_ is None else prefix_) + endpoint) % (65535 - 8023)

def is_local(addr: str | None) -> bool:
  """openpilot's rule: only 127.0.0.1 (and no address) means this machine's queues; anything else is TCP."""
  return addr in (None, "", "127.0.0.1")

class Context:
  """openpilot's Context: nothing to hold (each transport keeps its own per process)."""
  def term(self) -> None: pass

class PubSocket:
  """openpilot's PubSocket: PubSocket(), connect(), send(). Frees its endpoint at close(), at the end of a `with`
  block, or when its last reference goes (the transport's socket's, which its bound send() holds too)."""
  _s = None

  def connect(self, context: Context, endpoint: str, segment_size: int = 0) -> None:
    if self._s is not None: raise IpcError(f"this PubSocket is connected to {self._s.endpoint!r} already")
    self._s = _module(transport()).PubSocket(check_endpoint(endpoint), segment_size)
    self.send = self._s.send   # no call in between on the hot path

  @property
  def endpoint(self) -> str: return self._s.endpoint

  def send(self, data: bytes | bytearray | memoryview) -> int:
    """Queue data for every subscriber and return its length; never blocks. MultiplePublishersError once a newer
    publisher took the endpoint (this one then lets go of it); ValueError for an empty message or one larger than
    max_message(segment_size)."""
    raise IpcError("send on a PubSocket that is not connected")

  def taken_over(self) -> bool:
    """A newer publisher took the endpoint: the next send raises MultiplePublishersError. (Not in openpilot's API: a
    daemon checks it while idle, to leave at once.)"""
    return self._s is not None and self._s.taken_over()

  def all_readers_updated(self) -> bool:
    """shm: a reader is registered and every one has read everything sent; zmq: a reader is subscribed."""
    return self._s.all_readers_updated()

  def reader_pids(self) -> set[int]:
    """The local processes reading this endpoint (not TCP peers). Not in openpilot's API: a lockstep camera tells by it
    that the process holding its camera client has subscribed. One that closed its subscription may stay listed while
    it lives (neither transport says which subscriber left)."""
    return self._s.reader_pids()

  def wait_for_readers(self, timeout: float = 1.0, interval: float = 0.001) -> None:
    """Wait until all_readers_updated(); TimeoutError after `timeout` s, as openpilot's."""
    deadline = time.monotonic() + timeout
    while not self.all_readers_updated():
      if time.monotonic() >= deadline: raise TimeoutError(f"{self.endpoint}: no subscriber caught up within {timeout} s")
      time.sleep(interval)

  def close(self) -> None:
    if self._s is not None: self._s.close()

  def __enter__(self): return self
  def __exit__(self, *exc) -> None: self.close()

class SubSocket:
  """openpilot's SubSocket: SubSocket(), connect(), receive(). `address` other than 127.0.0.1 reads over TCP."""
  _s = None

  def connect(self, context: Context, endpoint: str, address: str | None = "127.0.0.1", conflate: bool = False,
              segment_size: int = 0) -> None:
    if self._s is not None: raise IpcError(f"this SubSocket is connected to {self._s.endpoint!r} already")
    if isinstance(address, bytes): address = address.decode()
    self._s = _module(transport() if is_local(address) else "zmq").SubSocket(check_endpoint(endpoint), address, conflate, segment_size)
    self.receive = self._s.receive

  @property
  def endpoint(self) -> str: return self._s.endpoint

  @property
  def confirmed(self) -> bool:
    """The subscription is live: on shm at once; on zmq once a local publisher that was up said so (sub_sock waits
    up to 2 s for it), never for a remote one."""
    return getattr(self._s, "confirmed", True)

  def setTimeout(self, timeout: int | None) -> None:
    """ms a blocking receive() waits (None or < 0: forever)."""
    self._s.timeout = None if timeout is None or timeout < 0 else timeout

  def receive(self, non_blocking: bool = False) -> bytes | None:
    """The next message (with conflate, the newest); None if non_blocking and there is none, or after the timeout."""
    raise IpcError("receive on a SubSocket that is not connected")

  def close(self) -> None:
    if self._s is not None: self._s.close()

  def __enter__(self): return self
  def __exit__(self, *exc) -> None: self.close()

class Poller:
  """openpilot's Poller: registerSocket(), poll(timeout_ms) -> the registered sockets with a message ready. It holds its
  sockets, as openpilot's does. All of one transport."""
  def __init__(self):
    self.sockets: list[SubSocket] = []
    self._p = None

  def registerSocket(self, sock: SubSocket) -> None:
    kind = sock._s.transport
    if self._p is None:
      self._p = _module(kind).Poller()
      self.poll = self._p.poll   # no call in between on the wake-up path
    elif self._p.transport != kind: raise IpcError(f"a Poller takes sockets of one transport: {sock.endpoint!r} is {kind}, the others {self._p.transport}")
    self._p.register(sock._s, sock)
    self.sockets.append(sock)

  def poll(self, timeout: int) -> list[SubSocket]:
    """The sockets with a message ready, waiting up to timeout ms (-1: until one is)."""
    time.sleep(max(timeout, 0) / 1000)   # none registered yet
    return []

  def close(self) -> None:
    """Forget every socket (it owns no resource itself)."""
    self.sockets.clear()
    self._p = None
    self.__dict__.pop("poll", None)

  def __enter__(self): return self
  def __exit__(self, *exc) -> None: self.close()

def pub_sock(endpoint: str, segment_size: int = 0) -> PubSocket:
  s = PubSocket()
  s.connect(Context(), endpoint, segment_size)
  return s

def sub_sock(endpoint: str, poller: Poller | None = None, addr: str | None = "127.0.0.1", conflate: bool = False,
             timeout: int | None = None, segment_size: int = 0) -> SubSocket:
  s = SubSocket()
  s.connect(Context(), endpoint, addr, conflate, segment_size)
  if timeout is not None: s.setTimeout(timeout)
  if poller is not None: poller.registerSocket(s)
  return s

def drain_sock_raw(sock: SubSocket, wait_for_one: bool = False) -> list[bytes]:
  """Everything queued on sock, oldest first; with wait_for_one, block (up to its timeout) for the first."""
  out = []
  if wait_for_one and (msg := sock.receive()) is not None: out.append(msg)
  while (msg := sock.receive(non_blocking=True)) is not None: out.append(msg)
  return out
