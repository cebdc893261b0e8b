"""ONNX import (openpilot conventions) and the build-time validation of modeld-compile; the artifact it writes and the
runners over it are tested in test_runtime.py."""
import base64, json, os, pickle
import pytest
from tinygrad import Tensor
from tinygrad.helpers import Context
from onnx_models import vision_onnx, policy_onnx, dm_onnx
from modelrt.constants import VISION_OUTPUT_SIZES, POLICY_OUTPUT_SIZES, DM_OUTPUT_SIZES, slices_from_sizes
from modelrt.onnx_import import load_onnx, OnnxImportError, metadata_props
from modelrt.compile import build_jit, InputPlan, ValidationError, main
from modelrt.artifact import write_artifact

@pytest.fixture(autouse=True)
def _no_compile_workers():
  with Context(PARALLEL=0): yield   # tiny kernels compile faster in-process than through spawned workers

@pytest.mark.parametrize('make, kind, sizes', [(vision_onnx, 'vision', VISION_OUTPUT_SIZES), (policy_onnx, 'policy', POLICY_OUTPUT_SIZES),
                                               (dm_onnx, 'dm', DM_OUTPUT_SIZES)])
def test_onnx_import_reads_inputs_and_output_slices(tmp_path, make, kind, sizes):
  md = load_onnx(make(tmp_path / 'm.onnx'), kind)
  assert md.output_slices == slices_from_sizes(sizes)
  assert list(md.inputs) == list({'vision': ['img', 'big_img'], 'policy': ['features_buffer', 'desire_pulse', 'traffic_convention'],
                                   'dm': ['input_img', 'calib']}[kind])
  assert len(md.source_sha256) == 64

@pytest.mark.parametrize('kw, msg', [
  ({'drop_input': 'big_img'}, r"missing \['big_img'\], extra \[\]"),
  ({'extra_inputs': [('extra', (1, 2))]}, r"missing \[\], extra \['extra'\]"),
  ({'output_slices': None}, r"no output_slices in metadata_props"),
  ({'output_slices': {'pose': slice(0, 12), 'hidden_state': slice(1500, 1600)}}, r"'hidden_state' = slice\(1500, 1600, None\) is not a plain range within the model's 1520 outputs"),
  ({'output_slices': {'pose': slice(0, 12, 2)}}, r"not a plain range"),
])
def test_onnx_import_refuses(tmp_path, kw, msg):
  with pytest.raises(OnnxImportError, match=msg): load_onnx(vision_onnx(tmp_path / 'v.onnx', **kw), 'vision')

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

def test_onnx_import_refuses_wrong_model_kind_and_garbage(tmp_path):
  with pytest.raises(OnnxImportError, match=r"policy model inputs must be"): load_onnx(vision_onnx(tmp_path / 'v.onnx'), 'policy')
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

# ***** the command line *****

def test_help_explains_itself(capsys):
  with pytest.raises(SystemExit) as e: main(['--help'])
  assert e.value.code == 0
  out = capsys.readouterr().out
  for word in ('--vision-onnx', '--policy-onnx', '--dm-onnx', '--reference', '--camera', 'WxH:stride:uv_offset:size', '--out', '--device',
               '--beam', 'atomically', 'code', 'PARALLEL'):
    assert word in out

@pytest.mark.parametrize('argv, msg', [
  (['--camera', '64x48', '--out', 'x'], 'nothing to build'),
  (['--vision-onnx', 'v.onnx', '--camera', '64x48', '--out', 'x'], 'needs both --vision-onnx and --policy-onnx'),
  (['--reference', '--dm-onnx', 'd.onnx', '--camera', '64x48', '--out', 'x'], 'one or the other'),
  (['--reference', '--camera', '64x47', '--out', 'x'], 'positive even width and height'),
  (['--reference', '--camera', 'big', '--out', 'x'], "expected 'WxH'"),
  (['--dm-onnx', 'd.onnx', '--family', 'road', '--camera', '64x48', '--out', 'x'], 'has no models given'),
])
def test_cli_refuses_bad_arguments(capsys, argv, msg):
  with pytest.raises(SystemExit) as e: main(argv)
  assert e.value.code == 2 and msg in capsys.readouterr().err

def test_cli_reports_onnx_errors_without_writing(tmp_path, capsys):
  p = dm_onnx(tmp_path / 'd.onnx', output_slices=None)
  assert main(['--dm-onnx', str(p), '--camera', '64x48', '--out', str(tmp_path / 'art'), '--quiet']) == 1
  assert 'no output_slices' in capsys.readouterr().err and not (tmp_path / 'art' / 'dm').exists()

def test_build_leaves_no_compile_worker_processes(tmp_path, capsys):
  import multiprocessing
  p = dm_onnx(tmp_path / 'd.onnx')
  with Context(PARALLEL=2):   # compile workers are spawned for the build and must be gone when it returns
    assert main(['--dm-onnx', str(p), '--camera', '64x48', '--out', str(tmp_path / 'art'), '--quiet']) == 0
  assert multiprocessing.active_children() == []
  assert 'dm: built' in capsys.readouterr().out
