"""modeld: frame sync, drops, desire, action and messages as units; then the daemon as a real process against a real
camera server (VisionIPC shared memory), real pub/sub sockets and a real notify socket, as openpilot's daemon test."""
import logging, math, random, time
import numpy as np
import pytest
from cereal import messaging
from msgq import pub_sock
from msgq.visionipc import ROAD, WIDE_ROAD
from tests.artifacts import CACHE, LAYOUT, ALT_LAYOUT, UNSERVED_LAYOUT, build
from tests.daemon_harness import Camera, Collector, Daemon, Notify, beyond_base_install, start_daemon
from tests.onnx_models import SLICES, KNOWN
from modelrt.constants import T_IDXS
from modelrt.contracts import ROAD_V0_11_1
from modeld.main import FrameSync
from modeld.model import FrameDrops
from modeld.desire import DesireHelper, Desire
from modeld.fill_msgs import (Action, FrameInfo, PublishState, action_times, fill_model_msgs, fits_float32, get_action, path_coefficients,
                              hard_brake_predicted, update_confidence)
from modeld.model import RoadModel
from modeld_common.daemon import EX_CONFIG
from modeld_common.frame import FrameRun
from service import Stats
from modelrt.runner import RoadRunner, _output
from modeld.parse import parse_outputs
from transformations.camera import sensor_name, camera_for
from modelrt.calibration import Calibration, CalibrationError, check_rpy

OUTPUTS = ['modelV2', 'drivingModelData', 'cameraOdometry']

@pytest.fixture(scope='session')
def artifacts(): return build(CACHE.parent / 'tiny', models='tiny')

# ***** units *****

class F:
  """What the frame code reads of a camera frame besides its pixels."""
  def __init__(self, frame_id, sof_ms): self.frame_id, self.timestamp_sof, self.timestamp_eof = frame_id, int(sof_ms * 1e6), int(sof_ms * 1e6)

class _Recv:
  """A camera client's recv over a list of frames (None: that receive times out); records each receive's timeout."""
  def __init__(self, frames): self.frames, self.timeouts = list(frames), []
  def __call__(self, timeout_ms: int):
    self.timeouts.append(timeout_ms)
    return self.frames.pop(0) if self.frames else None

def test_sync_takes_main_ahead_then_extra_within_25ms():
  # main frames every 50 ms; extra has an old frame queued, then one 3 ms later than each main frame
  sync = FrameSync(_Recv([F(1, 50), F(2, 100)]), _Recv([F(7, 0), F(8, 53), F(9, 103)]), 100)
  main, extra, out_of_sync = sync.next()
  assert (main.frame_id, extra.frame_id, out_of_sync) == (1, 8, False)   # extra 7 was > 25 ms behind: skipped
  main, extra, _ = sync.next()
  assert (main.frame_id, extra.frame_id) == (2, 9)
  assert sync.next() is None   # no more main frames: nothing to run
  sync = FrameSync(_Recv([F(1, 50)]), _Recv([F(1, 38)]), 100)
  assert sync.next()[2]        # 12 ms apart: out of sync (logged, still run)
  sync = FrameSync(_Recv([F(1, 0), F(2, 50), F(3, 100)]), _Recv([F(3, 100)]), 100)
  sync.extra_sof = int(75e6)   # the last extra frame was at 75 ms: main frames up to 100 ms are not ahead of it
  assert [f.frame_id for f in sync.next()[:2]] == [3, 3]
  one = FrameSync(_Recv([F(4, 50)]), None, 100).next()
  assert one[0] is one[1] and not one[2]   # one camera: extra is main

def test_sync_keeps_the_main_frame_while_its_extra_frame_is_late():
  """An extra frame later than the receive timeout: the main frame waits for it (a lockstep camera sends the next frame
  only once this one is answered, so dropping it would stall both sides)."""
  sync = FrameSync(_Recv([F(5, 250)]), _Recv([None, F(5, 250)]), 100)
  assert sync.next() is None   # the extra receive timed out
  main, ext, out_of_sync = sync.next()
  assert (main.frame_id, ext.frame_id, out_of_sync) == (5, 5, False)

