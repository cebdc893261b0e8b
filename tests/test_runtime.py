"""Artifacts built by modeld-compile from tiny ONNX models (built once for this module), the loader's refusals, and the
runners the daemons use every frame (frame history, camera buffers, outputs that outlive the next frame)."""
import dataclasses, hashlib, json, os, pickle, re, shutil
import numpy as np
import pytest
from tinygrad.helpers import Context
from tests.onnx_models import vision_onnx, policy_onnx, dm_onnx, SLICES, KNOWN
from msgq.visionipc.layout import NV12Layout
from modelrt.constants import FRAME_SKIP, DESIRE_LEN, IMG_CHANNELS
from modelrt.contracts import CONTRACTS, DM_V0_11_1, ROAD_V0_11_1
from modelrt.artifact import load_artifact, ArtifactError, FORMAT_VERSION, tinygrad_version
from modelrt import compile as modeld_compile
from modelrt.compile import main
from modelrt.replay import CameraLayoutError, buffer_of
from modelrt.runner import RoadRunner, DMRunner, HostBuf
from modelrt.warp import road_warp_np, dm_warp_np

MAIN, EXTRA = NV12Layout.aligned(64, 48), NV12Layout.packed(64, 48)
WARP = 'warp_' + str(EXTRA).replace(':', '_')

def CamBuf(layout: NV12Layout, stream=0, idx=0, seed=0, misalign=0) -> HostBuf:
  """A camera buffer of random pixels."""
  return HostBuf(layout, np.random.default_rng(seed).integers(0, 256, layout.size, dtype=np.uint8), stream, idx, misalign)

@pytest.fixture(scope='module')
def built(tmp_path_factory):
  d = tmp_path_factory.mktemp('runtime')
  onnx = {'vision': vision_onnx(d / 'v.onnx'), 'policy': policy_onnx(d / 'p.onnx'), 'dm': dm_onnx(d / 'd.onnx')}
  road = ['--vision-onnx', str(onnx['vision']), '--policy-onnx', str(onnx['policy']), '--camera', str(MAIN), '--camera', str(EXTRA),
          '--out', str(d / 'art'), '--quiet']
  with Context(PARALLEL=0):
    assert main(road) == 0
    assert main(['--dm-onnx', str(onnx['dm']), '--camera', str(MAIN), '--out', str(d / 'art'), '--quiet']) == 0
  return d / 'art', onnx, road

@pytest.fixture(scope='module')
def road(built): return load_artifact(built[0], 'road')

T = np.array([[64 / 512, 0, 0], [0, 48 / 256, 0], [0, 0, 1]], np.float32)   # model frame -> the 64x48 camera
def desire(i=None): return np.eye(DESIRE_LEN, dtype=np.float32)[i] if i is not None else np.zeros(DESIRE_LEN, np.float32)
LHD = np.array([1, 0], np.float32)
def one(runner, buf, *args, **kwargs):
  """One camera: both warps read the same buffer."""
  return runner.run(buf, buf, *args, **kwargs)

@pytest.fixture
def runner(road):
  r = RoadRunner(road, MAIN, None)
  r.set_transforms(T, T * 1.1)
  return r

# ***** the artifact *****

def test_manifest_describes_the_build(built, road):
  m = road.manifest
  assert (m['format'], m['family'], m['tinygrad'], m['target']['device']) == (FORMAT_VERSION, 'road', tinygrad_version(), 'CPU')
  if os.uname().machine == 'x86_64': assert 'sse2' in m['target']['cpu_features']
  assert m['options'] == {'beam': 0, 'winograd': 'rule', 'schedule': 'shape'} and m['layouts'] == [str(MAIN), str(EXTRA)]
  assert m['contract'] == 'openpilot-0.11.1' and road.contract is ROAD_V0_11_1
  assert m['output_slices']['vision'] == {k: [s.start, s.stop] for k, s in SLICES['vision'].items()}
  assert road.output_slices('policy') == SLICES['policy']
  warp = m['jits']['warp_' + str(MAIN).replace(':', '_')]
  assert {i['name']: (i['device'], i['layout'], i['shape'][0]) for i in warp['inputs']}['frame'] == ('CPU', str(MAIN), MAIN.size)
  assert set(m['files']) == {f for j in m['jits'].values() for f in (j['file'], j['weights'])}
  assert m['command'][:3] == ['modeld-compile', '--vision-onnx', str(built[1]['vision'].resolve())] and str(EXTRA) in m['command']

