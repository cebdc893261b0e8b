"""The reference models against the synthetic scenes' ground truth, run as the daemons run them (tests/evaluate.py:
render -> RoadRunner / DMRunner on the daemons' artifact, with the scene's calibration -> parsers -> compare), and the
artifact's replays against the models' eager functions. The daemons' end-to-end accuracy tests run the same models
through real processes and sockets."""
import numpy as np
import pytest
from tinygrad import Tensor
from camerad.render import SceneRenderer
from camerad.scene import load_scene, parse_scene
from modelrt.constants import X_IDXS, T_IDXS
from modelrt.contracts import ROAD_V0_11_1
from transformations.model import dm_warp_matrix, road_warp_matrix
from modelrt.reference import vision_model, policy_model, dm_model
from modelrt.runner import host_tensor
from dmonitoringd.policy import face_pose
from modelrt.warp import dm_warp_np, road_warp_np
from msgq.visionipc.layout import NV12Layout
from tests.evaluate import run_road, run_dm, scene_artifacts
from modelrt.reference.road import PLAN_TAU

NEAR = (X_IDXS >= 10) & (X_IDXS <= 50)
PLAN = ROAD_V0_11_1.plan

@pytest.fixture(scope='module')
def road():
  """Parsed outputs for a few frames of each road scene (module-scoped: rendered and run once), each frame after every
  frame before it, as a daemon sees a camera."""
  def go(name, frames, calib=None): return run_road(load_scene(name), frames, calib)
  return {'straight': go('straight', range(8, 13)), 'curve': go('curve', range(36, 46)),
          'curve_uncalibrated': go('curve', range(44, 46), calib=(0.0, 0.0, 0.0)), 'lead': go('lead_braking', range(6, 80, 9))}

def lane_errors(r: dict) -> np.ndarray:
  """Max |error| over 10..50 m of the ego left and right lines."""
  truth = np.array([l['y'] for l in r['truth']['road']['lane_lines']])
  return np.abs(r['lane_lines'][1:3, :, 0] - truth[1:3])[:, NEAR].max(1)

def test_the_artifacts_replay_the_models_bit_for_bit():
  """What the evaluation runs, the models compiled into the daemons' artifacts, on a scene's frames: every replay equals
  its model's eager function bit for bit (modeld-compile checks random inputs, to a tolerance that BEAM builds need)."""
  sc = load_scene('lead_braking')
  arts = scene_artifacts(sc)
  def frame(camera: str, i: int) -> np.ndarray:
    cam = sc.cameras[camera]
    layout = NV12Layout.packed(cam.width, cam.height)
    buf = SceneRenderer(sc, camera, layout).render(i)
    if camera == 'driver': return dm_warp_np(buf, dm_warp_matrix(cam), layout)
    return road_warp_np(buf, road_warp_matrix(sc.calib, cam, wide=camera == 'wide'), layout)
  img, big_img = (np.concatenate([frame(c, 20), frame(c, 24)])[None] for c in ('road', 'wide'))
  vision = arts['road'].models['vision'].run({'img': Tensor(img, device='CPU').realize(), 'big_img': Tensor(big_img, device='CPU').realize()})
  np.testing.assert_array_equal(vision, vision_model().fn(img=Tensor(img), big_img=Tensor(big_img)).numpy()[0])
  features, desire = (np.zeros(ROAD_V0_11_1.policy.inputs[k].shape, np.float32) for k in ('features_buffer', 'desire_pulse'))
  features[0, -1] = vision[arts['road'].output_slices('vision')['hidden_state']]
  traffic = np.array([[1, 0]], np.float32)
  policy = arts['road'].models['policy'].run({k: host_tensor(v) for k, v in
                                            (('features_buffer', features), ('desire_pulse', desire), ('traffic_convention', traffic))})
  eager = policy_model().fn(features_buffer=Tensor(features), desire_pulse=Tensor(desire), traffic_convention=Tensor(traffic))
  np.testing.assert_array_equal(policy, eager.numpy()[0])
  input_img, calib = frame('driver', 30), np.array([sc.calib], np.float32)
  dm = arts['dm'].models['dm'].run({'input_img': Tensor(input_img, device='CPU').realize(), 'calib': host_tensor(calib)})
  np.testing.assert_array_equal(dm, dm_model().fn(input_img=Tensor(input_img), calib=Tensor(calib)).numpy()[0])

