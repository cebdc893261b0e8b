"""Synthetic scenes: JSON validation, tracks, deterministic NV12 rendering into any buffer layout, and ground truth
that agrees with the pixels (projected through transformations, the same projection the daemons' warps use)."""
import copy, io, json, math
from functools import cache
import numpy as np
import pytest
from camerad.scene import SCENES_DIR, SceneError, Track, load_scene, parse_scene
from camerad.render import EYE, LEAD_BODY, PAINT, PHONE, SKIN, SceneRenderer, write_truth
from modelrt.constants import X_IDXS
from transformations.model import dm_warp_matrix
from transformations.camera import camera_from_calib
from msgq.visionipc.layout import NV12Layout

SHIPPED = sorted(p.stem for p in SCENES_DIR.glob('*.json'))
# a small camera (fast to set up) that shows everything: yellow and dashed paint, grass, a lead, lighting, noise
SMALL = {'sensor': 'ar0231', 'intrinsics': {'road': {'width': 480, 'height': 302, 'focal_length': 660.0},
                                            'wide': {'width': 480, 'height': 302, 'focal_length': 142.0},
                                            'driver': {'width': 480, 'height': 302, 'focal_length': 142.0}},
         'calib': [0.01, 0.02, -0.015], 'frames': 10, 'seed': 7,
         'road': {'curvature': 0.002, 'ego_offset': [[0, 0.3], [0.5, -0.3]], 'lines': [{'color': 'yellow'}, {'dashed': True}, {'dashed': True}, {}]},
         'lead': {'distance': [[0, 30.0], [0.5, 20.0]]}, 'lighting': {'brightness': 0.9, 'noise': 3.0},
         'driver': {'phone': {'present': True}}}

DELETE = object()
def merged(base: dict, patch: dict) -> dict:
  """base with patch applied recursively (dicts merge, DELETE removes a key, anything else replaces)."""
  out = copy.deepcopy(base)
  for k, v in patch.items():
    if v is DELETE: del out[k]
    elif isinstance(v, dict) and isinstance(out.get(k), dict): out[k] = merged(out[k], v)
    else: out[k] = v
  return out

@cache
def renderer(name: str, camera: str, layout: str | None = None) -> SceneRenderer:
  sc = parse_scene(SMALL, 'small') if name == 'small' else load_scene(name)
  cam = sc.cameras[camera]
  return SceneRenderer(sc, camera, NV12Layout.parse(layout) if layout else NV12Layout.packed(cam.width, cam.height))

def planes(r: SceneRenderer, frame: int):
  return r.layout.planes(r.render(frame))

def project(sc, cam, x, y, z=None, calib=None) -> tuple[int, int]:
  p = camera_from_calib(sc.calib if calib is None else calib, cam) @ [x, y, sc.height if z is None else z]
  return int(round(p[0] / p[2])), int(round(p[1] / p[2]))

def pixel(plane: np.ndarray, uv: tuple[int, int]) -> int | None:
  return int(plane[uv[1], uv[0]]) if 0 <= uv[0] < plane.shape[1] and 0 <= uv[1] < plane.shape[0] else None

# ---- the scene format

def test_shipped_scenes_load_with_calibration():
  assert {'straight', 'curve', 'lead_braking', 'lane_change', 'driver_distracted', 'driver_blinking'} <= set(SHIPPED)
  for name in SHIPPED:
    sc = load_scene(SCENES_DIR / f'{name}.json')
    assert sc.name == name and 20 <= sc.n_frames <= 100 and all(abs(a) > 0.005 for a in sc.calib), name