def test_sync_uses_a_close_main_frame_when_no_newer_one_comes():
  """Lockstep faster than 40 Hz: each frame under 25 ms after the last, the next only once this one is answered."""
  main = _Recv([F(1, 100), F(2, 112), None, F(3, 130), None])
  sync = FrameSync(main, _Recv([F(1, 100), F(2, 112), F(3, 130)]), 100)
  assert [f.frame_id for f in sync.next()[:2]] == [1, 1]
  assert [f.frame_id for f in sync.next()[:2]] == [2, 2]   # main 2 is 12 ms ahead; no main frame after it in time
  assert [f.frame_id for f in sync.next()[:2]] == [3, 3]
  assert sync.next() is None
  assert main.timeouts == [100, 100, 25, 100, 25, 100]     # a newer main frame is waited for 25 ms only
  # a camera faster than 40 Hz sends it within 25 ms: openpilot's skip stays
  sync = FrameSync(_Recv([F(1, 100), F(2, 117), F(3, 133)]), _Recv([F(1, 100), F(3, 133)]), 100)
  sync.next()
  assert [f.frame_id for f in sync.next()[:2]] == [3, 3]

def test_drops_filter_and_warmup():
  d = FrameDrops()
  assert [d.update(i) for i in range(1, 11)] == [0] * 10
  assert d.update(13) == 2 and d.frame_drop_perc > 0   # after the first 10 runs a drop shows
  f = d.frame_drop_perc / 100
  assert math.isclose(f / (1 - f), 2 * (1 / 20) / (10 + 1 / 20))   # one filter step of min(dropped, 10) = 2
  d2 = FrameDrops()
  assert d2.update(50) == 0   # the first frame of a session follows none: no drop (a replay may start at any frame id)
  assert d2.update(53) == 2 and d2.frame_drop_perc == 0   # held at 0 in the first runs, but still a drop (prepare-only)

def test_calibration_and_camera_geometry():
  cal = Calibration()
  assert not cal.valid and cal.rpy.tolist() == [0, 0, 0]   # the default transform until one arrives
  cal.update([0., 0.02, -0.01])
  assert cal.valid and cal.rpy.tolist() == [0., 0.02, -0.01]
  for bad in ([float('nan'), 0., 0.], [0., 0., 2.], [0., 0.], [float('inf')] * 3):
    cal.update(bad)
    assert not cal.valid and cal.rpy.tolist() == [0., 0.02, -0.01]   # kept, but outputs invalid
  cal.update([0., 0.03, -0.01])
  assert cal.errors == 4 and cal.valid and cal.rpy.tolist() == [0., 0.03, -0.01]
  with pytest.raises(CalibrationError, match=r'expected 3 finite angles .* got \[nan, 0.0, 0.0\]'): check_rpy([float('nan'), 0, 0])
  assert [sensor_name(m, o) for m, o in (('unknown', None), ('os04c10', None), ('os04c10', 'ar0231'))] == ['ar0231', 'os04c10', 'ar0231']
  # no sensor named yet: the one whose cameras have the stream's size
  assert [sensor_name('unknown', None, size) for size in ((1344, 760), (1928, 1208), (964, 604))] == ['os04c10', 'ar0231', 'ar0231']
  half = camera_for('ar0231', 'road', 964, 604)
  assert (half.width, half.height, half.focal_length) == (964, 604, 2648 / 2)   # a scaled stream keeps the field of view
  assert camera_for('ar0231', 'wide', 1928, 1208).focal_length == 567

class CS:
  def __init__(self, **kw):
    self.vEgo, self.leftBlinker, self.rightBlinker, self.steeringPressed, self.steeringTorque = 25., False, False, False, 0.
    self.leftBlindspot = self.rightBlindspot = False
    self.__dict__.update(kw)

