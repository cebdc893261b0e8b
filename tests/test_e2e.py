"""End to end, real processes: camerad (synthetic scenes) -> VisionIPC -> modeld / dmonitoringd -> messages -> this test,
compared with the ground truth of the frame each output names. camerad runs --lockstep (each frame only after the
daemon answered the previous one), so every frame is answered and a run is deterministic however slow the machine.
One modeld and one dmonitoringd serve all the runs of this file (camerad restarts between runs; the daemons reconnect
and reset their history). And the demo, run as `make demo` runs it."""
import contextlib, os, re, shutil, subprocess, sys, time
import numpy as np
import pytest
from tests.artifacts import REPO, build
from tests.daemon_harness import Camera, Collector, Daemon, Notify
from cereal import messaging
from camerad.render import SceneRenderer
from camerad.scene import load_scene
from transformations.model import DM_HEIGHT, DM_WIDTH
from modelrt.constants import X_IDXS
from msgq import runtime_dir
from msgq.visionipc import ROAD, WIDE_ROAD
from msgq.visionipc.layout import NV12Layout
from modeld_tools.demo import scene_layouts

E2E = REPO / '.cache' / 'e2e'
NEAR = (X_IDXS >= 10) & (X_IDXS <= 50)
LANE_BOUND = 0.15   # m, ego lane lines for 10 m <= x <= 50 m
# from this frame of a run on, the road model's older image (4 frames back) is from the same run
WARMUP = 5

@pytest.fixture(scope='module')
def artifacts():
  """The demo's artifacts (both daemons, packed and aligned full-size layouts), built once into .cache/e2e."""
  return build(E2E, layouts=tuple(scene_layouts(load_scene('straight'))))

