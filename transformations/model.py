"""The model frames (road and wide 512x256, driver 1440x960) and the warp matrices from them into a camera's pixels."""
from collections.abc import Iterable
import numpy as np
from transformations.camera import CameraConfig, VIEW_FROM_DEVICE, camera_from_calib

MODEL_WIDTH, MODEL_HEIGHT = 512, 256   # road and wide: the packed 6x128x256 input is this frame subsampled
DM_WIDTH, DM_HEIGHT = 1440, 960        # the driver model's Y plane

def _intrinsics(fl: float, cx: float, cy: float) -> np.ndarray: return np.array([[fl, 0, cx], [0, fl, cy], [0, 0, 1]], dtype=np.float64)
MEDMODEL_INTRINSICS = _intrinsics(910.0, 256.0, 47.6)     # road
SBIGMODEL_INTRINSICS = _intrinsics(455.0, 256.0, 151.8)   # wide road
# the 567-px driver camera at full scale, centred across and the bottom 960 of its 1208 rows down (openpilot's principal
# point (720, 356)), where the driver's face and body are
DM_INTRINSICS = _intrinsics(567.0, DM_WIDTH / 2, DM_HEIGHT / 2 - (1208 - DM_HEIGHT) / 2)

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