def test_lane_change_state_machine():
  dh = DesireHelper()
  dh.update(CS(leftBlinker=True), True, 0.)
  assert (dh.lane_change_state, dh.lane_change_direction, dh.desire) == ('preLaneChange', 'left', Desire.none)
  dh.update(CS(leftBlinker=True, steeringPressed=True, steeringTorque=-1.), True, 0.)   # torque the wrong way: wait
  assert dh.lane_change_state == 'preLaneChange'
  dh.update(CS(leftBlinker=True, steeringPressed=True, steeringTorque=1.), True, 1.)
  assert dh.lane_change_state == 'laneChangeStarting' and dh.desire == Desire.laneChangeLeft
  assert dh.vector().tolist() == np.eye(8)[Desire.laneChangeLeft].tolist()
  for _ in range(10): dh.update(CS(leftBlinker=True), True, 0.5)   # the model still sees the change going on
  assert dh.lane_change_state == 'laneChangeStarting'
  dh.update(CS(), True, 0.01)   # lines faded out and the model is sure it is done
  assert dh.lane_change_state == 'laneChangeFinishing'
  for _ in range(20): dh.update(CS(), True, 0.)
  assert (dh.lane_change_state, dh.lane_change_direction, dh.desire) == ('off', 'none', Desire.none)
  # blind spot blocks, too slow or no lateral control cancels
  dh.update(CS(rightBlinker=True), True, 0.)
  dh.update(CS(rightBlinker=True, steeringPressed=True, steeringTorque=-1., rightBlindspot=True), True, 0.)
  assert (dh.lane_change_state, dh.lane_change_direction) == ('preLaneChange', 'right')
  dh.update(CS(rightBlinker=True, vEgo=5.), True, 0.)
  assert dh.lane_change_state == 'off'
  dh.update(CS(vEgo=float('nan'), leftBlinker=True), True, 0.)
  assert dh.lane_change_state == 'off'
  dh.update(CS(leftBlinker=True), False, 0.)
  assert dh.lane_change_state == 'off'

def _plan(v=20., yaw_rate=0.):
  plan = np.zeros((33, 15), np.float32)
  plan[:, 0], plan[:, 3] = v * T_IDXS, v
  plan[:, 11], plan[:, 14] = yaw_rate * T_IDXS, yaw_rate
  return plan

PLAN = ROAD_V0_11_1.plan
def action(plan, prev, v_ego, lat_t=0.4, long_t=0.5): return get_action(plan, prev, lat_t, long_t, v_ego, PLAN)

def test_action_from_plan():
  # a steady turn at yaw rate r: curvature r / v; a constant speed: no acceleration
  a = Action()
  for _ in range(100): a = action(_plan(20., 0.02), a, 20.)
  assert math.isclose(a.desiredCurvature, 0.02 / 20, rel_tol=1e-5) and abs(a.desiredAcceleration) < 1e-6 and not a.shouldStop
  held = action(_plan(20., 0.05), a, 0.3)   # at 0.3 m/s and below the curvature is held
  assert held.desiredCurvature == a.desiredCurvature
  assert action(_plan(0.), Action(), 0.).shouldStop and not action(_plan(0.4), Action(), 0.).shouldStop
  plan = _plan()
  plan[:, 3], plan[:, 6] = 20 - 2 * T_IDXS, -2.   # braking at 2 m/s^2
  a = Action()
  for _ in range(100): a = action(plan, a, 20.)
  assert math.isclose(a.desiredAcceleration, -2., rel_tol=1e-3)
  one = action(plan, Action(), 20.)   # smoothed with tau 0.3 s over a 0.05 s step
  assert math.isclose(one.desiredAcceleration, -2 * (1 - math.exp(-0.05 / 0.3)), rel_tol=1e-5)

def test_hard_brake_and_confidence_compare_in_openpilot_precision():
  # hardBrakePredicted: float32 probabilities against float32 thresholds; float32(0.15) is not above float32(0.15),
  # though it is above the float64 0.15
  state, th = PublishState(), ROAD_V0_11_1.hard_brake
  meta = {'brake5MetersPerSecondSquaredProbs': np.full(6, 0.15, np.float32), 'brake3MetersPerSecondSquaredProbs': np.full(6, 0.9, np.float32)}
  assert not any(hard_brake_predicted(state, meta, th) for _ in range(5))
  meta['brake5MetersPerSecondSquaredProbs'][0] = np.nextafter(np.float32(0.15), np.float32(1))
  assert [hard_brake_predicted(state, meta, th) for _ in range(3)] == [False, False, True]   # the last three need 0.15
  # confidence: the score is summed in float64, term by term; these five float32 terms sum to the green threshold
  # in float32 (yellow) but to just under it in float64 (green)
  terms = np.array([0.005538300145417452, 0.020287971943616867, 0.01338605210185051, 0.008199721574783325, 0.01083795353770256], np.float32)
  assert sum(terms) / 5 == np.float32(ROAD_V0_11_1.confidence[0])
  state.disengage_buffer[[i * 5 + 4 - i for i in range(5)]] = terms
  assert update_confidence(state, {}, 1, ROAD_V0_11_1.confidence) == 'green'

