"""modeld-dump, modeld-overlay and modeld-plot against real processes and sockets.

A small stack runs once per module: camerad on a 320x200 synthetic scene in lockstep, modeld-record with video,
modeld-overlay --live, and a stand-in model process answering every frame from the scene's ground truth (so the drawn
lane lines must land on the painted ones)."""
import base64, json, os, re, select, shutil, signal, subprocess, sys, uuid
from pathlib import Path
import av
import numpy as np
import pytest
from PIL import Image
from camerad.scene import load_scene
from cereal.services import CAMERAS
from transformations.camera import camera_from_calib
from msgq import runtime_dir
from tests.daemon_harness import Notify

BIN = Path(sys.executable).parent
N_FRAMES = 20
SCENE = {"name": "tools", "calib": [0.01, 0.02, -0.015], "frames": N_FRAMES, "seed": 3, "road": {"speed": 20.0},
         "lead": {"distance": [[0, 30.0], [1.0, 20.0]], "offset": 0.1},
         "driver": {"eyes_closed": [[0, False], [0.3, True]], "phone": {"present": True}},
         "intrinsics": {c: {"width": 320, "height": 200, "focal_length": f} for c, f in (("road", 439.5), ("wide", 94.1), ("driver", 94.1))}}

# answers each camera frame like the daemons would (a VisionIPC client of road and driver), from the scene's truth
MODEL = r"""
import sys, time
from camerad.scene import load_scene
from cereal.services import CAMERAS
from cereal import messaging
from modelrt.constants import X_IDXS, T_IDXS
from msgq.visionipc import DRIVER, ROAD, VisionIpcClient
sc = load_scene(sys.argv[1])
pm = messaging.PubMaster(['modelV2', 'driverStateV2', 'driverMonitoringState'])
clients = {s: VisionIpcClient('camerad', s, conflate=False) for s in (ROAD, DRIVER)}
for c in clients.values(): c.connect(blocking=True)
states = [messaging.sub_sock(s) for s in ('roadCameraState', 'driverCameraState')]   # as a daemon, once ready: lockstep waits for it
print('ready', flush=True)
sys.stdin.readline()   # go: the recorder and the live overlay are up
while True:
  for stream, c in clients.items():
    if (buf := c.recv(timeout_ms=20)) is None: continue
    fid = buf.frame_id
    del buf
    time.sleep(0.03)   # about a model's pace, so the live overlay keeps up
    t = sc.truth(fid)
    if stream == ROAD:
      m = messaging.new_message('modelV2')
      mv = m.modelV2
      mv.frameId = mv.frameIdExtra = fid
      mv.modelExecutionTime, mv.frameDropPerc, mv.confidence = 0.010 + 0.002 * (fid % 3), 0.0, 'green'
      for dst, src in ((mv.init('laneLines', 4), t['road']['lane_lines']), (mv.init('roadEdges', 2), t['road']['road_edges'])):
        for l, s in zip(dst, src): l.x, l.y, l.z = X_IDXS.tolist(), s['y'], [sc.height] * len(X_IDXS)
      mv.laneLineProbs = [0.4, 0.95, 0.95, 0.4]
      mv.position.x, mv.position.y, mv.position.z = (T_IDXS * t['v_ego']).tolist(), [0.] * 33, [0.] * 33
      lead = mv.init('leadsV3', 3)[0]
      lead.prob, lead.x, lead.y, lead.v = 0.9, [t['lead']['x']] * 6, [t['lead']['y']] * 6, [t['lead']['v']] * 6
      pm.send('modelV2', m)
    else:
      d = t['driver']
      m = messaging.new_message('driverStateV2')
      ds = m.driverStateV2
      ds.frameId, ds.modelExecutionTime = fid, 0.005
      for dd in (ds.leftDriverData, ds.rightDriverData):
        dd.facePosition, dd.faceProb = d['face']['position'], 0.97
        dd.leftEyeProb = dd.rightEyeProb = 0.9
        dd.leftBlinkProb = dd.rightBlinkProb = 0.95 if d['eyes_closed'] else 0.05
        dd.phoneProb = 0.9 if d['phone'] else 0.1
      s = messaging.new_message('driverMonitoringState')
      s.driverMonitoringState.activePolicy = 'vision'
      s.driverMonitoringState.visionPolicyState.awarenessPercent = 100 - fid * 5
      s.driverMonitoringState.visionPolicyState.isDistracted = d['eyes_closed']
      pm.send('driverStateV2', m)
      pm.send('driverMonitoringState', s)
"""

