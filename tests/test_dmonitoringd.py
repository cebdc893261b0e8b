"""dmonitoringd: the driver monitoring policy as a unit; the daemon as a real process against a real camera server,
real sockets and a real notify socket."""
import math, os, signal, time
import numpy as np
import pytest
from cereal import messaging
from msgq import pub_sock
from msgq.visionipc import DRIVER
from tests.artifacts import CACHE, LAYOUT, ALT_LAYOUT, UNSERVED_LAYOUT, build
from tests.daemon_harness import Camera, Collector, Daemon, beyond_base_install, start_daemon
from tests.onnx_models import KNOWN
from tests import openpilot_ref as op
from dmonitoringd.policy import DriverMonitoring, FilteredMean, DT_DMON, face_pose
from dmonitoringd.fill_msgs import fill_monitoring_state
from modeld_common.daemon import EX_CONFIG

OUTPUTS = ['driverStateV2', 'driverMonitoringState']

@pytest.fixture(scope='session')
def artifacts(): return build(CACHE.parent / 'tiny', models='tiny')

# ***** the policy: openpilot v0.11.1's rules, each scenario's expected states derived from them *****

STEP_V, STEP_W = DT_DMON / 11, DT_DMON / 30                  # awareness per frame: vision (11 s), wheel-touch (30 s) policies
VISION_T = (1 - 3 / 11, 1 - 5 / 11)                          # alert one, two at or below these (vision: 3 and 5 s of distraction)
WHEEL_T = (1 - 15 / 30, 1 - 24 / 30)                         # wheel-touch: 15 and 24 s
FILTERED = 5   # frames the distraction filter (0.25 s at 20 Hz) takes past 0.63: (5/6)^6 < 0.37 < (5/6)^5; the 6th counts

def driver_state(face=0.95, pitch=0.011, yaw=-0.075, std=0.05, blink=0.05, phone=0.05, sunglasses=0.05, wheel_on_right=0.03,
                 right=None):
  """A driverStateV2 whose left (LHD) driver has these; yaw is the model's (the driver's view is its opposite): the
  defaults look straight at the natural offsets (0.011, 0.075)."""
  ds = messaging.new_message('driverStateV2').driverStateV2
  ds.wheelOnRightProb = wheel_on_right
  for d, kw in ((ds.leftDriverData, {}), (ds.rightDriverData, right or {'face': 0.05})):
    v = {**dict(face=face, pitch=pitch, yaw=yaw, std=std, blink=blink, phone=phone, sunglasses=sunglasses), **kw}
    d.faceOrientation, d.faceOrientationStd = [v['pitch'], v['yaw'], 0.], [v['std'], v['std'], v['std']]
    d.facePosition, d.facePositionStd = [0., 0.], [0.1, 0.1]
    d.faceProb, d.leftEyeProb, d.rightEyeProb = v['face'], 0.9, 0.9
    d.leftBlinkProb = d.rightBlinkProb = v['blink']
    d.sunglassesProb, d.phoneProb = v['sunglasses'], v['phone']
  return ds.as_reader()

def car_state(v=20., standstill=False, angle=0., touch=False, gear='drive'):
  cs = messaging.new_message('carState').carState
  cs.vEgo, cs.standstill, cs.steeringAngleDeg, cs.steeringPressed, cs.gearShifter = v, standstill, angle, touch, gear
  return cs.as_reader()

ATTENTIVE, EYES_CLOSED, NO_FACE = driver_state(), driver_state(blink=0.95), driver_state(face=0.1)
MOVING = car_state()

def drive(dm, ds, n, cs=MOVING, engaged=True, calib=(0., 0., 0.)) -> list[dict]:
  """n frames of the same inputs: the published state after each, as driverMonitoringState reads back."""
  out = []
  for _ in range(n):
    dm.step(ds, cs, engaged, calib)
    out.append(fill_monitoring_state(dm.state(), True).driverMonitoringState.to_dict())
  return out

def countdown(start: float, step: float, n: int, skip: int = 0) -> list[float]:
  """Awareness over n frames: the first `skip` frames hold it, then each takes a step off, down to -0.1."""
  a, out = start, []
  for i in range(n):
    if i >= skip: a = max(a - step, -0.1)
    out.append(a)
  return out

