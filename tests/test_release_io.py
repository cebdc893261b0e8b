"""openpilot v0.11.1's model I/O through the real daemons. ONNX models with the release's exact inputs, output widths
and output_slices metadata (tests/onnx_models.py: known outputs plus a few exact taps on the inputs) are built by
modeld-compile and run by modeld and dmonitoringd against a real camera server and real sockets; every published
field is compared with the value computed here by hand from the release's rules (indices written out, not taken
from the code under test)."""
import collections
import numpy as np
import pytest
from cereal import messaging
from msgq.visionipc import ROAD, WIDE_ROAD, DRIVER
from tests.artifacts import CACHE, LAYOUT, build
from tests.daemon_harness import Camera, Collector, start_daemon
from tests.onnx_models import KNOWN, KNOWN_SLICES, Y_BIAS, Y_SCALE, HISTORY_OUT, PULSE_OUT, TRAFFIC_WEIGHTS

OUTPUTS = ['modelV2', 'drivingModelData', 'cameraOdometry']
T_IDXS = [10 * (i / 32) ** 2 for i in range(33)]
X_IDXS = [192 * (i / 32) ** 2 for i in range(33)]
V_EGO, LAT_DELAY = 20., 0.3
LAST, SKIPPED = 86, 50                 # frames 1..LAST; frame SKIPPED never comes, so the next one only prepares
BLINKER_FROM, RHD_FROM = 60, 70        # left blinker and a nudge to the left; then a right-hand-drive car
N_VISION = KNOWN['vision'].size
CAR = ['liveCalibration', 'carState', 'carControl', 'liveDelay', 'driverMonitoringState']   # what the test sends modeld every frame

def sigmoid(x): return 1 / (1 + np.exp(np.minimum(-np.asarray(x, np.float64), 11)))   # openpilot's: exp clamped at 11
def softmax(x): return np.exp(x - np.max(x, -1, keepdims=True)) / np.exp(x - np.max(x, -1, keepdims=True)).sum(-1, keepdims=True)
def close(got, want, rtol=1e-5, atol=1e-6): np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=rtol, atol=atol)

# camera brightness per frame: road Y drives meta[6] (hard brake 5 m/s^2, 2 s), wide Y meta[4] (3 m/s^2, 2 s):
# 128 -> 0.5, 96 -> 0.119, 64 -> 0.018 and 160 -> 0.88; road U goes into hidden_state (history)
def road_y(n: int) -> int: return {20: 96, 21: 96, 40: 64}.get(n, 128)
def wide_y(n: int) -> int: return {30: 128}.get(n, 160)
def road_u(n: int) -> int: return (37 * n) % 251

def image(y: int, u: int) -> np.ndarray:
  img = np.full(LAYOUT.size, 77, np.uint8)   # V
  img[:LAYOUT.uv_offset] = y
  img[LAYOUT.uv_offset::2] = u
  return img

@pytest.fixture(scope='module')
def artifacts(): return build(CACHE.parent / 'tiny', models='tiny')

@pytest.fixture(scope='module')
def road(artifacts):
  """modeld on frames 1..LAST: {frame id: (modelV2, drivingModelData, cameraOdometry)}."""
  cam = Camera({ROAD: LAYOUT, WIDE_ROAD: LAYOUT})
  pm = messaging.PubMaster(CAR)   # before modeld subscribes: every message reaches it
  d, notify = start_daemon('modeld', artifacts, '--raw-predictions', '--stats-interval', '0')   # a STATUS= line per loop turn
  col, out = Collector(OUTPUTS), {}
  try:
    for n in range(1, LAST + 1):
      msgs = {s: messaging.new_message(s) for s in CAR}
      msgs['liveCalibration'].liveCalibration.rpyCalib = [0., 0.02, -0.01]
      cs = msgs['carState'].carState
      cs.vEgo = V_EGO
      cs.leftBlinker = cs.steeringPressed = n >= BLINKER_FROM
      cs.steeringTorque = 1. if n >= BLINKER_FROM else 0.
      msgs['carControl'].carControl.latActive = True
      msgs['liveDelay'].liveDelay.lateralDelay = LAT_DELAY
      msgs['driverMonitoringState'].driverMonitoringState.isRHD = n >= RHD_FROM
      for s, m in msgs.items(): pm.send(s, m)
      if n == SKIPPED: continue
      cam.images[ROAD], cam.images[WIDE_ROAD] = image(road_y(n), road_u(n)), image(wide_y(n), 128)
      cam.send(n)
      if n == SKIPPED + 1:   # publishes nothing
        notify.wait_count('prepare_only', 1)
        assert notify.count('dropped') == 1
      else: out[n] = tuple(col.wait(s, len(col.msgs[s]) + 1)[-1] for s in OUTPUTS)
  finally:
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close(); pm.close()
  assert rc == 0 and 'Traceback' not in d.stderr()
  assert all(getattr(e, s).frameId == n for n, es in out.items() for s, e in zip(OUTPUTS, es))
  return out