def test_action_times_shorter_than_the_stable_delay_read_the_plan_at_it():
  plan = _plan(20., 0.)
  plan[:, 3], plan[:, 11] = 20 - 3 * T_IDXS ** 2, 0.05 * T_IDXS ** 2   # speed and yaw change ever faster
  at = {t: action(plan, Action(), 20., lat_t=t, long_t=t) for t in (0.1, 0.2, 0.3)}
  for t in (0.1, 0.2):
    assert math.isclose(at[t].desiredAcceleration, at[0.3].desiredAcceleration, rel_tol=1e-6)
    assert math.isclose(at[t].desiredCurvature, at[0.3].desiredCurvature, rel_tol=1e-6)
  assert not math.isclose(action(plan, Action(), 20., lat_t=0.6).desiredCurvature, at[0.3].desiredCurvature, rel_tol=1e-3)

def test_a_huge_plan_gives_a_finite_action_and_path_that_fit_no_float32():
  """Computed in float64, a plan near float32's limit gives finite values, which fits_float32 refuses: the acceleration
  (a speed from -3e38 to 3e38 within 0.5 s), the curvature (a yaw of 3e38 in 0.4 s at 1 m/s) and the path polynomial (a
  position whose signs follow the least-squares weights of its constant term)."""
  plan = np.zeros((33, 15), np.float32)
  plan[:, 3], plan[:, 11] = np.where(np.arange(33) > 0, 3e38, -3e38), 3e38
  a = action(plan, Action(), 1.)
  weights = np.linalg.pinv(np.polynomial.polynomial.polyvander(T_IDXS.astype(np.float64), 4))[0]
  plan[:, 0] = np.sign(weights) * 3e38
  path = path_coefficients(plan, PLAN['position'])
  assert all(math.isfinite(x) for x in (a.desiredAcceleration, a.desiredCurvature, *path.ravel()))
  assert not fits_float32(a.desiredAcceleration) and not fits_float32(a.desiredCurvature) and not fits_float32(path)
  assert fits_float32(3e38, -3e38, np.zeros(3)) and not fits_float32(np.nan) and not fits_float32(1, [np.inf])

def test_action_times():
  assert action_times(0.25) == pytest.approx((0.25 + 0.075, 0.15 + 0.3 + 0.075))
  assert action_times(float('nan'))[0] == action_times(-3.)[0] == pytest.approx(0.075) and action_times(50.)[0] == pytest.approx(1.075)

def _outputs(rng, scale=1.):
  return {k: (rng.standard_normal((1, s.stop - s.start)) * scale).astype(np.float32) for k, s in {**SLICES['vision'], **SLICES['policy']}.items()}

def _floats(obj):
  """Every float in a capnp reader, recursively."""
  if isinstance(obj, float): yield obj
  elif hasattr(obj, 'schema') and hasattr(obj, 'to_dict'): yield from _floats(obj.to_dict())
  elif isinstance(obj, dict):
    for v in obj.values(): yield from _floats(v)
  elif isinstance(obj, (list, tuple)):
    for v in obj: yield from _floats(v)

def test_non_finite_outputs_never_reach_a_message():
  out = _outputs(np.random.default_rng(0))
  out['plan'][0, :50] = np.nan
  out['lane_lines'][0, 3] = np.inf
  ends = np.cumsum([v.size for v in out.values()])
  result = _output((np.concatenate([v.reshape(-1) for v in out.values()]), {k: slice(e - v.size, e) for (k, v), e in zip(out.items(), ends)}))
  assert not result.finite and np.isfinite(result.raw).all()
  parsed = parse_outputs(result.outputs, ROAD_V0_11_1)
  plan = parsed['plan']
  msgs = fill_model_msgs(parsed, FrameInfo(40, 40, 0, 0., 1, .01, valid=False), action(plan, Action(), 20.),
                         path_coefficients(plan, PLAN['position']), PublishState(), ROAD_V0_11_1)
  for m in msgs:
    r = m.as_reader()
    assert not r.valid and all(math.isfinite(x) for x in _floats(getattr(r, r.which())))
  mv2 = msgs[0].as_reader().modelV2
  assert len(mv2.laneLines) == 4 and len(mv2.leadsV3) == 3 and len(mv2.position.x) == 33
  assert list(mv2.laneLines[1].x) == pytest.approx(np.float32(np.array([192 * (i / 32) ** 2 for i in range(33)])).tolist())
  assert len(mv2.laneLines[1].t) == 0 and len(mv2.velocity.xStd) == 0 and len(mv2.temporalPose.trans) == 0   # left empty, as in the release