def level(a: float, t=VISION_T) -> str: return 'three' if a <= 0 else 'two' if a <= t[1] else 'one' if a <= t[0] else 'none'
def percent(a: float) -> int: return int(min(max(a * 100, 0), 100))
def alerts(states) -> list[str]: return [s['alertLevel'] for s in states]
def first(states, lvl: str) -> int: return alerts(states).index(lvl)

def test_face_pose_as_seen_from_the_road():
  """openpilot's conversion: a face in the middle of the picture keeps the model's pitch and the opposite of its yaw, less
  the calibration; off-centre, the direction of its place in the picture (pinhole, f 598 over 1928x1208) is added."""
  assert face_pose([0.1, 0.2, 0.], [0., 0.], [0., 0.02, 0.03]) == pytest.approx((0.1 - 0.02, -0.2 - 0.03))
  pitch, yaw = face_pose([0., 0., 0.], [0.25, -0.25], [0., 0., 0.])   # a quarter picture right of and above the centre
  assert (pitch, yaw) == pytest.approx((math.atan2(-302, 598), math.atan2(482, 598)))

def test_attentive_driver():
  """Engaged, attentive for 2 minutes: no alert, the vision policy, awareness 100 % on both policies, no lockout."""
  states = drive(DriverMonitoring(), ATTENTIVE, 2400)
  assert {(s['alertLevel'], s['activePolicy'], s['visionPolicyState']['awarenessPercent'], s['wheeltouchPolicyState']['awarenessPercent'],
           s['lockout'], s['visionPolicyState']['isDistracted']) for s in states} == {('none', 'vision', 100, 100, False, False)}
  assert states[-1]['visionPolicyState']['awarenessStep'] == pytest.approx(STEP_V)

def test_distracted_driver_alerts_then_locks_out():
  """Eyes closed, engaged: awareness holds for the filter's 5 frames, then falls by DT/11 s a frame to -0.1; alert one,
  two, three at 8/11, 6/11 and 0 (about 3, 5 and 11 s); 30 s of terminal alert lock engaging out, from the frame after;
  disengaging resets awareness, not the lockout."""
  dm = DriverMonitoring()
  states = drive(dm, EYES_CLOSED, 1000)
  want = countdown(1., STEP_V, 1000, skip=FILTERED)
  assert alerts(states) == [level(a) for a in want]
  assert [s['visionPolicyState']['awarenessPercent'] for s in states] == [percent(a) for a in want]
  assert (first(states, 'one') * DT_DMON, first(states, 'two') * DT_DMON, first(states, 'three') * DT_DMON) == pytest.approx((3.25, 5.25, 11.25), abs=0.06)
  terminal = first(states, 'three')
  assert [s['alertTimeLockoutPercent'] for s in states[terminal:terminal + 601:60]] == list(range(0, 101, 10))
  assert [s['lockout'] for s in states] == [i > terminal + 599 for i in range(1000)]   # 600 terminal frames, then locked out
  assert {s['alertCountLockoutPercent'] for s in states[terminal:]} == {33} and states[terminal - 1]['alertCountLockoutPercent'] == 0
  assert all(s['visionPolicyState']['distractedTypes'] == {'pose': False, 'eye': True, 'phone': False} for s in states)
  (s,) = drive(dm, EYES_CLOSED, 1, engaged=False)
  assert (s['alertLevel'], s['visionPolicyState']['awarenessPercent'], s['lockout']) == ('none', 100, True)

def test_three_terminal_alerts_lock_out():
  """Each terminal alert counts once (a third of the lockout's count); the frame after the third, engaging is refused."""
  dm, counts = DriverMonitoring(), []
  for _ in range(3):
    states = drive(dm, EYES_CLOSED, 240)
    t = first(states, 'three')
    counts.append([(s['alertCountLockoutPercent'], s['lockout']) for s in (states[t - 1], states[t], states[t + 1])])
    drive(dm, EYES_CLOSED, 1, engaged=False)
  assert counts == [[(0, False), (33, False), (33, False)], [(33, False), (66, False), (66, False)], [(66, False), (100, False), (100, True)]]

