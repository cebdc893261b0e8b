"""Pub/sub over ZMQ with the msgq API openpilot users know.

Transport: `ipc://` sockets in a per-user runtime directory (mode 0700), one sub-directory per
OPENPILOT_PREFIX so parallel stacks never see each other. Remote subscribers (addr not local) use TCP on
openpilot's port scheme; publishers listen on TCP only when MSGQ_TCP names an address ("1" = loopback).

Guarantees (each has a test in tests/test_msgq.py):
- one publisher per endpoint, across threads and processes (an flock held for the publisher's life);
- no slow-joiner loss: when the publisher is up, sub_sock() returns once the subscription is live. The
  publisher is an XPUB with a welcome message; it only reaches a subscriber after the publisher attached it
  and read its subscription. A small pump thread keeps the XPUB processing attachments while the
  application is not sending, and the welcome message is filtered out of the data;
- a slow or dead subscriber never blocks the publisher: ZMQ drops at the high-water mark, which is sized
  from the endpoint's largest message so queued memory stays bounded.
"""
import errno, fcntl, os, select, stat, threading, time
import zmq

DEFAULT_MAX_SIZE = 16 * 1024 * 1024   # largest message on an endpoint the caller gave no size for
QUEUE_BYTES = 64 * 1024 * 1024        # bound on what one socket queues per peer
WELCOME = b"\xffmsgq-welcome\xff"     # never a valid Cap'n Proto message (segment count 2^32)

class IpcError(Exception): pass
class MultiplePublishersError(IpcError): pass

def _fnv1a64(s: str) -> int:
  h = 0xcbf29ce484222325
  for b in s.encode():
    h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
  return h

def _prefix() -> str:
  p = os.environ.get("OPENPILOT_PREFIX", "")
  if "/" in p or p in (".", ".."): raise IpcError(f"OPENPILOT_PREFIX must be a plain name, got {p!r}")
  return p

def tcp_port(endpoint: str) -> int:
  """openpilot's port scheme; the prefix takes part so parallel stacks do not collide on TCP either."""
  return 8023 + _fnv1a64(_prefix() + endpoint) % (65535 - 8023)

