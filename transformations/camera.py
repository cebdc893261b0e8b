"""The cameras: each sensor's geometry, which sensor a stream is, and the projection of the calibrated road frame into
a camera's pixels (camera_from_calib: the one place that projects the road, for the warps and the scene renderer)."""
from collections.abc import Iterable
from dataclasses import dataclass
import numpy as np

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
DEFAULT_SENSOR = 'ar0231'
CAM_HEIGHT = 1.22   # m, a typical camera height above the road: the scenes' default, the reference model's and the overlay's
                    # assumption when no liveCalibration height is known
VIEW_FROM_DEVICE = np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], dtype=np.float64)

def camera_config(sensor: str, camera: str) -> CameraConfig:
  if sensor not in SENSORS: raise KeyError(f"unknown sensor {sensor!r}, known sensors: {', '.join(sorted(SENSORS))}")
  if camera not in SENSORS[sensor]: raise KeyError(f"unknown camera {camera!r} for sensor {sensor!r}, known: {', '.join(SENSORS[sensor])}")
  return SENSORS[sensor][camera]

def sensor_name(msg_sensor: str, override: str | None, size: tuple[int, int] | None = None) -> str:
  """The camera sensor: the CLI override, else the camera-state message's, else the first sensor whose cameras have
  the stream's size (width, height), else DEFAULT_SENSOR. By size, as openpilot's driver model picks its geometry:
  a 1344x760 stream before its first camera-state message is the os04c10's, not a scaled ar0231."""
  if override: return override
  if msg_sensor in SENSORS: return msg_sensor
  return next((s for s, cams in SENSORS.items() if size and (cams['road'].width, cams['road'].height) == tuple(size)), DEFAULT_SENSOR)

def camera_for(sensor: str, camera: str, width: int, height: int, base: CameraConfig | None = None) -> CameraConfig:
  """The camera geometry of a stream of width x height: `base` (a scene's own camera), else the sensor's. A stream
  smaller or larger than that camera (scaled output) keeps its field of view: the focal length scales with the width."""
  cam = base or camera_config(sensor, camera)
  if (cam.width, cam.height) == (width, height): return cam
  return CameraConfig(width, height, cam.focal_length * width / cam.width)

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