def cleanup_prefix(prefix: str) -> None:
  """Remove the runtime directory of a module fixture's own prefix (conftest cleans only the per-test ones)."""
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('OPENPILOT_PREFIX', prefix)
    shutil.rmtree(runtime_dir(), ignore_errors=True)

def start(args, env, **kw) -> subprocess.Popen:
  return subprocess.Popen([str(a) for a in args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)

def stop(p: subprocess.Popen, sig=signal.SIGINT, timeout: float = 20) -> tuple[str, str]:
  if p.poll() is None: p.send_signal(sig)
  try: return p.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    p.kill()
    return p.communicate()

def start_scene_stack(scene: Path, env: dict, procs: list) -> tuple[subprocess.Popen, subprocess.Popen]:
  """camerad in lockstep on the scene and the stand-in model (MODEL) answering it, both in procs; the model waits for
  'go' on its stdin. camerad first: in lockstep it waits for the model's client, then for each frame's outputs."""
  cam = start([BIN / 'camerad', '--source', f"synthetic:{scene}", '--cameras', 'road,driver', '--lockstep', '--lockstep-timeout', '30'], env)
  procs.append(cam)
  while 'serving' not in (line := cam.stderr.readline()): assert line, cam.communicate()[1]
  model = start([sys.executable, '-c', MODEL, scene], env, stdin=subprocess.PIPE)
  procs.append(model)
  assert model.stdout.readline().strip() == 'ready', model.stderr.read()
  return cam, model

@pytest.fixture(scope='module')
def stack(tmp_path_factory):
  d = tmp_path_factory.mktemp('stack')
  (d / 'scene.json').write_text(json.dumps(SCENE))
  env = {**os.environ, 'OPENPILOT_PREFIX': f"tools{uuid.uuid4().hex[:8]}", 'PYTHONUNBUFFERED': '1'}
  procs, notify = [], Notify()
  try:
    cam, model = start_scene_stack(d / 'scene.json', env, procs)
    rec = start([BIN / 'modeld-record', '--route', d / 'route', '--video', 'road,driver', '--stats-interval', '0'], {**env, 'NOTIFY_SOCKET': notify.addr})
    procs.append(rec)
    live = start([BIN / 'modeld-overlay', '--live', '--frames', '5', '--out', d / 'live.mp4', '--quiet', '--timeout', '30'], env)
    procs.append(live)
    notify.wait_count('video_connected', 2, timeout=30)   # the recorder's camera clients, then the overlay's
    while 'connected' not in (line := live.stderr.readline()): assert line, 'modeld-overlay ended before it connected'
    model.stdin.write('go\n')
    model.stdin.flush()
    cam_err = cam.communicate(timeout=120)[1]
    assert cam.returncode == 0, cam_err
    live_out = live.communicate(timeout=60)
    for svc in ('roadEncodeIdx', 'driverEncodeIdx', 'modelV2', 'driverStateV2'): notify.wait_count(svc, N_FRAMES)   # all recorded
    rec_out = stop(rec)
    assert rec.returncode == 0, rec_out[1]
    yield {'dir': d, 'route': d / 'route', 'scene': load_scene(d / 'scene.json'), 'env': env, 'live': (live.returncode, *live_out)}
  finally:
    for p in procs: stop(p, signal.SIGKILL)
    notify.close()
    cleanup_prefix(env['OPENPILOT_PREFIX'])

def run(args, env=None, timeout=60, umask: int | None = None) -> subprocess.CompletedProcess:
  return subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, timeout=timeout,
                        preexec_fn=None if umask is None else lambda: os.umask(umask))

def decode(path: Path) -> list[tuple[int, np.ndarray]]:
  with av.open(str(path)) as c: return [(f.pts, f.to_ndarray(format='rgb24')) for f in c.decode(video=0)]

