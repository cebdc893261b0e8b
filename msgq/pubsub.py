"""Pub/sub over ZMQ with the msgq API openpilot users know.

Transport: `ipc://` sockets in a per-user runtime directory (mode 0700), one sub-directory per
OPENPILOT_PREFIX so parallel stacks never see each other. A subscriber whose addr is "127.0.0.1" (the
default), "" or None is local and uses ipc, as in openpilot; any other addr ("localhost" included) is remote
and uses TCP on port 8023 + fnv1a64(prefix + endpoint) % (65535 - 8023) (openpilot's scheme; with no prefix
the same port as openpilot). Publishers listen on TCP only when MSGQ_TCP names an address ("1" = 127.0.0.1,
"0.0.0.0" = every interface).

Guarantees (each has a test in tests/test_msgq.py):
- one publisher per endpoint, across threads and processes (an flock held for the publisher's life; it dies
  with the process, so a publisher killed by SIGKILL frees its endpoint);
- no slow-joiner loss: when a local publisher is up, sub_sock() returns once the subscription is live (a remote
  subscriber cannot see whether its publisher is up, and returns at once). The publisher is an XPUB with manual
  subscriptions: every subscription reaches it and takes effect when it applies it; a small pump thread applies
  them while the application is not sending. A subscriber that waits subscribes, after its real subscription
  (everything), to a token topic: LIVE_TOPIC and 32 random hex digits. The publisher never applies a token (no
  message goes out for it); reading one, it knows that the subscription before it on the same connection is
  applied, and says so with one datagram to the unix socket the token names (LIVE_ADDR and the digits, in the
  abstract namespace; only a datagram from our own uid counts), which sub_sock() waits on. So nothing but the
  messages sent goes out on the wire: a plain ZMQ SUB (openpilot's, a script's) receives openpilot's bytes. (A
  frame of msgq's own on the data socket, libzmq's welcome message included, would reach such a subscriber as a
  message no Cap'n Proto reader parses.) A publisher in another network namespace cannot reach the datagram's
  socket: sub_sock() then returns after its wait, `confirmed` False;
- a slow or dead subscriber never blocks the publisher: ZMQ drops at the high-water mark. Queues are bounded in
  bytes: a publisher queues for each subscriber at least QUEUE_BYTES (64 MiB, counting MSG_OVERHEAD per message)
  and at most four times that, sized from the size class (power of two, rounded down) of the largest message it has
  sent so far (so at least 1,023 messages of 64 KiB, or 58,255 of 1 KiB, whatever the endpoint's max_size); a
  subscriber queues as much again, sized from its max_size. Before its first message, and for a TCP subscriber that
  connects after it, a publisher's queues are sized from its max_size (bounded in bytes, fewer messages).
  A reader that keeps reading loses nothing of a burst that fits; the publisher's memory stays bounded whatever
  its readers do. libzmq gives a new connection the mark its socket had when the listener bound, so each new size
  class also binds a new ipc listener at the same path (the old one keeps its connections; new ones reach the new
  file). Re-sizing live queues (setsockopt SNDHWM) can crash libzmq 4.3.5 while a subscriber is leaving (see
  docs/RELIABILITY.md): hence once per size class, not per new largest message;
- a message larger than a subscriber's max_size is refused by it (counted in `refused`, logged); publishers
  refuse to send more than their own max_size. Only a message over 4x the subscriber's max_size (from a
  publisher with another services table) ends the connection, as a ZMQ protocol error, until the subscriber
  is re-created;
- a restarted publisher (same process or another) is re-connected to by existing subscribers within
  RECONNECT_IVL_MAX; messages it sends before that are lost, as with any new subscriber. ZMQ re-sends the
  subscription on the subscriber's own thread, the next time it receives or polls, so a publisher's
  wait_for_readers() sees an idle subscriber only once it reads again.

Lifetimes: PubSocket, SubSocket and Poller free what they hold (endpoint lock, socket file, ZMQ socket, pump thread)
in close(), at the end of a `with` block, or as soon as the last reference goes: the publisher's pump thread holds
only a state object shared with it, never the PubSocket, so no cycle keeps one alive (tests/test_lifetimes.py).
"""
import errno, fcntl, logging, math, os, select, socket, struct, sys, threading, time
import zmq