def test_face_lost_falls_back_to_wheel_touch():
  """No face from the start: the wheel-touch policy, whose awareness falls by DT/30 s from the first frame; alert one,
  two, three at 1/2, 1/5 and 0 (15, 24, 30 s). The vision policy's awareness is kept aside at 100 %."""
  states = drive(DriverMonitoring(), NO_FACE, 700)
  want = countdown(1., STEP_W, 700)
  assert alerts(states) == [level(a, WHEEL_T) for a in want]
  assert [s['wheeltouchPolicyState']['awarenessPercent'] for s in states] == [percent(a) for a in want]
  assert (first(states, 'one'), first(states, 'two'), first(states, 'three')) == (299, 479, 599)
  assert {(s['activePolicy'], s['visionPolicyState']['awarenessPercent'], s['visionPolicyState']['awarenessStep'],
           s['visionPolicyState']['faceDetected']) for s in states} == {('wheeltouch', 100, 0., False)}
  assert states[0]['wheeltouchPolicyState']['awarenessStep'] == pytest.approx(STEP_W)

def test_wheel_touch():
  """Under the wheel-touch policy a touch of the wheel or the gas resets awareness (not once terminal); under the
  vision policy only while attentive: a touch does not excuse closed eyes."""
  dm = DriverMonitoring()
  drive(dm, NO_FACE, 400)
  (s,) = drive(dm, NO_FACE, 1, car_state(touch=True))
  assert (s['alertLevel'], s['wheeltouchPolicyState']['awarenessPercent'], s['wheeltouchPolicyState']['driverInteracting']) == ('none', 100, True)
  states = drive(dm, NO_FACE, 700)
  assert states[-1]['alertLevel'] == 'three'
  assert drive(dm, NO_FACE, 1, car_state(touch=True))[0]['alertLevel'] == 'three'   # terminal: only disengaging clears it
  dm = DriverMonitoring()
  states = drive(dm, EYES_CLOSED, 200, car_state(touch=True))
  assert alerts(states) == [level(a) for a in countdown(1., STEP_V, 200, skip=FILTERED)]

def test_coming_back_into_view_keeps_each_policys_awareness():
  """Face lost for 10 s, then back and attentive: the vision policy resumes at the awareness it had (100 %), the
  wheel-touch policy's is kept aside, a step back a frame while vision's is 100 %. Eyes closed past alert two, then
  gone: vision stays the policy (no escape from an alert by hiding the face) and its awareness holds."""
  dm = DriverMonitoring()
  lost = drive(dm, NO_FACE, 200)
  (back,) = drive(dm, ATTENTIVE, 1)
  assert back['activePolicy'] == 'vision' and back['visionPolicyState']['awarenessPercent'] == 100
  a = countdown(1., STEP_W, 200)[-1]
  assert lost[-1]['wheeltouchPolicyState']['awarenessPercent'] == percent(a) == 66
  assert back['wheeltouchPolicyState']['awarenessPercent'] == percent(a + STEP_V) == 67   # recovers while vision is at 100 %
  dm = DriverMonitoring()
  states = drive(dm, EYES_CLOSED, 120)
  assert states[-1]['alertLevel'] == 'two'
  hidden = drive(dm, NO_FACE, 100)
  assert {(s['activePolicy'], s['alertLevel'], s['visionPolicyState']['awarenessPercent'], s['visionPolicyState']['awarenessStep'])
          for s in hidden} == {('vision', 'two', states[-1]['visionPolicyState']['awarenessPercent'], 0.)}

def test_phone_and_sunglasses():
  """Phone above 0.5 (on every camera) is a distraction; 0.45 is not. Closed eyes behind sunglasses (above 0.9) are not
  judged; without them they are."""
  phone, eye = {'pose': False, 'eye': False, 'phone': True}, {'pose': False, 'eye': True, 'phone': False}
  for ds, types in ((driver_state(phone=0.6), phone), (driver_state(phone=0.45), None), (driver_state(blink=0.95, sunglasses=0.95), None),
                    (driver_state(blink=0.95, sunglasses=0.85), eye)):
    states = drive(DriverMonitoring(), ds, 300)
    if types is None: assert set(alerts(states)) == {'none'} and not any(s['visionPolicyState']['isDistracted'] for s in states)
    else:
      assert alerts(states) == [level(a) for a in countdown(1., STEP_V, 300, skip=FILTERED)]
      assert states[-1]['visionPolicyState']['distractedTypes'] == types