def test_unchanged_build_is_skipped(built, tmp_path, capsys):
  shutil.copytree(built[0] / 'road', tmp_path / 'road')   # a copy: the build id, not the path, says what is up to date
  mtime = os.stat(tmp_path / 'road' / 'manifest.json').st_mtime_ns
  assert main(built[2][:-3] + ['--out', str(tmp_path), '--quiet']) == 0
  assert 'road: up to date' in capsys.readouterr().out and os.stat(tmp_path / 'road' / 'manifest.json').st_mtime_ns == mtime
  argv = built[2][:-3]   # the same layouts in the other order, one of them twice: the same build
  cams = [i + 1 for i, a in enumerate(argv) if a == '--camera']
  argv[cams[0]], argv[cams[-1]] = argv[cams[-1]], argv[cams[0]]
  assert main(argv + ['--camera', argv[cams[0]], '--out', str(tmp_path), '--quiet']) == 0
  assert 'road: up to date' in capsys.readouterr().out and os.stat(tmp_path / 'road' / 'manifest.json').st_mtime_ns == mtime

@pytest.mark.parametrize('change', ['code', 'contract'])
def test_a_changed_dependency_is_built_again(built, tmp_path, capsys, monkeypatch, change):
  """The programs are made from more than the model files: with a constant of the code or the contract's description
  changed (in this process, in what the build hashes), an artifact that was up to date is built again."""
  shutil.copytree(built[0] / 'dm', tmp_path / 'dm')
  argv = ['--dm-onnx', str(built[1]['dm']), '--camera', str(MAIN), '--out', str(tmp_path), '--quiet']
  with Context(PARALLEL=0):
    assert main(argv) == 0 and 'dm: up to date' in capsys.readouterr().out
    if change == 'code':
      sources = modeld_compile.code_sources()
      monkeypatch.setattr(modeld_compile, 'code_sources', lambda: {**sources, 'modelrt.constants': sources['modelrt.constants'] + b'IDX_N = 34\n'})
    else:
      monkeypatch.setitem(CONTRACTS['dm'], DM_V0_11_1.name, dataclasses.replace(DM_V0_11_1, face_descs={'face_orientation': slice(0, 3)}))
    assert main(argv) == 0 and 'dm: built' in capsys.readouterr().out

@pytest.fixture
def copy(built, tmp_path):
  shutil.copytree(built[0] / 'road', tmp_path / 'road')
  return tmp_path

def _edit_manifest(d, fn):
  m = json.loads((p := d / 'road' / 'manifest.json').read_text())
  fn(m)
  p.write_text(json.dumps(m))