def _mdn(raw, shape):   # means, then log-stds
  n = raw.size // 2
  return raw[:n].reshape(shape), np.exp(raw[n:]).reshape(shape)

def test_every_constant_field(road):
  v, p = KNOWN_SLICES['vision'], KNOWN_SLICES['policy']
  plan, plan_std = _mdn(p['plan'], (33, 15))
  lines, line_std = _mdn(v['lane_lines'], (4, 33, 2))
  edges, edge_std = _mdn(v['road_edges'], (2, 33, 2))
  lead, lead_std = _mdn(v['lead'], (3, 6, 4))
  meta = sigmoid(v['meta'])
  assert all(e[0].valid for e in list(road.values())[3:])   # calibration seen
  for n, (mv2_ev, dmd_ev, odo_ev) in road.items():
    m, dmd, odo = mv2_ev.modelV2, dmd_ev.drivingModelData, odo_ev.cameraOdometry
    # plan: position with stds, velocity, acceleration, orientation, orientation rate without
    for name, cols in (('position', slice(0, 3)), ('velocity', slice(3, 6)), ('acceleration', slice(6, 9)), ('orientation', slice(9, 12)),
                       ('orientationRate', slice(12, 15))):
      f = getattr(m, name)
      close(f.t, T_IDXS)
      close([f.x, f.y, f.z], plan[:, cols].T)
      if name == 'position': close([f.xStd, f.yStd, f.zStd], plan_std[:, cols].T)
      else: assert len(f.xStd) == len(f.yStd) == len(f.zStd) == 0
    close(dmd.path.xCoefficients, np.polynomial.polynomial.polyfit(T_IDXS, plan[:, 0], 4), rtol=1e-4, atol=1e-4)
    close(dmd.path.yCoefficients, np.polynomial.polynomial.polyfit(T_IDXS, plan[:, 1], 4), rtol=1e-4, atol=1e-4)
    # lane lines and road edges on X_IDXS with no times; the probabilities are the odd entries of lane_lines_prob
    for got, want, std, got_std in ((m.laneLines, lines, line_std, m.laneLineStds), (m.roadEdges, edges, edge_std, m.roadEdgeStds)):
      assert len(got) == len(want)
      for g, w in zip(got, want):
        assert len(g.t) == 0
        close(g.x, X_IDXS); close(g.y, w[:, 0]); close(g.z, w[:, 1])
      close(got_std, std[:, 0, 0])
    close(m.laneLineProbs, sigmoid(v['lane_lines_prob'][[1, 3, 5, 7]]))
    llm = dmd.laneLineMeta
    close([llm.leftY, llm.rightY, llm.leftProb, llm.rightProb], [lines[1, 0, 0], lines[2, 0, 0], *sigmoid(v['lane_lines_prob'][[3, 5]])])
    # leads: one per time offset 0, 2, 4 s, each a trajectory over 0..10 s
    assert len(m.leadsV3) == 3
    for i, l in enumerate(m.leadsV3):
      close([l.probTime, l.prob], [2. * i, sigmoid(v['lead_prob'][i])])
      close(l.t, [0, 2, 4, 6, 8, 10])
      close([l.x, l.y, l.v, l.a], lead[i].T)
      close([l.xStd, l.yStd, l.vStd, l.aStd], lead_std[i].T)
    # meta, interleaved: engaged at 0; from 1 in steps of 6 (2..10 s) gas, brake, steer, brake 3, 4, 5 m/s^2;
    # from 31 in steps of 4 (0..10 s) gas press, brake press (then the blinkers, not published)
    mm, dp = m.meta, m.meta.disengagePredictions
    close(mm.engagedProb, meta[0])
    close(dp.t, [2, 4, 6, 8, 10])
    close(dp.gasDisengageProbs, meta[[1, 7, 13, 19, 25]])
    close(dp.brakeDisengageProbs, meta[[2, 8, 14, 20, 26]])
    close(dp.steerOverrideProbs, meta[[3, 9, 15, 21, 27]])
    close(dp.brake3MetersPerSecondSquaredProbs, [sigmoid(Y_BIAS + Y_SCALE * wide_y(n)), *meta[[10, 16, 22, 28]]])
    close(dp.brake4MetersPerSecondSquaredProbs, meta[[5, 11, 17, 23, 29]])
    close(dp.brake5MetersPerSecondSquaredProbs, [sigmoid(Y_BIAS + Y_SCALE * road_y(n)), *meta[[12, 18, 24, 30]]])
    close(dp.gasPressProbs, meta[[31, 35, 39, 43, 47, 51]])
    close(dp.brakePressProbs, meta[[32, 36, 40, 44, 48, 52]])
    close(mm.desireState, softmax(p['desire_state']))
    close(mm.desirePrediction, softmax(v['desire_pred'].reshape(4, 8)).ravel())
    assert len(m.temporalPose.trans) == len(m.temporalPose.rot) == 0   # these models have no pose over time
    # cameraOdometry
    pose, pose_std = _mdn(v['pose'], (6,))
    wide, wide_std = _mdn(v['wide_from_device_euler'], (3,))
    rt, rt_std = _mdn(v['road_transform'], (6,))
    close([odo.trans, odo.rot, odo.transStd, odo.rotStd], [pose[:3], pose[3:], pose_std[:3], pose_std[3:]])
    close([odo.wideFromDeviceEuler, odo.wideFromDeviceEulerStd, odo.roadTransformTrans, odo.roadTransformTransStd], [wide, wide_std, rt[:3], rt_std[:3]])