@pytest.mark.parametrize('patch, message', [
  ({'road': {'lane_widht': 3.5}}, "road.lane_widht: unknown field"),
  ({'colour': 1}, "colour: unknown field"),
  ({'lead': {'distance': DELETE}}, "lead.distance: missing required field"),
  ({'road': {'curvature': [[0, 0.0], [1, 'x']]}}, "road.curvature[1][1]: expected a number, got 'x'"),
  ({'road': {'curvature': [[1, 0.0], [0, 0.1]]}}, "road.curvature[1][0]: keyframe times must be >= 0 and non-decreasing"),
  ({'road': {'speed': [5]}}, "road.speed[0]: expected a keyframe [t, value], got 5"),
  ({'driver': {'eyes_closed': [[0, 1]]}}, "driver.eyes_closed[0][1]: expected true/false, got 1"),
  ({'driver': {'wheel': 'middle'}}, "driver.wheel: expected one of 'left', 'right', got 'middle'"),
  ({'calib': [0, 0]}, "calib: expected [roll, pitch, yaw] in radians"),
  ({'seed': 1.5}, "seed: expected an integer, got 1.5"),
  ({'seed': -1}, "seed: expected an integer >= 0, got -1"),
  ({'sensor': 'nope'}, "sensor: unknown sensor 'nope', known sensors:"),
  ({'duration': 2.0}, "give exactly one of 'duration' (seconds) or 'frames'"),
  ({'road': {'lines': [{}, {}]}}, "road.lines: expected 4 lines (lanes_left + lanes_right + 2, left to right), got 2"),
  ({'road': {'lines': [{}, {'dashed': 'yes'}, {}, {}]}}, "road.lines[1].dashed: expected true/false, got 'yes'"),
  ({'road': {'lane_width': {'keys': [[0, 3.5]], 'period': 0}}}, "road.lane_width.period: expected > 0"),
  ({'intrinsics': {'road': {'focal_length': DELETE}}}, "intrinsics.road.focal_length: missing required field"),
  ({'road': 3}, "road: expected an object, got int"),
])
def test_scene_validation_errors_name_the_field(patch, message):
  with pytest.raises(SceneError) as e: parse_scene(merged(SMALL, patch))
  assert message in str(e.value)

def test_load_scene_names_the_file(tmp_path):
  p = tmp_path / 'bad.json'
  p.write_text('{"frames": 3, "road": {"speed": true}}')
  with pytest.raises(SceneError, match=r"bad\.json: road\.speed: expected a number, got True"): load_scene(p)
  p.write_text('{"frames": 3,')
  with pytest.raises(SceneError, match="not valid JSON"): load_scene(p)

def test_tracks():
  lin = Track([1.0, 3.0], [10.0, 20.0], step=False)
  assert (lin(0), lin(2), lin(5)) == (10.0, 15.0, 20.0) and (lin.slope(2), lin.slope(4)) == (5.0, 0.0)
  assert math.isclose(lin.integral(4), 10 + 30 + 20)   # held 10 on [0,1], ramp to 20 on [1,3], held 20 on [3,4]
  step = Track([0.0, 0.6, 0.9], [0.0, 1.0, 0.0], step=True, period=1.0)
  assert [step(t) for t in (0.5, 0.7, 0.95, 1.65, 2.1)] == [0, 1, 0, 1, 0]
  rep = Track([0.0, 1.0], [0.0, 2.0], step=False, period=1.0)
  assert math.isclose(rep.integral(2.5), 2 * 1.0 + 0.25)

# ---- rendering into buffers

def test_deterministic_and_seeded():
  a, b = renderer('small', 'road'), SceneRenderer(parse_scene(SMALL), 'road', renderer('small', 'road').layout)
  assert np.array_equal(a.render(3), b.render(3))
  assert not np.array_equal(a.render(3), a.render(4))
  other = SceneRenderer(parse_scene({**SMALL, 'seed': 8}), 'road', a.layout)
  assert not np.array_equal(a.render(3), other.render(3))

@pytest.mark.parametrize('camera', ['road', 'wide'])
def test_frames_do_not_depend_on_the_frames_rendered_before(camera):
  # the renderer keeps the grass of its backgrounds between frames and rewrites only the pixels whose side of a road
  # edge changed: in any order, frame n is the same (a lane change moves the edges every frame)
  r, again = renderer('lane_change', camera), renderer('lane_change', camera)
  frames = {i: r.render(i).copy() for i in range(0, 60, 6)}
  for i in (54, 0, 30, 30, 6, 48, 12): assert np.array_equal(again.render(i), frames[i]), f"frame {i}"