def test_pose_thresholds_around_the_natural_offsets():
  """Before the driver's offsets are learned the pose is judged around the natural ones (pitch 0.011, yaw 0.075): down
  beyond 0.449 (never up), sideways beyond the slack yaw threshold 0.5042 (modelV2's brake-disengage probability 0)."""
  def distracted(pitch=0.011, yaw=0.075) -> bool:
    return drive(DriverMonitoring(), driver_state(pitch=pitch, yaw=-yaw), 1)[0]['visionPolicyState']['distractedTypes']['pose']
  assert distracted(pitch=0.011 - 0.46) and not distracted(pitch=-0.43) and not distracted(pitch=0.011 + 0.9)
  assert distracted(yaw=0.58) and not distracted(yaw=0.075 + 0.5) and distracted(yaw=0.075 - 0.51) and not distracted(yaw=-0.42)

def test_pose_thresholds_tighten_with_the_brake_disengage_probability():
  """The yaw threshold goes from slack (0.5042) to strict (0.4020) as modelV2's brake-disengage probability rises to
  half of its speed scale (0.6 at 16 m/s): 0.3 is strict there, 0.15 halfway (0.4531). dmonitoringd reads no modelV2:
  it passes 0, the slack thresholds (docs/REFERENCE_MODELS.md)."""
  def distracted(yaw_err: float, p: float) -> bool:
    dm = DriverMonitoring()
    dm.step(driver_state(yaw=-(0.075 + yaw_err)), car_state(v=16.), True, (0., 0., 0.), p)
    return dm.state()['visionPolicyState']['distractedTypes']['pose']
  assert distracted(0.45, 0.3) and not distracted(0.45, 0.) and distracted(0.41, 0.6) and not distracted(0.39, 1.)
  assert distracted(0.46, 0.15) and not distracted(0.45, 0.15)

def test_speed_not_a_number_reads_as_stopped():
  """A departure: carState.vEgo NaN is read as 0 m/s. In openpilot it would make the pose thresholds NaN, and a driver
  looking away would never count as distracted by pose."""
  for v in (float('nan'), 0.):
    assert drive(DriverMonitoring(), driver_state(yaw=-(0.075 + 0.55)), 1, car_state(v=v))[0]['visionPolicyState']['distractedTypes']['pose']

def test_steering_allows_looking_where_the_car_turns():
  """Past 30 degrees of steering, the yaw error towards the turn (left: positive angle, the driver's yaw negative) is
  reduced by 0.15 of the angle past 30 degrees, at most 0.3927 rad; the other way it is not."""
  def distracted(yaw: float, angle: float) -> bool:
    return drive(DriverMonitoring(), driver_state(yaw=-yaw), 1, car_state(angle=angle))[0]['visionPolicyState']['isDistracted']
  left = 0.075 - 0.65                                                           # 0.65 rad to the driver's left of the offset
  assert distracted(left, 0.) and distracted(left, 25.) and distracted(left, -90.)
  assert not distracted(left, 90.)                                              # 0.65 - 0.15 * 60 deg = 0.49 rad
  assert distracted(left - 0.15, 90.) and not distracted(left - 0.15, 180.)     # 0.80 - 0.157 = 0.64; 0.80 - 0.15 * 150 deg = 0.41
  assert distracted(0.075 - 0.9, 400.) and not distracted(0.075 - 0.88, 400.)  # at most 0.3927 off: 0.51 and 0.49

def test_standstill():
  """Stopped: no alert; an alert two clears within 0.5 s of stopping and stays clear while stopped (awareness hovers
  at alert one's threshold); moving again, distracted, alert one comes at once and alert two 2 s later."""
  dm = DriverMonitoring()
  states = drive(dm, EYES_CLOSED, 110)
  assert states[-1]['alertLevel'] == 'two'
  stopped = drive(dm, EYES_CLOSED, 2000, car_state(v=0., standstill=True))
  clear = alerts(stopped).index('none')
  assert clear < 10 and set(alerts(stopped[clear:])) == {'none'}
  hover = [s['visionPolicyState']['awarenessPercent'] for s in stopped].index(72)   # recovering, faster the lower it was
  assert hover < 20 and set(s['visionPolicyState']['awarenessPercent'] for s in stopped[hover:]) == {72, 73, 74}
  moving = drive(dm, EYES_CLOSED, 100)
  assert first(moving, 'one') <= 1 and first(moving, 'two') - first(moving, 'one') in (40, 41)
  states = drive(DriverMonitoring(), EYES_CLOSED, 2000, car_state(v=0., standstill=True))   # distracted from the start, stopped
  assert set(alerts(states)) == {'none'}