def recorded(route: Path, camera: str) -> dict[int, np.ndarray]:
  """The route's video frames of the camera by frame id, placed by its EncodeIdx events."""
  from oproute import LogReader, segment_dirs
  from oproute.video import EncodeIndex
  idx, segs = EncodeIndex(), {int(d.name.rsplit('--', 1)[1]): d for d in segment_dirs(route)}
  for ev in LogReader(route): idx.add(ev)
  files = {n: [rgb for _, rgb in decode(d / CAMERAS[camera].video)] for n, d in segs.items() if (d / CAMERAS[camera].video).exists()}
  return {fid: files[seg][i] for fid, places in idx.frames[camera].items() for seg, i, _ in places}

def road_pixel(scene, x: float, y: float) -> tuple[int, int]:
  """The road camera pixel of the road point x ahead, y right (calibrated frame, road at camera height)."""
  p = camera_from_calib(scene.calib, scene.cameras['road']) @ [x, y, scene.height]
  return int(round(p[0] / p[2])), int(round(p[1] / p[2]))

# ---- modeld-dump

PUB = r"""
import time
from cereal import messaging
pm = messaging.PubMaster(['modelV2', 'carState'])
garbage = messaging.pub_sock('driverStateV2')
print('ready', flush=True)
i = 0
while True:
  m = messaging.new_message('modelV2')
  m.modelV2.frameId, m.modelV2.rawPredictions, m.modelV2.laneLineProbs = i, bytes(range(64)), [0.25, 0.5]
  pm.send('modelV2', m)
  c = messaging.new_message('carState')
  c.carState.vEgo = 20.5
  pm.send('carState', c)
  if i % 4 == 0: garbage.send(b'not a capnp message')
  i += 1
  time.sleep(0.05)
"""

@pytest.fixture(scope='module')
def publisher():
  prefix = f"dump{uuid.uuid4().hex[:8]}"
  p = start([sys.executable, '-c', PUB], {**os.environ, 'OPENPILOT_PREFIX': prefix, 'MSGQ_TCP': '0.0.0.0'})
  assert p.stdout.readline().strip() == 'ready', p.stderr.read()
  yield prefix
  stop(p, signal.SIGKILL)
  cleanup_prefix(prefix)

def test_dump_text(publisher):
  # the publisher runs under another prefix than this test's: --prefix selects it
  r = run([BIN / 'modeld-dump', '--prefix', publisher, 'modelV2', '-n', '2'], timeout=30)
  assert r.returncode == 0, r.stderr
  assert r.stdout.count('modelV2 = (') == 2
  assert 'rawPredictions = "<64 bytes>"' in r.stdout and 'laneLineProbs = [0.25, 0.5]' in r.stdout
  assert 'frameId = ' in r.stdout

def test_dump_json(publisher):
  r = run([BIN / 'modeld-dump', '--prefix', publisher, '--json', 'modelV2', 'carState', '-n', '6'], timeout=30)
  assert r.returncode == 0, r.stderr
  lines = [json.loads(l) for l in r.stdout.splitlines()]
  assert len(lines) == 6 and {next(iter(l)) for l in lines} == {'modelV2', 'carState'}
  mv = next(l for l in lines if 'modelV2' in l)
  assert base64.b64decode(mv['modelV2']['rawPredictions']) == bytes(range(64)) and mv['modelV2']['laneLineProbs'] == [0.25, 0.5]
  assert next(l for l in lines if 'carState' in l)['carState']['vEgo'] == 20.5 and isinstance(mv['logMonoTime'], int)
  r = run([BIN / 'modeld-dump', '--prefix', publisher, '--json', '--bytes', 'length', 'modelV2', '-n', '1'], timeout=30)
  assert json.loads(r.stdout)['modelV2']['rawPredictions'] == {'bytes': 64}

def test_dump_malformed_counted(publisher):
  r = run([BIN / 'modeld-dump', '--prefix', publisher, 'driverStateV2', 'modelV2', '-n', '12'], timeout=30)
  assert r.returncode == 0, r.stderr
  assert r.stdout.count('modelV2 = (') == 12
  assert re.search(r'driverStateV2: malformed message \(19 bytes\).*\(1 so far\)', r.stderr), r.stderr

