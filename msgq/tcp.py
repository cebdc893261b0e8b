"""A publisher's TCP side (MSGQ_TCP), on both transports: ZMTP 3.0's PUB end spoken here over a ZMQ STREAM socket, so
a peer's requests are judged before anything is stored. Only the empty subscription (openpilot's subscribers', all
messages) is served, at most PEERS connections, each with a bounded queue, all gone with the peer. A plain ZMQ SUB
(openpilot's bridge, a script) reads openpilot's bytes. docs/MSGQ.md: serving TCP.
"""
import logging, os, select, sys, threading, time
import zmq
from msgq.pubsub import IpcError, max_message, tcp_port
from service import RateLimit
from msgq.zmq import PUMP_S, REMOTE_QUEUE_CAP, queue_len

PEERS = 16            # connections per endpoint: one more is closed as it arrives (a ZMQ SUB retries by its reconnect interval)
SUBSCRIBE_S = 5.0     # a peer has this long after it connected (or unsubscribed) to subscribe, or is closed
FRAME_MAX = 255       # the longest frame a subscriber sends (its READY, a subscription): a longer one closes the connection
PEER_QUEUE = 64       # a peer's bytes not yet judged, in libzmq's reads of up to 8 KiB
FRAMES, FRAMES_PER_S = 32, 4   # frames a peer may send at once (READY, subscribing, a heartbeat's PINGs), then per second:
                               # a peer sending more (valid ones too: each is judged here, holding the GIL) is closed
KEEPALIVE_S = 10      # TCP keepalive: a peer gone without a word is closed after about 25 s (10 s idle, 3 probes 5 s apart)
GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)   # ZMTP 3.0, NULL, as client

log = logging.getLogger("msgq.tcp")
log.addFilter(RateLimit())   # what peers make us say stays bounded, with or without setup_logging

def _header(n: int, flags: int = 0) -> bytes:
  """A ZMTP frame's header: flags (4: a command), the body's length in one byte, or in eight (flag 2)."""
  return bytes((flags, n)) if n < 256 else bytes((flags | 2,)) + n.to_bytes(8, "big")

_READY = b"\x05READY\x0bSocket-Type" + (3).to_bytes(4, "big") + b"PUB"
READY = _header(len(_READY), 4) + _READY   # NULL's handshake: our socket type

def tcp_address() -> str | None:
  """Where publishers serve remote subscribers: MSGQ_TCP '1' is loopback, an address binds that; unset or '0': nowhere."""
  tcp = os.environ.get("MSGQ_TCP", "")
  return None if tcp in ("", "0") else "127.0.0.1" if tcp == "1" else tcp

def tcp_publisher(endpoint: str, segment_size: int) -> "TcpPublisher | None":
  """The endpoint's TCP side on its port (openpilot's scheme) when MSGQ_TCP asks for one."""
  if (addr := tcp_address()) is None: return None
  return TcpPublisher(endpoint, addr, tcp_port(endpoint), max_message(segment_size))

def _socket_type(props: bytes) -> bytes | None:
  """The Socket-Type of a READY command's properties (name: 1-byte length; value: 4-byte length)."""
  i = 0
  while i < len(props):
    n = props[i]
    v = int.from_bytes(props[i + 1 + n:i + 5 + n], "big")
    if props[i + 1:i + 1 + n].lower() == b"socket-type": return props[i + 5 + n:i + 5 + n + v]
    i += 5 + n + v
  return None

def _address(frame: zmq.Frame) -> str:
  try: return frame.get("Peer-Address")
  except zmq.ZMQError: return "?"

