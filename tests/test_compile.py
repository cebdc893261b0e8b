"""ONNX import (openpilot conventions) and the build-time validation of modeld-compile; the artifact it writes and the
runners over it are tested in test_runtime.py."""
import base64, contextlib, json, os, pickle
import numpy as np
import pytest
from tinygrad import Tensor
from tinygrad.helpers import Context
from tests.onnx_models import vision_onnx, policy_onnx, dm_onnx, SLICES, KNOWN, RELEASE_DM_SLICES
from modelrt.contracts import ROAD_V0_11_1, DM_V0_11_1, ContractError, identify
from modelrt.onnx_import import load_onnx, OnnxImportError, metadata_props
from modelrt import compile as modeld_compile
from modelrt.compile import build_jit, code_sha256, code_sources, InputPlan, ValidationError, main
from modelrt.artifact import write_artifact

@pytest.fixture(autouse=True)
def _no_compile_workers():
  with Context(PARALLEL=0): yield   # tiny kernels compile faster in-process than through spawned workers

@pytest.mark.parametrize('make, kind, width', [(vision_onnx, 'vision', 1576), (policy_onnx, 'policy', 1000), (dm_onnx, 'dm', 553)])
def test_onnx_import_reads_the_models_own_metadata(tmp_path, make, kind, width):
  p = make(tmp_path / 'm.onnx')
  assert '\n' in metadata_props(p)['output_slices']   # MIME base64, as openpilot's files hold it
  md = load_onnx(p, kind)
  assert md.output_slices == SLICES[kind] and md.width == width and len(md.source_sha256) == 64
  if kind == 'policy':   # the release's metadata counts its unused tail from the end; it is read as the range it names
    assert pickle.loads(base64.b64decode(metadata_props(p)['output_slices']))['pad'] == slice(-2, None)
    assert md.output_slices['pad'] == slice(998, 1000)
  assert md.inputs == {'vision': {'img': ((1, 12, 128, 256), 'uint8'), 'big_img': ((1, 12, 128, 256), 'uint8')},
                       'policy': {'features_buffer': ((1, 25, 512), 'float32'), 'desire_pulse': ((1, 25, 8), 'float32'),
                                  'traffic_convention': ((1, 2), 'float32')},
                       'dm': {'input_img': ((1, 1440 * 960), 'uint8'), 'calib': ((1, 3), 'float32')}}[kind]

@pytest.mark.parametrize('kw, msg', [
  ({'output_slices': None}, r"no output_slices in metadata_props"),
  ({'output_slices': {'pose': slice(0, 12), 'hidden_state': slice(1500, 1600)}},
   r"'hidden_state' = slice\(1500, 1600, None\) is not a plain range within the model's 1576 outputs"),
  ({'output_slices': {'pose': slice(0, 12, 2)}}, r"not a plain range"),
  ({'output_slices': {'pose': slice(0, 12), 'hidden_state': slice(-1600, None)}}, r"'hidden_state' = slice\(-1600, None, None\) is not a plain range"),
  ({'output_slices': {'pose': slice(12, 12)}}, r"'pose' = slice\(12, 12, None\) is not a plain range"),
  ({'output_slices': {'pose': slice(0.0, 12)}}, r"'pose' = slice\(0.0, 12, None\) is not a plain range"),
])
def test_onnx_import_refuses(tmp_path, kw, msg):
  with pytest.raises(OnnxImportError, match=msg): load_onnx(vision_onnx(tmp_path / 'v.onnx', **kw), 'vision')

# ***** which contract: the release's models are identified, any other is refused with every mismatch named *****

def _road(tmp_path, vision=None, policy=None):
  return {'vision': load_onnx(vision_onnx(tmp_path / 'v.onnx', **(vision or {})), 'vision'),
          'policy': load_onnx(policy_onnx(tmp_path / 'p.onnx', **(policy or {})), 'policy')}