def test_dump_hz(publisher):
  r = run([BIN / 'modeld-dump', '--prefix', publisher, '--hz', 'modelV2', 'driverStateV2', 'liveCalibration', '-n', '50'], timeout=30)
  assert r.returncode == 0, r.stderr
  # a table per second and one at the end, blank lines between: service, Hz, expected Hz, msgs, dt min / avg / max (ms),
  # malformed. The rates depend on how the publisher is scheduled (test_dump_hz_table has them from known times); the
  # counts do not: -n counts the good messages, only modelV2 has any, and each is in exactly one table
  tables = [{l.split()[0]: l.split() for l in t.splitlines()[1:]} for t in r.stdout.strip().split('\n\n')]
  assert sum(int(t['modelV2'][3]) for t in tables) == 50, r.stdout
  assert int(tables[-1]['driverStateV2'][-1]) > 0 and 'nothing received' in ' '.join(tables[-1]['liveCalibration'])

def test_dump_hz_table():
  """The --hz table from known receive times: the rate over the window, the gaps between receives (the first of a
  window from the previous window's last message), malformed messages since the start."""
  from modeld_tools.dump import Rates
  rates = Rates(['modelV2', 'carState', 'liveCalibration'])
  rates.reset(100.0)
  for t in (100.0, 100.04, 100.09, 100.15): rates.add('modelV2', t)   # gaps of 40, 50 and 60 ms
  rates.add('carState', 100.3)
  rates.malformed['carState'] += 2
  rows = {l.split()[0]: l.split() for l in rates.report(100.5).splitlines()[1:]}
  assert rows['modelV2'][1:] == ['8.0', '20.0', '4', '40.0', '50.0', '60.0', '0']
  assert rows['carState'][1:] == ['2.0', '100.0', '1', '-', '-', '-', '2']
  assert rows['liveCalibration'][1:] == ['0.0', '4.0', '0', '-', '-', '-', '0', '(nothing', 'received', 'yet)']
  rates.reset(101.0)
  rates.add('modelV2', 101.2)
  rows = {l.split()[0]: l.split() for l in rates.report(102.0).splitlines()[1:]}
  assert rows['modelV2'][1:] == ['1.0', '20.0', '1', '1050.0', '1050.0', '1050.0', '0']
  assert rows['carState'][1:] == ['0.0', '100.0', '0', '-', '-', '-', '2']

def test_dump_remote_addr(publisher):
  # 127.0.1.1 is not "local" to msgq: it goes over TCP to the publisher's MSGQ_TCP port
  r = run([BIN / 'modeld-dump', '--prefix', publisher, '--addr', '127.0.1.1', '--json', 'carState', '-n', '1'], timeout=30)
  assert r.returncode == 0, r.stderr
  assert json.loads(r.stdout)['carState']['vEgo'] == 20.5

def stderr_line(p: subprocess.Popen, timeout: float) -> str:
  """The process's next stderr line, or '' if none came within timeout."""
  ready, _, _ = select.select([p.stderr], [], [], timeout)
  return p.stderr.readline() if ready else ''

def test_dump_says_once_what_it_waits_for(publisher):
  """Nothing of a service within a few seconds: one stderr line names it and where it is listened for, and modeld-dump
  goes on waiting (a missing publisher, a wrong --prefix or an unreachable --addr would otherwise look like a hang);
  a service that is received is not named, and stdout stays the messages alone."""
  nobody = f"nobody{uuid.uuid4().hex[:8]}"
  procs = [start([BIN / 'modeld-dump', '--prefix', nobody, 'modelV2'], os.environ),
           start([BIN / 'modeld-dump', '--prefix', nobody, '--addr', '127.0.1.1', 'modelV2', 'carState'], os.environ),
           start([BIN / 'modeld-dump', '--prefix', publisher, '--json', 'modelV2', 'liveCalibration'], os.environ)]
  try:
    notes = [stderr_line(p, 30) for p in procs]
    assert all(p.poll() is None for p in procs), "still waiting"
  finally:
    ends = [stop(p) for p in procs]
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('OPENPILOT_PREFIX', nobody)
    assert notes[0] == (f"modeld-dump: no modelV2 message yet from this machine's stack (OPENPILOT_PREFIX='{nobody}', zmq transport, "
                        f"in {runtime_dir()}); waiting\n")
  assert notes[1] == "modeld-dump: no modelV2 or carState message yet from 127.0.1.1 over TCP (its publishers need MSGQ_TCP set); waiting\n"
  assert notes[2].startswith("modeld-dump: no liveCalibration message yet from this machine's stack"), notes[2]
  assert [p.returncode for p in procs] == [0, 0, 0] and [e[1] for e in ends] == ['', '', ''], ends   # one note each, and SIGINT ends it cleanly
  assert ends[0][0] == ends[1][0] == '' and ends[2][0] and all(next(iter(json.loads(l))) == 'modelV2' for l in ends[2][0].splitlines()), ends[2][0][:300]
  cleanup_prefix(nobody)