def test_hard_brake_needs_five_and_two_frames_over_their_thresholds(road):
  q5, q3, want = collections.deque([0.] * 5, 5), collections.deque([0.] * 2, 2), {}
  for n in road:   # kept per published frame, oldest first
    q5.append(sigmoid(Y_BIAS + Y_SCALE * road_y(n)))
    q3.append(sigmoid(Y_BIAS + Y_SCALE * wide_y(n)))
    want[n] = bool(all(np.array(q5) > [.05, .05, .15, .15, .15]) and all(np.array(q3) > [.7, .7]))
    if n == 24: assert want[n] and all(0.05 < x < 0.15 for x in list(q5)[:2])   # only the older two may be that low
  assert {n: e[0].modelV2.meta.hardBrakePredicted for n, e in road.items()} == want
  assert not want[20] and not want[30] and not want[31] and want[32] and not want[44] and want[45]

def test_confidence_every_2_s_from_the_disengage_predictions(road):
  meta = sigmoid(KNOWN_SLICES['vision']['meta'])
  brake, gas, steer = meta[[2, 8, 14, 20, 26]], meta[[1, 7, 13, 19, 25]], meta[[3, 9, 15, 21, 27]]
  any_dis = 1 - (1 - brake) * (1 - gas) * (1 - steer)
  ind = [any_dis[0], *np.diff(any_dis) / (1 - any_dis[:-1])]
  buf, want = np.zeros(25), {}
  for n in road:
    if n % 40 == 0: buf = np.r_[buf[5:], ind]
    score = np.mean([buf[5 * i + 4 - i] for i in range(5)])
    want[n] = 'green' if score < 0.01165 else 'yellow' if score < 0.06157 else 'red'
  assert {n: str(e[0].modelV2.confidence) for n, e in road.items()} == want
  assert [want[n] for n in (39, 40, 79, 80)] == ['green', 'yellow', 'yellow', 'red']

def test_action_from_the_plan(road):
  p = KNOWN_SLICES['policy']['plan'][:33 * 15].reshape(33, 15).astype(np.float64)
  lat_t, long_t = LAT_DELAY + 0.075, 0.15 + 0.3 + 0.075   # both past the 0.3 s the plan is read at least
  accel_raw = 2 * (np.interp(long_t, T_IDXS, p[:, 3]) - p[0, 3]) / long_t - p[0, 6]   # -1: the plan brakes at 1 m/s^2
  curvature = 2 * np.interp(lat_t, T_IDXS, p[:, 11]) / (V_EGO * lat_t) - p[0, 14] / V_EGO
  alpha, accel = 1 - np.exp(-0.05 / 0.3), 0.
  first_valid = min(n for n, e in road.items() if e[0].valid)
  for n, (mv2, dmd, _) in road.items():
    accel = alpha * accel_raw + (1 - alpha) * accel
    a = mv2.modelV2.action
    close(a.desiredAcceleration, accel)
    assert not a.shouldStop and a.to_dict() == dmd.drivingModelData.action.to_dict()
    if n > first_valid: close(a.desiredCurvature, curvature)   # carState and liveDelay went with the calibration
  close([accel_raw, curvature], [-1, 0.0005])

