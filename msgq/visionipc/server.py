"""VisionIpcServer: owns the camera buffers (one sealed memfd each), hands them to clients, publishes frames."""
import atexit, errno, fcntl, os, selectors, socket, sys, threading, time, weakref
import numpy as np
from msgq.pubsub import IpcError, pub_sock
from msgq.visionipc.buffers import Buffers, VisionBuf
from msgq.visionipc.layout import NV12Layout
from msgq.visionipc.wire import (BUF, MAX_BUFFERS, PACKET, REQUEST, STREAM_LIST, STREAMS, TRAILER, WRITING, check_name, check_stream,
                                 endpoint, log, socket_path)
from service.owned import check, modes, open_private, own_socket_file

HANDSHAKE_TIMEOUT = 1.0   # s a connected client has to send its request; others are served meanwhile

class _Stream:
  def __init__(self, fds: list[int], bufs: Buffers, pub):
    self.fds, self.bufs, self.pub, self.next = fds, bufs, pub, 0
    self.handshakes = 0   # clients that took the buffers from this server (counted by the listener thread)

_live: "weakref.WeakSet[VisionIpcServer]" = weakref.WeakSet()

@atexit.register
def _close_live() -> None:
  """Interpreter exit closes every server still open (removes its socket and lock files)."""
  for s in list(_live): s.close()

