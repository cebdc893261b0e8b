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
from dmonitoringd.policy import DriverMonitoring, DistractedType, FilteredMean, Settings, DT_DMON, face_pose
from modeld_common.daemon import EX_CONFIG

OUTPUTS = ['driverStateV2', 'driverMonitoringState']

@pytest.fixture(scope='session')
def artifacts(): return build(CACHE.parent / 'tiny', models='tiny')

# ***** the policy *****

def _side(face=0.95, pitch=0.03, yaw=0.1, std=0.1, eyes=0.9, blink=0.05, phone=0.05, sunglasses=0.05):
  return {'face_orientation': np.array([pitch, yaw, 0.], np.float32), 'face_orientation_std': np.full(3, std, np.float32),
          'face_position': np.zeros(2, np.float32), 'face_position_std': np.full(2, .1, np.float32),
          'face_prob': face, 'left_eye_prob': eyes, 'right_eye_prob': eyes, 'left_blink_prob': blink, 'right_blink_prob': blink,
          'sunglasses_prob': sunglasses, 'using_phone_prob': phone, 'sleep_prob': 0.}

def _dm(lhd=None, rhd=None, wheel_on_right=0.05):
  return {'lhd': lhd or _side(), 'rhd': rhd or _side(face=0.05), 'wheel_on_right_prob': wheel_on_right}

def test_face_pose_as_seen_from_the_road():
  """openpilot's conversion: a face in the middle of the picture keeps the model's pitch and the opposite of its yaw, less
  the calibration; off-centre, the direction of its place in the picture (pinhole, f 598 over 1928x1208) is added."""
  assert face_pose([0.1, 0.2, 0.], [0., 0.], [0., 0.02, 0.03]) == pytest.approx((0.1 - 0.02, -0.2 - 0.03))
  pitch, yaw = face_pose([0., 0., 0.], [0.25, -0.25], [0., 0., 0.])   # a quarter picture right of and above the centre
  assert (pitch, yaw) == pytest.approx((math.atan2(-302, 598), math.atan2(482, 598)))

def test_distraction_types():
  """Slack pose thresholds around the natural offsets, looking down only (0.449 before the offsets are learned),
  distractedType judged with any face, isDistracted only with a face detected and a confident pose (the larger of the
  pitch and yaw stds)."""
  def types(side, **kw): return DriverMonitoring().update(_dm(side), 20., **kw)['distractedType']
  assert types(_side(pitch=0.029 - 0.45)) == DistractedType.POSE and types(_side(pitch=0.029 - 0.44)) == 0
  assert types(_side(pitch=0.029 + 0.9)) == 0                         # looking up is no distraction
  assert types(_side(yaw=-0.097 - 0.51)) == DistractedType.POSE and types(_side(yaw=-0.097 + 0.51)) == DistractedType.POSE
  assert types(_side(yaw=-0.097 + 0.50)) == 0                          # model yaw is the opposite of the driver's
  assert types(_side(blink=0.95)) == DistractedType.EYES and types(_side(blink=0.95, sunglasses=0.95)) == 0
  assert types(_side(phone=0.45)) == DistractedType.PHONE and types(_side(phone=0.45), phone_thresh=0.75) == 0
  assert types(_side(yaw=-0.7, phone=0.9)) == DistractedType.POSE | DistractedType.PHONE
  s = DriverMonitoring().update(_dm(_side(yaw=-0.7, std=0.35)), 20.)
  assert s['distractedType'] == DistractedType.POSE and not s['isDistracted'] and not s['isLowStd']
  s = DriverMonitoring().update(_dm(_side(face=0.6, phone=0.9)), 20.)
  assert s['distractedType'] == DistractedType.PHONE and not s['isDistracted'] and not s['faceDetected']

def test_awareness():
  """Engaged and distracted with a confident face: the distraction filter (0.25 s) passes 0.63 on the 6th frame, from
  which awareness falls by DT/11 s a frame, down to -0.1, where it stays until disengaged; attentive before that it
  recovers, fastest when lowest. No face: passive mode, DT/30 s a frame. Disengaged: always 1. At standstill it stops
  short of the prompt (6 s to go)."""
  step, dm = DT_DMON / 11., DriverMonitoring()
  for _ in range(5): s = dm.update(_dm(_side(phone=0.9)), 20., engaged=True)
  assert s['awarenessStatus'] == 1 and s['isDistracted'] and s['isActiveMode'] and s['stepChange'] == pytest.approx(step)
  for n in range(1, 101):
    s = dm.update(_dm(_side(phone=0.9)), 20., engaged=True)
    assert s['awarenessStatus'] == pytest.approx(1 - n * step, abs=1e-9), n
  prev, ups = s['awarenessStatus'], []
  while prev < 1 and len(ups) < 10 / DT_DMON:
    prev, ups = (a := dm.update(_dm(), 20., engaged=True)['awarenessStatus']), ups + [a - prev]
  assert prev == 1 and ups[5] > ups[-2] > 0   # recovers (once the filter says attentive), fastest when lowest
  for _ in range(300): s = dm.update(_dm(_side(phone=0.9)), 20., engaged=True)
  assert s['awarenessStatus'] == -0.1
  for _ in range(100): s = dm.update(_dm(), 20., engaged=True)
  assert s['awarenessStatus'] == -0.1   # red: attention alone does not bring it back
  assert dm.update(_dm(), 20.)['awarenessStatus'] == 1   # disengaging does
  s = DriverMonitoring().update(_dm(_side(face=0.1)), 20., engaged=True)
  assert not s['faceDetected'] and not s['isActiveMode'] and s['awarenessStatus'] == pytest.approx(1 - DT_DMON / 30.)
  dm = DriverMonitoring()
  for _ in range(400): s = dm.update(_dm(_side(phone=0.9)), 20.)
  assert s['awarenessStatus'] == 1 and s['isDistracted']   # not engaged
  dm = DriverMonitoring()
  for _ in range(400): s = dm.update(_dm(_side(phone=0.9)), 0., standstill=True, engaged=True)
  assert 6 / 11 < s['awarenessStatus'] <= 6 / 11 + step