@pytest.mark.parametrize('edit, msg', [
  (lambda m: m.update(format=FORMAT_VERSION + 1), f"format version {FORMAT_VERSION + 1}, this loader reads {FORMAT_VERSION}"),
  (lambda m: m.update(tinygrad='0.0.1'), f"built with tinygrad 0.0.1, this is tinygrad {tinygrad_version()}"),
  (lambda m: m['target'].update(device='CUDA'), "built for device CUDA, this process uses CPU"),
  (lambda m: m['target'].update(arch='x86_64,znver9'), "arch x86_64,znver9"),
  (lambda m: m['target']['cpu_features'].append('avx512_imaginary'), "instruction-set features this machine lacks: avx512_imaginary"),
  (lambda m: m.update(family='dm'), "holds family 'dm', expected 'road'"),
  (lambda m: m.pop('target'), "manifest.json field target: expected an object, got nothing"),
  (lambda m: m['jits']['vision'].pop('buffers'), "manifest.json field jits.vision.buffers: expected a list of [offset, size] pairs, got nothing"),
  (lambda m: m['jits'].pop(WARP), f"manifest.json field jits.{WARP}: expected an object, got nothing"),   # a layout it says it serves
  (lambda m: m.update(layouts=str(MAIN)), f"manifest.json field layouts: expected a list of camera layouts, got '{MAIN}'"),
  (lambda m: m['jits'][WARP]['inputs'][1].update(dtype='uint7'),
   f"manifest.json field jits.{WARP}.inputs.1: expected an input spec (dtype: expected a numpy dtype name tinygrad has, got 'uint7')"),
  (lambda m: m['output_slices']['vision'].update(lead=[917]),
   "field output_slices.vision.lead: expected [start, stop] within the output's 1576 values, got [917]"),
  (lambda m: m['output_slices']['policy'].update(plan=[0, 1001]),
   "field output_slices.policy.plan: expected [start, stop] within the output's 1000 values, got [0, 1001]"),
  (lambda m: m['output_slices'].pop('policy'), "manifest.json field output_slices.policy: expected {output name: [start, stop]}, got nothing"),
  (lambda m: m.update(contract='openpilot-9.9'), "its models follow contract 'openpilot-9.9', which this version does not know"),
  (lambda m: next(i for i in m['jits'][WARP]['inputs'] if i['name'] == 'frame').update(layout=str(MAIN)),
   f"field jits.{WARP}.inputs.frame.layout: expected the camera layout {EXTRA}, got '{MAIN}'"),
])
def test_loader_refuses_other_builds_with_the_rebuild_command(copy, edit, msg):
  _edit_manifest(copy, edit)
  with pytest.raises(ArtifactError, match='Rebuild with: modeld-compile --vision-onnx') as e: load_artifact(copy, 'road')
  assert msg in str(e.value) and f" --out {copy} " in str(e.value)   # where it was loaded from: a copy of the build

