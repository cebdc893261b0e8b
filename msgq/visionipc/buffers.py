"""A stream's buffers, each its own shared-memory file mapped whole (image, then the uint64 frame id), and VisionBuf,
the view of one buffer that servers fill and clients read."""
import fcntl, mmap, os, struct
import numpy as np
from msgq.pubsub import IpcError
from msgq.visionipc.layout import NV12Layout
from msgq.visionipc.wire import TRAILER

_U64 = struct.Struct("=Q")

def sealed(fd: int) -> bool:
  """The file can no longer shrink (a memfd sealed with F_SEAL_SHRINK, as our server's): no mapping of it can SIGBUS."""
  try: return bool(fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK)
  except OSError: return False   # no shared-memory file: it has no seals

class Buffers:
  """The mappings of one stream's buffers (all of one layout). close() unmaps them, and refuses while any VisionBuf
  (or view of one) is alive. The buffers a server could still shrink (openpilot's are unsealed files) keep an fd, for
  shrunk() to look at their size before each frame: a read past a file's end is a SIGBUS."""
  def __init__(self, fds: list[int], layout: NV12Layout, writable: bool, name: str = "VisionIPC"):
    self.layout, self.name, self.mms, self.unsealed = layout, name, [], {}
    try:
      for i, fd in enumerate(fds):
        if (have := os.fstat(fd).st_size) < layout.size + TRAILER:   # a shorter file would SIGBUS us on the first read
          raise IpcError(f"{name}: buffer {i} is a file of {have} bytes, expected at least {layout.size + TRAILER} (layout {layout})")
        self.mms.append(mmap.mmap(fd, layout.size + TRAILER, mmap.MAP_SHARED, mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)))
        if not sealed(fd): self.unsealed[i] = os.dup(fd)
    except BaseException:
      self.close()
      raise
    self.addrs = [np.frombuffer(m, np.uint8, 1).ctypes.data for m in self.mms]   # page aligned; the views go at once

  @property
  def count(self) -> int: return len(self.mms)

  def frame_id(self, idx: int) -> int:
    """The frame id in buffer idx's trailer; WRITING while our server fills it."""
    return _U64.unpack_from(self.mms[idx], self.layout.size)[0]

  def set_frame_id(self, idx: int, frame_id: int) -> None: _U64.pack_into(self.mms[idx], self.layout.size, frame_id)

  def shrunk(self, idx: int) -> str | None:
    """Why buffer idx cannot be read now (its server shrank the file under our mapping), or None: an fstat for an
    unsealed buffer, nothing for a sealed one."""
    if (fd := self.unsealed.get(idx)) is None or (have := os.fstat(fd).st_size) >= (need := self.layout.size + TRAILER): return None
    return f"{self.name}: buffer {idx} is a file of {have} bytes now, expected at least {need}: its server shrank it"

  def close(self) -> bool:
    """Unmap; False (and what is still viewed stays mapped) while views of a buffer are alive."""
    left = []
    for m in self.mms:
      try: m.close()
      except BufferError: left.append(m)
    self.mms = left
    if not left:
      for fd in self.unsealed.values(): os.close(fd)
      self.unsealed = {}
    return not left

class VisionBuf:
  """One camera buffer as received (or, on the server, as taken for filling). `data` is a memoryview over the shared
  memory (read-only on clients), `addr` the address of its first byte (page aligned) for Tensor.from_blob."""
  def __init__(self, bufs: Buffers, idx: int, stream: int, frame_id: int = 0, timestamp_sof: int = 0, timestamp_eof: int = 0,
               valid: bool = True):
    l = bufs.layout
    self.data = memoryview(bufs.mms[idx])[:l.size]
    self.addr, self.idx, self.stream, self.layout, self._bufs = bufs.addrs[idx], idx, stream, l, bufs
    self.width, self.height, self.stride, self.uv_offset, self.size = l.width, l.height, l.stride, l.uv_offset, l.size
    self.frame_id, self.timestamp_sof, self.timestamp_eof, self.valid = frame_id, timestamp_sof, timestamp_eof, valid

  @property
  def array(self) -> np.ndarray:
    """The buffer as a flat uint8 numpy array (zero-copy; writable on the server, read-only on clients)."""
    return np.frombuffer(self.data, np.uint8)

  def overwritten(self) -> bool:
    """True once the buffer no longer holds this frame: the server is filling it again or filled it with a newer frame
    (the frame id after the image changed). Check it after using the data: False then means what was read is this
    frame, untorn. openpilot's servers write the frame id only once the image is in, so with them a buffer being
    filled still reads False. A buffer its server shrank meanwhile reads True (its frame id is not read: a SIGBUS)."""
    return self._bufs.shrunk(self.idx) is not None or self._bufs.frame_id(self.idx) != self.frame_id

  def __repr__(self) -> str:
    return f"VisionBuf(stream={self.stream}, idx={self.idx}, frame_id={self.frame_id}, layout={self.layout}, addr={self.addr:#x})"