DEFAULT_MAX_SIZE = 16 * 1024 * 1024   # largest message on an endpoint the caller gave no size for
QUEUE_BYTES = 64 * 1024 * 1024        # what one socket's queue for one peer holds at least (and at most twice)
MSG_OVERHEAD = 128                    # bytes libzmq spends per queued message besides its data (measured: 48-126)
RECONNECT_IVL_MAX_S = 0.5             # a subscriber re-tries a missing publisher at least this often
ZERO_COPY_MIN = 64 * 1024             # bytes objects this large are sent without a copy (pyzmq: slower below)
LIVE_TOPIC = b"\xffmsgq-live:"        # + a token: a subscription that asks to hear when the one before it is live
LIVE_ADDR = b"\0msgq-live-"           # + the token: where the subscriber waits to hear it (abstract: no file to clean up)
_UCRED = struct.Struct("3i")          # struct ucred: pid, uid, gid

logger = logging.getLogger("msgq")

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

def is_local(addr: str | None) -> bool:
  """openpilot's rule: only 127.0.0.1 (and no address) means this machine's ipc; anything else is TCP."""
  return addr in (None, "", "127.0.0.1")

def runtime_dir() -> str:
  """Per-user directory (0700) holding the ipc sockets and publisher locks of this prefix."""
  root = os.environ.get("MSGQ_RUNTIME_DIR") or \
         (os.path.join(os.environ["XDG_RUNTIME_DIR"], "msgq") if os.environ.get("XDG_RUNTIME_DIR") else f"/tmp/msgq-{os.getuid()}")
  path = os.path.join(root, _prefix() or "default")
  if os.getuid() == 0 and (owner := _owner(root)) not in (None, 0):
    # root looking at another user's stack (a service user's /run/modeld): as it is. A folder made or a mode changed
    # here would lock that user out of its own stack
    if not os.path.isdir(path): raise IpcError(f"no stack runs in {path} (its runtime directory {root} belongs to uid {owner})")
    return path
  try:
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(root)
    if st.st_uid != os.getuid():   # someone else made it (e.g. in /tmp): their sockets, not ours
      raise IpcError(f"runtime directory {root} belongs to uid {st.st_uid}, not to us ({os.getuid()})")
    for d in (root, path):
      if os.stat(d).st_mode & 0o077: os.chmod(d, 0o700)
  except OSError as e: raise IpcError(f"cannot create runtime directory {path}: {e}") from None
  return path

def _owner(path: str) -> int | None:
  try: return os.stat(path).st_uid
  except OSError: return None

def _ipc_path(endpoint: str) -> str:
  if not endpoint or "/" in endpoint: raise IpcError(f"endpoint must be a plain name, got {endpoint!r}")
  path = os.path.join(runtime_dir(), endpoint)
  if len(path) > 100: raise IpcError(f"ipc path too long for a unix socket ({len(path)} > 100): {path}")
  return path

def queue_len(msg_size: int) -> int:
  """High-water mark (messages) for a queue of messages up to msg_size bytes that holds at least QUEUE_BYTES (and at
  least one message). Twice that count: libzmq learns what the other end of a queue took only every hwm/2 messages,
  so a queue reports full anywhere between half and all of its high-water mark."""
  return 2 * math.ceil(QUEUE_BYTES / (msg_size + MSG_OVERHEAD))

class Context:
  """The process's ZMQ context (one per process; a forked child gets its own)."""
  def __init__(self): self.context = zmq.Context.instance()
  def term(self) -> None: pass   # the shared instance lives as long as the process