def test_dump_usage_errors():
  r = run([BIN / 'modeld-dump', 'modelV2', 'fooState'])
  assert r.returncode == 2 and "unknown service 'fooState'" in r.stderr and 'driverStateV2' in r.stderr
  r = run([BIN / 'modeld-dump'])
  assert r.returncode == 2 and 'known services: modelV2' in r.stderr

# ---- modeld-overlay

def test_overlay_route_mp4(stack, tmp_path):
  out = tmp_path / 'o.mp4'
  r = run([BIN / 'modeld-overlay', stack['route'], '--out', out, '--quiet'])
  assert r.returncode == 0, r.stderr
  frames = decode(out)
  assert len(frames) == len(recorded(stack['route'], 'road')) >= N_FRAMES - 2 and frames[0][1].shape == (200, 320, 3)

def test_overlay_draws_lanes_where_they_are(stack, tmp_path):
  r = run([BIN / 'modeld-overlay', stack['route'], '--out', tmp_path, '--frames', '2', '--start', '5', '--quiet'])
  assert r.returncode == 0, r.stderr
  pngs = sorted(tmp_path.glob('frame_*.png'))
  assert len(pngs) == 2
  fid = int(pngs[0].stem.split('_')[1])
  assert fid == 5   # --start: the first frame drawn
  raw = recorded(stack['route'], 'road')[fid].astype(int)
  out = np.asarray(Image.open(pngs[0])).astype(int)
  sc = stack['scene']
  lane_y = sc.truth(fid)['road']['lane_lines'][1]['y'][0]
  u, v = road_pixel(sc, 15.0, lane_y)
  assert np.abs(out[v, u] - raw[v, u]).max() > 60, (out[v, u], raw[v, u])   # the left ego lane line is drawn there
  assert np.abs(out[5:30, -40:-5] - raw[5:30, -40:-5]).max() <= 2             # the sky in the top right corner is not touched

def test_overlay_driver(stack, tmp_path):
  """The face drawn where it is; the picture of the cabin this account's alone under umask 0 (0644 before)."""
  r = run([BIN / 'modeld-overlay', stack['route'], '--camera', 'driver', '--out', tmp_path / 'o', '--frames', '1', '--quiet'], umask=0)
  assert r.returncode == 0, r.stderr
  png = next((tmp_path / 'o').glob('frame_*.png'))
  assert (tmp_path / 'o').stat().st_mode & 0o777 == 0o700 and png.stat().st_mode & 0o777 == 0o600
  fid = int(png.stem.split('_')[1])
  raw = recorded(stack['route'], 'driver')[fid].astype(int)
  out = np.asarray(Image.open(png)).astype(int)
  u, v = (int(c) for c in stack['scene'].truth(fid)['driver']['face']['camera_px'])
  changed = np.abs(out - raw).max(-1) > 40
  assert changed[max(0, v - 40):v + 40, max(0, u - 40):u + 40].any()   # the face box and eyes around the face
  assert not changed[60:150, -60:].any() or u > 220                     # the cabin far right of the face is not

def test_overlay_without_video(stack, tmp_path):
  seg = tmp_path / 'novideo' / 'novideo--0'
  seg.mkdir(parents=True)
  shutil.copy(next(stack['route'].glob('*--0')) / 'rlog.zst', seg)
  r = run([BIN / 'modeld-overlay', seg.parent, '--out', tmp_path / 'blank', '--frames', '1', '--quiet'])
  assert r.returncode == 0, r.stderr
  blank = np.asarray(Image.open(next((tmp_path / 'blank').glob('*.png'))))
  assert blank.shape == (1208, 1928, 3) and (blank[5:30, -40:-5] == 40).all()   # the sensor's (ar0231) size, a plain canvas
  r = run([BIN / 'modeld-overlay', seg.parent, '--scene', stack['dir'] / 'scene.json', '--out', tmp_path / 'scene', '--frames', '1', '--quiet'])
  assert r.returncode == 0, r.stderr
  img = np.asarray(Image.open(next((tmp_path / 'scene').glob('*.png'))))
  assert img.shape == (200, 320, 3) and img[5:30, -40:-5].mean() > 150   # the scene's sky