@pytest.mark.parametrize('fn', ['vision.bin', 'policy.pkl', 'warp_' + str(MAIN).replace(':', '_') + '.pkl'])
def test_loader_refuses_altered_truncated_or_missing_files(copy, fn):
  p = copy / 'road' / fn
  data = p.read_bytes()
  p.write_bytes(altered := data[:-1] + bytes([data[-1] ^ 1]))
  want, got = json.loads((copy / 'road' / 'manifest.json').read_text())['files'][fn], hashlib.sha256(altered).hexdigest()
  with pytest.raises(ArtifactError, match=rf"{fn} does not match its sha256 in the manifest \(expected {want[:12]}\.\.\., got {got[:12]}\.\.\.\)"
                                          ".*Rebuild with: modeld-compile"): load_artifact(copy, 'road')
  p.write_bytes(data[:len(data) // 2])
  with pytest.raises(ArtifactError, match=f"{fn} (does not match its sha256|is shorter than its buffer table)"): load_artifact(copy, 'road')
  p.unlink()
  with pytest.raises(ArtifactError, match=f"{fn} is missing"): load_artifact(copy, 'road')

def test_a_buffer_table_that_does_not_fit_the_pickle_names_both_sizes(copy):
  n = json.loads((copy / 'road' / 'manifest.json').read_text())['jits']['policy']['buffers'][0][1]
  _edit_manifest(copy, lambda m: m['jits']['policy']['buffers'][0].__setitem__(1, n + 1))
  with pytest.raises(ArtifactError, match=f"policy.bin: buffer table does not match policy.pkl: buffer 0 of the pickle has {n} bytes, the table says {n + 1}"):
    load_artifact(copy, 'road')

def test_no_artifact_says_how_to_build_one(tmp_path):
  with pytest.raises(ArtifactError, match="no manifest.json; build the road artifact with modeld-compile"): load_artifact(tmp_path, 'road')

def test_altered_pickle_is_never_unpickled(copy, tmp_path):
  class Evil:
    def __reduce__(self): return (os.system, ('touch ' + str(tmp_path / 'pwned'),))
  (copy / 'road' / 'vision.pkl').write_bytes(pickle.dumps(Evil()))
  with pytest.raises(ArtifactError, match="vision.pkl does not match its sha256"): load_artifact(copy, 'road')
  assert not (tmp_path / 'pwned').exists()

@pytest.mark.parametrize('what', ['pickle', 'manifest', 'folder', 'owner'])
def test_an_artifact_another_account_can_change_is_refused(copy, what):
  """An artifact is code: one that another account can write (a file or folder of it writable by others, or by a group
  other than its owner's private one) or owns is refused by name before anything is unpickled; root's is taken."""
  path = {'pickle': copy / 'road' / 'vision.pkl', 'manifest': copy / 'road' / 'manifest.json', 'folder': copy / 'road', 'owner': copy}[what]
  if what == 'owner':
    if os.geteuid() != 0: pytest.skip("giving a folder to another account needs root")
    os.chown(path, 65534, -1)   # nobody's
  else: path.chmod(path.stat().st_mode | 0o022)
  want = 'belongs to uid 65534' if what == 'owner' else r'is writable by other accounts \(mode 0\d{3}\)'
  with pytest.raises(ArtifactError, match=f"{re.escape(str(path))} {want}.*An artifact is code"): load_artifact(copy, 'road')
  if what == 'owner': os.chown(path, 0, -1)
  else: path.chmod(path.stat().st_mode & ~0o022)
  assert load_artifact(copy, 'road').models

def test_truncated_pickle_with_a_matching_hash_is_a_clear_error(copy):
  p = copy / 'road' / 'policy.pkl'
  p.write_bytes(p.read_bytes()[:1000])
  _edit_manifest(copy, lambda m: m['files'].update({'policy.pkl': hashlib.sha256(p.read_bytes()).hexdigest()}))
  with pytest.raises(ArtifactError, match=r"policy.pkl is not a loadable pickle \(truncated or corrupt"): load_artifact(copy, 'road')

def test_each_load_gets_its_own_buffers(road):
  # tinygrad 0.14 keys buffers by per-process slot numbers and dedups equal UOps: two plain unpickles share buffers
  e = road.manifest['jits']['vision']
  data, w = (road.dir / e['file']).read_bytes(), (road.dir / e['weights']).read_bytes()
  plain = [pickle.loads(data, buffers=[memoryview(w)[o:o + n] for o, n in e['buffers']]) for _ in range(2)]
  assert buffer_of(plain[0].captured.ret) is buffer_of(plain[1].captured.ret)
  ours = [road.load_jit('vision') for _ in range(2)]
  assert buffer_of(ours[0].jit.captured.ret) is not buffer_of(ours[1].jit.captured.ret)

@pytest.mark.parametrize('model', ['vision', 'policy', 'dm'])
def test_models_match_onnxruntime(built, model):
  ort = pytest.importorskip('onnxruntime')
  from tinygrad import Tensor
  from modelrt.runner import host_tensor
  art = load_artifact(built[0], 'dm' if model == 'dm' else 'road')
  g, rng = art.models[model], np.random.default_rng(5)
  feeds = {}
  for k, s in g.inputs.items():
    a = rng.integers(0, 256, s.shape, dtype=np.uint8) if s.dtype == 'uint8' else rng.standard_normal(s.shape).astype(s.dtype)
    feeds[k] = (a, host_tensor(a) if s.device == 'NPY' else Tensor(a, device=s.device).realize())
  ours = g.run({k: t for k, (a, t) in feeds.items()})
  so = ort.SessionOptions()
  so.intra_op_num_threads = 1
  theirs = ort.InferenceSession(str(built[1][model]), so).run(None, {k: a for k, (a, t) in feeds.items()})[0].reshape(-1)
  np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)   # float32, summation order differs

# ***** the road runner *****

def test_outputs_are_cut_and_outlive_later_frames(runner):
  bufs = [CamBuf(MAIN, idx=i, seed=i) for i in range(3)]
  first = runner.run(bufs[0], bufs[0], desire(), LHD)
  assert set(first.outputs) == set(SLICES['vision']) | set(SLICES['policy']) and first.finite
  assert all(first.outputs[k].shape == (1, s.stop - s.start) for k, s in {**SLICES['vision'], **SLICES['policy']}.items())
  assert first.raw.shape == (1576 + 1000,) and np.array_equal(first.outputs['plan'][0], KNOWN['policy'][SLICES['policy']['plan']])
  held = {k: v.copy() for k, v in first.outputs.items()}
  for b in bufs[1:]: runner.run(b, b, desire(), LHD)
  assert all(np.array_equal(first.outputs[k], held[k]) for k in held)

def test_heads_are_cut_where_the_model_says(built, road, tmp_path):
  """A vision model with the release's heads in another order (the same widths: the contract is identified, and its
  output_slices say where each head is): every head comes out as from the release's layout, so the runtime cuts by
  the model's own metadata, never by where the contract lists a head."""
  order = tuple(reversed(ROAD_V0_11_1.vision.heads))
  road_cmd = built[2]
  v = vision_onnx(tmp_path / 'v.onnx', order=order)
  cmd = [*road_cmd[:road_cmd.index('--vision-onnx') + 1], str(v), *road_cmd[road_cmd.index('--vision-onnx') + 2:]]
  cmd[cmd.index('--out') + 1] = str(tmp_path / 'art')
  with Context(PARALLEL=0): assert main(cmd) == 0
  other = load_artifact(tmp_path / 'art', 'road')
  assert list(other.output_slices('vision')) == list(order) and other.output_slices('vision') != road.output_slices('vision')
  outs = []
  for art in (road, other):
    r = RoadRunner(art, MAIN, None)
    r.set_transforms(T, T * 1.1)
    outs.append({k: v.copy() for k, v in one(r, CamBuf(MAIN, seed=5), desire(), LHD).outputs.items()})
  assert outs[0].keys() == outs[1].keys() and all(np.array_equal(outs[0][k], outs[1][k]) for k in outs[0]), \
    [k for k in outs[0] if not np.array_equal(outs[0][k], outs[1][k])]

def test_image_queue_keeps_the_frame_four_earlier(road):
  w = road.load_jit(road.warp_name(str(MAIN)))
  r = RoadRunner(road, MAIN, None)
  r.set_transforms(T, T)
  bufs, imgs = [CamBuf(MAIN, idx=i, seed=10 + i) for i in range(2 * FRAME_SKIP + 1)], []
  for b in bufs:
    imgs.append(w.run({'queue': r.queues['img'], 'frame': r.cameras.get(b, w), 'transform': r.transforms['img'][1]}).reshape(2 * IMG_CHANNELS, -1))
  assert not imgs[0][:IMG_CHANNELS].any()                  # no history yet: the older half is zeros
  for b, img in zip(bufs, imgs):                            # the newest half is the warp of this frame (from_blob, reloaded JIT)
    np.testing.assert_array_equal(img[IMG_CHANNELS:], road_warp_np(b.data, T, MAIN).reshape(IMG_CHANNELS, -1))
  for k in range(len(bufs) - FRAME_SKIP):
    np.testing.assert_array_equal(imgs[k + FRAME_SKIP][:IMG_CHANNELS], imgs[k][IMG_CHANNELS:])
  assert not np.array_equal(imgs[-1][IMG_CHANNELS:], imgs[-2][IMG_CHANNELS:])

def test_feature_and_desire_history(runner):
  hs = []
  for i in range(2 * FRAME_SKIP + 1):
    hs.append(one(runner, CamBuf(MAIN, seed=20 + i), desire(3 if i >= 2 else None), LHD).outputs['hidden_state'][0].copy())
  fb = runner.features_buffer[0][0]
  np.testing.assert_array_equal(fb[-1], hs[-1])
  np.testing.assert_array_equal(fb[-2], hs[-1 - FRAME_SKIP])
  np.testing.assert_array_equal(fb[-3], hs[-1 - 2 * FRAME_SKIP])
  assert not fb[:-3].any()
  # desire 3 held from frame 2 on: one pulse on the rising edge, max over blocks of 4 frames
  assert runner.full_desire[:, 3].sum() == 1 and runner.full_desire[-1 - (2 * FRAME_SKIP - 2), 3] == 1
  assert runner.desire_pulse[0][0, :, 3].sum() == 1 and runner.desire_pulse[0].shape == (1, 25, DESIRE_LEN)
  one(runner, CamBuf(MAIN, seed=1), desire(0), LHD)
  assert runner.full_desire[-1, 0] == 0                     # index 0 (no desire) never pulses

def test_prepare_only_updates_the_images_not_the_features_or_desire(runner):
  one(runner, CamBuf(MAIN, seed=30), desire(), LHD)
  fb, fd = runner.features_buffer[0].copy(), runner.full_desire.copy()
  assert one(runner, CamBuf(MAIN, seed=31), desire(2), LHD, prepare_only=True) is None
  np.testing.assert_array_equal(runner.features_buffer[0], fb)
  np.testing.assert_array_equal(runner.full_desire, fd)     # the pulse of that frame is lost, as in openpilot
  one(runner, CamBuf(MAIN, seed=32), desire(2), LHD)
  assert not runner.full_desire[:, 2].any()                 # desire 2 held: no new rising edge

def test_reset_clears_history(road):
  r = RoadRunner(road, MAIN, None)
  r.set_transforms(T, T * 1.1)
  x = CamBuf(MAIN, seed=40)
  fresh = r.run(x, x, desire(), LHD)
  for i in range(FRAME_SKIP + 1): one(r, CamBuf(MAIN, seed=41 + i), desire(4), LHD)
  with_history = r.run(x, x, desire(), LHD)
  assert not np.array_equal(with_history.raw, fresh.raw)
  r.reset()
  np.testing.assert_array_equal(r.run(x, x, desire(), LHD).raw, fresh.raw)

def test_new_buffer_pointer_is_picked_up(runner):
  a, b = CamBuf(MAIN, idx=0, seed=50), CamBuf(MAIN, idx=1, seed=51)
  out_a = runner.run(a, a, desire(), LHD).raw.copy()
  runner.reset()
  out_b = runner.run(b, b, desire(), LHD).raw.copy()
  assert not np.array_equal(out_a, out_b)
  runner.reset()
  remapped = CamBuf(MAIN, idx=0, seed=51)                   # ring index 0 mapped again at another address (camera restart)
  assert remapped.addr != a.addr
  np.testing.assert_array_equal(runner.run(remapped, remapped, desire(), LHD).raw, out_b)
  runner.release_camera_tensors()
  assert not runner.cameras._cache

def test_two_cameras_with_different_layouts(road):
  r = RoadRunner(road, MAIN, EXTRA)
  r.set_transforms(T, T)
  out = r.run(CamBuf(MAIN, 0, seed=60), CamBuf(EXTRA, 2, seed=61), desire(), LHD)
  r.reset()
  assert not np.array_equal(out.raw, r.run(CamBuf(MAIN, 0, seed=60), CamBuf(EXTRA, 2, seed=62), desire(), LHD).raw)
  with pytest.raises(CameraLayoutError, match=f"expected layout {EXTRA}, got {MAIN}"): r.run(CamBuf(MAIN), CamBuf(MAIN, 2), desire(), LHD)

def test_transforms_are_live_inputs(runner):
  x = CamBuf(MAIN, seed=70)
  out = runner.run(x, x, desire(), LHD).raw.copy()
  runner.reset()
  runner.set_transforms(T + np.array([[0, 0, 5], [0, 0, 3], [0, 0, 0]], np.float32), T * 1.1)
  assert not np.array_equal(out, runner.run(x, x, desire(), LHD).raw)

@pytest.mark.parametrize('buf, msg', [
  (lambda: CamBuf(NV12Layout(64, 48, 128, 8192, 12288 + 64)), r"expected layout 64x48:128:8192:12288, got 64x48:128:8192:12352"),
  (lambda: CamBuf(NV12Layout(64, 48, 256, 256 * 64, 256 * 96)), r"got 64x48:256:16384:24576"),
  (lambda: CamBuf(MAIN, misalign=16), r"is not 64-byte aligned"),
])
def test_bad_camera_buffers_are_refused_and_change_nothing(runner, buf, msg):
  one(runner, CamBuf(MAIN, seed=80), desire(5), LHD)
  before = (runner.full_desire.copy(), runner.features_buffer[0].copy())
  with pytest.raises(CameraLayoutError, match=msg): one(runner, buf(), desire(6), LHD)
  assert np.array_equal(runner.full_desire, before[0]) and np.array_equal(runner.features_buffer[0], before[1])

def test_bad_host_inputs_are_refused(runner):
  with pytest.raises(ValueError, match=r"desire: expected shape \(8,\), got \(7,\)"): one(runner, CamBuf(MAIN), np.zeros(7), LHD)
  with pytest.raises(ValueError, match=r"traffic_convention: expected shape \(2,\)"): one(runner, CamBuf(MAIN), desire(), np.zeros(3))
  with pytest.raises(ValueError, match=r"img transform: expected shape \(3, 3\)"): runner.set_transforms(np.eye(2), np.eye(3))

def test_unserved_layout_names_the_command_that_builds_it(road):
  with pytest.raises(ArtifactError, match=r"no warp compiled for camera layout 32x16:32:512:768 .*--camera 32x16:32:512:768"):
    RoadRunner(road, NV12Layout.packed(32, 16), None)

def test_warmup_leaves_no_history(runner):
  runner.warmup()
  assert not runner.full_desire.any() and not runner.features_buffer[0].any()
  assert not buffer_of(runner.queues['img']).numpy().any()

# ***** the driver monitoring runner *****

def test_dm_runner(built):
  r = DMRunner(built[0], MAIN)
  r.warmup()
  x = CamBuf(MAIN, stream=1, seed=90)
  out = r.run(x, np.zeros(3), T)
  np.testing.assert_array_equal(r.warp.run({'frame': r.cameras.get(x, r.warp), 'transform': r.transform[1]}), dm_warp_np(x.data, T, MAIN).reshape(-1))
  assert set(out.outputs) == set(SLICES['dm']) and out.raw.shape == (553,)
  held = out.raw.copy()
  assert not np.array_equal(held, r.run(x, np.array([0, .1, 0]), T).raw)          # calibration is a live input
  assert not np.array_equal(held, r.run(x, np.zeros(3), T * 1.2).raw)             # so is the transform
  np.testing.assert_array_equal(r.run(x, np.zeros(3), T).raw, held)
  np.testing.assert_array_equal(out.raw, held)
  with pytest.raises(CameraLayoutError): r.run(CamBuf(EXTRA, stream=1), np.zeros(3), T)

def test_loaded_jit_is_not_linked_before_its_first_replay(road):
  # tinygrad caches `linear` from `_linear` on first use; a caller that re-lowers `_linear` can still do so
  g = road.load_jit('policy')
  assert 'linear' not in g.jit.captured.__dict__ and g.jit.fxn is None and g.jit.cnt == 2

def test_weights_load_without_a_host_view(road, monkeypatch):
  # GPU memory has no CPU view: the loader then reads each buffer into a bytearray and copies it in
  import modelrt.artifact
  from modelrt.runner import host_tensor
  feeds = {k: host_tensor(np.random.default_rng(1).standard_normal(s.shape).astype(np.float32)) for k, s in road.models['policy'].inputs.items()}
  want = road.models['policy'].run(feeds)
  monkeypatch.setattr(modelrt.artifact, '_host_view', lambda buf: None)
  np.testing.assert_array_equal(road.load_jit('policy').run(feeds), want)

# ***** threads *****

def test_runners_with_threads_give_one_threads_outputs(built):
  """set_threads(n) (the daemons' --threads): every JIT of a runner replays its kernels' launches on n threads, the
  outputs bit for bit those of one thread."""
  road, dm = load_artifact(built[0], 'road'), load_artifact(built[0], 'dm')
  outs = {}
  for n in (1, 2):
    r, d = RoadRunner(road, MAIN, None, threads=n), DMRunner(dm, MAIN, threads=n)
    r.set_transforms(T, T * 1.1)
    outs[n] = [one(r, CamBuf(MAIN, idx=i, seed=30 + i), desire(i % 3), LHD).raw.copy() for i in range(FRAME_SKIP + 2)]
    outs[n].append(d.run(CamBuf(MAIN, stream=1, seed=40), np.array([0, .1, 0]), T).raw.copy())
    assert {g.threads for g in (*r.warps.values(), r.vision, r.policy, d.warp, d.model)} == {n}
  for a, b in zip(outs[1], outs[2]): np.testing.assert_array_equal(a, b)

@pytest.mark.parametrize('daemon', ['modeld', 'dmonitoringd'])
def test_daemons_offer_threads_and_refuse_fewer_than_one(daemon, tmp_path):
  import pathlib, subprocess, sys
  root = pathlib.Path(__file__).resolve().parents[1]
  def run(*args): return subprocess.run([sys.executable, '-m', daemon, *args], cwd=root, capture_output=True, text=True, timeout=60)
  assert '--threads N' in run('--help').stdout
  p = run('--artifacts', str(tmp_path), '--threads', '0')
  assert p.returncode == 2 and '--threads: expected N >= 1, got 0' in p.stderr, (p.returncode, p.stderr)