def runtime_dir() -> str:
  """Per-user directory (0700) holding the ipc sockets and publisher locks of this prefix."""
  base = os.environ.get("MSGQ_RUNTIME_DIR") or os.path.join(os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/msgq-{os.getuid()}", "msgq")
  path = os.path.join(base, _prefix() or "default")
  for d in (base, path):
    try: os.makedirs(d, mode=0o700, exist_ok=True)
    except OSError as e: raise IpcError(f"cannot create runtime directory {d}: {e}") from None
  st = os.stat(base)
  if st.st_uid != os.getuid() and not os.environ.get("MSGQ_RUNTIME_DIR"):
    raise IpcError(f"runtime directory {base} belongs to uid {st.st_uid}, not to us ({os.getuid()})")
  return path

def _ipc_path(endpoint: str) -> str:
  if not endpoint or "/" in endpoint: raise IpcError(f"endpoint must be a plain name, got {endpoint!r}")
  path = os.path.join(runtime_dir(), endpoint)
  if len(path) > 100: raise IpcError(f"ipc path too long for a unix socket ({len(path)} > 100): {path}")
  return path

def _hwm(max_size: int) -> int: return max(16, min(1000, QUEUE_BYTES // max(max_size, 1)))

class Context:
  """The process's ZMQ context (one per process; a forked child gets its own)."""
  def __init__(self): self.context = zmq.Context.instance()
  def term(self) -> None: pass   # the shared instance lives as long as the process

class PubSocket:
  def __init__(self): self.sock = None

  def connect(self, context: Context, endpoint: str, max_size: int = DEFAULT_MAX_SIZE) -> None:
    self.endpoint, self.path = endpoint, (path := _ipc_path(endpoint))
    self._lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try: fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(self._lock_fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
        raise MultiplePublishersError(f"endpoint {endpoint!r} already has a publisher ({path})") from None
      raise
    s = context.context.socket(zmq.XPUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, _hwm(max_size))
    s.setsockopt(zmq.XPUB_NODROP, 0)
    s.setsockopt(zmq.XPUB_VERBOSER, 1)   # every subscribe and unsubscribe reaches us: a reader count
    s.setsockopt(zmq.XPUB_WELCOME_MSG, WELCOME)
    try:
      s.bind("ipc://" + path)
      if (tcp := os.environ.get("MSGQ_TCP", "")) not in ("", "0"):
        s.bind(f"tcp://{'127.0.0.1' if tcp == '1' else tcp}:{tcp_port(endpoint)}")
    except zmq.ZMQError as e:
      s.close(); os.close(self._lock_fd)
      raise IpcError(f"cannot publish {endpoint!r}: {e}") from None
    self.sock, self.readers, self._mutex, self._closed = s, 0, threading.Lock(), False
    self._pump = threading.Thread(target=self._pump_loop, name=f"msgq-pub-{endpoint}", daemon=True)
    self._pump.start()

  def _process(self) -> None:
    # caller holds the mutex; reading EVENTS makes ZMQ attach new subscribers and send their welcome
    while self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
      sub = self.sock.recv(zmq.NOBLOCK)
      if sub[:1] == b"\x01": self.readers += 1
      elif sub[:1] == b"\x00": self.readers = max(0, self.readers - 1)

  def _pump_loop(self) -> None:
    fd = self.sock.getsockopt(zmq.FD)
    while not self._closed:
      try: select.select([fd], [], [], 0.1)
      except (OSError, ValueError): return
      with self._mutex:
        if self._closed: return
        try: self._process()
        except zmq.ZMQError: return

  def send(self, data: bytes) -> int:
    with self._mutex:
      if self._closed: raise IpcError(f"send on closed publisher {self.endpoint!r}")
      self.sock.send(data, copy=len(data) < 65536)
    return len(data)

  def all_readers_updated(self) -> bool:
    """True when at least one reader is subscribed. ZMQ delivers every message to every subscribed reader in
    order but cannot report what a reader consumed, so this cannot mean more than openpilot's 'has readers'."""
    with self._mutex:
      self._process()
      return self.readers > 0

  def wait_for_readers(self, timeout: float | None = None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    while not self.all_readers_updated():
      if deadline is not None and time.monotonic() >= deadline: return False
      time.sleep(0.005)
    return True

  def close(self) -> None:
    if self.sock is None or self._closed: return
    with self._mutex:
      self._closed = True
      self.sock.close(0)
    self._pump.join(1)
    try: os.unlink(self.path)   # libzmq leaves the socket file; we still hold the endpoint's lock, so it is ours
    except FileNotFoundError: pass
    os.close(self._lock_fd)

  def __del__(self):
    try: self.close()
    except Exception: pass

class SubSocket:
  def __init__(self): self.sock, self.timeout = None, None

  def connect(self, context: Context, endpoint: str, address: str = "127.0.0.1", conflate: bool = False,
              max_size: int = DEFAULT_MAX_SIZE, wait: float = 2.0) -> None:
    """Subscribe. If the publisher is up, return only once the subscription is live (at most `wait` s)."""
    self.endpoint = endpoint
    s = context.context.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, 1 if conflate else _hwm(max_size))
    s.setsockopt(zmq.MAXMSGSIZE, max(max_size, len(WELCOME)))
    s.setsockopt(zmq.RECONNECT_IVL, 20)
    s.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
    if conflate: s.setsockopt(zmq.CONFLATE, 1)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    local = address in ("127.0.0.1", "localhost", "::1", "")
    path = _ipc_path(endpoint)
    s.connect(("ipc://" + path) if local else f"tcp://{address}:{tcp_port(endpoint)}")
    self.sock, self.poller = s, zmq.Poller()
    self.poller.register(s, zmq.POLLIN)
    if local and _publisher_alive(path) and wait > 0 and s.poll(int(wait * 1000)):
      self._recv(zmq.NOBLOCK)   # the welcome (or, if it was conflated away, nothing is lost: it came first)

  def _recv(self, flags: int) -> bytes | None:
    try: msg = self.sock.recv(flags, copy=True)
    except zmq.Again: return None
    return None if msg == WELCOME else msg

  def setTimeout(self, timeout: int | None) -> None:
    self.timeout = timeout

  def receive(self, non_blocking: bool = False) -> bytes | None:
    """The next message; None if non_blocking and nothing is queued, or after the timeout (ms)."""
    if non_blocking:
      while self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
        if (msg := self._recv(zmq.NOBLOCK)) is not None: return msg
      return None
    deadline = None if self.timeout is None else time.monotonic() + self.timeout / 1000
    while True:
      left = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
      if self.sock.poll(left) and (msg := self._recv(zmq.NOBLOCK)) is not None: return msg
      if deadline is not None and time.monotonic() >= deadline: return None

  def fileno(self) -> int: return self.sock.getsockopt(zmq.FD)

  def close(self) -> None:
    if self.sock is not None: self.sock.close(0); self.sock = None

def _publisher_alive(path: str) -> bool:
  try: fd = os.open(path + ".lock", os.O_RDONLY | os.O_CLOEXEC)
  except OSError: return False
  try:
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    return False
  except OSError: return True
  finally: os.close(fd)

class Poller:
  def __init__(self):
    self.poller, self.sockets = zmq.Poller(), {}

  def registerSocket(self, sock: SubSocket) -> None:
    self.sockets[sock.sock] = sock
    self.poller.register(sock.sock, zmq.POLLIN)

  def poll(self, timeout: int) -> list[SubSocket]:
    """Sockets with a message ready, waiting up to timeout ms (-1 forever) for the first one."""
    return [self.sockets[s] for s, ev in self.poller.poll(timeout) if ev & zmq.POLLIN]

def pub_sock(endpoint: str, max_size: int = DEFAULT_MAX_SIZE) -> PubSocket:
  s = PubSocket()
  s.connect(Context(), endpoint, max_size)
  return s

def sub_sock(endpoint: str, poller: Poller | None = None, addr: str = "127.0.0.1", conflate: bool = False,
             timeout: int | None = None, max_size: int = DEFAULT_MAX_SIZE) -> SubSocket:
  s = SubSocket()
  s.connect(Context(), endpoint, addr, conflate, max_size)
  if timeout is not None: s.setTimeout(timeout)
  if poller is not None: poller.registerSocket(s)
  return s

def drain_sock_raw(sock: SubSocket, wait_for_one: bool = False) -> list[bytes]:
  """Everything queued on sock, oldest first; with wait_for_one, block (up to its timeout) for the first."""
  out = []
  if wait_for_one and (msg := sock.receive()) is not None: out.append(msg)
  while (msg := sock.receive(non_blocking=True)) is not None: out.append(msg)
  return out
