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
from dmonitoringd.policy import DriverMonitoring, DistractedType, Settings, DT_DMON
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

def test_distraction_types_and_awareness():
  dm = DriverMonitoring()
  s = dm.update(_dm(), v_ego=20.)
  assert s['faceDetected'] and not s['isDistracted'] and s['awarenessStatus'] == 1 and s['isActiveMode'] and s['isLowStd']
  for side, bit in ((_side(yaw=0.7), DistractedType.POSE), (_side(pitch=-0.4), DistractedType.POSE), (_side(blink=0.95), DistractedType.EYES),
                    (_side(phone=0.9), DistractedType.PHONE), (_side(yaw=0.7, phone=0.9), DistractedType.POSE | DistractedType.PHONE)):
    assert DriverMonitoring().update(_dm(side), 20.)['distractedType'] == bit
  assert DriverMonitoring().update(_dm(_side(blink=0.95, sunglasses=0.95)), 20.)['distractedType'] == 0   # eyes unseen behind sunglasses
  assert DriverMonitoring().update(_dm(_side(yaw=0.7, std=0.5)), 20.)['distractedType'] == 0              # pose too unsure to judge
  # distracted with a confident face: awareness 1 -> 0 in DISTRACTED_TIME, then recovers when attentive
  n = int(round(Settings().DISTRACTED_TIME / DT_DMON))
  for _ in range(n): s = dm.update(_dm(_side(yaw=0.7)), 20.)
  assert s['awarenessStatus'] == pytest.approx(0, abs=1e-6) and s['stepChange'] == pytest.approx(DT_DMON / Settings().DISTRACTED_TIME)
  prev = s['awarenessStatus']
  ups = []
  for _ in range(int(10 / DT_DMON)):   # back to full within 10 s
    a = dm.update(_dm(), 20.)['awarenessStatus']
    ups.append(a - prev)
    prev = a
  assert prev == 1 and ups[0] > ups[5] > 0   # recovers, fastest when awareness is lowest
  # no face: slower decay; standstill: held
  s = DriverMonitoring().update(_dm(_side(face=0.1)), 20.)
  assert not s['faceDetected'] and s['awarenessStatus'] == pytest.approx(1 - DT_DMON / Settings().AWARENESS_TIME)
  assert DriverMonitoring().update(_dm(_side(phone=0.9)), 0., standstill=True)['awarenessStatus'] == 1

def test_rhd_from_the_running_mean_while_driving_with_a_face():
  """openpilot's rule: wheelOnRightProb counts only above WHEELPOS_CALIB_MIN_SPEED (11 m/s) with a face on either side;
  once WHEELPOS_MIN_COUNT such frames are in isRHD is their plain mean above 0.5, no hysteresis, LHD until then."""
  dm = DriverMonitoring(Settings(WHEELPOS_MIN_COUNT=20))
  right = _dm(_side(face=0.05), _side(), wheel_on_right=0.95)
  for _ in range(40): s = dm.update(right, 11.)                                           # not faster than 11 m/s
  for _ in range(40): s = dm.update(_dm(_side(face=0.1), _side(face=0.1), 0.95), 20.)   # no face
  assert dm.wheelpos.n == 0 and not dm.rhd_checked and not s['isRHD']
  for _ in range(19): s = dm.update(right, 20.)
  assert not dm.rhd_checked and not s['isRHD'] and not s['faceDetected']   # not enough frames yet: LHD, whose driver is not seen
  s = dm.update(right, 20.)
  assert dm.rhd_checked and s['isRHD'] and s['faceDetected']   # now the right side's driver data is used
  left = _dm(_side(), _side(), 0.2)
  for _ in range(40): s = dm.update(left, 5.)   # too slow: not counted
  assert s['isRHD']
  for _ in range(29): s = dm.update(left, 20.)   # the mean of 20 x 0.95 and 29 x 0.2: 0.506
  assert s['isRHD']
  for _ in range(2): s = dm.update(left, 20.)    # and 31 x 0.2: 0.494
  assert not s['isRHD'] and dm.wheelpos.x == pytest.approx((20 * 0.95 + 31 * 0.2) / 51)

def test_pose_offsets_learned_while_driving():
  st = Settings(POSE_OFFSET_MIN_COUNT=50, POSE_OFFSET_TAU=0.5)
  dm = DriverMonitoring(st)
  for _ in range(60): s = dm.update(_dm(_side(yaw=0.3)), 5.)   # too slow to learn
  assert s['poseYawValidCount'] == 0 and s['poseYawOffset'] == st.YAW_NATURAL_OFFSET
  for _ in range(60): s = dm.update(_dm(_side(yaw=0.3)), 20.)
  assert s['poseYawValidCount'] == 60 and s['poseYawOffset'] == pytest.approx(0.3)
  assert dm.update(_dm(_side(yaw=0.65)), 20.)['distractedType'] == 0   # 0.35 from this driver's own offset

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
