"""Tiny ONNX models in openpilot's I/O contract (input names, shapes, dtypes, output_slices metadata) for tests and
benchmarks: a few pooling/conv/matmul layers, so tinygrad compiles them in seconds. Uses the onnx package (test-only)."""
import base64, pathlib, pickle
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto
from modelrt.constants import VISION_INPUTS, POLICY_INPUTS, DM_INPUTS, VISION_OUTPUT_SIZES, POLICY_OUTPUT_SIZES, DM_OUTPUT_SIZES, slices_from_sizes

_DT = {'uint8': TensorProto.UINT8, 'float32': TensorProto.FLOAT}
OPSET = 17

def _save(path, nodes, inputs, n_out, weights, output_slices, extra_inputs=(), drop_input=None, name='tiny') -> pathlib.Path:
  ins = [helper.make_tensor_value_info(k, _DT[dt], shape) for k, (shape, dt) in inputs.items() if k != drop_input]
  ins += [helper.make_tensor_value_info(k, TensorProto.FLOAT, shape) for k, shape in extra_inputs]
  if drop_input is not None:   # baked into the file as a constant instead of being an input
    shape, dt = inputs[drop_input]
    weights = {**weights, drop_input: np.zeros(shape, dt)}
  out = helper.make_tensor_value_info('outputs', TensorProto.FLOAT, (1, n_out))
  graph = helper.make_graph(nodes, name, ins, [out], [numpy_helper.from_array(w, k) for k, w in weights.items()])
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', OPSET)], ir_version=8)
  if output_slices is not None:
    model.metadata_props.add(key='output_slices', value=base64.b64encode(pickle.dumps(output_slices)).decode())
  onnx.checker.check_model(model)
  onnx.save(model, path)
  return pathlib.Path(path)

def _w(rng, *shape, scale=None): return (rng.standard_normal(shape) * (scale or 1 / np.sqrt(shape[0]))).astype(np.float32)

def vision_onnx(path, seed=0, **kw) -> pathlib.Path:
  """img, big_img (1,12,128,256) uint8 -> conv 16x16/16 each -> relu -> matmul -> (1, sum of VISION_OUTPUT_SIZES)."""
  rng, n = np.random.default_rng(seed), sum(VISION_OUTPUT_SIZES.values())
  w = {'conv_w': _w(rng, 4, 12, 16, 16, scale=1 / (255 * 48)), 'big_conv_w': _w(rng, 4, 12, 16, 16, scale=1 / (255 * 48)),
       'fc_w': _w(rng, 1024, n), 'fc_b': _w(rng, n, scale=.1)}
  nodes = [helper.make_node('Cast', ['img'], ['imgf'], to=TensorProto.FLOAT), helper.make_node('Cast', ['big_img'], ['bigf'], to=TensorProto.FLOAT),
           helper.make_node('Conv', ['imgf', 'conv_w'], ['c1'], kernel_shape=[16, 16], strides=[16, 16]),
           helper.make_node('Conv', ['bigf', 'big_conv_w'], ['c2'], kernel_shape=[16, 16], strides=[16, 16]),
           helper.make_node('Flatten', ['c1'], ['f1']), helper.make_node('Flatten', ['c2'], ['f2']),
           helper.make_node('Concat', ['f1', 'f2'], ['f'], axis=1), helper.make_node('Relu', ['f'], ['r']),
           helper.make_node('MatMul', ['r', 'fc_w'], ['m']), helper.make_node('Add', ['m', 'fc_b'], ['outputs'])]
  return _save(path, nodes, VISION_INPUTS, n, w, kw.pop('output_slices', slices_from_sizes(VISION_OUTPUT_SIZES)), **kw)

def policy_onnx(path, seed=1, **kw) -> pathlib.Path:
  """features mean over time ++ desire ++ traffic convention -> matmul/relu/matmul -> (1, sum of POLICY_OUTPUT_SIZES)."""
  rng, n = np.random.default_rng(seed), sum(POLICY_OUTPUT_SIZES.values())
  w = {'w1': _w(rng, 512 + 200 + 2, 64), 'w2': _w(rng, 64, n), 'shape_d': np.array([1, 200], np.int64)}
  nodes = [helper.make_node('ReduceMean', ['features_buffer'], ['fm'], axes=[1], keepdims=0),
           helper.make_node('Reshape', ['desire_pulse', 'shape_d'], ['d']),
           helper.make_node('Concat', ['fm', 'd', 'traffic_convention'], ['x'], axis=1),
           helper.make_node('MatMul', ['x', 'w1'], ['h']), helper.make_node('Relu', ['h'], ['hr']),
           helper.make_node('MatMul', ['hr', 'w2'], ['outputs'])]
  return _save(path, nodes, POLICY_INPUTS, n, w, kw.pop('output_slices', slices_from_sizes(POLICY_OUTPUT_SIZES)), **kw)

def dm_onnx(path, seed=2, **kw) -> pathlib.Path:
  """input_img (1,1440*960) uint8 as 960x1440 -> avgpool 32 -> ++ calib -> matmul -> (1, sum of DM_OUTPUT_SIZES)."""
  rng, n = np.random.default_rng(seed), sum(DM_OUTPUT_SIZES.values())
  w = {'w': _w(rng, 30 * 45 + 3, n, scale=1 / 255), 'shape_i': np.array([1, 1, 960, 1440], np.int64)}
  nodes = [helper.make_node('Cast', ['input_img'], ['f'], to=TensorProto.FLOAT), helper.make_node('Reshape', ['f', 'shape_i'], ['i']),
           helper.make_node('AveragePool', ['i'], ['p'], kernel_shape=[32, 32], strides=[32, 32]),
           helper.make_node('Flatten', ['p'], ['pf']), helper.make_node('Concat', ['pf', 'calib'], ['x'], axis=1),
           helper.make_node('MatMul', ['x', 'w'], ['outputs'])]
  return _save(path, nodes, DM_INPUTS, n, w, kw.pop('output_slices', slices_from_sizes(DM_OUTPUT_SIZES)), **kw)
