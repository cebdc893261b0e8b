"""Model inputs from the car's messages that both daemons share: the checked calibration and the camera geometry."""
from __future__ import annotations
import logging
from collections.abc import Iterable
import numpy as np
from modelrt.geometry import CameraConfig, camera_config, SENSORS

log = logging.getLogger(__name__)
DEFAULT_SENSOR = 'ar0231'
MAX_CALIB_ANGLE = np.pi / 2   # rad: beyond this a "calibration" is a broken producer, not a mounted camera

class CalibrationError(ValueError): pass

def check_rpy(rpy: Iterable[float]) -> np.ndarray:
  a = np.asarray(list(rpy), np.float64)
  if a.shape != (3,) or not np.all(np.isfinite(a)) or np.any(np.abs(a) > MAX_CALIB_ANGLE):
    raise CalibrationError(f"liveCalibration.rpyCalib: expected 3 finite angles within +-{MAX_CALIB_ANGLE:.2f} rad, got {a.tolist()}")
  return a

class Calibration:
  """The last good rpyCalib. `valid` (what the outputs' valid flag needs): a good calibration arrived and the newest
  calibration message was good. A bad one keeps the last good angles but makes outputs invalid until a good one comes."""
  def __init__(self):
    self.rpy, self.valid, self.errors = np.zeros(3), False, 0

  def update(self, rpy: Iterable[float]) -> None:
    try: new = check_rpy(rpy)
    except CalibrationError as e:
      self.errors += 1
      if self.valid or self.errors == 1: log.error("CalibrationError: %s; outputs are invalid until a good calibration arrives", e)
      self.valid = False
      return
    if not self.valid and self.errors: log.info("calibration good again: %s", new.round(4).tolist())
    self.rpy, self.valid = new, True

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
