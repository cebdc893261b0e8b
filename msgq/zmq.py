"""The zmq transport: ZMQ `ipc://` sockets in a private per-user runtime directory (one folder per OPENPILOT_PREFIX), TCP
for remote subscribers and, with MSGQ_TCP, publishers that serve them. Nothing but the messages goes on the wire, so a
plain ZMQ SUB (openpilot's bridge, a script) reads openpilot's bytes. Delivery is asynchronous (an I/O thread).
Guarantees and how they are kept: docs/MSGQ.md; each has a test in tests/test_msgq.py.
"""
import errno, fcntl, logging, math, mmap, os, select, socket, stat, struct, sys, threading, time
import zmq
from zmq.utils.monitor import recv_monitor_message
from service import RateLimit
from service.owned import NotOwnedError, account, check, open_private, own_socket_file, private_dir
from msgq.pubsub import IpcError, MultiplePublishersError, max_message, prefix, tcp_port

QUEUE_BYTES = 64 * 1024 * 1024        # one socket's queue for one peer holds at least this much of the largest message
QUEUE_MESSAGES = 16384                # and a high-water mark of this many messages, whatever their size,
QUEUE_CAP = 4 * 1024 ** 3             # unless that many of the largest would take more than this: then as many as fit
MSG_OVERHEAD = 128                    # bytes libzmq spends per queued message besides its data (measured: 48-126)
REMOTE_QUEUE_CAP = 2 * QUEUE_BYTES    # a queue to or from a TCP peer: at most about this much of the largest message
LINK_CHECK_MS = 500                   # a remote subscriber waiting looks this often for a connection libzmq gave up
RELINK_WAIT_MS = 50                   # the retry libzmq follows a lost connection with comes within this (microseconds)
RECONNECT_IVL_MAX_S = 0.5             # a subscriber re-tries a missing publisher at least this often
PUMP_S = 0.1                          # a publisher's thread applies subscriptions and looks for a newer publisher this often
ZERO_COPY_MIN = 64 * 1024             # bytes objects this large are sent without a copy (pyzmq: slower below)
IN_FLIGHT_WAIT_MS = 100               # a receive waits this long at most for messages its publisher has sent
MAX_PIDS = 64                         # subscriber processes remembered before the gone ones are dropped
LIVE_TOPIC = b"\xffmsgq-live:"        # + a token: a subscription that asks to hear when the one before it is live
LIVE_ADDR = b"\0msgq-live-"           # + the token: where the subscriber waits to hear it (abstract: no file to clean up)
_UCRED = struct.Struct("3i")          # struct ucred: pid, uid, gid
_OWNER = struct.Struct("<8sQ")        # an endpoint's owner file: its newest publisher's uid, the messages it has sent

logger = logging.getLogger("msgq")
logger.addFilter(RateLimit())   # what a publisher, a remote one too, makes a subscriber say stays bounded

def runtime_dir() -> str:
  """This prefix's folder of ipc sockets, locks and owner files in the runtime directory: $MSGQ_RUNTIME_DIR, else
  $XDG_RUNTIME_DIR/msgq, else /run/msgq for root (never /tmp, where any account can make it first), /tmp/msgq-<uid> for
  others. Both ours, 0700 (MSGQ_GROUP: 0770) whatever the umask; another account's, or a symlink, is refused by name,
  except where root reads a service account's stack (_adopted())."""
  named = os.environ.get("MSGQ_RUNTIME_DIR")
  root = os.path.abspath(named or (os.path.join(os.environ["XDG_RUNTIME_DIR"], "msgq") if os.environ.get("XDG_RUNTIME_DIR")
                                   else "/run/msgq" if os.geteuid() == 0 else f"/tmp/msgq-{os.geteuid()}"))
  if named and (adopted := _adopted(root)) is not None:
    # as it is: a folder made or a mode changed here would lock that account out of its own stack
    uid, real = adopted
    path = os.path.join(real, prefix() or "default")
    try: st = os.lstat(path)
    except OSError: st = None
    if st is None or not stat.S_ISDIR(st.st_mode) or st.st_uid not in (uid, 0):
      raise IpcError(f"no stack runs in {path} (its runtime directory {root} belongs to {account(uid)})")
    return path
  path = os.path.join(root, prefix() or "default")
  try:
    os.makedirs(parent := os.path.dirname(root), mode=0o700, exist_ok=True)
    st = check(parent, os.stat(parent), "the runtime directory's folder")   # its owner could swap ours for its own
    if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX: raise NotOwnedError(f"{parent} is every account's to write: refused")
    private_dir(root, "runtime directory")
    return private_dir(path, "runtime directory")
  except NotOwnedError as e: raise IpcError(str(e)) from None
  except OSError as e: raise IpcError(f"cannot create runtime directory {path}: {e}") from None

