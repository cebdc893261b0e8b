import numpy as np
import pytest
from transformations.camera import SENSORS, VIEW_FROM_DEVICE, CameraConfig, camera_config, rot_from_euler, camera_from_calib
from transformations.model import (DM_WIDTH, DM_HEIGHT, MODEL_WIDTH, MODEL_HEIGHT, MEDMODEL_INTRINSICS, SBIGMODEL_INTRINSICS,
                                   road_warp_matrix, dm_warp_matrix)

CAM = camera_config('ox03c10', 'road')
RPY = (0.02, -0.035, 0.015)   # a real-looking calibration: roll, pitch, yaw (rad)

def project(P: np.ndarray, pt) -> np.ndarray:
  h = P @ np.asarray(pt, dtype=np.float64)
  return h[:2] / h[2]

def test_intrinsics_table():
  assert CAM == CameraConfig(1928, 1208, 2648.0)
  np.testing.assert_array_equal(CAM.intrinsics, [[2648, 0, 964], [0, 2648, 604], [0, 0, 1]])
  assert CAM.intrinsics.dtype == np.float32
  assert camera_config('ar0231', 'wide').focal_length == camera_config('ox03c10', 'driver').focal_length == 567
  os = SENSORS['os04c10']
  assert (os['road'].width, os['road'].height, os['road'].focal_length, os['wide'].focal_length) == (1344, 760, 1141.5, 425.25)
  with pytest.raises(KeyError, match="known sensors: ar0231, os04c10, ox03c10"): camera_config('imx999', 'road')
  with pytest.raises(KeyError, match="known: road, wide, driver"): camera_config('ar0231', 'rear')

def test_rot_from_euler():
  R = rot_from_euler(RPY)
  np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-12)
  assert np.linalg.det(R) == pytest.approx(1.0)
  r, p, y = RPY
  np.testing.assert_allclose(R, rot_from_euler((0, 0, y)) @ rot_from_euler((0, p, 0)) @ rot_from_euler((r, 0, 0)), atol=1e-12)
  # right-handed, z down: positive yaw turns x (ahead) towards y (right); positive pitch turns x towards -z (up)
  np.testing.assert_allclose(rot_from_euler((0, 0, np.pi / 2)) @ [1, 0, 0], [0, 1, 0], atol=1e-12)
  np.testing.assert_allclose(rot_from_euler((0, np.pi / 2, 0)) @ [1, 0, 0], [0, 0, -1], atol=1e-12)
  np.testing.assert_allclose(rot_from_euler((np.pi / 2, 0, 0)) @ [0, 1, 0], [0, 0, 1], atol=1e-12)

def test_road_point_projection():
  P = camera_from_calib((0, 0, 0), CAM)
  # straight ahead at infinity -> principal point; a road point 20 m ahead, 1.22 m below, 2 m right
  np.testing.assert_allclose(project(P, [1, 0, 0]), [964, 604])
  np.testing.assert_allclose(project(P, [20, 2, 1.22]), [964 + 2648 * 2 / 20, 604 + 2648 * 1.22 / 20])
  # calibration pitch -0.01 (the road's forward points 0.01 rad below the device's): vanishing point fl*tan(0.01) lower
  u, v = project(camera_from_calib((0, -0.01, 0), CAM), [1, 0, 0])
  assert u == pytest.approx(964) and v == pytest.approx(604 + 2648 * np.tan(0.01))
  # the inverse maps the pixel back onto the road ray
  ray = np.linalg.inv(camera_from_calib(RPY, CAM)) @ np.array([*project(camera_from_calib(RPY, CAM), [20, 2, 1.22]), 1])
  np.testing.assert_allclose(ray / ray[0] * 20, [20, 2, 1.22], atol=1e-9)

@pytest.mark.parametrize("wide,K", [(False, MEDMODEL_INTRINSICS), (True, SBIGMODEL_INTRINSICS)])
def test_road_warp_matrix_vanishing_point(wide, K):
  cam = camera_config('ox03c10', 'wide' if wide else 'road')
  M = road_warp_matrix(RPY, cam, wide=wide)
  assert M.dtype == np.float32 and M.shape == (3, 3)
  # the model frame's principal point is the calibrated vanishing point: it maps to where the camera sees calib-forward
  np.testing.assert_allclose(project(M, [K[0, 2], K[1, 2], 1]), project(camera_from_calib(RPY, cam), [1, 0, 0]), atol=1e-3)
  # any road point: model pixel of it -> camera pixel of it
  pt = [30, -1.5, 1.22]
  np.testing.assert_allclose(project(M, [*project(K @ VIEW_FROM_DEVICE, pt), 1]), project(camera_from_calib(RPY, cam), pt), atol=2e-3)
  # without calibration the warp is the intrinsics ratio: a scale about the principal points
  s = cam.focal_length / K[0, 0]
  np.testing.assert_allclose(road_warp_matrix((0, 0, 0), cam, wide) / road_warp_matrix((0, 0, 0), cam, wide)[2, 2],
                             [[s, 0, cam.width / 2 - s * K[0, 2]], [0, s, cam.height / 2 - s * K[1, 2]], [0, 0, 1]], atol=1e-4)
  assert MODEL_WIDTH == 2 * K[0, 2] and MODEL_HEIGHT == 256

def test_dm_warp_matrix():
  # openpilot's driver model frame: principal point (720, 356), the bottom 960 rows of the 1208-row camera
  np.testing.assert_allclose(dm_warp_matrix(camera_config('ox03c10', 'driver')), [[1, 0, (1928 - 1440) / 2], [0, 1, 1208 - 960], [0, 0, 1]])
  cam = camera_config('os04c10', 'driver')
  M = dm_warp_matrix(cam)
  # the model frame's principal point lands on the camera's, scaled to the same field of view: across, the crop fits
  # the sensor; down, the model frame reaches past its last row
  np.testing.assert_allclose(project(M, [DM_WIDTH / 2, 356, 1]), [cam.width / 2, cam.height / 2])
  corners = np.array([project(M, [x, y, 1]) for x in (0, DM_WIDTH) for y in (0, DM_HEIGHT)])
  assert M[0, 0] == pytest.approx(0.75) and corners.min() >= 0 and corners[:, 0].max() <= cam.width and corners[:, 1].max() > cam.height
