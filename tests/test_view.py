"""modeld-view against real processes: a small stack (camerad in lockstep on test_tools' 320x200 scene, its stand-in
model answering from the scene's truth, modeld-record) watched live; its route logged to .rrd and read back with
rerun's own reader; rerun's web viewer opened in Debian's chromium, driven headless by Playwright, and judged by the
screenshot's pixels. UPDATE_SCREENSHOT=1 writes that screenshot to docs/view.png, the README's."""
import io, json, os, re, shutil, signal, socket, subprocess, time, uuid
from collections import defaultdict
from pathlib import Path
import numpy as np
import pytest
from PIL import Image
from camerad.scene import load_scene
from modelrt.constants import X_IDXS
from modeld_tools.projection import prob_colour
from tests.daemon_harness import Notify
from tests.test_tools import BIN, SCENE, cleanup_prefix, road_pixel, start, start_scene_stack, stop

REPO = Path(__file__).resolve().parents[1]
N_FRAMES = 40
CHROMIUM = Path('/usr/bin/chromium')
CHROMIUM_FLAGS = ['--headless', '--no-sandbox', '--use-angle=swiftshader', '--enable-unsafe-swiftshader', '--disable-background-networking',
                  '--disable-component-update', '--disable-sync', '--no-first-run']
VIEWPORT = {'width': 1600, 'height': 900}

@pytest.fixture(scope='module')
def stack(tmp_path_factory):
  d = tmp_path_factory.mktemp('view')
  (d / 'scene.json').write_text(json.dumps(dict(SCENE, frames=N_FRAMES)))
  env = {**os.environ, 'OPENPILOT_PREFIX': f"view{uuid.uuid4().hex[:8]}", 'PYTHONUNBUFFERED': '1'}
  procs, notify = [], Notify()
  try:
    cam, model = start_scene_stack(d / 'scene.json', env, procs)
    rec = start([BIN / 'modeld-record', '--route', d / 'route', '--video', 'road,driver', '--stats-interval', '0'], {**env, 'NOTIFY_SOCKET': notify.addr})
    procs.append(rec)
    live = start([BIN / 'modeld-view', '--live', '--save', d / 'live.rrd'], env)
    procs.append(live)
    while not re.search(r"connected to 'camerad': driver, road", line := live.stderr.readline()): assert line, stop(live)
    notify.wait_count('video_connected', 2, timeout=30)   # the recorder's camera clients: frames served before them go unrecorded
    model.stdin.write('go\n')
    model.stdin.flush()
    t = time.monotonic()
    assert cam.wait(60) == 0, cam.communicate()[1]
    live_out = stop(live)   # SIGINT: it stops and writes the file whole
    live_s = time.monotonic() - t
    rec_out = stop(rec)
    assert rec.returncode == 0, rec_out[1]
    yield {'dir': d, 'route': d / 'route', 'scene': load_scene(d / 'scene.json'), 'live': (live.returncode, *live_out), 'live_s': live_s}
  finally:
    for p in procs: stop(p, signal.SIGKILL)
    notify.close()
    cleanup_prefix(env['OPENPILOT_PREFIX'])

def read_rrd(path: Path, blobs: bool = True) -> dict[str, dict[str, list]]:
  """{entity: {column: values in frame order}} of a recording's rows on the frame timeline, read with rerun's own reader;
  None where a row has no such column (an entity's rows of another archetype: a Clear). blobs=False: a picture's bytes
  (Image:buffer) as their count."""
  from rerun.chunk import RrdReader
  chunks = defaultdict(list)
  for ch in RrdReader(path).stream().to_chunks():
    if ch.is_static: continue
    b = ch.to_record_batch()
    if 'frame' not in b.schema.names: continue   # logged before any frame (carState before the first road frame)
    chunks[ch.entity_path].append({name: column(name, b.column(name), blobs) for name in b.schema.names if not name.startswith('rerun.')})
  rows = {}
  for entity, cs in chunks.items():   # chunks come in any order
    names = {k for c in cs for k in c}
    cols = {k: [v for c in cs for v in c.get(k, [None] * len(c['frame']))] for k in names}
    order = np.argsort(cols['frame'], kind='stable')
    rows[entity] = {k: [v[i] for i in order] for k, v in cols.items()}
  return rows