def test_a_plan_too_large_for_float32_is_published_invalid_and_not_fed_back(artifacts):
  """Finite model outputs whose plan is 3e38 but for -3e38 now: the acceleration to reach its speed is beyond a Float32
  field's range (written, it would read inf, and the smoothing would keep it inf or NaN in every later frame).
  modeld's frame code publishes that frame invalid with the previous action and a zero path, every float finite, and
  does not feed it back: the sane frames after it smooth on from the action before it."""
  log = logging.getLogger('test')
  sm = messaging.SubMaster(RoadModel.SUBSCRIBES, addr=None)
  cs = messaging.new_message('carState')
  cs.carState.vEgo = 20.
  sm.update_msgs(time.monotonic(), [messaging.log_from_bytes(cs.to_bytes())])
  model = RoadModel(RoadRunner(artifacts, LAYOUT), ROAD, sm, stats := Stats(log, math.inf), log)
  policy = KNOWN['policy'].copy()
  policy[SLICES['policy']['plan']][:33 * 15].reshape(33, 15)[:] = np.where(np.arange(33) > 0, 3e38, -3e38)[:, None]
  sane, huge = (_output((KNOWN['vision'], SLICES['vision']), (p, SLICES['policy'])) for p in (KNOWN['policy'], policy))
  assert huge.finite
  alpha, accel, curvature = 1 - math.exp(-0.05 / 0.3), 0., None
  for n, out in enumerate([sane] * 3 + [huge] + [sane] * 3, 1):
    msgs = dict(model.fill(out.outputs, FrameRun((F(n, 50 * n),) * 2, out, 0., .01, False), True))
    for s, m in msgs.items():
      r = getattr(m.as_reader(), s)
      assert m.valid == (out is sane) and all(math.isfinite(x) for x in _floats(r)), (n, s, m.valid, r)
    dmd = msgs['drivingModelData'].as_reader().drivingModelData
    if out is sane: accel = alpha * -1. + (1 - alpha) * accel   # the known plan brakes at 1 m/s^2
    else: assert [*dmd.path.xCoefficients, *dmd.path.yCoefficients, *dmd.path.zCoefficients] == [0.] * 15
    assert dmd.action.desiredAcceleration == pytest.approx(accel, rel=1e-5), n
    if out is huge: assert dmd.action.desiredCurvature == curvature   # held
    curvature = dmd.action.desiredCurvature
  assert curvature == pytest.approx(0.01 / 20, rel=1e-2) and stats.totals['overflow'] == 1

# ***** the daemon *****

def _start(artifacts, *args, **kw): return start_daemon('modeld', artifacts, *args, **kw)

def _run(cam: Camera, col: Collector, n: int, **kw):
  eof = cam.send(n, **kw)
  return eof, [col.wait(s, len(col.msgs[s]) + 1)[-1] for s in OUTPUTS]