def test_release_models_are_identified(tmp_path):
  assert identify('road', _road(tmp_path)) is ROAD_V0_11_1
  dm = load_onnx(dm_onnx(tmp_path / 'd.onnx'), 'dm')
  assert dm.output_slices == RELEASE_DM_SLICES and dm.width == 553   # the test model is laid out as the release's metadata
  assert identify('dm', {'dm': dm}) is DM_V0_11_1
  extra = {**SLICES['dm'], 'features': slice(41, 549), 'other': slice(549, 553)}   # a slice the release does not name
  with pytest.raises(ContractError, match=r"dm output slice 'features': expected width 512, the model has 508 \(41:549\)\n.*"
                                          r"dm output slice 'other': not in the contract"):
    identify('dm', {'dm': load_onnx(dm_onnx(tmp_path / 'd2.onnx', output_slices=extra), 'dm')})

@pytest.mark.parametrize('vision, policy, lines', [
  ({'widths': {'lead': 102}}, {}, ["vision output vector: expected width 1576, the model has 1534",
                                    "vision output slice 'lead': expected width 144, the model has 102 (917:1019)"]),
  # the layout of an earlier model family: plan and lead with hypotheses, meta 48 wide
  ({'widths': {'lead': 255, 'meta': 48}}, {'widths': {'plan': 4955}},
   ["vision output vector: expected width 1576, the model has 1680", "vision output slice 'meta': expected width 55, the model has 48 (0:48)",
    "vision output slice 'lead': expected width 144, the model has 255 (910:1165)", "policy output vector: expected width 1000, the model has 4965",
    "policy output slice 'plan': expected width 990, the model has 4955 (0:4955)"]),
  ({'drop_input': 'big_img', 'extra_inputs': [('extra', (1, 2))]}, {},
   ["vision input 'extra': not in the contract", "vision input 'big_img': missing (expected uint8[1, 12, 128, 256])"]),
  ({}, {'output_slices': {**SLICES['policy'], 'desire_state': slice(990, 996), 'sim_pose': slice(996, 1000)}},
   ["policy output slice 'desire_state': expected width 8, the model has 6 (990:996)", "policy output slice 'sim_pose': not in the contract"]),
])
def test_other_models_are_refused_naming_each_mismatch(tmp_path, vision, policy, lines):
  with pytest.raises(ContractError) as e: identify('road', _road(tmp_path, vision, policy))
  msg = str(e.value)
  assert msg.startswith("the road models follow no known contract:\n  openpilot-0.11.1:")
  for line in lines: assert line in msg, msg
  assert msg.splitlines()[2:] == ['    ' + l for l in lines]   # every mismatch, nothing else

def test_float16_graph_inputs_are_fed_float32(tmp_path):
  ort = pytest.importorskip('onnxruntime')
  p = policy_onnx(tmp_path / 'p16.onnx', dtype='float16')
  md = load_onnx(p, 'policy')
  assert md.inputs['features_buffer'] == ((1, 25, 512), 'float16')
  fed = md.fed({k: i.dtype for k, i in identify('road', {**_road(tmp_path), 'policy': md}).policy.inputs.items()})
  assert fed.inputs['features_buffer'] == ((1, 25, 512), 'float32')
  rng = np.random.default_rng(0)
  x = {k: rng.integers(0, 4, s, dtype=np.int64).astype(np.float32) for k, (s, _) in fed.inputs.items()}
  want = ort.InferenceSession(str(p)).run(None, {k: v.astype(np.float16) for k, v in x.items()})[0]
  np.testing.assert_array_equal(fed.fn(**{k: Tensor(v) for k, v in x.items()}).numpy(), want)
  assert want[0, -2] != KNOWN['policy'][-2]   # the inputs reached the output

def test_onnx_output_slices_pickle_may_only_hold_slices(tmp_path):
  class Evil:
    def __reduce__(self): return (os.system, ('touch ' + str(tmp_path / 'pwned'),))
  p = vision_onnx(tmp_path / 'v.onnx', output_slices={'pose': slice(0, 12)})
  import onnx
  m = onnx.load(p)
  m.metadata_props[0].value = base64.b64encode(pickle.dumps({'pose': Evil()})).decode()
  onnx.save(m, p)
  assert 'output_slices' in metadata_props(p)
  with pytest.raises(OnnxImportError, match="may only hold slices, found posix.system"): load_onnx(p, 'vision')
  assert not (tmp_path / 'pwned').exists()