@pytest.mark.parametrize("scene", ["straight", "curve"])
def test_ego_lane_lines(road, scene):
  for r in road[scene]:
    assert lane_errors(r).max() < 0.15, (r['frame'], lane_errors(r))
    assert (r['lane_lines_prob'][1::2][1:3] > 0.9).all()   # per line (absent, present)
    assert (r['lane_lines_std'][1:3, NEAR, 0] < 0.5).all()
    np.testing.assert_allclose(r['lane_lines'][:, :, 1], r['truth']['road']['z'], atol=1e-6)
  # the adjacent lines of the 3-lane road and the road edges are found too, a little less precisely
  for r in road[scene]:
    truth = np.array([l['y'] for l in r['truth']['road']['lane_lines']])
    assert np.abs(r['lane_lines'][[0, 3], :, 0] - truth[[0, 3]])[:, NEAR].max() < 0.15
    edges = np.array([e['y'] for e in r['truth']['road']['road_edges']])
    assert np.abs(r['road_edges'][:, :, 0] - edges)[:, NEAR].max() < 0.25

def test_wrong_calibration_misses_the_lanes(road):
  # the same frames warped as if the camera were mounted straight: the lines land elsewhere in the model frame
  for r in road['curve_uncalibrated']: assert lane_errors(r).max() > 0.3

def test_lead(road):
  for r in road['straight']: assert r['lead_prob'][0] < 0.1
  for r in road['lead']:
    lead = r['truth']['lead']
    assert lead['present'] and 10 <= lead['x'] <= 80
    assert r['lead_prob'][0] > 0.9
    assert abs(r['lead'][0, 0, 0] - lead['x']) < 0.1 * lead['x'], (r['frame'], r['lead'][0, 0, 0], lead['x'])
    assert abs(r['lead'][0, 0, 1] - lead['y']) < 0.3
    assert r['lead_std'][0, 0, 0] < 0.1 * lead['x']

def test_plan_follows_the_lane(road):
  for r in road['curve'][-3:]:
    truth, plan = r['truth'], r['plan']
    v = plan[0, PLAN['velocity']][0]
    assert abs(v - truth['v_ego']) < 0.1 * truth['v_ego']          # speed from the dashes' motion
    assert abs(r['pose'][0] - truth['v_ego']) < 0.1 * truth['v_ego'] and r['pose_std'][0] < 2
    # the plan's path lies on the lane centre (it starts at the ego, 0.2 m off centre, and converges)
    centre = np.mean([l['y'] for l in truth['road']['lane_lines'][1:3]], axis=0)
    x, y = plan[:, PLAN['position']][:, 0], plan[:, PLAN['position']][:, 1]
    sel = (x >= 10) & (x <= 50)
    assert sel.sum() >= 3 and np.abs(y[sel] - np.interp(x[sel], X_IDXS, centre)).max() < 0.35
    # once back on the centre the path turns at the road's curvature: yaw rate / v
    k = truth['road']['curvature']
    assert abs(np.interp(5.0, T_IDXS, plan[:, PLAN['orientationRate']][:, 2]) / v - k) < 0.1 * k
    # openpilot's action, curvature = 2*yaw/(v*t) - yaw_rate/v at the lateral action time: the road's curvature
    # plus the turn back to the centre (a = centre offset, y_merge(t) = -a*exp(-t/tau))
    t, a = 0.5, -truth['road']['ego_offset']
    yaw = np.interp(t, T_IDXS, plan[:, PLAN['orientation']][:, 2])
    yaw_rate = np.interp(t, T_IDXS, plan[:, PLAN['orientationRate']][:, 2])
    e = np.exp(-t / PLAN_TAU)
    merge = 2 * a * e / (PLAN_TAU * v * v * t) + a * e / (PLAN_TAU ** 2 * v * v)
    assert abs(2 * yaw / (v * t) - yaw_rate / v - (k + merge)) < 0.15 * k
    assert r['desire_state'].argmax() == 0
    assert np.isfinite(r['plan_std']).all() and (r['plan_std'] > 0).all()