def test_daemon_frames_in_lockstep(artifacts, tmp_path):
  """openpilot's daemon test: frames 1..N on road and wide road; every output is for frame n, of the camera's eof,
  with no age and no drops. Also: READY only after start-up, WATCHDOG and STATUS from the loop, no torch in the
  child, SIGTERM -> exit 0 within a second."""
  cam = Camera({ROAD: LAYOUT, WIDE_ROAD: LAYOUT})
  modules = tmp_path / 'modules'
  d, notify = _start(artifacts, env={'WATCHDOG_USEC': '200000'}, modules_file=modules)
  assert open(f'/proc/{d.proc.pid}/cmdline', 'rb').read().split(b'\0')[0] == b'modeld'   # setproctitle
  col = Collector(OUTPUTS)
  try:
    for n in range(1, 31):
      eof, (mv2, dmd, odo) = _run(cam, col, n)
      m = mv2.modelV2
      assert (m.frameId, m.frameIdExtra, m.timestampEof, m.frameAge, m.frameDropPerc) == (n, n, eof, 0, 0)
      assert (odo.cameraOdometry.frameId, odo.cameraOdometry.timestampEof) == (n, eof)
      assert (dmd.drivingModelData.frameId, dmd.drivingModelData.frameIdExtra) == (n, n)
      assert not mv2.valid and not odo.valid   # no calibration yet
      assert 0 < m.modelExecutionTime < 5 and len(m.rawPredictions) == 0
      time.sleep(0.02)
    msgs = notify.wait(rf"STATUS=serving 'camerad': stream {int(ROAD)} \({LAYOUT}\), stream {int(WIDE_ROAD)} .*; rate=.* exec_ms_p50=", 5)
    assert 'WATCHDOG=1' in msgs and msgs.index('WATCHDOG=1') > [i for i, m in enumerate(msgs) if m.startswith('READY=1')][0]
    assert msgs[0] == "STATUS=waiting for camera server 'camerad' | totals nothing counted"   # what it does, first of all
  finally:
    rc, dt = d.stop()
    cam.close(); col.close(); notify.close()
  assert rc == 0 and dt < 1, (rc, dt, d.stderr())
  mods = modules.read_text().split()
  assert 'tinygrad' in mods and 'modelrt.runner' in mods and beyond_base_install(mods) == set()   # no torch, no extra
  log = d.stderr()
  info = [l for l in log.splitlines() if ' debug ' not in l]
  assert 'Traceback' not in log and len(info) < 15, info   # 30 frames: start-up, stats and stop lines, nothing per frame

def test_daemon_dropped_frames(artifacts):
  """Frames with the road camera missing (nothing, or only the wide one): the next road frame only feeds the history;
  outputs are published exactly for road frames whose predecessor was a road frame."""
  rng = random.Random(0)
  cam = Camera({ROAD: LAYOUT, WIDE_ROAD: LAYOUT})
  d, notify = _start(artifacts, '--stats-interval', '0')   # a STATUS= line per loop turn: the counts of each frame
  col = Collector(OUTPUTS)
  expected, prev_road, first_drop_published, prepare_only = [], True, None, 0
  try:
    for n in range(1, 61):
      road = n <= 3 or rng.random() > 0.15
      if not road:
        cam.send(n, streams=rng.choice([(), (WIDE_ROAD,)]))
        prev_road = False
        continue
      if prev_road:
        expected.append(n)
        _run(cam, col, n)
      else:   # prepare-only: nothing published, but counted
        prepare_only += 1
        cam.send(n)
        notify.wait_count('prepare_only', prepare_only)
        if n > 11 and first_drop_published is None: first_drop_published = n + 1
      prev_road = True
    notify.wait_count('frames', len(expected))
    col.poll()
    assert notify.count('prepare_only') == prepare_only
  finally:
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close()
  for s in OUTPUTS: assert [getattr(e, s).frameId for e in col.msgs[s]] == expected, s
  assert len(expected) < 60 and rc == 0 and notify.count('frames') == len(expected)
  drop_perc = {e.modelV2.frameId: e.modelV2.frameDropPerc for e in col.msgs['modelV2']}
  assert all(v == 0 for k, v in drop_perc.items() if k < 10) and first_drop_published is not None
  assert all(v > 0 for k, v in drop_perc.items() if k >= first_drop_published)
  assert all(e.modelV2.frameIdExtra == e.modelV2.frameId for e in col.msgs['modelV2'])

def _valid_after(cam, col, n0, want: bool, tries=20) -> int:
  """Send frames from n0 until one is published with valid == want (the daemon reads a new message at its next frame)."""
  for n in range(n0, n0 + tries):
    _, (mv2, dmd, odo) = _run(cam, col, n)
    if mv2.valid == want:
      assert dmd.valid == odo.valid == want
      return n + 1
  raise AssertionError(f"no frame with valid={want} in {tries} frames")