def test_onnx_import_refuses_garbage(tmp_path):
  (tmp_path / 'junk.onnx').write_bytes(b'\xff' * 100)
  with pytest.raises(OnnxImportError, match="not a readable ONNX model"): load_onnx(tmp_path / 'junk.onnx', 'vision')

# ***** build-time validation catches what a silent replay would get wrong *****

PLANS = [InputPlan('a', (4, 4), 'float32', 'device'), InputPlan('b', (1, 4), 'float32', 'host')]

def test_validation_accepts_a_sound_function(tmp_path):
  entry = build_jit('ok', lambda a, b: (a * b.to(a.device)).sum(0).contiguous().realize(), PLANS, 'CPU', tmp_path)
  assert [i['name'] for i in entry['inputs']] == ['a', 'b'] and entry['output'] == {'dtype': 'float32', 'shape': [4]}
  assert {i['name']: i['device'] for i in entry['inputs']} == {'a': 'CPU', 'b': 'NPY'}

def test_validation_catches_an_input_that_does_not_reach_the_program(tmp_path):
  scale = Tensor([[2., 2., 2., 2.]], device='CPU').realize()   # e.g. a closure tensor where the per-frame input was meant
  with pytest.raises(ValidationError, match="changing input 'b' does not change the output"):
    build_jit('frozen', lambda a, b: (a * scale).contiguous().realize(), PLANS, 'CPU', tmp_path)

def test_validation_catches_python_state_frozen_at_capture(tmp_path):
  calls = []
  def fn(a, b):
    calls.append(1)
    return (a + b.to(a.device) + len(calls)).contiguous().realize()   # a Python counter: frozen at capture
  with pytest.raises(ValidationError, match=r"differs from the eager run"): build_jit('counter', fn, PLANS, 'CPU', tmp_path)

def test_validation_catches_a_view_output(tmp_path):
  with pytest.raises(ValidationError, match="must return one realized contiguous Tensor"):
    build_jit('view', lambda a, b: (a + b.to(a.device)).realize()[:, :2], PLANS, 'CPU', tmp_path)

def test_failed_build_keeps_the_old_artifact_and_leaves_no_temp(tmp_path):
  def ok(d): (d / 'x').write_text('1'); return {'format': 0}
  def bad(d): (d / 'x').write_text('2'); raise ValidationError('nope')
  write_artifact(tmp_path, 'road', ok)
  with pytest.raises(ValidationError): write_artifact(tmp_path, 'road', bad)
  assert (tmp_path / 'road' / 'x').read_text() == '1' and sorted(p.name for p in tmp_path.iterdir()) == ['road']
  assert set(json.loads((tmp_path / 'road' / 'manifest.json').read_text())['files']) == {'x'}

# ***** what a build is addressed by *****

@pytest.mark.parametrize('module', ['modelrt.compile', 'modelrt.warp', 'modelrt.onnx_import', 'modelrt.constants', 'transformations.camera',
                                    'transformations.model',
                                    'modelrt.contracts', 'modelrt.modeldef', 'modelrt.runner', 'modelrt.schedule', 'msgq.visionipc.layout'])
def test_the_build_id_covers_the_code_the_programs_are_made_from(monkeypatch, module):
  """Each module the captured programs depend on (the captured functions, warps, ONNX lowering, constants, geometry,
  contract shapes, ModelDef.fed's casts, the runner's queue shape, the NV12 layouts): an edit to it is a new build."""
  base, sources = code_sha256(), code_sources()
  monkeypatch.setattr(modeld_compile, 'code_sources', lambda: {**sources, module: sources[module] + b'# edited\n'})
  assert code_sha256() != base

# ***** the command line *****

def test_help_explains_itself(capsys):
  with pytest.raises(SystemExit) as e: main(['--help'])
  assert e.value.code == 0
  out = capsys.readouterr().out
  for word in ('--vision-onnx', '--policy-onnx', '--dm-onnx', '--reference', '--camera', 'WxH:stride:uv_offset:size', '--out', '--device',
               '--beam', '--winograd', '--schedule', 'atomically', 'code', 'PARALLEL'):
    assert word in out