def test_uncertain_pose_falls_back_to_passive_mode():
  """A face whose pose the model is unsure of for more than 10 s: passive mode (30 s), counted in hiStdCount; once
  sure again hiStdCount is 0. uncertainCount counts frames of a face with an orientation std above 0.1 while moving."""
  dm = DriverMonitoring()
  for _ in range(int(10 / DT_DMON) + 1): s = dm.update(_dm(_side(std=0.35)), 20., engaged=True)
  assert s['isActiveMode'] and s['hiStdCount'] == 201 and s['uncertainCount'] == 201
  s = dm.update(_dm(_side(std=0.35)), 20., engaged=True)
  assert not s['isActiveMode'] and s['stepChange'] == pytest.approx(DT_DMON / 30.)
  s = dm.update(_dm(_side(std=0.05)), 0., standstill=True, engaged=True)
  assert s['hiStdCount'] == 0 and not s['isActiveMode'] and s['uncertainCount'] == 202   # the mode follows a frame later
  assert dm.update(_dm(_side(std=0.05)), 0., standstill=True, engaged=True)['isActiveMode']

def test_rhd_from_the_filtered_mean_while_driving_with_a_face():
  """openpilot's rule: wheelOnRightProb counts only above 11 m/s with a face on either side, through a filter that
  skips a sample raising the spread of all samples so far; with more than WHEELPOS_FILTER_MIN_COUNT in, isRHD is their
  mean above 0.5; the side holds while engaged."""
  dm = DriverMonitoring(Settings(WHEELPOS_FILTER_MIN_COUNT=20))
  right = _dm(_side(face=0.05), _side(), wheel_on_right=0.95)
  for _ in range(40): s = dm.update(right, 11.)                                           # not faster than 11 m/s
  for _ in range(40): s = dm.update(_dm(_side(face=0.1), _side(face=0.1), 0.95), 20.)   # no face
  assert dm.wheelpos.raw.n == 0 and not s['isRHD']
  for _ in range(20): s = dm.update(right, 20.)
  assert not s['isRHD'] and not s['faceDetected']   # 20 samples are not more than 20: LHD, whose driver is not seen
  s = dm.update(right, 20.)
  assert s['isRHD'] and s['faceDetected']   # now the right side's driver data is used
  for _ in range(20): s = dm.update(_dm(_side(), _side(), 0.05), 20.)
  assert s['isRHD'] and dm.wheelpos.filtered.n == 21   # each of these raised the spread: the filter skipped them
  for _ in range(30): s = dm.update(_dm(_side(), _side(), 0.05), 20.)   # now they lower it, and count
  assert not s['isRHD'] and dm.wheelpos.filtered.mean == pytest.approx((21 * 0.95 + 30 * 0.05) / 51)
  dm = DriverMonitoring(Settings(WHEELPOS_FILTER_MIN_COUNT=20))
  for _ in range(30): s = dm.update(right, 20., engaged=True)
  assert not s['isRHD']   # engaged from the first frame: the side it started with holds
  s = dm.update(right, 20.)
  assert s['isRHD']

def test_filtered_mean_is_openpilots_running_stat_filter():
  f = FilteredMean(max_n=3)
  for v in (1., 1., 3., 1., 0.5, 1.):
    f.push(v)
  # raw takes all six; the filtered mean only those that did not raise their spread: 1, 1, then (1 after 3, 0.5, 1)
  assert f.raw.n == 6 and f.raw.mean == pytest.approx(7.5 / 6)
  assert f.filtered.n == 3

def test_pose_offsets_learned_while_driving():
  st = Settings(POSE_OFFSET_MIN_COUNT=50)
  dm = DriverMonitoring(st)
  for _ in range(60): s = dm.update(_dm(_side(yaw=-0.3)), 5.)   # too slow to learn
  assert s['poseYawValidCount'] == 0 and s['poseYawOffset'] == 0
  for _ in range(60): s = dm.update(_dm(_side(yaw=-0.25)), 20.)
  assert s['poseYawValidCount'] == 60 and s['poseYawOffset'] == pytest.approx(0.25)
  assert dm.update(_dm(_side(yaw=-0.7)), 20.)['distractedType'] == 0   # 0.45 from this driver's own offset
  for _ in range(60): s = dm.update(_dm(_side(yaw=-0.45)), 20.)   # learned offsets are used up to 0.289
  assert dm.update(_dm(_side(yaw=-0.289 - 0.51)), 20.)['distractedType'] == DistractedType.POSE

# ***** the daemon *****

def _start(artifacts, *args, **kw): return start_daemon('dmonitoringd', artifacts, *args, abstract=True, **kw)

def _run(cam, col, n):
  cam.send(n)
  return [col.wait(s, len(col.msgs[s]) + 1)[-1] for s in OUTPUTS]

def test_daemon_frames_in_lockstep(artifacts, tmp_path):
  """Every frame n gives driverStateV2 and driverMonitoringState for n. The camera server name and the message
  prefix come from the command line (the environment names another prefix)."""
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