def test_overlay_live(stack):
  rc, out, err = stack['live']
  assert rc == 0, err
  assert len(decode(stack['dir'] / 'live.mp4')) == 5

def test_overlay_errors(stack, tmp_path):
  r = run([BIN / 'modeld-overlay', tmp_path / 'nope'])
  assert r.returncode == 2 and 'found none' in r.stderr
  r = run([BIN / 'modeld-overlay', stack['route'], '--live'])
  assert r.returncode == 2
  seg = tmp_path / 'empty' / 'empty--0'
  seg.mkdir(parents=True)
  (seg / 'rlog.zst').write_bytes(b'')
  r = run([BIN / 'modeld-overlay', seg.parent, '--quiet'])
  assert r.returncode != 0 and 'no modelV2' in r.stderr

# ---- modeld-plot

def test_plot(stack, tmp_path):
  r = run([BIN / 'modeld-plot', stack['route'], '--out', tmp_path])
  assert r.returncode == 0, r.stderr
  names = {Path(l).name for l in r.stdout.split()}
  assert names == {'timing.png', 'lanes.png', 'lead.png', 'driver.png'}
  for n in names:
    img = Image.open(tmp_path / n)
    assert img.width == 1400 and len(img.getcolors(1 << 16) or range(1000)) > 20   # axes, text and coloured series
  # the series are drawn: the palette's first colour (modelV2's execution time) is in the timing panel
  px = np.asarray(Image.open(tmp_path / 'timing.png').convert('RGB')).astype(int)
  assert (np.abs(px - (31, 119, 180)).max(-1) < 10).sum() > 100
  r = run([BIN / 'modeld-plot', stack['route'], '--out', tmp_path / 'svg', '--format', 'svg'])
  assert r.returncode == 0 and (tmp_path / 'svg' / 'lanes.svg').read_text().lstrip().startswith('<?xml'), r.stderr

def test_plot_empty_route(tmp_path):
  seg = tmp_path / 'r' / 'r--0'
  seg.mkdir(parents=True)
  (seg / 'rlog.zst').write_bytes(b'')
  r = run([BIN / 'modeld-plot', seg.parent])
  assert r.returncode == 1 and 'no modelV2' in r.stderr

def test_the_demo_never_overwrites_models_built_from_model_files(tmp_path):
  """Artifacts built from ONNX files in the demo's folder are used as built when they serve the scene's cameras (in
  the layout kind camerad is then told), refused with the reason when not; never replaced by the reference models."""
  from camerad.scene import parse_scene
  from modeld_tools.demo import DEMO_SCENE, prepare_artifacts
  from tests.artifacts import CACHE, build
  art = shutil.copytree(build(CACHE.parent / 'tiny', models='tiny'), tmp_path / 'art')   # 64x48, packed and aligned
  manifests = {f: (art / f / 'manifest.json').read_bytes() for f in ('road', 'dm')}
  small = parse_scene({**DEMO_SCENE, 'intrinsics': {c: {'width': 64, 'height': 48, 'focal_length': 30.} for c in ('road', 'wide', 'driver')}}, 'small')
  assert prepare_artifacts(str(art), small) == ['--layout', '64x48:64:3072:4608']
  with pytest.raises(SystemExit, match=r"holds models built from model files \(road, dm\), which the demo does not overwrite .* "
                                       r"the (road|wide|driver) camera is 1928x1208, .* was built for 64x48"):
    prepare_artifacts(str(art), parse_scene(DEMO_SCENE, 'demo'))
  m = json.loads((road := art / 'road' / 'manifest.json').read_text())
  m['layouts'] = [l for l in m['layouts'] if l != '64x48:64:3072:4608']
  road.write_text(json.dumps(m))
  assert prepare_artifacts(str(art), small) == ['--layout', '64x48:128:8192:12288']   # the road family lost its packed layout: the common one
  assert (art / 'dm' / 'manifest.json').read_bytes() == manifests['dm']