@pytest.mark.parametrize('argv, msg', [
  (['--camera', '64x48', '--out', 'x'], 'nothing to build'),
  (['--vision-onnx', 'v.onnx', '--camera', '64x48', '--out', 'x'], 'needs both --vision-onnx and --policy-onnx'),
  (['--reference', '--dm-onnx', 'd.onnx', '--camera', '64x48', '--out', 'x'], 'one or the other'),
  (['--reference', '--camera', '64x47', '--out', 'x'], 'positive even width and height'),
  (['--reference', '--camera', 'big', '--out', 'x'], "expected 'WxH'"),
  (['--dm-onnx', 'd.onnx', '--family', 'road', '--camera', '64x48', '--out', 'x'], '--family road: no models given for it'),
  (['--reference', '--camera', '64x48', '--beam', '-1', '--out', 'x'], '--beam: expected N >= 0, got -1'),
  (['--reference', '--camera', '64x48', '--winograd', 'some', '--out', 'x'], "--winograd: invalid choice: 'some'"),
])
def test_cli_refuses_bad_arguments(capsys, argv, msg):
  with pytest.raises(SystemExit) as e: main(argv)
  assert e.value.code == 2 and msg in capsys.readouterr().err

def test_cli_reports_onnx_errors_without_writing(tmp_path, capsys):
  p = dm_onnx(tmp_path / 'd.onnx', output_slices=None)
  assert main(['--dm-onnx', str(p), '--camera', '64x48', '--out', str(tmp_path / 'art'), '--quiet']) == 1
  assert 'no output_slices' in capsys.readouterr().err and not (tmp_path / 'art' / 'dm').exists()

def test_cli_refuses_a_model_with_another_lead_width(tmp_path, capsys):
  v, p = vision_onnx(tmp_path / 'v.onnx', widths={'lead': 102}), policy_onnx(tmp_path / 'p.onnx')
  assert main(['--vision-onnx', str(v), '--policy-onnx', str(p), '--camera', '64x48', '--out', str(tmp_path / 'art'), '--quiet']) == 1
  err = capsys.readouterr().err
  assert err.startswith('modeld-compile: error: the road models follow no known contract')
  assert "vision output slice 'lead': expected width 144, the model has 102 (917:1019)" in err and not (tmp_path / 'art').exists()

def test_build_leaves_no_compile_worker_processes(tmp_path, capsys):
  import multiprocessing
  p = dm_onnx(tmp_path / 'd.onnx')
  with Context(PARALLEL=2):   # compile workers are spawned for the build and must be gone when it returns
    assert main(['--dm-onnx', str(p), '--camera', '64x48', '--out', str(tmp_path / 'art'), '--quiet']) == 0
  assert multiprocessing.active_children() == []
  assert 'dm: built' in capsys.readouterr().out

def test_a_reduction_before_a_concat_runs_in_its_own_kernel(tmp_path):
  """The driver model's features concatenated with calib: the reduction that makes the features gets a kernel of its
  own size. Fused into the concat it ran in the concat's padded shape (the real-size DM's last conv, 24576 + 3
  outputs, 2.5x slower). The output stays onnxruntime's."""
  from tinygrad import TinyJit
  from tinygrad.engine.realize import get_call_arg_uops
  from modelrt.profile import _calls, call_name
  ort = pytest.importorskip('onnxruntime')
  md, rng = load_onnx(p := dm_onnx(tmp_path / 'dm.onnx'), 'dm'), np.random.default_rng(0)
  jit = TinyJit(lambda **kw: md.fn(**kw).contiguous().realize())
  for _ in range(3):
    x = {'input_img': rng.integers(0, 255, (1, 1440 * 960), dtype=np.uint8), 'calib': rng.standard_normal((1, 3)).astype(np.float32)}
    out = jit(**{k: Tensor(v).realize() for k, v in x.items()}).numpy()
  np.testing.assert_allclose(out, ort.InferenceSession(str(p)).run(None, x)[0], rtol=1e-5, atol=1e-5)
  written = [get_call_arg_uops(c)[0].shape for c in _calls(jit.captured.linear) if call_name(c).startswith('r_')]
  assert (1,) in written and (4,) not in written, written   # the mean's own output, not the concat's