def test_engage_and_disengage():
  """Not engaged: no countdown, awareness 100 %. Engaged: it counts from there; disengaged: back to 100 % at once."""
  dm = DriverMonitoring()
  assert set(alerts(drive(dm, EYES_CLOSED, 400, engaged=False))) == {'none'}
  states = drive(dm, EYES_CLOSED, 300)
  assert alerts(states) == [level(a) for a in countdown(1., STEP_V, 300)]   # the filter is past 0.63 already
  (s,) = drive(dm, EYES_CLOSED, 1, engaged=False)
  assert (s['alertLevel'], s['visionPolicyState']['awarenessPercent']) == ('none', 100)

def test_always_on():
  """Always on, not engaged: it counts down, but stops short of terminal (where a terminal one resets); in a gear other
  than drive or low (or one without a name) it does not count."""
  states = drive(DriverMonitoring(always_on=True), EYES_CLOSED, 400, engaged=False)
  assert set(alerts(states[200:])) == {'two'} and all(s['alwaysOnLockout'] for s in states[200:]) and states[-1]['alwaysOn']
  assert set(alerts(drive(DriverMonitoring(always_on=True), EYES_CLOSED, 400, car_state(gear='park'), engaged=False))) == {'none'}
  unknown = messaging.new_message('carState').carState
  unknown.gearShifter = 99   # a gear this schema has no name for (a peer's garbage): not a forward one
  assert set(alerts(drive(DriverMonitoring(always_on=True), EYES_CLOSED, 400, unknown.as_reader(), engaged=False))) == {'none'}

def test_uncertain_model_falls_back_to_wheel_touch():
  """A face whose pose the model is unsure of (std above 0.3) for 10 s: from the 201st frame the wheel-touch policy,
  whose awareness then falls (alert one 15 s later); wheeltouchFallbackPercent counts the 10 s up."""
  states = drive(DriverMonitoring(), driver_state(std=0.5, blink=0.95), 900)
  assert [s['activePolicy'] for s in states] == ['vision'] * 200 + ['wheeltouch'] * 700
  assert alerts(states) == ['none'] * 200 + [level(a, WHEEL_T) for a in countdown(1., STEP_W, 700)]
  assert [states[i]['visionPolicyState']['wheeltouchFallbackPercent'] for i in (0, 99, 199)] == [0, 50, 100]
  assert not any(s['visionPolicyState']['isDistracted'] for s in states)   # unsure: closed eyes are not judged

def test_uncertain_camera_count():
  """A face seen with an orientation std above 0.1 while moving counts towards the offroad alert (percent of 60 s); 2 s
  of a sure face or of standstill reset it (on the 41st frame)."""
  dm = DriverMonitoring()
  states = drive(dm, driver_state(std=0.2), 600)
  assert states[-1]['visionPolicyState']['uncertainOffroadAlertPercent'] == 50
  states = drive(dm, driver_state(std=0.2), 41, car_state(v=0., standstill=True))
  assert [s['visionPolicyState']['uncertainOffroadAlertPercent'] for s in states] == [50] * 40 + [0]

def test_wheel_side_learned_from_300_samples_with_a_prior():
  """wheelOnRightProb enters the wheel-side filter above 11 m/s with a face on either side; the filter starts from a
  prior (mean 0.03, variance 1.65e-4 as 2 samples), so samples far from it are first skipped; isRHD is decided once
  300 samples are in (rhdCalibration 100 %), and holds while engaged."""
  dm = DriverMonitoring()
  states = drive(dm, driver_state(wheel_on_right=0.03), 300, car_state(v=11.))   # not faster than 11 m/s
  assert states[-1]['rhdCalibration']['calibratedPercent'] == 0
  states = drive(dm, driver_state(wheel_on_right=0.03), 300, engaged=False)
  assert [states[i]['rhdCalibration']['calibratedPercent'] for i in (149, 298, 299)] == [50, 99, 100] and not states[-1]['isRHD']
  right = driver_state(face=0.05, wheel_on_right=0.95, right={'face': 0.95})
  states = drive(DriverMonitoring(), right, 2000, engaged=False)
  assert states[0]['rhdCalibration']['calibratedPercent'] == 0   # the first sample raised the prior's spread: skipped
  learned = [s['rhdCalibration']['calibratedPercent'] for s in states].index(100)
  assert learned > 299 and [s['isRHD'] for s in states] == [False] * learned + [True] * (2000 - learned)
  assert states[-1]['visionPolicyState']['faceDetected'] and states[-1]['rhdCalibration']['offset'] > 0.5
  assert not any(s['isRHD'] for s in drive(DriverMonitoring(), right, 2000))   # engaged from the start: the side holds