class _Peer:
  """A connection: its bytes not yet parsed, how far its handshake got, and when it must have subscribed."""
  __slots__ = ("buf", "greeted", "ready", "subscribed", "deadline", "addr", "since", "frames")
  def __init__(self, now: float):
    self.buf, self.greeted, self.ready, self.subscribed, self.deadline, self.addr = bytearray(), False, False, False, now + SUBSCRIBE_S, "?"
    self.since, self.frames = now, 0

  def take(self, data: memoryview) -> str | None:
    """Parse what the peer sent; why it must be closed, or None. Only whole frames up to FRAME_MAX are kept."""
    buf = self.buf
    buf += data
    if not self.greeted:
      if len(buf) >= 10 and (buf[0] != 0xff or not buf[9] & 1): return "not a ZMTP 3 peer"
      if len(buf) < 64: return None
      if buf[10] < 3 or bytes(buf[12:32]).rstrip(b"\0") != b"NULL":
        return f"ZMTP {buf[10]}.{buf[11]} with {bytes(buf[12:32]).rstrip(bytes(1))!r}: expected 3.x with NULL"
      self.greeted = True
      del buf[:64]
    pos = 0
    while len(buf) - pos >= 2:
      flags = buf[pos]
      if flags & ~0x07: return f"a malformed frame (flags {flags:#x})"
      head, size = (9, int.from_bytes(buf[pos + 1:pos + 9], "big")) if flags & 2 else (2, buf[pos + 1])
      if size > FRAME_MAX: return f"a frame of {size} bytes (a subscriber's are at most {FRAME_MAX})"
      if len(buf) - pos < head + size: break
      if (n := self.frames) >= FRAMES + FRAMES_PER_S * (time.monotonic() - self.since):
        return f"{n + 1} frames in {time.monotonic() - self.since:.1f} s (a subscriber sends a few)"
      self.frames = n + 1
      why = self.frame(flags, bytes(buf[pos + head:pos + head + size]))
      pos += head + size
      if why is not None: return why
    del buf[:pos]
    return None

  def frame(self, flags: int, body: bytes) -> str | None:
    if flags & 1: return "a message of several parts (a subscriber sends none)"
    if flags & 4:   # a command: READY once; SUBSCRIBE and CANCEL (ZMTP 3.1's); PING and the like are ignored
      name, rest = body[1:1 + body[0]] if body else b"", body[1 + body[0]:] if body else b""
      if name == b"READY":
        if self.ready: return "a second READY"
        if (kind := _socket_type(rest)) not in (b"SUB", b"XSUB"): return f"a peer of type {kind!r} (only SUB and XSUB subscribe)"
        self.ready = True
      elif name in (b"SUBSCRIBE", b"CANCEL"): return self.subscribe(name == b"SUBSCRIBE", rest)
      elif name == b"ERROR": return "an ERROR command"
      return None
    if not self.ready: return "a message before its READY"
    if body[:1] not in (b"\x00", b"\x01"): return "a message that is no subscription"
    return self.subscribe(body[0] == 1, body[1:])

  def subscribe(self, on: bool, topic: bytes) -> str | None:
    if topic: return f"a subscription to a topic of {len(topic)} bytes (only the empty one, everything, is served)"
    self.subscribed, self.deadline = on, None if on else time.monotonic() + SUBSCRIBE_S
    return None