def test_winograd_takes_the_dense_3x3_stride_1_convolutions_only(tmp_path):
  """Under WINO=1 (modeld-compile --winograd) a dense 3x3 stride-1 convolution of an ONNX model runs as Winograd (other
  kernels), a depthwise one stays direct (the same kernels); the outputs stay onnxruntime's."""
  from onnx import helper
  from tinygrad import TinyJit
  from modelrt.profile import _calls, call_name
  from tests.onnx_models import save_model
  ort = pytest.importorskip('onnxruntime')
  rng = np.random.default_rng(0)
  weights = {'dense': rng.standard_normal((8, 8, 3, 3)).astype(np.float32) / 8, 'depthwise': rng.standard_normal((8, 1, 3, 3)).astype(np.float32) / 3}
  x = {'x': rng.standard_normal((1, 8, 16, 16)).astype(np.float32)}
  for name, w in weights.items():
    nodes = [helper.make_node('Conv', ['x', 'w'], ['c'], kernel_shape=[3, 3], pads=[1] * 4, strides=[1, 1], group=8 // w.shape[1]),
             helper.make_node('Reshape', ['c', 'shape'], ['taps'])]
    path = save_model(tmp_path / f'{name}.onnx', nodes, {'x': ((1, 8, 16, 16), 'float32')}, np.zeros(2048, np.float32),
                 {'w': w, 'shape': np.array([1, -1], np.int64)}, {'out': slice(0, 2048)})
    md, want, kernels = load_onnx(path, 'vision'), ort.InferenceSession(str(path)).run(None, x)[0], {}
    for wino in (0, 1):
      with Context(WINO=wino):
        jit = TinyJit(lambda fn=md.fn, **kw: fn(**kw).contiguous().realize())
        for _ in range(3): out = jit(x=Tensor(x['x']).realize()).numpy()
      np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
      kernels[wino] = sorted(call_name(c) for c in _calls(jit.captured.linear))
    assert (kernels[0] != kernels[1]) == (name == 'dense'), (name, kernels)

def test_sigterm_mid_build_leaves_nothing(tmp_path):
  """SIGTERM (systemd, `timeout`) while a build runs stops it as Ctrl-C does: exit 143, a line saying so, and no
  temporary folder left in --out."""
  import pathlib, signal, subprocess, sys, time
  out = tmp_path / 'art'
  p = subprocess.Popen([sys.executable, '-m', 'modelrt.compile', '--reference', '--family', 'road', '--camera', '1928x1208', '--out', str(out),
                        '--quiet', '--force'], stderr=subprocess.PIPE, text=True, cwd=pathlib.Path(__file__).resolve().parents[1])
  deadline = time.monotonic() + 60
  while not list(out.glob('.road.tmp-*')) and time.monotonic() < deadline and p.poll() is None: time.sleep(0.05)
  p.send_signal(signal.SIGTERM)
  err = p.communicate(timeout=60)[1]
  assert p.returncode == 128 + signal.SIGTERM and 'interrupted' in err and 'Traceback' not in err, err
  assert list(out.iterdir()) == [], list(out.iterdir())

def test_shape_schedule_keeps_onnxruntimes_outputs(tmp_path):
  """modeld-compile's default schedule (modelrt.schedule: weights channels-last, convs and matmuls vectorized by rules
  from their shapes) gives other kernels than tinygrad's own for a conv + conv + matmul model, and onnxruntime's outputs
  within 1e-4 (relative)."""
  from onnx import helper
  from tinygrad import TinyJit
  from modelrt.profile import _calls, call_name
  from modelrt.schedule import scheduled
  from tests.onnx_models import save_model
  ort = pytest.importorskip('onnxruntime')
  rng = np.random.default_rng(0)
  weights = {'w1': rng.standard_normal((32, 12, 3, 3)).astype(np.float32) / 6, 'b1': rng.standard_normal(32).astype(np.float32),
             'w2': rng.standard_normal((48, 32, 1, 1)).astype(np.float32) / 6, 'shape': np.array([1, -1], np.int64),
             'fc': rng.standard_normal((64, 48 * 8 * 8)).astype(np.float32) / 50}
  nodes = [helper.make_node('Conv', ['x', 'w1', 'b1'], ['c1'], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2]),
           helper.make_node('Relu', ['c1'], ['r1']), helper.make_node('Conv', ['r1', 'w2'], ['c2'], kernel_shape=[1, 1]),
           helper.make_node('Reshape', ['c2', 'shape'], ['flat']), helper.make_node('Gemm', ['flat', 'fc'], ['taps'], transB=1)]
  path = save_model(tmp_path / 'm.onnx', nodes, {'x': ((1, 12, 16, 16), 'float32')}, np.zeros(64, np.float32), weights, {'out': slice(0, 64)})
  x = {'x': rng.standard_normal((1, 12, 16, 16)).astype(np.float32)}
  want, kernels = ort.InferenceSession(str(path)).run(None, x)[0], {}
  for schedule in ('tinygrad', 'shape'):
    with contextlib.ExitStack() as stack:
      if schedule == 'shape': stack.enter_context(scheduled('CPU', 16))
      md = load_onnx(path, 'vision')
      jit = TinyJit(lambda fn=md.fn, **kw: fn(**kw).contiguous().realize())
      for _ in range(3): out = jit(x=Tensor(x['x']).realize()).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    kernels[schedule] = sorted(call_name(c) for c in _calls(jit.captured.linear))
  assert kernels['shape'] != kernels['tinygrad'], kernels