def test_pose_offsets_learned_from_1200_samples():
  """Above 13 m/s with a sure face (not distracted while engaged) pitch and yaw enter filters with the natural offsets
  as priors; 1200 samples (60 s) in, the pose is judged around their means, within their bounds."""
  dm = DriverMonitoring()
  states = drive(dm, driver_state(yaw=-0.2), 1200)
  assert [states[i]['visionPolicyState']['pose']['calibrated'] for i in (1198, 1199)] == [False, True]
  assert states[-1]['visionPolicyState']['pose']['yawCalib'] == {'calibratedPercent': 100, 'offset': pytest.approx(0.2)}
  assert not drive(dm, driver_state(yaw=-0.2 - 0.5), 1)[0]['visionPolicyState']['distractedTypes']['pose']   # 0.5 from 0.2
  assert drive(dm, driver_state(pitch=0.011 - 0.34), 1)[0]['visionPolicyState']['distractedTypes']['pose']  # calibrated: 0.3237

def test_filtered_mean_is_openpilots_running_stat_filter():
  f = FilteredMean(max_n=3)
  for v in (1., 1., 3., 1., 0.5, 1.):
    f.push(v)
  # raw takes all six; the filtered mean only those that did not raise their spread: 1, 1, then (1 after 3, 0.5, 1)
  assert f.raw.n == 6 and f.raw.mean == pytest.approx(7.5 / 6)
  assert f.filtered.n == 3

# ***** the daemon *****

def _start(artifacts, *args, **kw): return start_daemon('dmonitoringd', artifacts, *args, abstract=True, **kw)

def _run(cam, col, n):
  cam.send(n)
  return [col.wait(s, len(col.msgs[s]) + 1)[-1] for s in OUTPUTS]

def test_daemon_frames_in_lockstep(artifacts, tmp_path):
  """Every frame n gives driverStateV2 and driverMonitoringState for n, the latter as openpilot v0.11.1 reads it
  (Event @151). The camera server name and the message prefix come from the command line (the environment names
  another prefix)."""
  v0_11_1 = op.v0_11_1_monitoring_reader(tmp_path)
  cam = Camera({DRIVER: LAYOUT}, name='drivercam')
  modules = tmp_path / 'modules'
  d, notify = _start(artifacts, '--raw-predictions', '--camera-server', 'drivercam', '--prefix', os.environ['OPENPILOT_PREFIX'],
                     env={'WATCHDOG_USEC': '200000', 'OPENPILOT_PREFIX': 'elsewhere'}, modules_file=modules)
  assert open(f'/proc/{d.proc.pid}/cmdline', 'rb').read().split(b'\0')[0] == b'dmonitoringd'   # setproctitle
  col = Collector(OUTPUTS)
  try:
    for n in range(1, 31):
      ds, dms = _run(cam, col, n)
      assert ds.driverStateV2.frameId == n and ds.valid and dms.valid
      v = ds.driverStateV2
      assert 0 < v.gpuExecutionTime <= v.modelExecutionTime < 5 and 0 <= v.wheelOnRightProb <= 1
      assert np.frombuffer(v.rawPredictions, np.float32).size == KNOWN['dm'].size
      with v0_11_1.Event.from_bytes(dms.as_builder().to_bytes()) as theirs:
        assert theirs.which() == 'driverMonitoringState' and theirs.driverMonitoringState.to_dict() == dms.driverMonitoringState.to_dict()
        assert theirs.driverMonitoringState.activePolicy in ('vision', 'wheeltouch') and theirs.driverMonitoringState.alertLevel == 'none'
        assert theirs.driverMonitoringState.visionPolicyState.awarenessStep > 0 or theirs.driverMonitoringState.wheeltouchPolicyState.awarenessStep > 0
      for side in (v.leftDriverData, v.rightDriverData):
        assert len(side.faceOrientation) == len(side.faceOrientationStd) == 3 and len(side.facePosition) == 2 and 0 <= side.faceProb <= 1
      time.sleep(0.02)
    notify.wait(rf"STATUS=serving 'drivercam': stream {int(DRIVER)} \({LAYOUT}\); rate=.* exec_ms_p50=", 5)
    assert 'WATCHDOG=1' in notify.messages
  finally:
    d.proc.send_signal(signal.SIGINT)   # SIGINT stops it like SIGTERM
    rc, dt = d.stop()
    cam.close(); col.close(); notify.close()
  assert rc == 0 and dt < 1, (rc, dt)
  assert beyond_base_install(modules.read_text().split()) == set()   # a plain `pip install .` runs it: no torch, no extra

