"""The calibration both daemons take from liveCalibration: rpyCalib checked, the last good one kept."""
from __future__ import annotations
import logging
from collections.abc import Iterable
import numpy as np

log = logging.getLogger(__name__)
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