class VisionIpcServer:
  """One per camera process and name. Buffers are memfds: nothing in /dev/shm, and the memory goes with its last user.
  close() (or `with`, or dropping the last reference, or interpreter exit) removes the socket file; a crashed server's
  stale one is replaced, one of another account refused (NotOwnedError), as is a lock file of another's. The listener
  thread holds the streams, never the server, so no cycle keeps a dropped one alive."""
  def __init__(self, name: str):
    self._closed, self._thread, self._sock = True, None, None   # until the name is ours: close() then has nothing to free
    self.name, self.path = check_name(name), socket_path(name)
    self.server_id = int.from_bytes(os.urandom(8), "little") | 1   # never 0
    self._lock_fd = _lock(self.path + ".lock", f"VisionIPC server {name!r} is already running")   # NotOwnedError: another account's
    self._streams: dict[int, _Stream] = {}
    self._closed = False
    _live.add(self)

  def create_buffers(self, stream: int, count: int, width: int, height: int) -> None:
    """`count` packed NV12 buffers (stride = width, UV right after Y)."""
    l = NV12Layout.packed(width, height)
    self.create_buffers_with_sizes(stream, count, width, height, l.size, l.stride, l.uv_offset)

  def create_buffers_with_sizes(self, stream: int, count: int, width: int, height: int, size: int, stride: int, uv_offset: int) -> None:
    """`count` NV12 buffers of a padded layout, as cameras produce (stride > width, UV plane at an offset)."""
    stream, layout = check_stream(stream), NV12Layout(width, height, stride, uv_offset, size)
    if stream in self._streams: raise IpcError(f"VisionIPC server {self.name!r}: stream {stream} already has buffers")
    if not 1 <= count <= MAX_BUFFERS: raise IpcError(f"VisionIPC buffer count must be in 1..{MAX_BUFFERS}, got {count}")
    fds = []
    try:
      for i in range(count):
        fds.append(fd := os.memfd_create(f"visionipc_{self.name}_{stream}_{i}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
        os.ftruncate(fd, size + TRAILER)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)   # no client can SIGBUS us
      bufs = Buffers(fds, layout, writable=True, name=f"VisionIPC server {self.name!r}")
      self._streams[stream] = _Stream(fds, bufs, pub_sock(endpoint(self.name, stream)))
    except BaseException:
      for fd in fds: os.close(fd)
      raise

  def start_listener(self) -> None:
    """Serve handshakes from a thread of this process; send() never waits for it."""
    if self._sock is not None: return
    s = _bind(self.path)
    self._sock_ino = os.stat(self.path).st_ino   # a newer server that took the path over is not ours to clean up
    s.listen(64)
    self._sock, self._wake = s, os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    self._thread = threading.Thread(target=_listen, args=(s, self._wake, self.name, self.server_id, self._streams),
                                    name=f"visionipc-{self.name}", daemon=True)
    self._thread.start()

  def _stream(self, stream: int) -> _Stream:
    if (s := self._streams.get(stream)) is None:
      raise IpcError(f"VisionIPC server {self.name!r} has no buffers for stream {stream}; call create_buffers first")
    return s

  def get_free_buffer(self, stream: int) -> VisionBuf:
    """The next buffer (round robin), to fill in place (`buf.array` is writable) and then publish(). Its frame id reads
    WRITING from now on, so clients still holding it see `overwritten()`."""
    s = self._stream(stream)
    idx, s.next = s.next, (s.next + 1) % s.bufs.count
    s.bufs.set_frame_id(idx, WRITING)
    return VisionBuf(s.bufs, idx, stream)

  def publish(self, stream: int, buf: VisionBuf, frame_id: int, timestamp_sof: int = 0, timestamp_eof: int = 0, valid: bool = True) -> None:
    """Make a filled buffer from get_free_buffer() the stream's newest frame: its frame id goes after the image, a packet
    naming it out on the stream's endpoint. Zero-copy."""
    s = self._stream(stream)
    if buf._bufs is not s.bufs: raise IpcError(f"VisionIPC publish: buffer {buf.idx} of stream {buf.stream} is not a buffer of stream {stream}")
    if not 0 <= frame_id < 1 << 32: raise IpcError(f"VisionIPC frame id must fit the packet's uint32, got {frame_id}")
    buf.frame_id, buf.timestamp_sof, buf.timestamp_eof, buf.valid = frame_id, timestamp_sof, timestamp_eof, valid
    s.bufs.set_frame_id(buf.idx, frame_id)
    s.pub.send(PACKET.pack(self.server_id, buf.idx, frame_id, timestamp_sof, timestamp_eof, valid))

  def send(self, stream: int, data, frame_id: int = 0, timestamp_sof: int = 0, timestamp_eof: int = 0, valid: bool = True) -> None:
    """Copy one frame (bytes-like or uint8 array of exactly the layout's size) into the next buffer and publish it."""
    l = self._stream(stream).bufs.layout
    src = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
    if src.dtype != np.uint8 or src.size != l.size:
      raise IpcError(f"VisionIPC send on stream {stream}: expected {l.size} uint8 bytes (layout {l}), got {src.size} of {src.dtype}")
    buf = self.get_free_buffer(stream)
    np.copyto(buf.array, src.reshape(-1))
    self.publish(stream, buf, frame_id, timestamp_sof, timestamp_eof, valid)

  def has_readers(self, stream: int) -> bool:
    """A client of this server is subscribed to the stream's frame packets (a lockstep source waits for this before
    its first frame). A client still subscribed from a previous server of the name does not count until it has taken
    this one's buffers: it would drop the first frame (it reconnects on it), and a lockstep source would wait forever."""
    s = self._streams[stream]
    return s.handshakes > 0 and s.pub.all_readers_updated()

  def reader_pids(self, stream: int) -> set[int]:
    """The processes whose clients are subscribed to the stream's frame packets."""
    return self._streams[stream].pub.reader_pids()

  def close(self) -> None:
    """Stop the listener, remove the socket and lock files, close the topics and buffers. Idempotent."""
    if self._closed: return
    self._closed = True
    _live.discard(self)
    if self._thread is not None:
      os.eventfd_write(self._wake, 1)
      if not sys.is_finalizing(): self._thread.join()   # at interpreter exit a daemon thread can no longer run to its end
      os.close(self._wake)
    if self._sock is not None:
      try:
        if os.stat(self.path).st_ino == self._sock_ino: os.unlink(self.path)
      except FileNotFoundError: pass
      self._sock.close()
    for s in self._streams.values():
      s.pub.close()
      for fd in s.fds: os.close(fd)
      s.bufs.close()   # views the producer still holds keep theirs mapped until they go
    try: os.unlink(self.path + ".lock")   # still locked by us: nobody else can own this file now
    except FileNotFoundError: pass        # its folder was removed under us
    os.close(self._lock_fd)

  def __enter__(self): return self
  def __exit__(self, *exc) -> None: self.close()
  def __del__(self): self.close()

def _listen(lsock: socket.socket, wake: int, name: str, server_id: int, streams: dict[int, _Stream]) -> None:
  """Serve handshakes until `wake` is written. Every connection waits for its request on its own deadline, so a client
  that connects and says nothing (or never reads its reply) delays nobody."""
  with selectors.DefaultSelector() as sel:
    sel.register(lsock, selectors.EVENT_READ)
    sel.register(wake, selectors.EVENT_READ)
    pending: dict[socket.socket, float] = {}
    try:
      while True:
        timeout = max(0., min(pending.values()) - time.monotonic()) if pending else None
        for key, _ in sel.select(timeout):
          if key.fileobj == wake: return
          if key.fileobj is lsock:
            try: conn = lsock.accept()[0]
            except OSError: continue   # the client gave up already
            conn.setblocking(False)
            sel.register(conn, selectors.EVENT_READ)
            pending[conn] = time.monotonic() + HANDSHAKE_TIMEOUT
          else:
            conn = key.fileobj
            try: _serve(conn, name, server_id, streams)
            except OSError: pass   # the client went away mid-handshake, or its receive queue is full
            except Exception as e: log.warning("VisionIPC server %r: handshake failed: %r", name, e)   # keep listening
            del pending[conn]
            sel.unregister(conn)
            conn.close()
        for conn in [c for c, t in pending.items() if t <= time.monotonic()]:   # said nothing in time
          del pending[conn]
          sel.unregister(conn)
          conn.close()
    finally:
      for conn in pending: conn.close()

def _serve(conn: socket.socket, name: str, server_id: int, streams: dict[int, _Stream]) -> None:
  """openpilot's protocol: a request of anything but 4 bytes, or for a stream we lack, is closed without a reply."""
  if len(req := conn.recv(64)) != REQUEST.size: return
  (stream,) = REQUEST.unpack(req)
  if stream == STREAM_LIST: conn.send(b"".join(STREAMS.pack(t) for t in sorted(streams)))
  elif (s := streams.get(stream)) is not None:
    l = s.bufs.layout
    records = [BUF.pack(l.size, l.size + TRAILER, 0, 0, fd, l.width, l.height, l.stride, l.uv_offset, 0, 0, server_id, i, stream, 0)
               for i, fd in enumerate(s.fds)]
    socket.send_fds(conn, [b"".join(records)], s.fds)
    s.handshakes += 1
  else: log.warning("VisionIPC server %r: a client asked for stream %d; it serves %s", name, stream, sorted(streams))

def _bind(path: str) -> socket.socket:
  """The listening socket at path, 0600 (MSGQ_GROUP: 0660) from the start whatever the umask. A file there of another
  account (or a symlink) is refused by name; ours is a crashed server's (or openpilot's): we hold the name's lock."""
  try: check(path, os.lstat(path), "VisionIPC socket")
  except FileNotFoundError: pass
  else: os.unlink(path)
  s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
  try:
    os.fchmod(s.fileno(), modes()[1])   # bind() gives the file the socket's mode less the umask: never wider, not for a moment
    try: s.bind(path)
    except OSError as e:
      if e.errno == errno.EADDRINUSE: check(path, os.lstat(path), "VisionIPC socket")   # one made since: whose, by name
      raise
    own_socket_file(path)
  except BaseException:
    s.close()
    raise
  return s

def _lock(path: str, busy: str) -> int:
  """An exclusive flock on `path`, held as long as the returned fd. Retries if the file was unlinked under us."""
  while True:
    fd = open_private(path, os.O_RDWR | os.O_CREAT, "VisionIPC lock")
    try: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN): raise IpcError(busy) from None
      raise
    try:
      if os.stat(path).st_ino == os.fstat(fd).st_ino: return fd
    except FileNotFoundError: pass
    os.close(fd)   # its owner unlinked it on close after we opened it: try the new one
