"""Warps on real tinygrad kernels (DEV=CPU) against the numpy references, padded layouts, the JIT, the image queue."""
import os
os.environ.setdefault('DEV', 'CPU')
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes
from tinygrad.uop.ops import Ops
from transformations.model import MODEL_WIDTH, MODEL_HEIGHT, DM_WIDTH, DM_HEIGHT, road_warp_matrix, dm_warp_matrix, MEDMODEL_INTRINSICS
from modelrt.constants import IMG_QUEUE_LEN, IMG_CHANNELS, IMG_INPUT_SHAPE
from transformations.camera import camera_config, camera_from_calib, CameraConfig
from modelrt import internals
from modelrt.warp import road_warp, dm_warp, road_warp_np, dm_warp_np, update_img_queue, UV_SCALE, PACKED_SHAPE
from msgq.visionipc.layout import NV12Layout

RPY = (0.02, -0.035, 0.015)
PAD = 255   # padding bytes; image bytes are 0..254, so a read of padding shows as a 255 in the output

def make_frame(layout: NV12Layout, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  buf = np.full(layout.size, PAD, dtype=np.uint8)
  w, h, s = layout.width, layout.height, layout.stride
  buf[:s * h].reshape(h, s)[:, :w] = rng.integers(0, PAD, (h, w), dtype=np.uint8)
  buf[layout.uv_offset:layout.uv_offset + s * h // 2].reshape(h // 2, s)[:, :w] = rng.integers(0, PAD, (h // 2, w), dtype=np.uint8)
  return buf

def planes(buf: np.ndarray, layout: NV12Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  w, h, s = layout.width, layout.height, layout.stride
  uv = buf[layout.uv_offset:layout.uv_offset + s * h // 2].reshape(h // 2, s)[:, :w]
  return buf[:s * h].reshape(h, s)[:, :w], uv[:, 0::2], uv[:, 1::2]

def unpack_y(packed: np.ndarray) -> np.ndarray:
  y = np.empty((MODEL_HEIGHT, MODEL_WIDTH), dtype=packed.dtype)
  y[0::2, 0::2], y[1::2, 0::2], y[0::2, 1::2], y[1::2, 1::2] = packed[:4]
  return y

def near_tie(M: np.ndarray, w: int, h: int, tol: float = 1e-3) -> np.ndarray:
  """(h, w) mask of destination pixels whose exact source coordinate is within tol of a rounding boundary."""
  xs, ys = np.meshgrid(np.arange(w, dtype=np.float64), np.arange(h, dtype=np.float64))
  p = [M[i, 0] * xs + M[i, 1] * ys + M[i, 2] for i in range(3)]
  return np.any([np.abs((p[i] / p[2]) % 1 - 0.5) < tol for i in (0, 1)], axis=0)

def assert_road_matches(out: np.ndarray, buf: np.ndarray, M: np.ndarray, layout: NV12Layout) -> int:
  """out == numpy reference except at exact rounding ties; no padding read. Returns the number of tie differences."""
  ref = road_warp_np(buf, M, layout)
  assert out.shape == PACKED_SHAPE and out.dtype == np.uint8 and (out != PAD).all()
  y_tie, uv_tie = near_tie(M.astype(np.float64), MODEL_WIDTH, MODEL_HEIGHT), near_tie((M * UV_SCALE).astype(np.float64), MODEL_WIDTH // 2, MODEL_HEIGHT // 2)
  ties = np.stack([*[y_tie[dy::2, dx::2] for dx in (0, 1) for dy in (0, 1)], uv_tie, uv_tie])
  diff = out != ref
  assert not (diff & ~ties).any(), f"{(diff & ~ties).sum()} pixels differ from the reference away from rounding ties"
  return int(diff.sum())

@pytest.fixture(scope="module")
def aligned_frame():
  layout = NV12Layout.aligned(1928, 1208)
  return layout, make_frame(layout)

def test_uv_map_is_the_half_resolution_y_map():
  # M * UV_SCALE == S M S^-1 (S = diag(1/2, 1/2, 1)): chroma pixel (u, v) goes to half of where Y pixel (2u, 2v) goes
  M = road_warp_matrix(RPY, camera_config('ox03c10', 'road')).astype(np.float64)
  S = np.diag([.5, .5, 1])
  np.testing.assert_allclose(M * UV_SCALE, S @ M @ np.linalg.inv(S))
  for u, v in [(0, 0), (100, 50), (255, 127)]:
    a, b = M * UV_SCALE @ [u, v, 1], M @ [2 * u, 2 * v, 1]
    np.testing.assert_allclose(a[:2] / a[2], b[:2] / b[2] / 2)

def test_identity_is_a_copy():
  layout = NV12Layout.packed(MODEL_WIDTH, MODEL_HEIGHT)
  buf = make_frame(layout)
  out = road_warp(Tensor(buf), Tensor(np.eye(3, dtype=np.float32)), layout).numpy()
  y, u, v = planes(buf, layout)
  np.testing.assert_array_equal(out, np.stack([y[0::2, 0::2], y[1::2, 0::2], y[0::2, 1::2], y[1::2, 1::2], u, v]))
  np.testing.assert_array_equal(out, road_warp_np(buf, np.eye(3), layout))

def test_padded_layout_identity_like_and_edges():
  # stride, uv_offset and size all padded beyond the image, padding full of 255s
  layout = NV12Layout(640, 400, 640 + 48, (640 + 48) * 400 + 96, (640 + 48) * 600 + 96 + 64)
  buf = make_frame(layout, seed=1)
  M = np.array([[1, 0, 70], [0, 1, 90], [0, 0, 1]], dtype=np.float32)   # a crop: integer shifts, no ties
  out = road_warp(Tensor(buf), Tensor(M), layout).numpy()
  y, u, v = planes(buf, layout)
  np.testing.assert_array_equal(unpack_y(out), y[90:90 + MODEL_HEIGHT, 70:70 + MODEL_WIDTH])
  np.testing.assert_array_equal(out[4], u[45:45 + 128, 35:35 + 256])
  np.testing.assert_array_equal(out[5], v[45:45 + 128, 35:35 + 256])
  # zoomed out 2x around the centre: most samples fall outside and clamp to the edge rows and columns
  M = np.array([[2, 0, 320 - 512], [0, 2, 200 - 256], [0, 0, 1]], dtype=np.float32)
  out = road_warp(Tensor(buf), Tensor(M), layout).numpy()
  assert assert_road_matches(out, buf, M, layout) == 0
  Y = unpack_y(out)
  np.testing.assert_array_equal(Y[0, 100:400], y[0, 2 * 100 - 192:2 * 400 - 192:2])    # clamped to the top row
  np.testing.assert_array_equal(Y[:, -1], y[np.clip(2 * np.arange(256) - 56, 0, 399), -1])   # and the right column

def test_real_calibration_full_size(aligned_frame):
  layout, buf = aligned_frame
  M = road_warp_matrix(RPY, camera_config('ox03c10', 'road'))
  assert assert_road_matches(road_warp(Tensor(buf), Tensor(M), layout).numpy(), buf, M, layout) <= 2

def test_wide_calibration_custom_layout():
  cam = camera_config('os04c10', 'wide')
  layout = NV12Layout(cam.width, cam.height, cam.width + 64, (cam.width + 64) * (cam.height + 8), (cam.width + 64) * (cam.height * 3 // 2 + 16))
  buf = make_frame(layout, seed=2)
  M = road_warp_matrix((-0.01, 0.04, -0.03), cam, wide=True)
  assert assert_road_matches(road_warp(Tensor(buf), Tensor(M), layout).numpy(), buf, M, layout) <= 2

def test_vanishing_point_lands_on_the_model_principal_point():
  cam = camera_config('ox03c10', 'road')
  layout = NV12Layout.packed(cam.width, cam.height)
  buf = np.full(layout.size, 16, dtype=np.uint8)
  vp = camera_from_calib(RPY, cam) @ [1, 0, 0]
  u, v = np.round(vp[:2] / vp[2]).astype(int)
  buf[:layout.width * layout.height].reshape(layout.height, layout.width)[v - 4:v + 5, u - 4:u + 5] = 235
  Y = unpack_y(road_warp(Tensor(buf), Tensor(road_warp_matrix(RPY, cam)), layout).numpy())
  rows, cols = np.nonzero(Y == 235)
  assert len(rows) and abs(cols.mean() - MEDMODEL_INTRINSICS[0, 2]) < 1 and abs(rows.mean() - MEDMODEL_INTRINSICS[1, 2]) < 1

def test_driver_warp(aligned_frame):
  layout, buf = aligned_frame
  out = dm_warp(Tensor(buf), Tensor(dm_warp_matrix(camera_config('ox03c10', 'driver'))), layout).numpy()
  assert out.shape == (1, DM_WIDTH * DM_HEIGHT) and (out != PAD).all()
  np.testing.assert_array_equal(out.reshape(DM_HEIGHT, DM_WIDTH), planes(buf, layout)[0][248:248 + 960, 244:244 + 1440])   # the bottom rows

def test_driver_warp_of_a_scaled_sensor():
  """os04c10 (1344x760, fl 425.25) in a padded layout: model pixel (x, y) -> (0.75 x + 132, 0.75 y + 113), whose exact
  halves round to even, and the rows past the camera's last read 16, as openpilot v0.11.1's driver warp fills them."""
  cam = camera_config('os04c10', 'driver')
  layout = NV12Layout(cam.width, cam.height, cam.width + 128, (cam.width + 128) * cam.height + 256, (cam.width + 128) * cam.height * 3 // 2 + 512)
  buf, M = make_frame(layout, seed=3), dm_warp_matrix(cam)
  np.testing.assert_allclose(M, [[.75, 0, 132], [0, .75, 113], [0, 0, 1]])
  out = dm_warp(Tensor(buf), Tensor(M), layout).numpy()
  np.testing.assert_array_equal(out, dm_warp_np(buf, M, layout))
  xs, ys = np.round(0.75 * np.arange(DM_WIDTH) + 132).astype(int), np.round(0.75 * np.arange(DM_HEIGHT) + 113).astype(int)
  assert np.count_nonzero((0.75 * np.arange(DM_WIDTH) + 132) % 1 == 0.5) == DM_WIDTH // 4   # ties: every 4th column
  expected = np.full((DM_HEIGHT, DM_WIDTH), 16, np.uint8)
  expected[ys < cam.height] = planes(buf, layout)[0][ys[ys < cam.height]][:, xs]
  np.testing.assert_array_equal(out.reshape(DM_HEIGHT, DM_WIDTH), expected)
  assert (ys >= cam.height).sum() == 98 and (out != PAD).all()

def test_bad_inputs_are_named():
  layout = NV12Layout.packed(64, 32)
  with pytest.raises(ValueError, match=r"expected a 1-D uint8 tensor of 3072 bytes \(64x32:64:2048:3072\), got dtypes.uchar \(3073,\)"):
    road_warp(Tensor(np.zeros(3073, np.uint8)), Tensor(np.eye(3, dtype=np.float32)), layout)
  with pytest.raises(ValueError, match=r"transform: expected a \(3, 3\) float32 tensor, got dtypes.double \(3, 3\)"):
    dm_warp(Tensor(np.zeros(3072, np.uint8)), Tensor(np.eye(3)), layout)
  with pytest.raises(ValueError, match="image queue"):
    update_img_queue(Tensor.zeros(1, 12, 128, 256).contiguous(), Tensor.zeros(*PACKED_SHAPE).contiguous())

def test_jit_replay_follows_transform_frame_and_queue():
  """One capture: a new transform (calibration change) and new camera memory are seen at replay; the queue keeps
  the last IMG_QUEUE_LEN frames and the model input is [4 frames earlier, newest]."""
  layout = NV12Layout(640, 400, 640 + 48, (640 + 48) * 400 + 96, (640 + 48) * 600 + 96 + 64)
  cam = CameraConfig(640, 400, 910.0)
  queue = Tensor.zeros(1, IMG_QUEUE_LEN * IMG_CHANNELS, *PACKED_SHAPE[1:], dtype='uint8').contiguous().realize()
  @TinyJit
  def step(frame: Tensor, M: Tensor) -> Tensor:
    img = update_img_queue(queue, road_warp(frame, M, layout))
    Tensor.realize(queue, img)
    return img
  # camera memory as the daemons see it: one mapping, rewritten per frame, under a zero-copy tensor
  cambuf = make_frame(layout)
  frame = Tensor.from_blob(cambuf.ctypes.data, (layout.size,), dtype=dtypes.uint8, device='CPU')
  # the transform as openpilot feeds small host inputs: a numpy array shared by an 'NPY' tensor, written in place
  M = np.zeros((3, 3), np.float32)
  M_host = Tensor(M, device='NPY')
  newest = []
  for n in range(8):
    cambuf[:] = make_frame(layout, seed=10 + n)
    M[:] = road_warp_matrix((0.0, 0.01 * n, -0.02 * n), cam)
    img = step(frame, M_host).numpy()
    assert img.shape == IMG_INPUT_SHAPE
    assert_road_matches(img[0, IMG_CHANNELS:], cambuf, M, layout)
    newest.append(img[0, IMG_CHANNELS:])
    np.testing.assert_array_equal(img[0, :IMG_CHANNELS], newest[n - 4] if n >= 4 else 0)
  assert step.cnt > 2 and len(set(x.tobytes() for x in newest)) == len(newest)
  np.testing.assert_array_equal(queue.numpy()[0].reshape(IMG_QUEUE_LEN, *PACKED_SHAPE), np.stack(newest[-IMG_QUEUE_LEN:]))

def test_road_warp_is_one_kernel():
  # tinygrad must fold the gather into loads in one kernel, not split it into partial sums over the whole frame
  layout = NV12Layout(640, 400, 640 + 48, (640 + 48) * 400 + 96, (640 + 48) * 600 + 96 + 64)
  jit = TinyJit(lambda f, m: road_warp(f, m, layout))
  for _ in range(3): jit(Tensor(make_frame(layout)).realize(), Tensor(np.eye(3, dtype=np.float32)).realize())
  assert [si.src[0].op for si in internals.calls(jit.captured).src] == [Ops.PROGRAM]
