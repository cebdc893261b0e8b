"""NV12 buffer layouts: where the Y rows and the interleaved UV rows sit in a camera buffer."""
from dataclasses import dataclass
import numpy as np

def align(x: int, a: int) -> int:
  """x rounded up to a multiple of a."""
  return (x + a - 1) // a * a

@dataclass(frozen=True)
class NV12Layout:
  width: int
  height: int
  stride: int      # bytes per Y (and UV) row, >= width
  uv_offset: int   # byte offset of the first UV row, >= stride * height
  size: int        # bytes in the buffer, >= uv_offset + stride * height // 2

  def __post_init__(self):
    if self.width <= 0 or self.height <= 0 or self.width % 2 or self.height % 2:
      raise ValueError(f"NV12 needs a positive even width and height, got {self.width}x{self.height}")
    if self.stride < self.width: raise ValueError(f"stride {self.stride} < width {self.width}")
    if self.uv_offset < self.stride * self.height:
      raise ValueError(f"uv_offset {self.uv_offset} < stride*height {self.stride * self.height}")
    if self.size < self.uv_offset + self.stride * self.height // 2:
      raise ValueError(f"size {self.size} < uv_offset + stride*height/2 = {self.uv_offset + self.stride * self.height // 2}")

  @classmethod
  def packed(cls, width: int, height: int) -> "NV12Layout":
    """stride = width, UV right after Y: what create_buffers() makes."""
    return cls(width, height, width, width * height, width * height * 3 // 2)

  @classmethod
  def aligned(cls, width: int, height: int, stride_align: int = 128, y_rows_align: int = 32, uv_rows_align: int = 16) -> "NV12Layout":
    """Padded like openpilot's camera buffers: stride aligned to 128, Y rows to 32, UV rows to 16."""
    stride = align(width, stride_align)
    uv_offset = stride * align(height, y_rows_align)
    return cls(width, height, stride, uv_offset, uv_offset + stride * align(height // 2, uv_rows_align))

  @classmethod
  def parse(cls, spec: str) -> "NV12Layout":
    """'WxH' (packed), 'WxH:aligned', or 'WxH:stride:uv_offset:size'."""
    try:
      wh, *rest = spec.split(':')
      w, h = (int(v) for v in wh.lower().split('x'))
      if not rest: return cls.packed(w, h)
      if rest == ['aligned']: return cls.aligned(w, h)
      stride, uv_offset, size = (int(v) for v in rest)
    except ValueError as e:
      raise ValueError(f"camera layout {spec!r}: expected 'WxH', 'WxH:aligned' or 'WxH:stride:uv_offset:size' ({e})") from None
    return cls(w, h, stride, uv_offset, size)

  def y_uv(self, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Views of Y (h, w) and of the interleaved UV (h/2, w/2, 2) inside a flat uint8 NV12 buffer of this layout;
    padding untouched."""
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1 or not buf.flags.c_contiguous:
      raise ValueError(f"NV12 buffer: expected a contiguous 1-D uint8 array, got "
                       f"{type(buf).__name__} {getattr(buf, 'dtype', '')} shape {getattr(buf, 'shape', '')}")
    if buf.size < self.size: raise ValueError(f"NV12 buffer: layout {self} needs {self.size} bytes, the buffer has {buf.size}")
    w, h, s = self.width, self.height, self.stride
    uv = buf[self.uv_offset:self.uv_offset + s * (h // 2)].reshape(h // 2, s)[:, :w].reshape(h // 2, w // 2, 2)
    return buf[:s * h].reshape(h, s)[:, :w], uv

  def planes(self, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Views of Y (h, w), U and V (h/2, w/2) inside a flat uint8 NV12 buffer of this layout; padding untouched."""
    y, uv = self.y_uv(buf)
    return y, uv[..., 0], uv[..., 1]

  def __str__(self) -> str: return f"{self.width}x{self.height}:{self.stride}:{self.uv_offset}:{self.size}"