def _adopted(root: str) -> tuple[int, str] | None:
  """(its owner, its real path) where we are root and `root`, named by MSGQ_RUNTIME_DIR, is a folder of another account
  that only root can have made (systemd's /run/modeld for a service's User=): the folder above is root's and writable
  by no one else, and so is every one above that, or sticky (/tmp) to keep root's own entry. One that account made
  itself (in /tmp) is refused as any other account's; so are XDG_RUNTIME_DIR's and the default."""
  if os.geteuid() != 0: return None
  real = os.path.join(os.path.realpath(os.path.dirname(root)), os.path.basename(root))
  try: st = os.lstat(real)
  except OSError: return None
  if st.st_uid == 0 or not stat.S_ISDIR(st.st_mode): return None
  up = parent = os.path.dirname(real)
  while True:
    s = os.lstat(up)
    if s.st_uid != 0 or s.st_mode & 0o022 and (up == parent or not s.st_mode & stat.S_ISVTX): return None
    if up == (up := os.path.dirname(up)): return st.st_uid, real

def _owner(path: str) -> int | None:
  try: return os.stat(path).st_uid
  except OSError: return None

def _ipc_path(endpoint: str) -> str:
  path = os.path.join(runtime_dir(), endpoint)
  if len(path) > 100: raise IpcError(f"ipc path too long for a unix socket ({len(path)} > 100): {path}")
  return path

def _locked(path: str) -> int:
  """An exclusive flock on `path` (created if missing), waiting for it; the fd holds it. Retries when the file was
  unlinked by its last holder meanwhile (the lock of an unlinked file excludes nobody)."""
  while True:
    try: fd = open_private(path, os.O_RDWR | os.O_CREAT, "lock")
    except NotOwnedError as e: raise IpcError(str(e)) from None
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
      if os.stat(path).st_ino == os.fstat(fd).st_ino: return fd
    except FileNotFoundError: pass
    os.close(fd)