class _PubState:
  """What a publisher shares with its pump thread: the thread holds this, never the PubSocket."""
  def __init__(self, sock: zmq.Socket, path: str):
    self.sock, self.path, self.readers, self.mutex, self.closed, self.size_class = sock, path, 0, threading.Lock(), False, 0

  def resize(self, n: int) -> None:
    """Size every queue for messages of n bytes' size class (caller holds the mutex). Live connections take the new
    mark from setsockopt; a later one takes the mark its listener was bound with, so a new ipc listener replaces the
    old at the same path (the bind unlinks the old file; the old listener's connections live on). A TCP port cannot
    be bound twice: TCP subscribers that connect later keep the mark of the first bind."""
    self.size_class = 1 << (max(n, 1).bit_length() - 1)
    self.sock.setsockopt(zmq.SNDHWM, queue_len(self.size_class))
    try: self.sock.bind("ipc://" + self.path)
    except zmq.ZMQError as e: logger.warning("%s: new subscribers keep the old queue size: %s", self.path, e)

  def process(self) -> None:
    # caller holds the mutex; reading EVENTS makes ZMQ attach new subscribers and queue their (un)subscriptions
    while self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
      sub = self.sock.recv(zmq.NOBLOCK)
      kind, topic = sub[:1], sub[1:]
      if topic.startswith(LIVE_TOPIC):   # never applied, not a reader; its subscriber drops it once it has heard
        if kind == b"\x01": _tell_live(topic[len(LIVE_TOPIC):])
      elif kind == b"\x01":
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.readers += 1
      elif kind == b"\x00":   # a subscriber left (our subscribers never unsubscribe while connected)
        self.sock.setsockopt(zmq.UNSUBSCRIBE, topic)
        self.readers = max(0, self.readers - 1)

def _tell_live(token: bytes) -> None:
  """One datagram to the subscriber waiting on `token`: every subscription it made before the token is applied.
  Never blocks the publisher: a subscriber that stopped waiting (timed out, gone) simply misses it."""
  with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.setblocking(False)
    try: s.sendto(b"\x01", LIVE_ADDR + token)
    except OSError: pass   # nobody waits there any more (or a foreign token names no socket we could reach)

def _pump(st: _PubState, fd: int, wake: int) -> None:
  """Applies subscriptions while the application is not sending. The 0.1 s timeout: a send() on the application's
  thread can consume the ZMQ fd's edge while leaving a subscription queued."""
  while True:
    try: ready = select.select([fd, wake], [], [], 0.1)[0]
    except (OSError, ValueError): return
    if wake in ready: return
    with st.mutex:
      if st.closed: return
      try: st.process()
      except zmq.ZMQError: return