def column(name: str, values, blobs: bool) -> list:
  import pyarrow.compute as pc
  if name == 'mono_time': return values.cast('int64').to_pylist()
  if name == 'Image:buffer' and not blobs: return pc.list_value_length(values.flatten()).to_pylist()   # one picture a row
  return values.to_pylist()

def recorded_ids(route: Path, camera: str) -> list[int]:
  from oproute import LogReader
  from oproute.video import EncodeIndex
  idx = EncodeIndex()
  for ev in LogReader(route): idx.add(ev)
  return sorted(idx.frames[camera])

def near_polyline(p, strip) -> float:
  """Distance from point p to a polyline."""
  a, b, p = np.asarray(strip[:-1]), np.asarray(strip[1:]), np.asarray(p, float)
  t = np.clip(((p - a) * (b - a)).sum(1) / np.maximum(((b - a) ** 2).sum(1), 1e-9), 0, 1)[:, None]
  return float(np.min(np.linalg.norm(a + t * (b - a) - p, axis=1)))

ENTITIES = {'/road/image', '/road/lanes', '/road/edges', '/road/path', '/road/lead', '/driver/image', '/driver/face', '/driver/eyes',
            '/text/model', '/text/driver', '/timing/modelV2', '/timing/driverStateV2', '/speed/vEgo', '/speed/model', '/monitoring/awareness',
            '/monitoring/driver', '/model/meta'}