@pytest.mark.parametrize('camera', ['road', 'wide', 'driver'])
def test_padded_layout_same_pixels_padding_untouched(camera):
  packed = renderer('small', camera)
  w, h = packed.layout.width, packed.layout.height
  stride = w + 72
  padded = NV12Layout(w, h, stride, stride * (h + 6), stride * (h + 6) + stride * (h // 2) + 100)
  buf = np.full(padded.size, 0xA5, np.uint8)
  SceneRenderer(packed.scene, camera, padded).render(5, buf)
  for p, q in zip(packed.layout.planes(packed.render(5)), padded.planes(buf)): assert np.array_equal(p, q)
  written = np.zeros(padded.size, np.uint8)
  for p in padded.planes(written): p[...] = 1
  assert (buf[written == 0] == 0xA5).all() and (written == 0).sum() == padded.size - w * h * 3 // 2

def test_render_rejects_bad_buffers():
  r = renderer('small', 'road')
  with pytest.raises(ValueError, match="needs 217440 bytes, the buffer has 100"): r.render(0, np.zeros(100, np.uint8))
  with pytest.raises(ValueError, match="contiguous 1-D uint8"): r.render(0, np.zeros(r.layout.size, np.float32))
  with pytest.raises(ValueError, match="contiguous 1-D uint8"): r.render(0, np.zeros((2, r.layout.size), np.uint8))
  with pytest.raises(ValueError, match="road camera of sensor ar0231 is 480x302, layout is 1928x1208"):
    SceneRenderer(r.scene, 'road', NV12Layout.packed(1928, 1208))

def test_lighting_scales_luma():
  dark = parse_scene({**SMALL, 'lighting': {'brightness': 0.45, 'noise': 3.0}})
  y0, y1 = planes(renderer('small', 'road'), 2)[0], planes(SceneRenderer(dark, 'road', renderer('small', 'road').layout), 2)[0]
  assert abs(y1.mean() / y0.mean() - 0.5) < 0.02

# ---- ground truth agrees with the pixels (full-size sensors, shipped scenes)

@pytest.mark.parametrize('name, camera, frame', [('straight', 'road', 7), ('curve', 'road', 50), ('curve', 'wide', 50),
                                                 ('lane_change', 'road', 45)])
def test_lane_truth_is_on_paint(name, camera, frame):
  r = renderer(name, camera)
  sc, cam, (y, _, _) = r.scene, r.cam, planes(r, frame)
  road = r.truth(frame)['road']
  on = off = wrong_calib = checked = 0
  for i, line in enumerate(road['lane_lines']):
    k = road['ego_lane'] + i - 1
    if not line['present'] or sc.lines()[k + sc.road['lanes_left']]['dashed']: continue
    for x, ly in zip(X_IDXS, line['y']):
      if not 6 <= x <= 80: continue
      u, v = project(sc, cam, x, ly)
      if not (0 <= u < cam.width and 0 <= v < cam.height): continue
      checked += 1
      on += y[v, u] >= PAINT['white'][0] - 20
      beside = pixel(y, project(sc, cam, x, ly + 0.6))   # asphalt or grass, never paint (where lines run steep)
      off += camera == 'wide' or beside is None or beside < 150
      uncalibrated = pixel(y, project(sc, cam, x, ly, calib=(0, 0, 0)))   # ignoring calibration misses the paint
      wrong_calib += uncalibrated is not None and uncalibrated >= PAINT['white'][0] - 20
  assert checked >= 8 and on == checked and off == checked and wrong_calib <= checked // 4, (checked, on, off, wrong_calib)
  # road edges: asphalt inside, grass outside
  for side, edge in zip((-1, 1), road['road_edges']):
    for x, ey in zip(X_IDXS, edge['y']):
      if not 6 <= x <= 50: continue
      inside, outside = pixel(y, project(sc, cam, x, ey - side * 0.3)), pixel(y, project(sc, cam, x, ey + side * 0.3))
      assert inside is None or inside > 85, (x, inside)
      assert outside is None or outside < 85, (x, outside)

def test_dashes_scroll_with_speed():
  r = renderer('straight', 'road')
  sc, cam = r.scene, r.cam
  line = r.truth(0)['road']['lane_lines'][1]   # ego left line: dashed
  pts = [project(sc, cam, x, line['y'][0]) for x in np.arange(8, 30, 0.5)]
  lit = [[planes(r, f)[0][v, u] > 200 for u, v in pts] for f in (0, 4)]   # 0.2 s at 25 m/s: 5 m
  assert 0.1 < np.mean(lit[0]) < 0.5 and lit[0] != lit[1]

def test_lead_truth_matches_box():
  r = renderer('lead_braking', 'road')
  sc, cam = r.scene, r.cam
  for frame in (0, 40, 78):
    lead, (y, _, _) = r.truth(frame)['lead'], planes(r, frame)
    assert lead['present'] and lead['in_ego_lane']
    cu, bottom = project(sc, cam, lead['x'], lead['y'])
    assert y[bottom - 2, cu] == LEAD_BODY[0] and y[bottom + 2, cu] != LEAD_BODY[0]
    _, top = project(sc, cam, lead['x'], lead['y'], sc.height - lead['height'])
    assert y[top + 2, cu] == LEAD_BODY[0] and y[top - 2, cu] != LEAD_BODY[0]
    left, _ = project(sc, cam, lead['x'], lead['y'] - lead['width'] / 2)
    assert y[(top + bottom) // 2, left + 2] == LEAD_BODY[0] and y[(top + bottom) // 2, left - 2] != LEAD_BODY[0]
  xs = [r.truth(f)['lead']['x'] for f in range(r.scene.n_frames)]
  assert xs[0] == 60 and xs[-1] <= 15.5 and all(a >= b for a, b in zip(xs, xs[1:]))
  assert r.truth(30)['lead']['v'] < r.truth(30)['v_ego']

def test_no_lead_truth():
  assert load_scene('straight').truth(0)['lead'] == {'present': False}

def test_driver_truth_matches_face():
  r = renderer('driver_blinking', 'driver')
  cam = r.cam
  opened = closed = 0
  for frame in range(20):
    tr, (y, _, _) = r.truth(frame)['driver'], planes(r, frame)
    face = tr['face']
    assert face['present'] and not tr['phone'] and not tr['wheel_on_right']
    skin = (y == SKIN[0])
    rows, cols = np.nonzero(skin)
    assert abs(cols.mean() - face['camera_px'][0]) < 3 and abs(rows.mean() - face['camera_px'][1]) < 3
    assert abs(skin.sum() / (math.pi * 0.375 * 0.5 * face['size_px'] ** 2) - 1) < 0.05
    mu, mv, mw = np.linalg.inv(dm_warp_matrix(cam).astype(np.float64)) @ [*face['camera_px'], 1]
    assert np.allclose(face['model_px'], [mu / mw, mv / mw]) and np.allclose(face['position'], [mu / mw / 1440 - .5, mv / mw / 960 - .5])
    dark = (y == EYE[0]).sum()
    if tr['eyes_closed']: closed += 1; assert dark == 0
    else: opened += 1; assert dark > 500
  assert opened >= 10 and closed >= 4

def test_driver_phone_and_yaw():
  r = renderer('driver_distracted', 'driver')
  for frame in (0, 50):
    tr, (y, _, _) = r.truth(frame)['driver'], planes(r, frame)
    phone = y == PHONE[0]
    assert phone.any() == tr['phone'] == (frame == 50)
    eyes_u = np.nonzero(y == EYE[0])[1].mean()
    shift = eyes_u - tr['face']['camera_px'][0]   # features move toward +u with yaw
    assert (abs(shift) < 2) if frame == 0 else (shift > 0.25 * 0.375 * tr['face']['size_px'])
  u_phone = np.nonzero(y == PHONE[0])[1].mean()
  assert u_phone > tr['face']['camera_px'][0] + 0.375 * tr['face']['size_px']   # beside the face, not on it

def test_write_truth():
  sc = parse_scene(SMALL)
  f = io.StringIO()
  assert write_truth(sc, f) == 10
  rows = [json.loads(line) for line in f.getvalue().splitlines()]
  assert [r['frame'] for r in rows] == list(range(10))
  r = rows[9]
  assert len(r['road']['lane_lines']) == 4 and all(len(l['y']) == len(X_IDXS) for l in r['road']['lane_lines'] + r['road']['road_edges'])
  assert r['lead']['present'] and math.isclose(r['lead']['x'], 21.0) and math.isclose(r['lead']['v_rel'], -20.0) and r['driver']['phone']
  ys = [l['y'][0] for l in r['road']['lane_lines']]   # t = 0.45 s: ego offset 0.3 - 0.6 * 0.9 = -0.24 m
  assert np.allclose(np.diff(ys), 3.7) and math.isclose(ys[1], -1.85 + 0.24)