class PubSocket:
  def __init__(self): self._st: _PubState | None = None

  def connect(self, context: Context, endpoint: str, max_size: int = DEFAULT_MAX_SIZE) -> None:
    self.endpoint, self.path, self.max_size = endpoint, (path := _ipc_path(endpoint)), max_size
    lock_fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    # a subscriber probing for a publisher holds a shared lock for a few microseconds: retry briefly
    deadline = time.monotonic() + 0.05
    while True:
      try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN) and time.monotonic() < deadline:
          time.sleep(0.001)
          continue
        os.close(lock_fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
          raise MultiplePublishersError(f"endpoint {endpoint!r} already has a publisher ({path})") from None
        raise IpcError(f"cannot lock {path}.lock: {e}") from None
    s = context.context.socket(zmq.XPUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, queue_len(max_size))   # bounded in bytes until the first message sets its size class
    s.setsockopt(zmq.XPUB_NODROP, 0)
    # manual subscriptions: every subscribe reaches us (a reader count, token topics) and takes effect when we apply
    # it. Not XPUB_MANUAL_LAST_VALUE: that sends the next message after a subscription to its subscriber alone
    s.setsockopt(zmq.XPUB_MANUAL, 1)
    try:
      s.bind("ipc://" + path)   # libzmq removes a socket file left by a dead publisher first
      if (tcp := os.environ.get("MSGQ_TCP", "")) not in ("", "0"):
        s.bind(f"tcp://{'127.0.0.1' if tcp == '1' else tcp}:{tcp_port(endpoint)}")
    except zmq.ZMQError as e:
      s.close(); os.close(lock_fd)
      raise IpcError(f"cannot publish {endpoint!r}: {e}") from None
    self._lock_fd, self._wake, self._st = lock_fd, os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK), _PubState(s, path)
    self._pump = threading.Thread(target=_pump, args=(self._st, s.getsockopt(zmq.FD), self._wake), name=f"msgq-pub-{endpoint}", daemon=True)
    self._pump.start()

  @property
  def readers(self) -> int: return self._st.readers

  def send(self, data: bytes | bytearray | memoryview) -> int:
    """Queue data for every subscriber; never blocks (a subscriber whose queue is full misses it).
    bytes are sent without a copy when large; mutable buffers are copied, so the caller may reuse them."""
    if (n := len(data)) > self.max_size:
      raise ValueError(f"message of {n} bytes is larger than {self.endpoint!r}'s max_size {self.max_size}")
    st = self._st
    with st.mutex:
      if st.closed: raise IpcError(f"send on closed publisher {self.endpoint!r}")
      # queues stay bounded in bytes: fewer messages once they are larger. Re-sized per size class (the power of two
      # at or below the largest message), not per new largest message: each re-size of live queues risks libzmq
      # 4.3.5's crash (below), and a daemon's sizes settle in one class after its first messages
      if n >= 2 * st.size_class: st.resize(n)
      st.sock.send(data, copy=not (isinstance(data, bytes) and n >= ZERO_COPY_MIN))
    return n

  def all_readers_updated(self) -> bool:
    """True when at least one reader is subscribed. ZMQ delivers every message to every subscribed reader in
    order but cannot report what a reader consumed, so this cannot mean more than openpilot's 'has readers'."""
    with self._st.mutex:
      self._st.process()
      return self._st.readers > 0

  def wait_for_readers(self, timeout: float | None = None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    while not self.all_readers_updated():
      if deadline is not None and time.monotonic() >= deadline: return False
      time.sleep(0.005)
    return True

  def close(self) -> None:
    """Stop the pump, close the socket, free the endpoint. Idempotent; also runs when the last reference goes."""
    if (st := self._st) is None or st.closed: return
    with st.mutex: st.closed = True
    os.eventfd_write(self._wake, 1)
    if not sys.is_finalizing(): self._pump.join()   # at interpreter exit a daemon thread can no longer run to its end
    st.sock.close(0)
    try: os.unlink(self.path)   # libzmq leaves the socket file; we still hold the endpoint's lock, so it is ours
    except FileNotFoundError: pass
    os.close(self._lock_fd)
    os.close(self._wake)

  def __enter__(self): return self
  def __exit__(self, *exc) -> None: self.close()
  def __del__(self): self.close()

class SubSocket:
  def __init__(self): self.sock, self.timeout, self._pending, self._rcvtimeo, self.confirmed = None, None, None, -1, False

  def connect(self, context: Context, endpoint: str, address: str | None = "127.0.0.1", conflate: bool = False,
              max_size: int = DEFAULT_MAX_SIZE, wait: float = 2.0) -> None:
    """Subscribe. If a local publisher is up, return only once the subscription is live (at most `wait` s);
    `confirmed` says whether the publisher confirmed that in time."""
    self.endpoint, self.conflate, self.max_size, self.refused = endpoint, conflate, max_size, 0
    # Larger messages than max_size are refused here, after arrival: ZMQ's own limit (MAXMSGSIZE) would end the
    # connection for good. It is kept at 4x, only to bound the memory a foreign publisher can make us queue.
    s = context.context.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, queue_len(max_size))
    s.setsockopt(zmq.MAXMSGSIZE, 4 * max_size)
    s.setsockopt(zmq.RECONNECT_IVL, 20)
    s.setsockopt(zmq.RECONNECT_IVL_MAX, int(RECONNECT_IVL_MAX_S * 1000))
    # conflate: receive() drains the queue for its newest message. Not libzmq's ZMQ_CONFLATE, whose one-message pipe
    # has been seen to leave a frame unread by a blocking receive until the next one came (a lockstep camera then
    # waits forever for the answer to it)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    local = is_local(address)
    path = _ipc_path(endpoint)
    s.connect(("ipc://" + path) if local else f"tcp://{address}:{tcp_port(endpoint)}")
    self.sock = s
    # the publisher's answer counts from our uid, or the uid its socket file belongs to (root reading a service's stack)
    if local and wait > 0 and _publisher_alive(path): self.confirmed = _wait_live(s, wait, {os.getuid(), _owner(path)} - {None})

  def _recv(self, timeout: int = 0) -> bytes | None:
    """The next message, skipping refused ones; waits up to timeout ms (0: not at all, -1: forever).
    A blocking recv with a timeout, not poll + recv: one wake-up per message."""
    deadline = None if timeout < 0 else time.monotonic() + timeout / 1000
    while True:
      if timeout != self._rcvtimeo: self.sock.setsockopt(zmq.RCVTIMEO, timeout); self._rcvtimeo = timeout
      try: msg = self.sock.recv(copy=True)
      except zmq.Again: return None
      if len(msg) > self.max_size:
        self.refused += 1
        logger.warning("%s: refused a message of %d bytes (max_size %d; %d refused so far)", self.endpoint, len(msg), self.max_size, self.refused)
      else: return msg
      if deadline is not None: timeout = max(0, int((deadline - time.monotonic()) * 1000))

  def setTimeout(self, timeout: int | None) -> None:
    self.timeout = timeout

  def receive(self, non_blocking: bool = False) -> bytes | None:
    """The next message (with conflate, the newest queued); None if non_blocking and nothing is queued, or after the
    timeout (ms)."""
    msg, self._pending = self._pending, None   # read ahead by a Poller
    if msg is None: msg = self._recv(0 if non_blocking else -1 if self.timeout is None or self.timeout < 0 else self.timeout)
    while self.conflate and msg is not None and (newer := self._recv()) is not None: msg = newer
    return msg

  def close(self) -> None:
    if self.sock is not None: self.sock.close(0); self.sock = None

  def __enter__(self): return self
  def __exit__(self, *exc) -> None: self.close()
  def __del__(self): self.close()