class TcpPublisher:
  """Serves tcp://addr:port: every message sent goes to each subscribed peer, as one ZMTP frame (one copy, shared by
  their queues), while its queue has room (queue_len, at most about REMOTE_QUEUE_CAP of the largest message). A thread
  answers connections and judges what peers send: a peer over PEERS, one that does not subscribe within SUBSCRIBE_S,
  or sends anything but a subscription to everything (or its cancel) is closed, with a rate-limited warning naming it."""
  def __init__(self, name: str, addr: str, port: int, max_size: int):
    self.name, self.url, self.max_size = name, f"tcp://{addr}:{port}", max_size
    self.peers: dict[bytes, _Peer] = {}
    self.subscribed: list[bytes] = []   # the peers sent to; replaced (never changed in place) under the lock
    s = zmq.Context.instance().socket(zmq.STREAM)
    for opt, v in ((zmq.LINGER, 0), (zmq.SNDHWM, queue_len(max_size, REMOTE_QUEUE_CAP)), (zmq.RCVHWM, PEER_QUEUE), (zmq.TCP_KEEPALIVE, 1),
                   (zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_S), (zmq.TCP_KEEPALIVE_INTVL, 5), (zmq.TCP_KEEPALIVE_CNT, 3)):
      s.setsockopt(opt, v)
    try: s.bind(self.url)
    except zmq.ZMQError as e:
      s.close(0)
      raise IpcError(f"cannot publish {name!r} on {self.url}: {e}") from None
    self.sock, self.lock, self._wake = s, threading.Lock(), os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    self._thread = threading.Thread(target=self._serve, args=(s.getsockopt(zmq.FD),), name=f"msgq-tcp-{name}", daemon=True)
    self._thread.start()

  @property
  def readers(self) -> int: return len(self.subscribed)

  def send(self, data: bytes | bytearray | memoryview) -> None:
    """To every subscribed peer whose queue has room; never blocks."""
    if not self.subscribed: return
    n = data.nbytes if isinstance(data, memoryview) else len(data)
    frame = zmq.Frame(b"".join((_header(n), data)))   # a whole frame or none: a peer's stream stays in step
    with self.lock:
      if self.sock is None: return
      gone = []
      for rid in self.subscribed:
        try:
          self.sock.send(rid, zmq.SNDMORE | zmq.NOBLOCK)
          self.sock.send(frame, zmq.NOBLOCK, copy=False)   # libzmq's copy of a message shares its bytes
        except zmq.Again: pass   # its queue is full: it misses this one
        except zmq.ZMQError: gone.append(rid)   # closed meanwhile
      for rid in gone: self._forget(rid)

  def _serve(self, fd: int) -> None:
    """Answers peers until closed. The PUMP_S timeout: a send() can consume the ZMQ fd's edge, and deadlines pass."""
    while True:
      try: ready = select.select([fd, self._wake], [], [], PUMP_S)[0]
      except (OSError, ValueError): return
      if self._wake in ready: return
      with self.lock:
        if self.sock is None: return
        try: self._process()
        except zmq.ZMQError: return

  def _process(self) -> None:
    """What peers sent (STREAM: [id, b''] is a connection or its end, [id, bytes] its data); then the deadlines. Caller
    holds the lock."""
    while self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
      rid, data = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
      rid, peer = rid.bytes, self.peers.get(rid.bytes)
      if peer is None and not len(data): self._connected(rid)
      elif peer is None: continue   # what a peer closed here had still sent
      elif not len(data): self._forget(rid)
      else:
        if peer.addr == "?": peer.addr = _address(data)
        if (why := peer.take(data.buffer)) is not None: self._close(rid, why)
    now = time.monotonic()
    for rid in [rid for rid, p in self.peers.items() if p.deadline is not None and now > p.deadline]:
      self._close(rid, f"no subscription within {SUBSCRIBE_S:g} s")
    self.subscribed = [rid for rid, p in self.peers.items() if p.subscribed]

  def _connected(self, rid: bytes) -> None:
    if len(self.peers) >= PEERS:
      log.warning("%s: closed a connection to %s over its %d", self.name, self.url, PEERS)
      return self._drop(rid)
    try: self.sock.send_multipart([rid, GREETING + READY], zmq.NOBLOCK)
    except zmq.ZMQError: return   # gone already
    self.peers[rid] = _Peer(time.monotonic())

  def _close(self, rid: bytes, why: str) -> None:
    log.warning("%s: closed a connection from %s to %s: %s", self.name, self.peers[rid].addr, self.url, why)
    self._forget(rid)
    self._drop(rid)

  def _drop(self, rid: bytes) -> None:
    """Close the connection (a STREAM socket's empty message): libzmq frees its queues."""
    try: self.sock.send_multipart([rid, b""], zmq.NOBLOCK)
    except zmq.ZMQError: pass

  def _forget(self, rid: bytes) -> None:
    if self.peers.pop(rid, None) is not None: self.subscribed = [r for r in self.subscribed if r != rid]

  def close(self) -> None:
    """Close every connection and the port. Idempotent."""
    with self.lock:
      if self.sock is None: return
      self.sock.close(0)
      self.sock = None
    os.eventfd_write(self._wake, 1)
    if threading.current_thread() is not self._thread and not sys.is_finalizing(): self._thread.join()
    os.close(self._wake)