def test_honest_uncertainty(road):
  r = road['straight'][-1]
  assert (r['pose_std'][3:] >= 0.099).all() and (r['road_transform_std'] >= 0.99).all() and (r['wide_from_device_euler_std'] >= 0.049).all()
  # beyond the visible range (the far end of X_IDXS) and below it (x < 5 m) the stds grow
  std = r['lane_lines_std'][1, :, 0]
  assert std[-1] > 5 * std[NEAR].max() and std[0] > std[NEAR].max()

@pytest.fixture(scope='module')
def dm():
  def go(scene, frames): return run_dm(scene, frames)
  rhd = parse_scene({'duration': 1.0, 'driver': {'wheel': 'right', 'face': {'x': 0.6}}}, 'rhd')
  return {'blinking': go(load_scene('driver_blinking'), range(0, 60, 2)), 'distracted': go(load_scene('driver_distracted'), range(0, 60, 4)),
          'rhd': go(rhd, range(2))}

def test_face_position(dm):
  for r in [*dm['blinking'], *dm['distracted']]:
    face = r['truth']['driver']['face']
    got = r['lhd']['face_position']
    assert r['lhd']['face_prob'] > 0.9 and r['rhd']['face_prob'] < 0.1 and r['wheel_on_right_prob'] < 0.1
    # within 5% of the image width, in pixels of the model input
    assert np.hypot(*((got - face['position']) * (1440, 960))) < 0.05 * 1440, (r['frame'], got, face['position'])

def test_blink_detected(dm):
  rs = dm['blinking']
  closed = np.array([r['truth']['driver']['eyes_closed'] for r in rs])
  assert 0 < closed.sum() < len(rs)
  right = [(r['lhd']['left_blink_prob'] > 0.5 and r['lhd']['right_blink_prob'] > 0.5) == c and r['lhd']['left_eye_prob'] > 0.5   # visible, open or closed
           for r, c in zip(rs, closed)]
  assert np.mean(right) >= 0.95, right

def test_phone_and_orientation(dm):
  rs = dm['distracted']
  phone = np.array([r['truth']['driver']['phone'] for r in rs])
  got = np.array([r['lhd']['using_phone_prob'] > 0.5 for r in rs])
  assert 0 < phone.sum() < len(rs) and np.mean(got == phone) >= 0.95
  for r in rs:   # openpilot's monitoring reads the orientation as the driver's view of the road: the scene's turn, negated
    f, (_, cal_pitch, cal_yaw) = r['truth']['driver']['face'], r['truth']['calib']
    pitch, yaw = face_pose(r['lhd']['face_orientation'], r['lhd']['face_position'], r['truth']['calib'])
    assert abs(pitch + cal_pitch + f['pitch']) < 0.1 and abs(yaw + cal_yaw + f['yaw']) < 0.1, (r['frame'], pitch, yaw, f)

def test_right_hand_drive(dm):
  for r in dm['rhd']:
    assert r['wheel_on_right_prob'] > 0.9 and r['rhd']['face_prob'] > 0.9 and r['lhd']['face_prob'] < 0.1
    assert abs(r['rhd']['face_position'][0] - r['truth']['driver']['face']['position'][0]) < 0.05
