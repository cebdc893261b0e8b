"""A ring of NV12 buffers in one memfd mapping, and VisionBuf, the view of one buffer that servers fill and clients read."""
import mmap, os, struct
import numpy as np
from msgq.pubsub import IpcError
from msgq.visionipc.layout import NV12Layout
from msgq.visionipc.wire import ALIGN, TRAILER

_U64 = struct.Struct("<Q")

class Ring:
  """`offsets[i]` is where buffer i starts in the memfd; its trailer sits at offsets[i] + trailer_offset.
  The mapping is unmapped by close() only: while any VisionBuf (or view of one) is alive, close() refuses."""
  def __init__(self, fd: int, layout: NV12Layout, offsets: list[int], trailer_offset: int, writable: bool):
    length = os.fstat(fd).st_size
    if not offsets or trailer_offset < layout.size or any(o % ALIGN or o < 0 or o + trailer_offset + TRAILER.size > length for o in offsets):
      raise IpcError(f"VisionIPC ring: buffers of {layout.size} bytes at offsets {offsets[:4]}... (trailer +{trailer_offset}) "
                     f"must be {ALIGN}-byte aligned and fit the {length}-byte shared memory")
    self.layout, self.offsets, self.trailer_offset = layout, list(offsets), trailer_offset
    self.mm = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0))
    self.addr = np.frombuffer(self.mm, np.uint8, 1).ctypes.data   # page aligned; the temporary view is gone at once

  @property
  def count(self) -> int: return len(self.offsets)

  def trailer(self, idx: int) -> tuple[int, int]:
    """(seq, frame_id) of buffer idx; seq 0: the server is writing it."""
    return TRAILER.unpack_from(self.mm, self.offsets[idx] + self.trailer_offset)

  def take(self, idx: int) -> None: _U64.pack_into(self.mm, self.offsets[idx] + self.trailer_offset, 0)

  def publish(self, idx: int, seq: int, frame_id: int) -> None:
    # frame_id before seq: a reader that sees the new seq sees the new frame_id (x86 keeps the order of stores)
    _U64.pack_into(self.mm, self.offsets[idx] + self.trailer_offset + 8, frame_id)
    _U64.pack_into(self.mm, self.offsets[idx] + self.trailer_offset, seq)

  def close(self) -> bool:
    """Unmap; False (and still mapped) while views of it are alive."""
    try: self.mm.close()
    except BufferError: return False
    return True

class VisionBuf:
  """One camera buffer as received (or, on the server, as taken for filling). `data` is a memoryview over the shared
  memory (read-only on clients), `addr` the address of its first byte (64-byte aligned) for Tensor.from_blob."""
  def __init__(self, ring: Ring, idx: int, stream: int, frame_id: int = 0, timestamp_sof: int = 0, timestamp_eof: int = 0,
               seq: int = 0, valid: bool = True):
    off, l = ring.offsets[idx], ring.layout
    self.data = memoryview(ring.mm)[off:off + l.size]
    self.addr, self.idx, self.stream, self.layout, self._ring = ring.addr + off, idx, stream, l, ring
    self.width, self.height, self.stride, self.uv_offset, self.size = l.width, l.height, l.stride, l.uv_offset, l.size
    self.frame_id, self.timestamp_sof, self.timestamp_eof, self.seq, self.valid = frame_id, timestamp_sof, timestamp_eof, seq, valid

  @property
  def array(self) -> np.ndarray:
    """The buffer as a flat uint8 numpy array (zero-copy; writable on the server, read-only on clients)."""
    return np.frombuffer(self.data, np.uint8)

  def overwritten(self) -> bool:
    """True once the server has taken this buffer again (being written, or holding a newer frame) since this frame was
    published. Check it after using the data: False then means what was read is this frame, untorn."""
    return self._ring.trailer(self.idx) != (self.seq, self.frame_id)

  def __repr__(self) -> str:
    return f"VisionBuf(stream={self.stream}, idx={self.idx}, frame_id={self.frame_id}, layout={self.layout}, addr={self.addr:#x})"