class Stack:
  """A daemon on its own OPENPILOT_PREFIX for the whole module; `serve` runs camerad on a scene against it."""
  def __init__(self, module: str, artifacts, output: str, cameras: str, prime: str):
    self.prefix, self.output, self.cameras = f"e2e{module[:2]}{os.getpid()}{time.monotonic_ns() % 10**6}", output, cameras
    # a STATUS= per loop turn: the totals of camera sessions (connects, disconnects) arrive as they change
    self.notify, self.sessions = Notify(), 0
    self.daemon = Daemon(module, artifacts, '--stats-interval', '0', notify=self.notify, env={'OPENPILOT_PREFIX': self.prefix})
    self.notify.wait('STATUS=', 60)   # its loop turns, waiting for a camera: its publishers are up, a subscriber is live at once
    self.runs: dict[tuple, dict[int, object]] = {}
    # camerad sends liveCalibration with every 5th frame, and a daemon's subscription to a new camerad is live only
    # once it reads again (after a frame): the first message can be missed. A short first run calibrates the daemon
    # (the angles stay between runs, all scenes share them), so every measured run is calibrated from its first frame
    self.serve(prime, 6)

  def serve(self, scene: str, frames: int, layout: str = 'packed') -> dict[int, object]:
    """{frame id: output event} for frames 0..frames-1 of the scene (cached: several tests look at the same run)."""
    if (key := (scene, frames, layout)) in self.runs: return self.runs[key]
    env = {**os.environ, 'OPENPILOT_PREFIX': self.prefix}
    with self.env(): col = Collector([self.output])   # the daemon's publisher is up: live before camerad's first frame
    try:
      p = subprocess.Popen([sys.executable, '-m', 'camerad', '--source', f'synthetic:{scene}', '--cameras', self.cameras, '--lockstep',
                            '--frames', str(frames), '--layout', layout], stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
      deadline = time.monotonic() + 120
      while p.poll() is None and time.monotonic() < deadline:   # read as they come: ZMQ drops beyond its queue
        col.poll()
        time.sleep(0.01)
      if p.poll() is None: p.kill()
      err = p.communicate()[1]
      assert p.returncode == 0, f"camerad: {p.returncode}\n{err}\n--- daemon:\n" + '\n'.join(self.daemon.stderr().splitlines()[-30:])
      evs = col.wait(self.output, frames, timeout=5)   # camerad saw every answer; they are here or on the way
    finally: col.close()
    self.camera_gone()
    out = {getattr(e, self.output).frameId: e for e in evs}
    assert sorted(out) == list(range(frames)), sorted(out)
    self.runs[key] = out
    return out

  @contextlib.contextmanager
  def env(self):
    """This process's sockets on the stack's prefix."""
    old = os.environ.get('OPENPILOT_PREFIX')
    os.environ['OPENPILOT_PREFIX'] = self.prefix
    try: yield
    finally:
      if old is None: del os.environ['OPENPILOT_PREFIX']
      else: os.environ['OPENPILOT_PREFIX'] = old

  def camera_gone(self) -> None:
    """Call when the camera server has exited: waits until the daemon noticed (it ends the session a second after the
    last frame and waits for a server again), so that the next server gets fresh clients. (A camera server back within
    that second is served by the old clients, whose subscriptions ZMQ renews only when they read: modeld does not read
    the wide road stream while idle, and a lockstep camerad waits for that client forever.)"""
    self.sessions += 1
    self.notify.wait_count('disconnects', self.sessions)

  def close(self) -> None:
    rc, _ = self.daemon.stop()
    self.notify.close()
    with self.env(): shutil.rmtree(runtime_dir())   # the publishers' lock files
    assert rc == 0

@pytest.fixture(scope='module')
def road(artifacts):
  s = Stack('modeld', artifacts, 'modelV2', 'road,wide', 'straight')
  yield s
  s.close()

@pytest.fixture(scope='module')
def driver(artifacts):
  s = Stack('dmonitoringd', artifacts, 'driverStateV2', 'driver', 'driver_blinking')
  yield s
  s.close()

def lane_errors(m, truth: dict) -> np.ndarray:
  """Max |error| over 10..50 m of the ego left and right lines."""
  got = np.array([m.laneLines[i].y for i in (1, 2)])
  want = np.array([truth['road']['lane_lines'][i]['y'] for i in (1, 2)])
  return np.abs(got - want)[:, NEAR].max(1)

# ***** road *****

@pytest.mark.parametrize('scene, frames', [('straight', 20), ('curve', 60)])
def test_ego_lane_lines(road, scene, frames):
  sc, out = load_scene(scene), road.serve(scene, frames)
  errs = {f: lane_errors(out[f].modelV2, sc.truth(f)) for f in range(WARMUP, frames)}
  worst = max(errs, key=lambda f: errs[f].max())
  print(f"{scene}: ego lane line error 10-50 m: mean {np.mean([e.max() for e in errs.values()]):.3f} m, worst {errs[worst].max():.3f} m (frame {worst})")
  assert errs[worst].max() < LANE_BOUND, (worst, errs[worst])
  for f in range(WARMUP, frames):
    m = out[f].modelV2
    assert out[f].valid and m.laneLineProbs[1] > 0.9 and m.laneLineProbs[2] > 0.9
    assert list(m.laneLines[1].x) == pytest.approx(X_IDXS.tolist())
  if scene == 'curve': assert sc.truth(frames - 1)['road']['curvature'] > 0.003   # the run reaches the tight part

def test_lead(road):
  sc, out = load_scene('lead_braking'), road.serve('lead_braking', 80)
  rel = {}
  for f in range(WARMUP, 80):
    lead, truth = out[f].modelV2.leadsV3[0], sc.truth(f)['lead']
    assert truth['present'] and 10 <= truth['x'] <= 80
    assert lead.prob > 0.9, (f, lead.prob)
    rel[f] = abs(lead.x[0] - truth['x']) / truth['x']
  worst = max(rel, key=rel.get)
  xs = [sc.truth(f)['lead']['x'] for f in rel]
  print(f"lead {min(xs):.0f}-{max(xs):.0f} m: distance error mean {np.mean(list(rel.values())) * 100:.1f} %, worst {rel[worst] * 100:.1f} % (frame {worst})")
  assert rel[worst] < 0.10, (worst, out[worst].modelV2.leadsV3[0].x[0], sc.truth(worst)['lead']['x'])
  assert min(xs) < 20 and max(xs) > 50   # the run covers near and far

def test_no_lead(road):
  sc, out = load_scene('straight'), road.serve('straight', 20)
  assert not any(sc.truth(f)['lead']['present'] for f in out)
  probs = [out[f].modelV2.leadsV3[i].prob for f in range(WARMUP, 20) for i in range(3)]
  print(f"no lead: prob max {max(probs):.4f}")
  assert max(probs) < 0.1

def test_padded_layout_same_numbers(road):
  packed, aligned = road.serve('curve', 60), road.serve('curve', 30, 'aligned')
  for f in range(30):   # every frame: the same pixels, the same history
    a, b = packed[f].modelV2, aligned[f].modelV2
    for get in (lambda m: [l.y for l in m.laneLines], lambda m: m.laneLineProbs, lambda m: [e.y for e in m.roadEdges],
                lambda m: [(l.prob, *l.x, *l.y) for l in m.leadsV3], lambda m: m.position.y, lambda m: m.position.x):
      np.testing.assert_allclose(np.array(get(a), np.float64), np.array(get(b), np.float64), rtol=1e-5, atol=1e-6, err_msg=f"frame {f}")

def test_daemon_uses_calibration(road):
  """The test is the camera: curve frames rendered with the scene's calibration, told to modeld first with the right
  calibration (within the bound), then with zero angles (the lines land elsewhere in the model frame: far off)."""
  sc = load_scene('curve')
  layout = NV12Layout.packed(sc.cameras['road'].width, sc.cameras['road'].height)
  rend = {s: SceneRenderer(sc, c, layout) for s, c in ((ROAD, 'road'), (WIDE_ROAD, 'wide'))}
  with road.env():   # camerad runs of this module have ended: the camera and the calibration are ours
    cam, pm, col = Camera({ROAD: layout, WIDE_ROAD: layout}), messaging.PubMaster(['liveCalibration']), Collector(['modelV2'])
  errs = {}
  try:
    road.notify.wait_count('connects', road.sessions + 1)   # frames sent before would be lost
    # and calibrations sent before the daemon subscribed to this new publisher (it re-tries every 0.5 s at most)
    assert pm.wait_for_readers_to_update('liveCalibration', 10)
    for phase, rpy in (('right', sc.calib), ('zero', (0., 0., 0.))):
      for k in range(2 * WARMUP):
        f = (1 if phase == 'right' else 1 + 2 * WARMUP) + k   # frame id (timestampSof f * 50 ms: modeld's sync skips 0)
        scene_frame = 40 + f   # the tight part of the curve
        cal = messaging.new_message('liveCalibration')
        cal.liveCalibration.calStatus, cal.liveCalibration.rpyCalib = 'calibrated', list(rpy)
        pm.send('liveCalibration', cal)
        for s, r in rend.items(): cam.images[s] = r.render(scene_frame)
        cam.send(f)
        ev = next(e for e in col.wait('modelV2', f, timeout=10)[::-1] if e.modelV2.frameId == f)
        if k >= WARMUP: errs[(phase, f)] = lane_errors(ev.modelV2, sc.truth(scene_frame)).max()
  finally:
    col.close(); pm.close(); cam.close()
    road.camera_gone()
  right = [e for (p, _), e in errs.items() if p == 'right']
  zero = [e for (p, _), e in errs.items() if p == 'zero']
  print(f"curve, right calibration: worst {max(right):.3f} m; zero calibration: best {min(zero):.3f} m")
  assert max(right) < LANE_BOUND and min(zero) > 2 * LANE_BOUND

# ***** driver *****

def face_errors(out: dict, sc) -> dict[int, float]:
  """Face position error per frame, as a fraction of the image width (model input pixels)."""
  errs = {}
  for f, ev in out.items():
    truth, d = sc.truth(f)['driver']['face'], ev.driverStateV2.leftDriverData
    assert truth['present'] and d.faceProb > 0.9, (f, d.faceProb)
    errs[f] = float(np.hypot(*((np.array(d.facePosition) - truth['position']) * (DM_WIDTH, DM_HEIGHT)))) / DM_WIDTH
  return errs

@pytest.mark.parametrize('scene', ['driver_blinking', 'driver_distracted'])
def test_face_position(driver, scene):
  sc = load_scene(scene)
  errs = face_errors(driver.serve(scene, sc.n_frames), sc)
  print(f"{scene}: face position error mean {np.mean(list(errs.values())) * 100:.2f} %, worst {max(errs.values()) * 100:.2f} % of the width")
  assert max(errs.values()) < 0.05

def test_blink_detected(driver):
  sc = load_scene('driver_blinking')
  out = driver.serve('driver_blinking', sc.n_frames)
  closed = {f: sc.truth(f)['driver']['eyes_closed'] for f in out}
  assert 0 < sum(closed.values()) < len(closed)
  right = [((d := out[f].driverStateV2.leftDriverData).leftBlinkProb > 0.5 and d.rightBlinkProb > 0.5) == c for f, c in closed.items()]
  print(f"blink: right in {np.mean(right) * 100:.1f} % of {len(right)} frames ({sum(closed.values())} closed)")
  assert np.mean(right) >= 0.95

def test_phone_detected(driver):
  sc = load_scene('driver_distracted')
  out = driver.serve('driver_distracted', sc.n_frames)
  phone = {f: sc.truth(f)['driver']['phone'] for f in out}
  assert 0 < sum(phone.values()) < len(phone)
  right = [(out[f].driverStateV2.leftDriverData.phoneProb > 0.5) == p for f, p in phone.items()]
  print(f"phone: right in {np.mean(right) * 100:.1f} % of {len(right)} frames ({sum(phone.values())} with a phone)")
  assert np.mean(right) >= 0.95

def test_driver_padded_layout_same_numbers(driver):
  packed, aligned = driver.serve('driver_blinking', 60), driver.serve('driver_blinking', 10, 'aligned')
  for f in range(10):
    a, b = packed[f].driverStateV2, aligned[f].driverStateV2
    for side in ('leftDriverData', 'rightDriverData'):
      da, db = getattr(a, side), getattr(b, side)
      got = lambda d: [*d.faceOrientation, *d.facePosition, d.faceProb, d.leftEyeProb, d.rightEyeProb, d.leftBlinkProb, d.rightBlinkProb, d.phoneProb]
      np.testing.assert_allclose(got(da), got(db), rtol=1e-5, atol=1e-6, err_msg=f"frame {f} {side}")

# ***** the demo *****

@pytest.mark.parametrize('transport', ['zmq', 'shm'])
def test_demo(artifacts, tmp_path, monkeypatch, transport):
  """The whole stack (camerad, both daemons, the recorder) on either transport, and nothing of it left afterwards; on
  zmq with modeld-view watching it live (modeld-demo --view-save), its recording read back."""
  out, view = tmp_path / 'demo', transport == 'zmq'
  p = subprocess.run([sys.executable, '-m', 'modeld_tools.demo', '--seconds', '8', '--artifacts', str(artifacts), '--out', str(out),
                      *(['--view-save', str(out / 'view.rrd')] if view else [])],
                     capture_output=True, text=True, cwd=REPO, timeout=240, env={**os.environ, 'MSGQ_TRANSPORT': transport})
  print(p.stdout[-3000:], p.stderr[-3000:])
  assert p.returncode == 0
  started = re.search(r"started (.*) with OPENPILOT_PREFIX=(\w+)", p.stdout)
  pids, prefix = [int(x) for x in re.findall(r"pid (\d+)", started.group(1))], started.group(2)
  assert len(pids) == 4 + view
  for pid in pids:   # reaped by the demo, none left behind as an orphan
    with pytest.raises(ProcessLookupError): os.kill(pid, 0)
  assert re.search(r"stopped camerad \(0\), modeld \(0\), dmonitoringd \(0\), record \(0\)" + (r", view \(0\)" if view else ''), p.stdout)
  if view: check_demo_view(out, int(re.search(r"summary.*\n.*modelV2 (\d+)", p.stdout).group(1)))
  m = re.search(r"summary.*\n.*modelV2 (\d+) .*driverStateV2 (\d+)", p.stdout)
  assert int(m.group(1)) > 0 and int(m.group(2)) > 0, p.stdout
  # the errors leave out invalid outputs and the road model's warm-up (its image queue filling: lane lines metres off), and say so
  assert (left := re.search(r"left out +of the errors: (\d+) modelV2, (\d+) driverStateV2 .* its first 4 valid", p.stdout)), p.stdout
  assert int(left.group(1)) >= 4, p.stdout
  assert float(re.search(r"lane lines .* worst ([\d.]+) m", p.stdout).group(1)) < 0.25, p.stdout
  # no sockets (VisionIPC or pub/sub) left in the demo's prefix, no shared memory files of it (the rings are memfds,
  # the shm transport's queue folder of the demo's private prefix is removed); other programs' files are not looked at
  monkeypatch.setenv('OPENPILOT_PREFIX', prefix)
  assert os.listdir(d := runtime_dir()) == []
  os.rmdir(d)   # runtime_dir() made it again just now
  assert not [f for f in os.listdir('/dev/shm') if prefix in f]
  assert not [f for f in os.listdir('/tmp') if f.startswith(f'{prefix}_visionipc_')]   # where the shm transport's socket was
  # it ends with the overlay video of the recorded route
  assert p.stdout.strip().splitlines()[-1] == f"modeld-demo: overlay video: {out / 'overlay.mp4'}"
  import av
  with av.open(str(out / 'overlay.mp4')) as c: assert sum(1 for _ in c.decode(video=0)) > 0

def check_demo_view(out, n_model: int) -> None:
  """modeld-view, live on the demo's stack: it saw the three cameras and logged their pictures (NV12, the 1928x1208
  streams decimated by 3), each frame once, and the outputs, the ego lane lines projected where the scene's truth
  puts them in the picture's pixels (the model's error aside)."""
  from tests.test_tools import road_pixel
  from tests.test_view import near_polyline, read_rrd
  log = (out / 'logs' / 'view.log').read_text()
  assert "connected to 'camerad': driver, road, wide" in log, log
  m = re.search(r"(\d+) pictures \(road (\d+), driver (\d+), wide (\d+)\), (\d+) modelV2, (\d+) driverStateV2", log)
  assert m, log
  rows, scene = read_rrd(out / 'view.rrd', blobs=False), load_scene(out / 'scene.json')
  assert {'/road/image', '/wide/image', '/driver/image', '/road/lanes', '/wide/lanes', '/road/path', '/driver/face', '/text/model',
          '/text/driver', '/timing/modelV2', '/monitoring/awareness'} <= set(rows), set(rows)
  for cam, n in zip(('road', 'driver', 'wide'), m.groups()[1:4]):
    img = rows[f'/{cam}/image']
    assert len(img['frame']) == len(set(img['frame'])) == int(n) >= 40, (cam, n)   # 8 s at 20 Hz: most frames, none twice
    assert set(img['Image:buffer']) == {642 * 402 * 3 // 2} and {f[0]['width'] for f in img['Image:format']} == {642}, cam
  # every output the demo saw, and the viewer's since it started (it may connect after the first)
  assert 0.8 * n_model <= int(m.group(5)) <= n_model + 20 and len(rows['/road/lanes']['frame']) == int(m.group(5)), (m.group(0), n_model)
  lanes = rows['/road/lanes']
  for i in range(WARMUP, len(lanes['frame']), 20):
    fid, strips = lanes['frame'][i], lanes['LineStrips2D:strips'][i]
    for line, strip in zip(scene.truth(fid % scene.n_frames)['road']['lane_lines'][1:3], strips[1:3]):
      u, v = road_pixel(scene, 20., float(np.interp(20., X_IDXS, line['y'])))
      assert near_polyline((u / 3, v / 3), strip) < 5, (fid, (u / 3, v / 3))   # 5 px: 0.11 m at 20 m
