"""VisionIpcClient: maps one stream's ring of a named server and receives its frames."""
import logging, os, time
from msgq.pubsub import IpcError, sub_sock
from msgq.visionipc.buffers import Ring, VisionBuf
from msgq.visionipc.layout import NV12Layout
from msgq.visionipc.wire import FRAME, MAGIC, MAX_PACKET, OP_BUFFERS, OP_STREAMS, check_name, check_stream, endpoint, request

log = logging.getLogger("msgq.visionipc")

class VisionIpcClient:
  """Lifecycle: connect() maps the server's buffers; recv() returns VisionBufs over them. When the server restarts (a
  packet with a new server_id) or sends nonsense (an index out of range), the client reports disconnected and the
  next connect() maps the new buffers. The old mappings stay mapped, so from_blob tensors over them stay safe, until
  the owner drops those tensors and calls release_old_mappings(). A tensor over an unmapped buffer is a segfault."""
  def __init__(self, name: str, stream: int, conflate: bool = False):
    self.server_id: int | None = None
    self._sock, self._old_rings = None, []   # before the checks: close() (from __del__) needs them
    self.name, self.stream, self.conflate = check_name(name), check_stream(stream), conflate
    self.width = self.height = self.stride = self.uv_offset = self.buffer_len = self.num_buffers = 0
    self.frame_id = self.timestamp_sof = self.timestamp_eof = 0
    self.bad_packets = 0   # garbage or truncated packets seen (and ignored) on the stream's topic
    self.reconnects = 0    # frames from another server, or naming a buffer it does not have: each disconnects
    self.connect_error: str | None = None   # why the last connect() that reached a server failed
    self.layout: NV12Layout | None = None
    self._ring: Ring | None = None
    self._old_ids: set[int] = set()

  def is_connected(self) -> bool: return self.server_id is not None

  def connect(self, blocking: bool = True) -> bool:
    """Map the stream's buffers. Blocking waits for the server to come up; False if it does not serve the stream."""
    if self.is_connected(): return True
    if self._sock is None:   # subscribe before the handshake: no frame published after it is missed
      self._sock = sub_sock(endpoint(self.name, self.stream), conflate=self.conflate, max_size=MAX_PACKET)
    while True:
      try:
        reply, fds = request(self.name, OP_BUFFERS, self.stream)
        break
      except (OSError, IpcError) as e:   # no server yet, a crashed server's stale socket, or one going away mid-reply
        if not blocking:
          log.debug("VisionIPC %r stream %d: no server (%s)", self.name, self.stream, e)
          return False
        time.sleep(0.02)
    try:
      if "error" in reply:
        self.connect_error = str(reply["error"])
        log.warning("VisionIPC %r stream %d: %s", self.name, self.stream, self.connect_error)
        return False
      if len(fds) != 1 or reply["stream"] != self.stream:
        raise IpcError(f"expected stream {self.stream} and 1 buffer fd, got stream {reply['stream']} and {len(fds)} fds")
      layout, server_id = NV12Layout.parse(reply["layout"]), int(reply["server_id"])
      self._ring = Ring(fds[0], layout, [int(o) for o in reply["offsets"]], int(reply["trailer_offset"]), writable=False)
    except (IpcError, OSError, ValueError, KeyError, TypeError) as e:
      self.connect_error = f"bad handshake reply ({e})"
      log.warning("VisionIPC %r stream %d: %s", self.name, self.stream, self.connect_error)
      return False
    finally:
      for fd in fds: os.close(fd)   # the mapping keeps the memory alive
    self.server_id, self.connect_error = server_id, None
    self._old_ids.discard(self.server_id)
    self.layout, self.num_buffers = layout, self._ring.count
    self.width, self.height, self.stride, self.uv_offset, self.buffer_len = layout.width, layout.height, layout.stride, layout.uv_offset, layout.size
    return True

  def recv(self, timeout_ms: int = 100) -> VisionBuf | None:
    """The next frame (the newest if conflate), or None after timeout_ms (< 0: wait forever) or when disconnected."""
    deadline = time.monotonic() + timeout_ms / 1000
    while self.is_connected():
      self._sock.setTimeout(None if timeout_ms < 0 else max(0, int((deadline - time.monotonic()) * 1000)))
      if (msg := self._sock.receive()) is None: return None
      if (buf := self._frame(msg)) is not None: return buf
    return None

  def _frame(self, msg: bytes) -> VisionBuf | None:
    if len(msg) != FRAME.size or msg[:4] != MAGIC:
      self.bad_packets += 1
      return None
    _, server_id, seq, frame_id, sof, eof, idx, valid = FRAME.unpack(msg)
    if server_id in self._old_ids: return None   # queued before the server we reconnected to replaced it
    if server_id != self.server_id or idx >= self.num_buffers:
      log.warning("VisionIPC %r stream %d: frame %d from server %#x idx %d, connected to %#x with %d buffers: reconnecting",
                  self.name, self.stream, frame_id, server_id, idx, self.server_id, self.num_buffers)
      self.reconnects += 1
      self._disconnect()
      return None
    self.frame_id, self.timestamp_sof, self.timestamp_eof = frame_id, sof, eof
    return VisionBuf(self._ring, idx, self.stream, frame_id, sof, eof, seq, valid)

  def _disconnect(self) -> None:
    self._old_ids.add(self.server_id)
    self._old_rings.append(self._ring)
    self.server_id, self._ring = None, None

  def release_old_mappings(self) -> int:
    """Unmap the buffers of servers this client has left. Call only after dropping every tensor (from_blob) over them.
    Returns how many old mappings stay mapped because VisionBufs (or views of their data) are still alive."""
    self._old_rings = [r for r in self._old_rings if not r.close()]
    return len(self._old_rings)

  def close(self) -> None:
    """Disconnect and unmap everything (drop from_blob tensors first). Also runs when the last reference goes."""
    if self.is_connected(): self._disconnect()
    self.release_old_mappings()
    if self._sock is not None: self._sock.close(); self._sock = None

  def __enter__(self): return self
  def __exit__(self, *exc) -> None: self.close()
  def __del__(self): self.close()

  @staticmethod
  def available_streams(name: str, block: bool) -> set[int]:
    """Streams the server `name` serves; empty if it is not up and not block, else waits for it."""
    while (info := VisionIpcClient.server_info(name)) is None:
      if not block: return set()
      time.sleep(0.02)
    return info[1]

  @staticmethod
  def server_info(name: str) -> tuple[int, set[int]] | None:
    """(server_id, streams) of the running server `name`, None if it is not up. The id changes when the server
    restarts: a client idle on a stream sees a restart only here (it notices in recv only once a frame comes)."""
    try: reply = request(name, OP_STREAMS)[0]
    except (OSError, IpcError): return None
    return reply.get("server_id"), set(reply.get("streams", []))
