"""VisionIpcServer: owns the camera rings (one memfd per stream), hands them to clients, publishes frames."""
import atexit, errno, fcntl, json, logging, os, socket, struct, threading
import numpy as np
from msgq.pubsub import IpcError, pub_sock
from msgq.visionipc.buffers import Ring, VisionBuf
from msgq.visionipc.layout import NV12Layout
from msgq.visionipc.wire import (FRAME, MAGIC, MAX_PACKET, OP_BUFFERS, OP_STREAMS, REQUEST, TRAILER_SPAN, VERSION, align, check_name,
                                 check_stream, endpoint, socket_path)

MAX_BUFFERS = 1024
log = logging.getLogger("msgq.visionipc")

class _Stream:
  def __init__(self, fd: int, ring: Ring, pub):
    self.fd, self.ring, self.pub, self.next, self.seq = fd, ring, pub, 0, 0

class VisionIpcServer:
  """One per camera process and name. Buffers are memfds: nothing in /dev/shm, and the memory goes with its last user.
  close() (or `with`, or interpreter exit) removes the socket file; a crashed server's stale one is replaced."""
  def __init__(self, name: str):
    self.name, self.path = check_name(name), socket_path(name)
    self.server_id = int.from_bytes(os.urandom(8), "little") | 1   # never 0
    self._lock_fd = _lock(self.path + ".lock", f"VisionIPC server {name!r} is already running")
    self._streams: dict[int, _Stream] = {}
    self._sock, self._thread, self._closed = None, None, False
    atexit.register(self.close)

  def create_buffers(self, stream: int, count: int, width: int, height: int) -> None:
    """`count` packed NV12 buffers (stride = width, UV right after Y)."""
    l = NV12Layout.packed(width, height)
    self.create_buffers_with_sizes(stream, count, width, height, l.size, l.stride, l.uv_offset)

  def create_buffers_with_sizes(self, stream: int, count: int, width: int, height: int, size: int, stride: int, uv_offset: int) -> None:
    """`count` NV12 buffers of a padded layout, as cameras produce (stride > width, UV plane at an offset)."""
    stream, layout = check_stream(stream), NV12Layout(width, height, stride, uv_offset, size)
    if stream in self._streams: raise IpcError(f"VisionIPC server {self.name!r}: stream {stream} already has buffers")
    if not 1 <= count <= MAX_BUFFERS: raise IpcError(f"VisionIPC buffer count must be in 1..{MAX_BUFFERS}, got {count}")
    slot = align(size) + TRAILER_SPAN
    fd = os.memfd_create(f"visionipc_{self.name}_{stream}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
      os.ftruncate(fd, slot * count)
      fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)   # no client can SIGBUS us
      ring = Ring(fd, layout, [i * slot for i in range(count)], align(size), writable=True)
      self._streams[stream] = _Stream(fd, ring, pub_sock(endpoint(self.name, stream), max_size=MAX_PACKET))
    except BaseException:
      os.close(fd)
      raise

  def start_listener(self) -> None:
    """Serve handshakes from a thread of this process; send() never waits for it."""
    if self._sock is not None: return
    try: os.unlink(self.path)   # we hold the name's lock, so a socket file here is a crashed server's
    except FileNotFoundError: pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    s.bind(self.path)
    s.listen(64)
    s.settimeout(0.1)
    self._sock = s
    self._thread = threading.Thread(target=self._listen, name=f"visionipc-{self.name}", daemon=True)
    self._thread.start()

  def _listen(self) -> None:
    while not self._closed:
      try: conn, _ = self._sock.accept()
      except TimeoutError: continue
      except OSError: return
      with conn:
        conn.settimeout(1.0)   # a client that connects and says nothing delays the next handshake by this much, at most
        try: self._serve(conn)
        except OSError: pass   # the client went away mid-handshake
        except Exception as e: log.warning("VisionIPC server %r: handshake failed: %r", self.name, e)   # keep listening

  def _serve(self, conn: socket.socket) -> None:
    req = conn.recv(64)
    try: magic, version, op, stream = REQUEST.unpack(req)
    except struct.error: magic = None
    if magic != MAGIC or version != VERSION:
      conn.send(json.dumps({"error": f"expected a VisionIPC v{VERSION} request, got {req[:16]!r}"}).encode())
    elif op == OP_STREAMS:
      conn.send(json.dumps({"server_id": self.server_id, "streams": sorted(self._streams)}).encode())
    elif (s := self._streams.get(stream)) is None or op != OP_BUFFERS:
      conn.send(json.dumps({"error": f"server {self.name!r} does not serve stream {stream} (it serves {sorted(self._streams)})"}).encode())
    else:
      r = s.ring
      socket.send_fds(conn, [json.dumps({"server_id": self.server_id, "stream": stream, "layout": str(r.layout), "count": r.count,
                                         "offsets": r.offsets, "trailer_offset": r.trailer_offset}).encode()], [s.fd])

  def _stream(self, stream: int) -> _Stream:
    if (s := self._streams.get(stream)) is None:
      raise IpcError(f"VisionIPC server {self.name!r} has no buffers for stream {stream}; call create_buffers first")
    return s

  def get_free_buffer(self, stream: int) -> VisionBuf:
    """The next buffer of the ring, to fill in place (`buf.array` is writable) and then publish(). Clients still
    holding it see `overwritten()` from now on."""
    s = self._stream(stream)
    idx, s.next = s.next, (s.next + 1) % s.ring.count
    s.ring.take(idx)
    return VisionBuf(s.ring, idx, stream)

  def publish(self, stream: int, buf: VisionBuf, frame_id: int, timestamp_sof: int = 0, timestamp_eof: int = 0, valid: bool = True) -> None:
    """Make a filled buffer from get_free_buffer() the stream's newest frame. Zero-copy: only its index travels."""
    s = self._stream(stream)
    if buf._ring is not s.ring: raise IpcError(f"VisionIPC publish: buffer {buf.idx} of stream {buf.stream} is not a buffer of stream {stream}")
    s.seq += 1
    s.ring.publish(buf.idx, s.seq, frame_id)
    s.pub.send(FRAME.pack(MAGIC, self.server_id, s.seq, frame_id, timestamp_sof, timestamp_eof, buf.idx, valid))

  def send(self, stream: int, data, frame_id: int, timestamp_sof: int = 0, timestamp_eof: int = 0) -> None:
    """Copy one frame (bytes-like or uint8 array of exactly the layout's size) into the next buffer and publish it."""
    l = self._stream(stream).ring.layout
    src = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
    if src.dtype != np.uint8 or src.size != l.size:
      raise IpcError(f"VisionIPC send on stream {stream}: expected {l.size} uint8 bytes (layout {l}), got {src.size} of {src.dtype}")
    buf = self.get_free_buffer(stream)
    np.copyto(buf.array, src.reshape(-1))
    self.publish(stream, buf, frame_id, timestamp_sof, timestamp_eof)

  def has_readers(self, stream: int) -> bool:
    """A client is subscribed to the stream's frame packets (a lockstep source waits for this before its first frame)."""
    return self._streams[stream].pub.all_readers_updated()

  def close(self) -> None:
    if self._closed: return
    self._closed = True
    atexit.unregister(self.close)
    if self._thread is not None: self._thread.join(1)
    if self._sock is not None:
      self._sock.close()
      try: os.unlink(self.path)
      except FileNotFoundError: pass
    for s in self._streams.values():
      s.pub.close()
      os.close(s.fd)
      s.ring.close()   # views the producer still holds keep it mapped until they go
    os.unlink(self.path + ".lock")   # still locked by us: nobody else can own this file now
    os.close(self._lock_fd)

  def __enter__(self): return self
  def __exit__(self, *exc) -> None: self.close()

def _lock(path: str, busy: str) -> int:
  """An exclusive flock on `path`, held as long as the returned fd. Retries if the file was unlinked under us."""
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN): raise IpcError(busy) from None
      raise
    try:
      if os.stat(path).st_ino == os.fstat(fd).st_ino: return fd
    except FileNotFoundError: pass
    os.close(fd)   # its owner unlinked it on close after we opened it: try the new one