def test_winograd_by_the_rule_takes_the_convolutions_on_large_images_only(tmp_path):
  """modeld-compile's default --winograd rule: a dense 3x3 stride-1 convolution on an image of at least
  WINOGRAD_MIN_PIXELS runs as Winograd (the kernels of --winograd all), a smaller one direct (those of --winograd off);
  the outputs stay onnxruntime's."""
  from onnx import helper
  from tinygrad import TinyJit
  from modelrt.onnx_import import WINOGRAD_MIN_PIXELS, winograd
  from modelrt.profile import _calls, call_name
  from tests.onnx_models import save_model
  ort = pytest.importorskip('onnxruntime')
  rng = np.random.default_rng(0)
  w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32) / 8
  for h, wd in ((32, 64), (16, 32)):
    n = 8 * h * wd
    nodes = [helper.make_node('Conv', ['x', 'w'], ['c'], kernel_shape=[3, 3], pads=[1] * 4, strides=[1, 1]),
             helper.make_node('Reshape', ['c', 'shape'], ['taps'])]
    path = save_model(tmp_path / f'{h}.onnx', nodes, {'x': ((1, 8, h, wd), 'float32')}, np.zeros(n, np.float32),
                      {'w': w, 'shape': np.array([1, -1], np.int64)}, {'out': slice(0, n)})
    x = {'x': rng.standard_normal((1, 8, h, wd)).astype(np.float32)}
    md, want, kernels = load_onnx(path, 'vision'), ort.InferenceSession(str(path)).run(None, x)[0], {}
    for mode in ('rule', 'all', 'off'):
      with winograd(mode):
        jit = TinyJit(lambda fn=md.fn, **kw: fn(**kw).contiguous().realize())
        for _ in range(3): out = jit(x=Tensor(x['x']).realize()).numpy()
      np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
      kernels[mode] = sorted(call_name(c) for c in _calls(jit.captured.linear))
    assert kernels['all'] != kernels['off'] and kernels['rule'] == kernels['all' if h * wd >= WINOGRAD_MIN_PIXELS else 'off'], (h, kernels)
  with pytest.raises(ValueError, match="winograd: expected one of \\('rule', 'all', 'off'\\), got 'some'"):
    with winograd('some'): pass