def test_daemon_calibration_garbage_and_nan(artifacts):
  cam = Camera({ROAD: LAYOUT, WIDE_ROAD: LAYOUT})
  pm = messaging.PubMaster(['liveCalibration', 'driverMonitoringState'])
  garbage = {s: pub_sock(s) for s in ('carState', 'liveDelay', 'carControl')}
  d, notify = _start(artifacts, '--raw-predictions')
  col = Collector(OUTPUTS)
  def calib(rpy):
    msg = messaging.new_message('liveCalibration')
    msg.liveCalibration.rpyCalib = rpy
    pm.send('liveCalibration', msg)
  try:
    n = _valid_after(cam, col, 1, False, tries=1)
    calib([0., 0.02, -0.01])
    n = _valid_after(cam, col, n, True)
    for s in garbage.values(): s.send(b'\x00\x01garbage that is no capnp message' * 3)
    msg = messaging.new_message('driverMonitoringState')
    msg.driverMonitoringState.isRHD = True
    pm.send('driverMonitoringState', msg)
    n = _valid_after(cam, col, n, True)
    calib([float('nan'), 0., 0.])
    start = len(col.msgs['modelV2'])
    n = _valid_after(cam, col, n, False)
    notify.wait_count('bad_calibration', 1)
    for _ in range(3): _valid_after(cam, col, n, False, tries=1); n += 1   # stays invalid, keeps running
    calib([0., 0.02, 5.])   # out of range: also refused
    for _ in range(3): _valid_after(cam, col, n, False, tries=1); n += 1
    notify.wait_count('bad_calibration', 2)
    calib([0., 0.02, -0.01])
    n = _valid_after(cam, col, n, True)
    notify.wait_count('malformed', len(garbage))   # one garbage message on each of three inputs, each dropped
    for e in col.msgs['modelV2'][start:]:
      assert all(math.isfinite(x) for x in _floats(e.modelV2.to_dict())) and len(e.modelV2.rawPredictions) > 0
      raw = np.frombuffer(e.modelV2.rawPredictions, np.float32)
      assert raw.size == KNOWN['vision'].size + KNOWN['policy'].size and np.isfinite(raw).all()
  finally:
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close(); pm.close()
    for s in garbage.values(): s.close()
  assert rc == 0, d.stderr()