def _wait_live(sock: zmq.Socket, wait: float, uids: set[int]) -> bool:
  """Subscribe `sock` (connected, subscribed to everything) to a fresh token and wait up to `wait` s for its publisher to
  say that the subscription is live. True if it did. Abstract socket names are open to every user (and listed in
  /proc/net/unix): only a datagram the kernel says one of `uids` sent counts (ours, the publisher's socket file's)."""
  token, deadline = os.urandom(16).hex().encode(), time.monotonic() + wait
  with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as told:
    told.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)   # every datagram arrives with its sender's credentials
    told.bind(LIVE_ADDR + token)   # before the token goes out: the answer cannot come too early
    sock.setsockopt(zmq.SUBSCRIBE, LIVE_TOPIC + token)
    try:
      while select.select([told], [], [], max(0., deadline - time.monotonic()))[0]:
        if _sender_uid(told) in uids: return True
      return False
    finally: sock.setsockopt(zmq.UNSUBSCRIBE, LIVE_TOPIC + token)   # done: a restarted publisher need not hear it again

def _sender_uid(s: socket.socket) -> int | None:
  """The uid that sent the next datagram on `s` (SO_PASSCRED set), which it consumes."""
  _, ancillary, _, _ = s.recvmsg(1, socket.CMSG_SPACE(_UCRED.size))
  return next((_UCRED.unpack(data)[1] for level, kind, data in ancillary
               if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS), None)

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

  def close(self) -> None:
    """Forget every socket (it holds them, as openpilot's does; it owns no file descriptor itself)."""
    for zs in self.sockets: self.poller.unregister(zs)
    self.sockets.clear()

  def __enter__(self): return self
  def __exit__(self, *exc) -> None: self.close()

  def poll(self, timeout: int) -> list[SubSocket]:
    """The sockets with a message ready, waiting up to timeout ms (-1 forever) for the first one. A ready
    socket's message is read ahead (so a refused one never counts as ready); receive() returns it."""
    deadline = None if timeout < 0 else time.monotonic() + timeout / 1000
    while True:
      ready = [s for s in self.sockets.values() if s._pending is not None]
      left = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
      for zs, ev in self.poller.poll(0 if ready else left):
        if ev & zmq.POLLIN and (s := self.sockets[zs])._pending is None: s._pending = s._recv()
      ready = [s for s in self.sockets.values() if s._pending is not None]
      if ready or (deadline is not None and time.monotonic() >= deadline): return ready

def pub_sock(endpoint: str, max_size: int = DEFAULT_MAX_SIZE) -> PubSocket:
  s = PubSocket()
  s.connect(Context(), endpoint, max_size)
  return s

def sub_sock(endpoint: str, poller: Poller | None = None, addr: str | None = "127.0.0.1", conflate: bool = False,
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