def test_history_and_inputs_as_the_release_feeds_them(road):
  raw = {n: np.frombuffer(e[0].modelV2.rawPredictions, np.float32) for n, e in road.items()}
  runs, received = list(road), [n for n in range(1, LAST + 1) if n != SKIPPED]   # the policy ran on, the camera sent
  hidden = {m: road_u(n) for m, n in enumerate(runs, 1)}                          # hidden_state[0] of the m-th run
  state = [str(e[0].modelV2.meta.laneChangeState) for e in road.values()]
  pulse_run = state.index('laneChangeStarting') + 2   # the desire is set after that run: the next one gets its rising edge
  assert state[pulse_run - 3] == 'preLaneChange' and runs[pulse_run - 1] > BLINKER_FROM
  assert all(str(e[0].modelV2.meta.laneChangeDirection) == 'left' for e in list(road.values())[pulse_run - 1:])
  traffic = []
  for m, n in enumerate(runs, 1):
    r = raw[n]
    # images: the newest road frame and the one 4 camera frames earlier (a frame that only prepared counts)
    i = received.index(n)
    assert r[1064] == road_u(n) and r[1065] == (road_u(received[i - 4]) if i >= 4 else 0)
    # features: 97 hidden states, every 4th, newest last
    close(r[N_VISION + HISTORY_OUT], sum((j + 1) * hidden.get(m - 96 + 4 * j, 0) for j in range(25)), rtol=0, atol=0)
    # desire: one pulse in a queue of 100, the policy sees the max over each block of 4 (laneChangeLeft: class 3)
    row = 99 - (m - pulse_run)
    desire = 4 * (row // 4 + 1) if m >= pulse_run and row >= 0 else 0
    traffic.append(r[N_VISION + PULSE_OUT] - desire)
  # traffic convention [1, 0] (LHD) until driverMonitoringState.isRHD, then [0, 1]
  switch = traffic.index(TRAFFIC_WEIGHTS[1])
  assert traffic == [TRAFFIC_WEIGHTS[0]] * switch + [TRAFFIC_WEIGHTS[1]] * (len(traffic) - switch) and runs[switch] in (RHD_FROM, RHD_FROM + 1)

def test_driver_state_both_sides(artifacts):
  cam = Camera({DRIVER: LAYOUT})
  cam.images[DRIVER] = image(90, 128)
  pm = messaging.PubMaster(['liveCalibration'])
  d, notify = start_daemon('dmonitoringd', artifacts, '--raw-predictions')
  col, rpy = Collector(['driverStateV2']), [0.01, 0.02, -0.03]
  try:
    for n in range(1, 21):
      cal = messaging.new_message('liveCalibration')
      cal.liveCalibration.rpyCalib = rpy
      pm.send('liveCalibration', cal)
      cam.send(n)
      ev = col.wait('driverStateV2', n)[-1]
      if np.allclose(np.frombuffer(ev.driverStateV2.rawPredictions, np.float32)[42:45], rpy): break   # the calib input, once seen
    else: raise AssertionError("liveCalibration.rpyCalib never reached the model's calib input")
  finally:
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close(); pm.close()
  assert rc == 0
  k, ds = KNOWN_SLICES['dm'], ev.driverStateV2
  assert ev.valid and ds.frameId == n
  close(ds.wheelOnRightProb, sigmoid(k['wheel_on_right'][0]))
  for side, got in (('lhd', ds.leftDriverData), ('rhd', ds.rightDriverData)):   # the driver on the left, on the right
    descs = k[f'face_descs_{side}']   # pitch, yaw, roll, x, y, size; then their log-stds
    close([got.faceOrientation, got.faceOrientationStd], [descs[0:3], np.exp(descs[6:9])])
    close([got.facePosition, got.facePositionStd], [descs[3:5], np.exp(descs[9:11])])
    close([got.faceProb, got.leftEyeProb, got.rightEyeProb, got.leftBlinkProb, got.rightBlinkProb, got.sunglassesProb, got.phoneProb, got.sleepProb],
          sigmoid([k[f'{p}_{side}'][0] for p in ('face_prob', 'left_eye_prob', 'right_eye_prob', 'left_blink_prob', 'right_blink_prob',
                                                 'sunglasses_prob', 'using_phone_prob', 'sleep_prob')]))