def test_model_only_leaves_driver_monitoring_state_to_openpilots_dmonitoringd(artifacts):
  """--model-only is openpilot's dmonitoringmodeld: driverStateV2 for every frame and no driverMonitoringState, so
  openpilot's own dmonitoringd (here a publisher started first, marking its messages) keeps its endpoint."""
  theirs = messaging.PubMaster(['driverMonitoringState'])
  cam = Camera({DRIVER: LAYOUT})
  d, notify = _start(artifacts, '--model-only')
  col = Collector(OUTPUTS)
  try:
    for n in range(1, 11):
      cam.send(n)
      assert col.wait('driverStateV2', n)[-1].driverStateV2.frameId == n
      m = messaging.new_message('driverMonitoringState')
      m.driverMonitoringState.isRHD = True
      theirs.send('driverMonitoringState', m)   # would raise MultiplePublishersError had the daemon taken the endpoint
    col.wait('driverMonitoringState', 5)
    time.sleep(0.2)
    col.poll()
  finally:
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close(); theirs.close()
  assert rc == 0 and all(e.driverMonitoringState.isRHD for e in col.msgs['driverMonitoringState']), rc

def test_daemon_bad_input_and_restart(artifacts):
  """Garbage on its topics and a NaN calibration: named errors, keeps running, bad frames invalid. Then the camera
  server restarts with another layout: reconnects and goes on."""
  cam = Camera({DRIVER: LAYOUT})
  pm = messaging.PubMaster(['liveCalibration'])
  garbage = pub_sock('carState')
  d, notify = _start(artifacts)
  col = Collector(OUTPUTS)
  def calib(rpy):
    msg = messaging.new_message('liveCalibration')
    msg.liveCalibration.rpyCalib = rpy
    pm.send('liveCalibration', msg)
  def until(first, want):
    for n in range(first, first + 20):
      ds, dms = _run(cam, col, n)
      if ds.valid == want:
        assert dms.valid == want
        return n + 1
    raise AssertionError(f"no frame with valid={want}")
  try:
    n = until(1, True)
    garbage.send(b'\xff' * 40)
    calib([0., float('nan'), 0.])
    n = until(n, False)
    notify.wait_count('bad_calibration', 1)
    notify.wait_count('malformed', 1)
    for e in col.msgs['driverStateV2'][-1:]:
      assert all(math.isfinite(x) for x in e.driverStateV2.leftDriverData.faceOrientation)
    calib([0., 0.05, 0.])
    n = until(n, True)
    cam.close()
    cam = Camera({DRIVER: ALT_LAYOUT})
    count = len(col.msgs['driverStateV2'])
    for n in range(1, 40):
      cam.send(n)
      try:
        if col.wait('driverStateV2', count + 1, timeout=0.3): break
      except TimeoutError: pass
    else: raise AssertionError("no output after the restart")
    for s in OUTPUTS: col.wait(s, count + 1)
    ds, _ = _run(cam, col, n + 1)
    assert ds.driverStateV2.frameId == n + 1
    notify.wait_count('disconnects', 1)
    notify.wait_count('connects', 2)
  finally:
    rc, _ = d.stop()
    cam.close(); col.close(); notify.close(); pm.close(); garbage.close()
  assert rc == 0

def test_daemon_refuses_a_layout_the_artifact_does_not_serve(artifacts):
  cam = Camera({DRIVER: UNSERVED_LAYOUT})
  d = Daemon('dmonitoringd', artifacts)
  try: rc = d.proc.wait(60)
  finally:
    d.stop()
    cam.close()
  assert rc == EX_CONFIG and f'no warp compiled for camera layout {UNSERVED_LAYOUT}' in d.stderr() and 'modeld-compile' in d.stderr()