def test_route_to_rrd(stack, tmp_path):
  out = tmp_path / 'route.rrd'
  r = subprocess.run([BIN / 'modeld-view', stack['route'], '--save', out], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  assert f"80 pictures (road 40, driver 40), {N_FRAMES} modelV2, {N_FRAMES} driverStateV2 -> {out}" in r.stdout, r.stdout
  rows = read_rrd(out)
  assert ENTITIES <= set(rows), ENTITIES - set(rows)
  for cam in ('road', 'driver'):   # one picture per recorded frame, a JPEG of the stream's size (320 wide: never upscaled)
    img = rows[f'/{cam}/image']
    assert img['frame'] == recorded_ids(stack['route'], cam) == list(range(N_FRAMES))
    assert Image.open(io.BytesIO(bytes(img['EncodedImage:blob'][0][0]))).size == (320, 200)
  sc, lanes, leads = stack['scene'], rows['/road/lanes'], rows['/road/lead']
  for i, fid in enumerate(lanes['frame'][::9]):   # a few frames: each lane line where the truth puts it, at 8 to 60 m
    strips, colours = lanes['LineStrips2D:strips'][i * 9], lanes['LineStrips2D:colors'][i * 9]
    truth = sc.truth(fid)['road']['lane_lines']
    assert len(strips) == 4
    for line, strip in zip(truth, strips):
      for x in (8., 20., 60.):
        u, v = road_pixel(sc, x, float(np.interp(x, X_IDXS, line['y'])))
        assert near_polyline((u, v), strip) < 1.0, (fid, x, (u, v))
    assert colours[1] >> 8 == int.from_bytes(bytes(prob_colour(0.95)), 'big')   # shaded by its probability
    (cx, cy), (hw, hh) = leads['Boxes2D:centers'][i * 9][0], leads['Boxes2D:half_sizes'][i * 9][0]
    u, v = road_pixel(sc, sc.truth(fid)['lead']['x'], sc.truth(fid)['lead']['y'])
    assert abs(u - cx) < hw and cy - hh < v <= cy + hh + 1, (fid, (u, v), (cx, cy, hw, hh))   # the lead's box stands on its road point
    assert re.fullmatch(r"\d+ m  0\.90", leads['Boxes2D:labels'][i * 9][0])
  faces = rows['/driver/face']
  for fid, (cx, cy), (hw, hh) in zip(faces['frame'], *(np.array(faces[k])[:, 0] for k in ('Boxes2D:centers', 'Boxes2D:half_sizes'))):
    u, v = sc.truth(fid)['driver']['face']['camera_px']
    assert abs(u - cx) < hw and abs(v - cy) < hh, fid
  # the route's own timeline: each picture at its frame's end of exposure, counted from the route's first event
  from oproute import LogReader
  evs = list(LogReader(stack['route']))
  t0, eof = min(e.logMonoTime for e in evs), {e.roadEncodeIdx.frameId: e.roadEncodeIdx.timestampEof for e in evs if e.which() == 'roadEncodeIdx'}
  assert np.abs(np.array(rows['/road/image']['mono_time']) - [eof[f] - t0 for f in rows['/road/image']['frame']]).max() < 1000

def test_answers_logged_before_their_pictures_are_drawn_at_the_streams_size(stack, tmp_path):
  """A recorder may log a frame's answer before its EncodeIdx (written from the camera's thread): the projection then
  takes the stream's size from the route's video, not a sensor's full size until a picture came (frame 0's lanes were
  120-160 px off)."""
  import shutil, zstandard
  from oproute import LogReader
  shutil.copytree(stack['route'], route := tmp_path / 'route')
  for seg in route.iterdir():
    (seg / 'qlog.zst').unlink(missing_ok=True)
    state = {e.roadCameraState.frameId: e.logMonoTime for e in LogReader(seg / 'rlog.zst') if e.which() == 'roadCameraState'}
    evs = []
    for e in LogReader(seg / 'rlog.zst'):
      b = e.as_builder()
      if e.which() == 'modelV2': b.logMonoTime = state[e.modelV2.frameId] + 1   # before the frame's roadEncodeIdx
      evs.append(b.to_bytes())
    (seg / 'rlog.zst').write_bytes(zstandard.ZstdCompressor().compress(b''.join(evs)))
  r = subprocess.run([BIN / 'modeld-view', route, '--save', out := tmp_path / 'route.rrd'], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  sc, lanes = stack['scene'], read_rrd(out)['/road/lanes']
  fid, strips = lanes['frame'][0], lanes['LineStrips2D:strips'][0]
  assert fid == 0
  for line, strip in zip(sc.truth(fid)['road']['lane_lines'], strips):
    u, v = road_pixel(sc, 20., float(np.interp(20., X_IDXS, line['y'])))
    assert near_polyline((u, v), strip) < 1.0, (u, v)

def test_live(stack):
  rc, out, err = stack['live']
  assert rc == 0, err
  m = re.search(r"(\d+) pictures \(road (\d+), driver (\d+)\), (\d+) modelV2, (\d+) driverStateV2", out)
  assert m, out
  rows = read_rrd(stack['dir'] / 'live.rrd')
  assert ENTITIES <= set(rows), ENTITIES - set(rows)
  # a conflating client: it may skip frames, never repeats one; the outputs all come (messages are not conflated)
  for cam in ('road', 'driver'):
    ids = rows[f'/{cam}/image']['frame']
    assert len(ids) == len(set(ids)) >= N_FRAMES // 2 and set(ids) <= set(range(N_FRAMES)), ids
  assert int(m.group(4)) == int(m.group(5)) == N_FRAMES and rows['/road/lanes']['frame'] == list(range(N_FRAMES))
  print(f"live: {m.group(0)} in {stack['live_s']:.1f} s")

def only_loopback(port: int) -> bool:
  """Nothing answers on 127.0.0.2 (a server on 0.0.0.0 would), something on 127.0.0.1."""
  with socket.socket() as s:
    s.settimeout(1)
    if s.connect_ex(('127.0.0.2', port)) == 0: return False
  with socket.create_connection(('127.0.0.1', port), timeout=1): return True

def test_web_viewer_in_chromium(stack, tmp_path):
  assert CHROMIUM.is_file(), f"{CHROMIUM} is missing: this test needs Debian's package chromium (apt-get install chromium; make setup installs it)"
  from playwright.sync_api import sync_playwright
  view = start([BIN / 'modeld-view', stack['route'], '--web', '--port', '0', '--web-port', '0'], None)
  try:
    lines = []
    while 'serving until Ctrl-C' not in (line := view.stdout.readline()):
      assert line, stop(view)
      lines.append(line)
    url = re.search(r"web viewer: (http://\S+)", ''.join(lines)).group(1)
    ports = [int(p) for p in re.findall(r"(?:%3A|:)(\d+)", url)]
    assert len(ports) == 2 and all(map(only_loopback, ports)), url
    # what the pixels must show: the scene's sky (the camera picture) and the ego lane lines' colour (the overlay)
    sky = first_picture(stack['route'])[:20].reshape(-1, 3).mean(0)
    lane = np.array(prob_colour(0.95))
    with sync_playwright() as pw:
      browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
      page = browser.new_page(viewport=VIEWPORT)
      page.goto(url)
      deadline, shot = time.monotonic() + 45, tmp_path / 'view.png'
      while True:
        page.screenshot(path=shot)
        px = np.asarray(Image.open(shot).convert('RGB')).astype(int)
        road = px[:int(VIEWPORT['height'] * 0.6), :VIEWPORT['width'] // 2]   # the road camera's view: top left
        n_sky = int((np.abs(road - sky).max(-1) < 12).sum())
        n_lane = int((np.abs(road - lane).max(-1) < 30).sum())
        if n_sky > 0.1 * road.shape[0] * road.shape[1] and n_lane > 2000 or time.monotonic() > deadline: break
        time.sleep(1.0)   # each screenshot makes the page render once more, in software
      browser.close()
    print(f"sky {n_sky} lane {n_lane} of {road.shape[0] * road.shape[1]}")
    assert n_sky > 0.1 * road.shape[0] * road.shape[1], f"the camera picture: {n_sky} sky pixels in the road view ({shot})"
    assert n_lane > 2000, f"the overlay: {n_lane} pixels of the lane lines' colour in the road view ({shot})"
    if os.environ.get('UPDATE_SCREENSHOT'): shutil.copy(shot, REPO / 'docs' / 'view.png')
  finally:
    stop(view)
  assert view.returncode == 0 and not any(map(listening_on, ports)), "the web server stops with modeld-view"

def listening_on(port: int) -> bool:
  with socket.socket() as s: return s.connect_ex(('127.0.0.1', port)) == 0

def first_picture(route: Path) -> np.ndarray:
  """The route's first road frame, RGB."""
  import av
  with av.open(str(next(route.glob('*--0')) / 'fcamera.hevc')) as c: return next(c.decode(video=0)).to_ndarray(format='rgb24').astype(int)

def test_errors(stack, tmp_path, monkeypatch, capsys):
  from modeld_tools.view import main
  monkeypatch.delenv('DISPLAY', raising=False)
  monkeypatch.delenv('WAYLAND_DISPLAY', raising=False)
  for argv, code, says in (([str(stack['route'])], 1, 'no display (DISPLAY and WAYLAND_DISPLAY are unset)'), ([str(stack['route']), '--live'], 2, 'not both'),
                           ([str(tmp_path / 'nope'), '--save', str(tmp_path / 'x.rrd')], 2, 'nope'), (['--live', '--quality', '101'], 2, 'got 101')):
    with pytest.raises(SystemExit) as e: main(argv)
    got = (1, e.value.code) if isinstance(e.value.code, str) else (e.value.code, capsys.readouterr().err)   # exit 1 with a message, or a usage error
    assert got[0] == code and says in got[1], (argv, got)
  assert not (tmp_path / 'x.rrd').exists()

def test_batch_output(stack, tmp_path, capsys):
  """A modeld-batch output (OUT/<route>/<route>--<n>/) holding one route is that route; holding two, they are named."""
  from modeld_tools.view import main
  out = tmp_path / 'runs'
  def route(name: str) -> None:   # the stack's route, as modeld-batch names its output: OUT/<route>/<route>--<n>
    shutil.copytree(stack['route'], out / name)
    for seg in (out / name).iterdir(): seg.rename(seg.with_name(f"{name}--{seg.name.rsplit('--', 1)[1]}"))
  route('r1')
  r = subprocess.run([BIN / 'modeld-view', out, '--save', tmp_path / 'b.rrd'], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0 and f"80 pictures (road 40, driver 40), {N_FRAMES} modelV2" in r.stdout, r.stderr
  route('r2')
  with pytest.raises(SystemExit) as e: main([str(out), '--save', str(tmp_path / 'c.rrd')])
  assert e.value.code == 2 and 'holds 2 routes (r1, r2): name one' in capsys.readouterr().err
