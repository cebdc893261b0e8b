"""Camera warps as tinygrad ops (capturable in a TinyJit), their numpy references, and the model image history.

The 3x3 transform (model pixel -> camera pixel, see transformations.model) is a Tensor input, so a calibration change
is a new value at the next replay, never a re-capture. The buffer layout (NV12Layout) is Python, fixed per capture.
Conventions (pixel centres, rounding, chroma, borders), shared with the numpy references: docs/RUNTIME.md."""
import numpy as np
from tinygrad import Tensor, dtypes
from tinygrad.helpers import Context
from transformations.model import MODEL_WIDTH, MODEL_HEIGHT, DM_WIDTH, DM_HEIGHT
from modelrt.constants import IMG_CHANNELS, IMG_QUEUE_LEN
from msgq.visionipc.layout import NV12Layout

# openpilot v0.11.1 fills the driver model's pixels outside the camera with 16 (video black luma). Only a sensor whose
# field ends inside the model frame (os04c10, 1344x760: its last 98 rows) shows it
DM_BORDER_FILL = 16
UV_SCALE = np.array([[1, 1, .5], [1, 1, .5], [2, 2, 1]], dtype=np.float32)
PACKED_SHAPE = (IMG_CHANNELS, MODEL_HEIGHT // 2, MODEL_WIDTH // 2)   # (6, 128, 256)

def _check(frame: Tensor, M: Tensor, layout: NV12Layout) -> Tensor:
  """Checks the Python-fixed shapes at trace time; returns M on the frame's device (a host 'NPY' tensor works)."""
  if frame.shape != (layout.size,) or frame.dtype != dtypes.uint8:
    raise ValueError(f"camera frame: expected a 1-D uint8 tensor of {layout.size} bytes ({layout}), got {frame.dtype} {frame.shape}")
  if M.shape != (3, 3) or M.dtype != dtypes.float32: raise ValueError(f"transform: expected a (3, 3) float32 tensor, got {M.dtype} {M.shape}")
  return M.to(frame.device)

def _inside(c: Tensor, n: int) -> Tensor:
  """Whether c rounds (half to even) into [0, n-1]; NaN does not."""
  return (c >= -0.5) & ((c <= n - 0.5) if (n - 1) % 2 == 0 else (c < n - 0.5))

def _nearest(M: Tensor, xs: Tensor, ys: Tensor, w: int, h: int, scale: float = 1.0) -> tuple[Tensor, Tensor, Tensor]:
  """Column and row (int32, clamped to w x h) of the nearest camera pixel to scale * M @ (xs, ys, 1), and whether
  that pixel is inside the image before the clamp."""
  d = M[2, 0] * xs + M[2, 1] * ys + M[2, 2]
  def nn(c: Tensor, n: int) -> Tensor:
    # floor(c + 0.5) clamped to [0, n-1] is the truncation of c + 0.5 clamped to [0, n - 0.5] (NaN fails `> 0`: 0);
    # an exact half whose floor is odd then goes one down: half to even. The int clamp after it changes no value; it
    # gives tinygrad the index's range, so the gather's loads lose their bounds masks and the kernel vectorizes
    # (4x faster here)
    t = (c + 0.5 > 0).where(c + 0.5, 0).minimum(n - 0.5).cast(dtypes.int32)
    return (t - ((t.cast(dtypes.float32) - c).eq(0.5) & (t % 2).eq(1)).cast(dtypes.int32)).maximum(0).minimum(n - 1)
  cx, cy = (M[0, 0] * xs + M[0, 1] * ys + M[0, 2]) / d * scale, (M[1, 0] * xs + M[1, 1] * ys + M[1, 2]) / d * scale
  return nn(cx, w), nn(cy, h), _inside(cx, w) & _inside(cy, h)

def _gather(frame: Tensor, idx: Tensor, inside: Tensor | None = None, fill: int = 0) -> Tensor:
  """frame[idx], or `fill` where not `inside`."""
  # tinygrad folds the one-hot reduce of frame[idx] into one load per output. Its split-reduce heuristic would first
  # cut the megabyte-long reduce into partial sums, a 4M-element pass that made the road warp 4x slower here.
  with Context(SPLIT_REDUCEOP=0):
    out = frame[idx.flatten()].reshape(idx.shape)
    if inside is None: return out.realize()
    # arithmetic, not inside.where(out, fill): tinygrad turns that where into a gated load, 4x slower here
    keep = inside.cast(out.dtype)
    return (out * keep + (1 - keep) * fill).realize()

def _grid(w: int, h: int, step: int = 1) -> tuple[Tensor, Tensor]:
  return (Tensor.arange(w, dtype=dtypes.float32) * step).reshape(1, w), (Tensor.arange(h, dtype=dtypes.float32) * step).reshape(h, 1)

def road_warp(frame: Tensor, M: Tensor, layout: NV12Layout) -> Tensor:
  """NV12 camera buffer (1-D uint8, layout.size bytes) -> packed (6, 128, 256) uint8 model frame:
  Y[0::2,0::2], Y[1::2,0::2], Y[0::2,1::2], Y[1::2,1::2] of the 512x256 Y warp, then U, V (256x128)."""
  M = _check(frame, M, layout)
  cx, cy, _ = _nearest(M, *_grid(MODEL_WIDTH, MODEL_HEIGHT), layout.width, layout.height)
  y_idx = (cy * layout.stride + cx).reshape(MODEL_HEIGHT // 2, 2, MODEL_WIDTH // 2, 2).permute(3, 1, 0, 2)   # (dx, dy, row, col)
  ux, uy, _ = _nearest(M, *_grid(MODEL_WIDTH // 2, MODEL_HEIGHT // 2, step=2), layout.width // 2, layout.height // 2, scale=0.5)
  u_idx = layout.uv_offset + uy * layout.stride + ux * 2
  return _gather(frame, y_idx.reshape(4, *PACKED_SHAPE[1:]).cat(u_idx.unsqueeze(0), u_idx.unsqueeze(0) + 1))

def dm_warp(frame: Tensor, M: Tensor, layout: NV12Layout) -> Tensor:
  """NV12 driver camera buffer -> (1, 1440*960) uint8: the Y plane warped to the driver model's input, DM_BORDER_FILL
  where the model frame reaches past the camera image."""
  M = _check(frame, M, layout)
  cx, cy, inside = _nearest(M, *_grid(DM_WIDTH, DM_HEIGHT), layout.width, layout.height)
  return _gather(frame, cy * layout.stride + cx, inside, DM_BORDER_FILL).reshape(1, DM_WIDTH * DM_HEIGHT)

def update_img_queue(queue: Tensor, packed: Tensor) -> Tensor:
  """queue (1, IMG_QUEUE_LEN*6, 128, 256) uint8, oldest frame first, a realized buffer; packed (6, 128, 256), the
  newest frame. Shifts the queue in place (assigns: realize it with the result) and returns the model input
  (1, 12, 128, 256) = [the frame IMG_QUEUE_LEN-1 = 4 earlier, the newest], older first as in openpilot."""
  if queue.shape != (1, IMG_QUEUE_LEN * IMG_CHANNELS, *PACKED_SHAPE[1:]) or packed.shape != PACKED_SHAPE:
    raise ValueError(f"image queue: expected {(1, IMG_QUEUE_LEN * IMG_CHANNELS, *PACKED_SHAPE[1:])} and frame {PACKED_SHAPE}, "
                     f"got {queue.shape} and {packed.shape}")
  # plain copies of whole slices: a cat of two buffers is one kernel that picks its source per byte (4x slower here).
  # clone, not contiguous: contiguous of a slice is a view of the queue, and the shift would read what it overwrites
  queue[:, :-IMG_CHANNELS].assign(queue[:, IMG_CHANNELS:].clone())
  queue[:, -IMG_CHANNELS:].assign(packed.unsqueeze(0))
  return queue[:, :IMG_CHANNELS].cat(queue[:, -IMG_CHANNELS:], dim=1).contiguous()

# numpy references: the same mapping written plainly, for tests and for tools that warp without tinygrad

def _nearest_np(M: np.ndarray, w_dst: int, h_dst: int, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
  M = M.astype(np.float32)
  xs, ys = np.meshgrid(np.arange(w_dst, dtype=np.float32), np.arange(h_dst, dtype=np.float32))
  p = [M[i, 0] * xs + M[i, 1] * ys + M[i, 2] for i in range(3)]
  cx, cy = np.round(p[0] / p[2]), np.round(p[1] / p[2])   # half to even
  with np.errstate(invalid='ignore'):
    inside = (cx >= 0) & (cx <= w - 1) & (cy >= 0) & (cy <= h - 1)
  return np.clip(np.nan_to_num(cx), 0, w - 1).astype(np.int64), np.clip(np.nan_to_num(cy), 0, h - 1).astype(np.int64), inside

def _planes_np(buf: np.ndarray, layout: NV12Layout) -> tuple[np.ndarray, np.ndarray]:
  if buf.shape != (layout.size,) or buf.dtype != np.uint8: raise ValueError(f"expected {layout.size} uint8 bytes ({layout}), got {buf.dtype} {buf.shape}")
  return layout.y_uv(buf)

def road_warp_np(buf: np.ndarray, M: np.ndarray, layout: NV12Layout) -> np.ndarray:
  y, uv = _planes_np(buf, layout)
  cx, cy, _ = _nearest_np(M, MODEL_WIDTH, MODEL_HEIGHT, layout.width, layout.height)
  Y = y[cy, cx]
  ux, uy, _ = _nearest_np(M * UV_SCALE, MODEL_WIDTH // 2, MODEL_HEIGHT // 2, layout.width // 2, layout.height // 2)
  return np.stack([Y[0::2, 0::2], Y[1::2, 0::2], Y[0::2, 1::2], Y[1::2, 1::2], uv[uy, ux, 0], uv[uy, ux, 1]])

def dm_warp_np(buf: np.ndarray, M: np.ndarray, layout: NV12Layout) -> np.ndarray:
  y, _ = _planes_np(buf, layout)
  cx, cy, inside = _nearest_np(M, DM_WIDTH, DM_HEIGHT, layout.width, layout.height)
  return np.where(inside, y[cy, cx], np.uint8(DM_BORDER_FILL)).reshape(1, DM_WIDTH * DM_HEIGHT)