def queue_len(msg_size: int, cap: int = QUEUE_CAP) -> int:
  """High-water mark (messages) of a queue of messages up to msg_size bytes (an endpoint's largest). libzmq counts
  messages, not bytes: QUEUE_MESSAGES, so a burst of small messages fits (a Python sender outruns its own I/O thread
  by thousands of them), or as many of the largest as `cap` holds where that is fewer (an endpoint of large
  messages: a stopped reader must not pin its publisher's memory without end); and at least twice what holds
  QUEUE_BYTES of the largest, since libzmq learns what the other end took only every half mark. Its memory: at most
  the mark times the queued messages' own size plus MSG_OVERHEAD."""
  return max(min(QUEUE_MESSAGES, cap // (msg_size + MSG_OVERHEAD)), 2 * math.ceil(QUEUE_BYTES / (msg_size + MSG_OVERHEAD)))

class _PubState:
  """What a publisher shares with its pump thread: the thread holds this, never the PubSocket. `owner` maps the
  endpoint's owner file (_OWNER): this publisher is the endpoint's while its uid is there, and counts what it sent
  there, so a local subscriber knows what is on its way to it."""
  def __init__(self, sock: zmq.Socket, path: str, owner: mmap.mmap, uid: bytes, tcp):
    self.sock, self.path, self.owner, self.uid, self.sent, self.tcp = sock, path, owner, uid, 0, tcp
    self.readers, self.mutex, self.closed, self.superseded = 0, threading.Lock(), False, False
    self.pids: set[int] = set()   # local subscribers' processes (the kernel's word, via libzmq); gone ones kept till pruned

  def is_owner(self) -> bool: return self.owner[:8] == self.uid

  def let_go(self) -> None:
    """A newer publisher took the endpoint: close our socket (its subscribers reconnect to the newer one), leave the
    socket file, which is the newer one's; and our TCP port. Caller holds the mutex."""
    self.closed = self.superseded = True
    self.sock.close(0)
    if self.tcp is not None: self.tcp.close()

  def process(self) -> None:
    # caller holds the mutex; reading EVENTS makes ZMQ attach new subscribers and queue their (un)subscriptions
    while self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
      frame = self.sock.recv(zmq.NOBLOCK, copy=False)
      kind, topic = frame.bytes[:1], frame.bytes[1:]
      if topic.startswith(LIVE_TOPIC):   # never applied, not a reader; its subscriber drops it once it has heard
        if kind == b"\x01": _tell_live(topic[len(LIVE_TOPIC):], self.owner[:_OWNER.size])
      elif kind == b"\x01":
        self.sock.setsockopt(zmq.SUBSCRIBE, topic)
        self.readers += 1
        if (pid := _peer_pid(frame)) is not None:
          self.pids.add(pid)
          if len(self.pids) > MAX_PIDS: self.pids = _alive(self.pids)
      elif kind == b"\x00":   # a subscriber left (our subscribers never unsubscribe while connected): libzmq says not who
        self.sock.setsockopt(zmq.UNSUBSCRIBE, topic)
        self.readers = max(0, self.readers - 1)

def _peer_pid(frame: zmq.Frame) -> int | None:
  """The process that sent a local subscription: libzmq gives an ipc peer's credentials (SO_PEERCRED) as its
  Peer-Address, "...:uid:gid:pid". None where it cannot tell."""
  try: return int(frame.get("Peer-Address").rsplit(":", 1)[1])
  except (zmq.ZMQError, ValueError, IndexError, TypeError): return None

def _alive(pids: set[int]) -> set[int]: return {p for p in pids if os.path.exists(f"/proc/{p}")}

def _tell_live(token: bytes, owner: bytes) -> None:
  """One datagram to the subscriber waiting on `token`: every subscription it made before the token is applied, and
  every message after the count in `owner` (the owner file's bytes now) is sent to it. Never blocks the publisher: a
  subscriber that stopped waiting (timed out, gone) simply misses it."""
  with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
    s.setblocking(False)
    try: s.sendto(b"\x01" + owner, LIVE_ADDR + token)
    except OSError: pass   # nobody waits there any more (or a foreign token names no socket we could reach)

def _pump(st: _PubState, fd: int, wake: int) -> None:
  """Applies subscriptions while the application is not sending, and lets go of the endpoint once a newer publisher
  took it. The PUMP_S timeout: a send() on the application's thread can consume the ZMQ fd's edge while leaving a
  subscription queued, and a newer publisher says nothing."""
  while True:
    try: ready = select.select([fd, wake], [], [], PUMP_S)[0]
    except (OSError, ValueError): return
    if wake in ready: return
    with st.mutex:
      if st.closed: return
      if not st.is_owner():
        st.let_go()
        return
      try: st.process()
      except zmq.ZMQError: return

class PubSocket:
  transport = "zmq"

  def __init__(self, endpoint: str, segment_size: int):
    """Take the endpoint, newest first: bind its ipc path (libzmq replaces the socket file of an older or dead
    publisher) and write our uid into its owner file, under the endpoint's lock. The owner file's shared flock, held
    for life, tells subscribers a publisher is up. With MSGQ_TCP, a TcpPublisher (msgq/tcp.py) serves TCP peers."""
    from msgq.tcp import tcp_publisher   # which imports this module
    self.endpoint, self.path, self.max_size = endpoint, (path := _ipc_path(endpoint)), max_message(segment_size)
    uid, lock = os.urandom(8), _locked(path + ".lock")
    owner_fd, s, tcp = None, None, None
    try:
      owner_fd = open_private(path + ".pub", os.O_RDWR | os.O_CREAT, "owner file")
      fcntl.flock(owner_fd, fcntl.LOCK_SH)
      if os.fstat(owner_fd).st_size < _OWNER.size: os.ftruncate(owner_fd, _OWNER.size)
      owner = mmap.mmap(owner_fd, _OWNER.size)
      s = zmq.Context.instance().socket(zmq.XPUB)
      s.setsockopt(zmq.LINGER, 0)
      # set once, before the bind: libzmq 4.3.5 can crash re-sizing the queues of live connections (docs/MSGQ.md)
      s.setsockopt(zmq.SNDHWM, queue_len(self.max_size))
      s.setsockopt(zmq.XPUB_NODROP, 0)
      # manual subscriptions: every subscribe reaches us (a reader count, token topics) and takes effect when we apply
      # it. Not XPUB_MANUAL_LAST_VALUE: that sends the next message after a subscription to its subscriber alone
      s.setsockopt(zmq.XPUB_MANUAL, 1)
      s.bind("ipc://" + path)
      own_socket_file(path)
      tcp = tcp_publisher(endpoint, segment_size)
      _OWNER.pack_into(owner, 0, uid, 0)
    except (zmq.ZMQError, OSError, IpcError) as e:
      if s is not None: s.close(0)
      if tcp is not None: tcp.close()
      if owner_fd is not None: os.close(owner_fd)
      raise e if isinstance(e, IpcError) else IpcError(f"cannot publish {endpoint!r}: {e}") from None
    finally: os.close(lock)
    self._owner_fd, self._wake, self._st = owner_fd, os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK), _PubState(s, path, owner, uid, tcp)
    self._pump = threading.Thread(target=_pump, args=(self._st, s.getsockopt(zmq.FD), self._wake), name=f"msgq-pub-{endpoint}", daemon=True)
    self._pump.start()

  @property
  def readers(self) -> int: return self._st.readers + (self._st.tcp.readers if self._st.tcp is not None else 0)

  def send(self, data: bytes | bytearray | memoryview) -> int:
    """Queue data for every subscriber; never blocks (a subscriber whose queue is full misses it).
    bytes are sent without a copy when large; mutable buffers are copied, so the caller may reuse them."""
    n = data.nbytes if isinstance(data, memoryview) else len(data)
    if n == 0: raise ValueError(f"{self.endpoint}: an empty message (openpilot's readers abort on one)")
    if n > self.max_size: raise ValueError(f"{self.endpoint}: a message of {n} bytes is larger than its segment takes ({self.max_size})")
    st = self._st
    with st.mutex:
      if not st.closed and not st.is_owner(): st.let_go()
      if st.superseded: raise MultiplePublishersError(f"{self.endpoint}: a newer publisher took the endpoint ({self.path})")
      if st.closed: raise IpcError(f"send on closed publisher {self.endpoint!r}")
      st.sock.send(data, copy=not (isinstance(data, bytes) and n >= ZERO_COPY_MIN))
      st.sent += 1
      _OWNER.pack_into(st.owner, 0, st.uid, st.sent)
    if st.tcp is not None: st.tcp.send(data)
    return n

  def taken_over(self) -> bool: return self._st.superseded or (not self._st.closed and not self._st.is_owner())

  def reader_pids(self) -> set[int]:
    """The local processes subscribed (a process that left without a word is dropped once it is gone)."""
    with self._st.mutex:
      if self._st.closed: return set()
      self._st.process()
      return _alive(self._st.pids)

  def all_readers_updated(self) -> bool:
    """True when at least one reader is subscribed. ZMQ delivers every message to every subscribed reader in
    order but cannot report what a reader consumed, so this cannot mean more than openpilot's 'has readers'."""
    with self._st.mutex:
      if self._st.closed: return False
      self._st.process()
    return self.readers > 0

  def close(self) -> None:
    """Stop the pump, close the socket; if still the endpoint's owner, remove its files. Idempotent; also runs when
    the last reference goes."""
    if (st := getattr(self, "_st", None)) is None or self._wake is None: return
    # at interpreter exit the pump (a daemon thread) may be frozen holding the mutex: the process's end frees all
    if not st.mutex.acquire(timeout=0 if sys.is_finalizing() else -1): return
    try:
      if not st.closed: st.closed = True; st.sock.close(0)
    finally: st.mutex.release()
    if st.tcp is not None: st.tcp.close()
    os.eventfd_write(self._wake, 1)
    if not sys.is_finalizing(): self._pump.join()   # at interpreter exit a daemon thread can no longer run to its end
    try: lock = _locked(self.path + ".lock")
    except (OSError, IpcError): lock = None   # its runtime directory was removed under us: nothing left to remove
    if lock is not None:
      try:
        if st.is_owner():
          for f in (self.path, self.path + ".pub", self.path + ".lock"):   # the .lock last: we hold it (see _locked)
            try: os.unlink(f)
            except FileNotFoundError: pass
      finally: os.close(lock)
    st.owner.close()
    os.close(self._owner_fd)
    os.close(self._wake)
    self._wake = None

  def __del__(self): self.close()

class SubSocket:
  transport = "zmq"

  def __init__(self, endpoint: str, address: str | None, conflate: bool, segment_size: int, wait: float = 2.0, port: int | None = None):
    """Subscribe. If a local publisher is up, return only once the subscription is live (at most `wait` s);
    `confirmed` says whether the publisher confirmed that in time. A remote one, or one given a port (a device's bridge
    on 127.0.0.1, say), reads tcp://address:port (default: tcp_port(endpoint))."""
    self.endpoint, self.conflate, self.max_size, self.refused = endpoint, conflate, max_message(segment_size), 0
    self.timeout, self._pending, self._rcvtimeo, self.confirmed = None, None, -1, False
    self._owner, self._base, self._got = None, None, 0   # what the publisher had sent when it confirmed us; taken since
    local = port is None and address in (None, "", "127.0.0.1")   # a port given: TCP, whatever the address
    # A larger message than max_size: from a remote peer, libzmq refuses it as it reads its size (MAXMSGSIZE), before
    # taking its bytes, and ends the connection for good (_relink connects again); from a local publisher (of our
    # user, with another services table) it is refused here, after arrival, up to 4x (beyond, the connection ends)
    s = zmq.Context.instance().socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    self.hwm = queue_len(self.max_size) if local else queue_len(self.max_size, REMOTE_QUEUE_CAP)   # messages its queue holds
    s.setsockopt(zmq.RCVHWM, self.hwm)
    s.setsockopt(zmq.MAXMSGSIZE, 4 * self.max_size if local else self.max_size)
    s.setsockopt(zmq.RECONNECT_IVL, 20)
    s.setsockopt(zmq.RECONNECT_IVL_MAX, int(RECONNECT_IVL_MAX_S * 1000))
    # conflate: receive() drains the queue for its newest message. Not libzmq's ZMQ_CONFLATE, whose one-message pipe
    # has been seen to leave a frame unread by a blocking receive until the next one came (a lockstep camera then
    # waits forever for the answer to it)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    path = _ipc_path(endpoint) if local else None
    self.url = ("ipc://" + path) if local else f"tcp://{address}:{port or tcp_port(endpoint)}"
    # a remote one's connection events: libzmq retries a lost connection (a disconnect, then a retry) but not one it
    # ended (a disconnect alone)
    self._link = None if local else s.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
    s.connect(self.url)
    self.sock = s
    # the publisher's answer counts from our uid, or the uid its socket file belongs to (root reading a service's stack)
    if local and wait > 0 and _publisher_alive(path) and (told := _wait_live(s, wait, {os.getuid(), _owner(path)} - {None})):
      self.confirmed = True
      try:
        fd = os.open(path + ".pub", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try: self._owner = mmap.mmap(fd, _OWNER.size, prot=mmap.PROT_READ)
        finally: os.close(fd)
        self._base = _OWNER.unpack(told[1:1 + _OWNER.size])
      except (OSError, ValueError, struct.error): pass   # gone meanwhile, or an older publisher: no count to follow

  def _recv(self, timeout: int = 0) -> bytes | None:
    """The next message, skipping refused ones; waits up to timeout ms (0: not at all, -1: forever).
    A blocking recv with a timeout, not poll + recv: one wake-up per message."""
    if self.sock is None: raise IpcError(f"receive on closed subscriber {self.endpoint!r}")
    deadline = None if timeout < 0 else time.monotonic() + timeout / 1000
    while True:
      # a remote subscriber waits in slices, looking for a connection to connect again in between
      if self._link is not None and not 0 <= timeout <= LINK_CHECK_MS: timeout = LINK_CHECK_MS
      if timeout != self._rcvtimeo: self.sock.setsockopt(zmq.RCVTIMEO, timeout); self._rcvtimeo = timeout
      try: msg = self.sock.recv(copy=True)
      except zmq.Again:   # libzmq's clock is coarse: it may give up before the deadline
        if self._link is not None: self._relink()
        if deadline is None: timeout = -1
        elif (left := deadline - time.monotonic()) <= 0: return None
        else: timeout = max(1, math.ceil(left * 1000))
        continue
      self._got += 1
      if len(msg) > self.max_size:
        self.refused += 1
        logger.warning("%s: refused a message of %d bytes (larger than its segment takes: %d; %d refused so far)",
                       self.endpoint, len(msg), self.max_size, self.refused)
      else: return msg
      if deadline is not None: timeout = max(0, int((deadline - time.monotonic()) * 1000))

  def _relink(self) -> None:
    """Connect again where libzmq ended a remote publisher's connection for good (a message over MAXMSGSIZE is a
    protocol error): its last event a disconnect, with no retry after it within RELINK_WAIT_MS."""
    last = None
    while self._link.poll(0) or (last == zmq.EVENT_DISCONNECTED and self._link.poll(RELINK_WAIT_MS)):
      last = recv_monitor_message(self._link)["event"]
    if last != zmq.EVENT_DISCONNECTED: return
    self.refused += 1
    logger.warning("%s: %s sent a message over %d bytes, or broke the protocol: connecting again (%d refused so far)",
                   self.endpoint, self.url, self.max_size, self.refused)
    self.sock.disconnect(self.url)
    self.sock.connect(self.url)

  def in_flight(self) -> int:
    """Messages the publisher has sent us that have not arrived yet (0 when it cannot tell: a remote or unconfirmed
    subscriber, or another publisher since)."""
    if self._base is None: return 0
    uid, sent = _OWNER.unpack(self._owner)
    if uid != self._base[0]: self._base = None; return 0
    return sent - self._base[1] - self._got

  def _next(self, timeout: int) -> bytes | None:
    """_recv(timeout); with timeout 0, waits for a message its publisher has sent already (ZMQ delivers on I/O
    threads): as on the shm transport, what was sent before a receive is there for it. A message that never comes
    (dropped at the high-water mark, or lost with its dead publisher) is given up after IN_FLIGHT_WAIT_MS."""
    if (msg := self._recv(timeout)) is None and timeout == 0 and self.in_flight() > 0:
      if (msg := self._recv(IN_FLIGHT_WAIT_MS)) is None and (lost := self.in_flight()) > 0: self._base = (self._base[0], self._base[1] + lost)
    return msg

  def receive(self, non_blocking: bool = False) -> bytes | None:
    msg, self._pending = self._pending, None   # read ahead by a Poller
    if msg is None: msg = self._next(0 if non_blocking else -1 if self.timeout is None else self.timeout)
    while self.conflate and msg is not None and (newer := self._next(0)) is not None: msg = newer
    return msg

  def close(self) -> None:
    if getattr(self, "_link", None) is not None: self._link.close(0); self._link = None
    if getattr(self, "sock", None) is not None: self.sock.close(0); self.sock = None
    if getattr(self, "_owner", None) is not None: self._owner.close(); self._owner = None

  def __del__(self): self.close()

def _wait_live(sock: zmq.Socket, wait: float, uids: set[int]) -> bytes | None:
  """Subscribe `sock` (connected, subscribed to everything) to a fresh token and wait up to `wait` s for its publisher to
  say that the subscription is live. Its datagram if it did. Abstract socket names are open to every user (and listed in
  /proc/net/unix): only a datagram the kernel says one of `uids` sent counts (ours, the publisher's socket file's)."""
  token, deadline = os.urandom(16).hex().encode(), time.monotonic() + wait
  with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as told:
    told.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)   # every datagram arrives with its sender's credentials
    told.bind(LIVE_ADDR + token)   # before the token goes out: the answer cannot come too early
    sock.setsockopt(zmq.SUBSCRIBE, LIVE_TOPIC + token)
    try:
      while select.select([told], [], [], max(0., deadline - time.monotonic()))[0]:
        if (got := _datagram(told))[0] in uids: return got[1]
      return None
    finally: sock.setsockopt(zmq.UNSUBSCRIBE, LIVE_TOPIC + token)   # done: a restarted publisher need not hear it again

def _datagram(s: socket.socket) -> tuple[int | None, bytes]:
  """The next datagram on `s` (SO_PASSCRED set) and the uid that sent it."""
  data, ancillary, _, _ = s.recvmsg(64, socket.CMSG_SPACE(_UCRED.size))
  return next((_UCRED.unpack(d)[1] for level, kind, d in ancillary if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS), None), data

def _publisher_alive(path: str) -> bool:
  """A publisher holds the endpoint's owner file (a shared flock for its life)."""
  try: fd = os.open(path + ".pub", os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
  except OSError: return False
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return False
  except OSError as e: return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
  finally: os.close(fd)

class Poller:
  """Polls the registered sockets; returns what was registered with each (the facade sockets)."""
  transport = "zmq"

  def __init__(self): self.poller, self.socks, self.owners = zmq.Poller(), [], []

  def register(self, s: SubSocket, owner) -> None:
    self.socks.append(s); self.owners.append(owner)
    self.poller.register(s.sock, zmq.POLLIN)
    if s._link is not None: self.poller.register(s._link, zmq.POLLIN)   # a remote one's connection events (_relink)

  def poll(self, timeout: int) -> list:
    """The owners of the sockets with a message ready, waiting up to timeout ms (-1 forever) for the first one. A ready
    socket's message is read ahead (so a refused one never counts as ready); receive() returns it."""
    deadline = None if timeout < 0 else time.monotonic() + timeout / 1000
    by_sock = {s.sock: s for s in self.socks} | {s._link: s for s in self.socks if s._link is not None}
    for s in self.socks:   # what the publishers sent before this poll is ready for it, as on the shm transport
      if s._pending is None and s.in_flight() > 0: s._pending = s._next(0)
    while True:
      ready = any(s._pending is not None for s in self.socks)
      left = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
      for zs, ev in self.poller.poll(0 if ready else left):
        if zs is (s := by_sock[zs])._link: s._relink()
        elif ev & zmq.POLLIN and s._pending is None: s._pending = s._recv()
      if (out := [o for o, s in zip(self.owners, self.socks) if s._pending is not None]) or (deadline is not None and time.monotonic() >= deadline):
        return out