def test_daemon_torn_frames_are_never_valid(artifacts):
  """A camera with one buffer rewrites it while the model reads it: the daemon sees it (buf.overwritten() after the run)
  and publishes that frame invalid."""
  cam = Camera({ROAD: LAYOUT}, buffers=1)
  pm = messaging.PubMaster(['liveCalibration'])
  d, notify = _start(artifacts, '--stats-interval', '0')
  col = Collector(OUTPUTS)
  def published(fid: int, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while not (out := [e for e in col.msgs['modelV2'] if e.modelV2.frameId == fid]) and time.monotonic() < deadline:
      col.poll()
      time.sleep(0.002)
    return out
  try:
    msg = messaging.new_message('liveCalibration')
    msg.liveCalibration.rpyCalib = [0., 0.02, 0.]
    pm.send('liveCalibration', msg)
    first = _valid_after(cam, col, 1, True)
    for i, n in enumerate(range(first, first + 200, 2)):
      cam.send(n)
      # rewrite the buffer while the daemon runs the model on it: the run takes a few ms, so try delays from 0 to 4 ms
      # (too early: frame n is conflated away; too late: the run has ended). Calibrated and finite, frame n is
      # published invalid only when torn.
      time.sleep(0.0005 * (i % 9))
      cam.send(n + 1)
      if any(not e.valid for e in published(n, 0.3)): break
    else: raise AssertionError("never caught the camera overwriting a frame in use")
    assert published(n + 1, 5), "the frame after the torn one was not published"
    notify.wait_count('torn', 1)   # the daemon's own counter saw it too
  finally:
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close(); pm.close()
  torn = [e for e in col.msgs['modelV2'] if e.modelV2.frameId == n]
  assert len(torn) == 1 and not torn[0].valid and rc == 0
  assert all(e.valid for e in col.msgs['modelV2'] if e.modelV2.frameId == n + 1)

def test_daemon_camera_restart_with_another_layout_and_camera_set(artifacts):
  """The camera server restarts with new buffers of another layout the artifact serves, and only the wide camera:
  modeld drops its tensors over the old buffers, reconnects, switches warps, resets its history and goes on."""
  cam = Camera({ROAD: LAYOUT, WIDE_ROAD: LAYOUT})
  d, notify = _start(artifacts)
  col = Collector(OUTPUTS)
  try:
    for n in range(1, 6): _run(cam, col, n)
    cam.close()
    cam = Camera({WIDE_ROAD: ALT_LAYOUT})
    for n in range(1, 40):
      cam.send(n)
      try:
        if col.wait('modelV2', 6, timeout=0.3): break
      except TimeoutError: pass
    else: raise AssertionError(f"no output after the restart; stderr:\n{d.stderr()}")
    for s in OUTPUTS: col.wait(s, 6)
    for n in range(n + 1, n + 6):   # noqa: B020 (continues where the restart loop stopped)
      _, (mv2, _, odo) = _run(cam, col, n)
      assert (mv2.modelV2.frameId, mv2.modelV2.frameIdExtra, odo.cameraOdometry.frameId) == (n, n, n)
    notify.wait_count('disconnects', 1)   # the first camera server's session ended, the second one's began
    notify.wait_count('connects', 2)
  finally:
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close()
  assert rc == 0, d.stderr()

def test_daemon_refuses_a_layout_the_artifact_does_not_serve(artifacts):
  cam = Camera({ROAD: UNSERVED_LAYOUT, WIDE_ROAD: UNSERVED_LAYOUT})
  notify = Notify()
  d = Daemon('modeld', artifacts, notify=notify)
  try: rc = d.proc.wait(60)
  finally:
    d.stop()
    cam.close()
  err = d.stderr()
  assert rc == EX_CONFIG, err
  assert f'no warp compiled for camera layout {UNSERVED_LAYOUT}' in err and f'--camera {UNSERVED_LAYOUT}' in err and 'modeld-compile' in err
  with pytest.raises(TimeoutError): notify.wait('READY=1', 0.1)   # never claimed to be ready
  notify.close()

def test_daemon_reconnects_to_a_restarted_server_that_waits_for_it(artifacts):
  """A lockstep camera source that restarts within a second sends nothing until the daemon's clients are back. The
  daemon, idle, sees the new server id and reconnects every stream (an idle extra client would otherwise never
  subscribe again: the source would wait for it forever)."""
  cam = Camera({ROAD: LAYOUT, WIDE_ROAD: LAYOUT})
  d, notify = _start(artifacts)
  col = Collector(OUTPUTS)
  try:
    for n in range(1, 4): _run(cam, col, n)
    cam.close()
    cam = Camera({ROAD: LAYOUT, WIDE_ROAD: LAYOUT})
    deadline = time.monotonic() + 6
    while not all(cam.server.has_readers(s) for s in (ROAD, WIDE_ROAD)):
      assert time.monotonic() < deadline, f"the daemon never came back to every stream; stderr:\n{d.stderr()}"
      time.sleep(0.02)
    notify.wait_count('disconnects', 1)
    _, (mv2, _, odo) = _run(cam, col, 1)
    assert (mv2.modelV2.frameId, mv2.modelV2.frameIdExtra, odo.cameraOdometry.frameId) == (1, 1, 1)
  finally:
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close()
  assert rc == 0

def test_the_first_frame_of_a_restarted_camera_is_answered(artifacts):
  """A camera restarted while frames flow sends its first frame as soon as the daemon's subscription reaches it (as
  openpilot's camerad does, waiting for nobody): the frame that shows the daemon the restart is answered, not dropped
  to reconnect (a lockstep source would wait for that answer forever)."""
  cam = Camera({ROAD: LAYOUT})
  d, notify = _start(artifacts)
  col = Collector(OUTPUTS)
  try:
    for n in range(1, 4): _run(cam, col, n)
    cam.close()
    cam = Camera({ROAD: LAYOUT})
    deadline = time.monotonic() + 5
    while not cam.server._stream(ROAD).pub.all_readers_updated():   # the daemon's old subscription, no handshake yet
      assert time.monotonic() < deadline, f"the daemon's subscription never reached the new camera; stderr:\n{d.stderr()}"
      time.sleep(0.005)
    _, (mv2, _, _) = _run(cam, col, 7)
    assert mv2.modelV2.frameId == 7 and "frame 7 from server" in d.stderr()   # seen on the old connection, answered on the new
  finally:
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close()
  assert rc == 0

@pytest.mark.parametrize("module", ["modeld", "dmonitoringd"])
def test_a_device_this_machine_cannot_open_exits_78(artifacts, module):
  """--device (or DEV) naming a tinygrad backend that is not here is a configuration error: exit 78 with the device
  named, which systemd does not restart, not a traceback and exit 1 (restarted over and over)."""
  d = Daemon(module, artifacts, '--device', 'NOPE')
  try: rc = d.proc.wait(60)
  finally: d.stop()
  err = d.stderr()
  assert rc == EX_CONFIG and "tinygrad device 'NOPE' cannot be opened on this machine" in err and 'Traceback' not in err, err
