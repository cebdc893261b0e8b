"""VisionIpcClient: maps one stream's buffers of a named server (ours or openpilot's) and receives its frames."""
import os, time
from collections import deque
from msgq.pubsub import IpcError, drain_sock_raw, sub_sock
from msgq.visionipc.buffers import Buffers, VisionBuf
from msgq.visionipc.layout import NV12Layout
from msgq.visionipc.wire import BUF, PACKET, TRAILER, check_name, check_stream, endpoint, log, request, streams
from service.owned import NotOwnedError

class VisionIpcClient:
  """Lifecycle: connect() maps the server's buffers; recv() returns VisionBufs over them. When the server restarts (a
  packet with a new server_id) or sends nonsense (an index out of range), the client reports disconnected and the
  next connect() maps the new buffers, and recv() goes on with the new server's frames from the one that showed the
  restart: a client kept across its server's restart misses none. The old mappings stay mapped, so from_blob tensors
  over them stay safe, until the owner drops those tensors and calls release_old_mappings()."""
  def __init__(self, name: str, stream: int, conflate: bool = False):
    self.server_id: int | None = None
    self._sock, self._old = None, []   # before the checks: close() (from __del__) needs them
    self.name, self.stream, self.conflate = check_name(name), check_stream(stream), conflate
    self.width = self.height = self.stride = self.uv_offset = self.buffer_len = None
    self.num_buffers = self.frame_id = self.timestamp_sof = self.timestamp_eof = 0
    self.valid = False
    self.bad_packets = 0   # packets of another size seen (and ignored) on the stream's endpoint
    self.reconnects = 0    # frames from another server, naming a buffer it does not have or one its server shrank: each disconnects
    self.connect_error: str | None = None   # why the last connect() that reached a server failed
    self.layout: NV12Layout | None = None
    self._bufs: Buffers | None = None
    self._old_ids: set[int] = set()
    self._queued: deque[bytes] = deque()   # packets recv() takes before the socket's: a new server's, kept over a reconnect
    self._carried: set[bytes] = set()      # those of them the new subscription may hold again
    self._resubscribe = False

  def is_connected(self) -> bool: return self.server_id is not None

  def connect(self, blocking: bool = True) -> bool:
    """Map the stream's buffers. Blocking waits for the server to come up; False if it does not serve the stream."""
    if self.is_connected(): return True
    if self._sock is None or self._resubscribe:   # subscribe before the handshake: no frame published after it is missed
      self._subscribe()
    while True:
      try:
        msg, fds = request(self.name, self.stream)
        break
      except (OSError, IpcError) as e:   # no server yet, a crashed server's stale socket, or one going away mid-reply
        if isinstance(e, NotOwnedError): self.connect_error = str(e)   # another account's: logged, waited past as none
        if not blocking:
          log.debug("VisionIPC %r stream %d: no server (%s)", self.name, self.stream, e)
          return False
        time.sleep(0.02)
    try:
      self._map(msg, fds)
    except (IpcError, OSError, ValueError) as e:
      self.connect_error = str(e)
      log.warning("VisionIPC %r stream %d: %s", self.name, self.stream, self.connect_error)
      return False
    finally:
      for fd in fds: os.close(fd)   # the mappings keep the memory alive
    self.connect_error = None
    return True

  def _subscribe(self) -> None:
    """A fresh subscription after a disconnect too: one left idle since its server went may never reach the successor
    (ZMQ re-subscribes only when the socket is used). What the old one holds is read first, each packet once."""
    old, self._resubscribe = self._sock, False
    self._sock = sub_sock(endpoint(self.name, self.stream), conflate=self.conflate)
    if old is not None:
      self._queued.extend(got := drain_sock_raw(old))
      self._carried = set(got)
      old.close()

  def _map(self, msg: bytes, fds: list[int]) -> None:
    if not msg and not fds:   # openpilot's server closes without a word for a stream it lacks
      try: have = sorted(streams(self.name))
      except (OSError, IpcError): have = "?"
      raise IpcError(f"server {self.name!r} does not serve stream {self.stream} (it serves {have})")
    if len(msg) != BUF.size * len(fds) or not fds:
      raise IpcError(f"server {self.name!r}: a handshake of {len(msg)} bytes with {len(fds)} fds (expected {BUF.size} bytes per fd)")
    recs = [BUF.unpack_from(msg, i * BUF.size) for i in range(len(fds))]
    length, mmap_len, _, _, _, w, h, stride, uv_offset, _, _, server_id, _, _, _ = recs[0]
    layout = NV12Layout(w, h, stride, uv_offset, length)
    for i, r in enumerate(recs):
      if (r[0], r[5:9], r[11], r[12], r[13]) != (length, (w, h, stride, uv_offset), server_id, i, self.stream) or r[1] < length + TRAILER:
        raise IpcError(f"server {self.name!r}: buffer record {i} {r} does not match buffer 0 {recs[0]} (one layout, indexes in order, "
                       f"stream {self.stream}, mmap_len >= len + {TRAILER})")
    self._bufs = Buffers(fds, layout, writable=False, name=f"VisionIPC server {self.name!r} stream {self.stream}")
    self.server_id, self.layout, self.num_buffers = server_id, layout, len(fds)
    self._old_ids.discard(server_id)
    self._queued = deque(p for p in self._queued if len(p) != PACKET.size or PACKET.unpack(p)[0] == server_id)   # not yet another's
    self.width, self.height, self.stride, self.uv_offset, self.buffer_len = w, h, stride, uv_offset, length

  def recv(self, timeout_ms: int = 100) -> VisionBuf | None:
    """The next frame (the newest if conflate), or None after timeout_ms (< 0: wait forever) or when disconnected."""
    deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
    while self.is_connected():
      self._sock.setTimeout(None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000)))
      if self._queued:   # conflate: the newest of them (the socket may hold a newer one still: the next recv's)
        msg = self._queued.popleft() if not self.conflate else self._queued.pop()
        if self.conflate: self._queued.clear()
      elif (msg := self._sock.receive()) is None: return None
      elif msg in self._carried: continue   # read from the old subscription already
      if (buf := self._frame(msg)) is not None: return buf
    return None

  def _frame(self, msg: bytes) -> VisionBuf | None:
    if len(msg) != PACKET.size:   # openpilot's client asserts (aborts) here
      self.bad_packets += 1
      return None
    server_id, idx, frame_id, sof, eof, valid = PACKET.unpack(msg)
    if server_id in self._old_ids: return None   # queued before the server we reconnected to replaced it
    if server_id != self.server_id or idx >= self.num_buffers:
      log.warning("VisionIPC %r stream %d: frame %d from server %#x idx %d, connected to %#x with %d buffers: reconnecting",
                  self.name, self.stream, frame_id, server_id, idx, self.server_id, self.num_buffers)
      self.reconnects += 1
      if server_id != self.server_id: self._queued.appendleft(msg)   # a new server: its frame, once connected to it
      self.disconnect()
      return None
    if (why := self._bufs.shrunk(idx)) is not None:   # reading it would SIGBUS the process
      log.warning("VisionIPC %r stream %d: frame %d refused: %s; reconnecting", self.name, self.stream, frame_id, why)
      self.reconnects += 1
      self.disconnect()
      return None
    self.frame_id, self.timestamp_sof, self.timestamp_eof, self.valid = frame_id, sof, eof, valid
    return VisionBuf(self._bufs, idx, self.stream, frame_id, sof, eof, valid)

  def disconnect(self) -> None:
    """Leave the server (its buffers stay mapped until release_old_mappings); the next connect() maps its successor's."""
    self._old_ids.add(self.server_id)
    self._old.append(self._bufs)
    self.server_id, self._bufs, self._resubscribe = None, None, True

  def release_old_mappings(self) -> int:
    """Unmap the buffers of servers this client has left. Call only after dropping every tensor (from_blob) over them.
    Returns how many old streams stay (partly) mapped because VisionBufs (or views of their data) are still alive."""
    self._old = [b for b in self._old if not b.close()]
    return len(self._old)

  def close(self) -> None:
    """Disconnect and unmap everything (drop from_blob tensors first). Also runs when the last reference goes."""
    if self.is_connected(): self.disconnect()
    self.release_old_mappings()
    if self._sock is not None: self._sock.close(); self._sock = None

  def __enter__(self): return self
  def __exit__(self, *exc) -> None: self.close()
  def __del__(self): self.close()

  @staticmethod
  def available_streams(name: str, block: bool) -> set[int]:
    """Streams the server `name` serves; empty if it is not up and not block, else waits for it."""
    while True:
      try:
        if have := streams(name): return have
      except (OSError, IpcError): pass
      if not block: return set()
      time.sleep(0.02)

  @staticmethod
  def server_info(name: str) -> tuple[int, set[int]] | None:
    """(server_id, streams) of the running server `name`, None if it is not up. The id changes when the server
    restarts: a client idle on a stream sees a restart only here (it notices in recv only once a frame comes). The id
    comes with a stream's buffers (openpilot's stream list has none): their fds are closed at once."""
    try:
      if not (have := streams(name)): return None, set()
      msg, fds = request(name, min(have))
      for fd in fds: os.close(fd)
    except (OSError, IpcError): return None
    return (BUF.unpack_from(msg)[11] if len(msg) >= BUF.size else None), have
