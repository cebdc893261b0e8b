"""Camera geometry: sensor intrinsics, model-frame intrinsics, calibration rotations and the warp matrices.

Frames (openpilot's): device x forward, y right, z down; view x right, y down, z forward. The calibrated road
frame is the device frame rotated by liveCalibration.rpyCalib ("device_from_calib" euler angles); the road
lies at z = camera height (about 1.22 m). Pixel coordinates are pixel indices: pixel (i, j) sits at (x=i, y=j),
and a camera's principal point is (w/2, h/2) as in openpilot's intrinsics. This module is the one place that
projects the road into a camera: warps and the scene renderer both go through camera_from_calib.
"""
from collections.abc import Iterable
from dataclasses import dataclass
import numpy as np
from modelrt.constants import DM_WIDTH, DM_HEIGHT

@dataclass(frozen=True)
class CameraConfig:
  width: int
  height: int
  focal_length: float

  @property
  def intrinsics(self) -> np.ndarray:
    return np.array([[self.focal_length, 0, self.width / 2], [0, self.focal_length, self.height / 2], [0, 0, 1]], dtype=np.float32)

def _sensor(width: int, height: int, road_fl: float, wide_fl: float) -> dict[str, CameraConfig]:
  wide = CameraConfig(width, height, wide_fl)
  return {'road': CameraConfig(width, height, road_fl), 'wide': wide, 'driver': wide}

# sensor -> camera ('road', 'wide', 'driver') -> geometry. comma 3/3X sensors; os04c10 is binned to half its
# 2688x1520 resolution, so its focal lengths are 3/4 of the 1928x1208 ones at the same field of view.
SENSORS: dict[str, dict[str, CameraConfig]] = {
  'ar0231': _sensor(1928, 1208, 2648.0, 567.0),
  'ox03c10': _sensor(1928, 1208, 2648.0, 567.0),
  'os04c10': _sensor(1344, 760, 1522.0 * 3 / 4, 567.0 * 3 / 4),
}

def camera_config(sensor: str, camera: str) -> CameraConfig:
  if sensor not in SENSORS: raise KeyError(f"unknown sensor {sensor!r}, known sensors: {', '.join(sorted(SENSORS))}")
  if camera not in SENSORS[sensor]: raise KeyError(f"unknown camera {camera!r} for sensor {sensor!r}, known: {', '.join(SENSORS[sensor])}")
  return SENSORS[sensor][camera]

CAM_HEIGHT = 1.22   # m, a typical camera height above the road: the scenes' default, the reference model's and the overlay's
                    # assumption when no liveCalibration height is known
VIEW_FROM_DEVICE = np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=np.float64)

def _intrinsics(fl: float, cx: float, cy: float) -> np.ndarray: return np.array([[fl, 0, cx], [0, fl, cy], [0, 0, 1]], dtype=np.float64)
# model frames, 512x256 (the packed 6x128x256 input is this frame subsampled): road ("medmodel"), wide ("sbigmodel")
MEDMODEL_INTRINSICS = _intrinsics(910.0, 256.0, 47.6)
SBIGMODEL_INTRINSICS = _intrinsics(455.0, 256.0, 151.8)
# driver model input (1440x960): the 567-px driver camera at full scale, centred across and the bottom 960 of its
# 1208 rows down (openpilot's principal point (720, 356)), where the driver's face and body are
DM_INTRINSICS = _intrinsics(567.0, DM_WIDTH / 2, DM_HEIGHT / 2 - (1208 - DM_HEIGHT) / 2)

def rot_from_euler(rpy: Iterable[float]) -> np.ndarray:
  """Rz(yaw) @ Ry(pitch) @ Rx(roll): roll about x, then pitch about y, then yaw about z (extrinsic)."""
  r, p, y = (float(v) for v in rpy)
  cr, sr, cp, sp, cy, sy = np.cos(r), np.sin(r), np.cos(p), np.sin(p), np.cos(y), np.sin(y)
  rx = np.array([[1, 0, 0], [0, cr, -sr], [0, sr, cr]])
  ry = np.array([[cp, 0, sp], [0, 1, 0], [-sp, 0, cp]])
  rz = np.array([[cy, -sy, 0], [sy, cy, 0], [0, 0, 1]])
  return rz @ ry @ rx

def camera_from_calib(rpy: Iterable[float], cam: CameraConfig) -> np.ndarray:
  """3x3 (float64): a point in the calibrated road frame -> homogeneous camera pixel (divide by the last row)."""
  return cam.intrinsics.astype(np.float64) @ VIEW_FROM_DEVICE @ rot_from_euler(rpy)

def road_warp_matrix(rpy: Iterable[float], cam: CameraConfig, wide: bool = False) -> np.ndarray:
  """3x3 float32, model pixel of the full-res 512x256 model frame -> camera pixel (homogeneous)."""
  model_from_calib = (SBIGMODEL_INTRINSICS if wide else MEDMODEL_INTRINSICS) @ VIEW_FROM_DEVICE
  return (camera_from_calib(rpy, cam) @ np.linalg.inv(model_from_calib)).astype(np.float32)

def dm_warp_matrix(cam: CameraConfig) -> np.ndarray:
  """3x3 float32, driver model pixel (1440x960) -> driver camera pixel: the crop of DM_INTRINSICS, scaled by
  cam.focal_length / 567 so every sensor shows the model the field of the 567-px driver camera. For 1928x1208 at
  fl 567 it is the translation ((1928-1440)/2, 1208-960): the bottom rows. A smaller sensor's field (os04c10's 1344x760)
  ends above the model frame's last rows; dm_warp fills those. Calibration does not enter: the driver model takes
  rpyCalib as its own input."""
  return (cam.intrinsics.astype(np.float64) @ np.linalg.inv(DM_INTRINSICS)).astype(np.float32)
