"""ONNX models with the exact I/O of openpilot v0.11.1's released models and known outputs, for tests and benchmarks.

Each output is a constant vector KNOWN[model] plus a few taps that depend on the inputs exactly (below), so a test can
compute every published field by hand, and modeld-compile's check that every input changes the output passes.
"""
import codecs, pathlib, pickle
import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto
from modelrt.constants import T_IDXS
from modelrt.contracts import ROAD_V0_11_1, DM_V0_11_1, Model

_DT = {'uint8': TensorProto.UINT8, 'float32': TensorProto.FLOAT, 'float16': TensorProto.FLOAT16}
OPSET = 17
ROAD_Y_META, WIDE_Y_META = 6, 4         # the first hard-brake 5 m/s^2 and 3 m/s^2 predictions (2 s)
Y_BIAS, Y_SCALE = -8.0, 1 / 16
HISTORY_OUT, PULSE_OUT = 998, 999       # policy taps
TRAFFIC_WEIGHTS = (1000.0, 3000.0)      # LHD, RHD

# Each model has the release's input names, shapes and dtypes, one (1, N) float output named `outputs`, and
# `output_slices` in metadata_props (encode_slices). Tiny graphs: tinygrad compiles them in seconds. The taps, all on
# uniform frames exact in float32 (a mean over one 128x256 channel of integers):
# - vision: meta[ROAD_Y_META] += mean Y of the newest road frame / 16, meta[WIDE_Y_META] += the same of the newest
#   wide frame / 16 (both biased -8: a brightness of 128 is probability 0.5); hidden_state[0] = mean U of the newest
#   road frame, hidden_state[1] = mean U of the road frame 4 frames earlier (the older half of `img`);
# - policy: outputs[998] = sum_j (j + 1) features_buffer[0, j, 0]; outputs[999] = sum_j (j + 1) sum_d (d + 1)
#   desire_pulse[0, j, d] + 1000 traffic_convention[0, 0] + 3000 traffic_convention[0, 1] (the 2 entries the release
#   leaves unused);
# - dm: features[0] = mean of input_img / 255, features[1:4] = calib.
# dense=True adds a path of random weights (conv + matmul, a few MB) to every output, for benchmarks that want a model
# with some compute and weights; its outputs are then no longer known. The onnx package is test-only.

# v0.11.1's dmonitoring_model_metadata.pkl output_slices, per driver side (lhd from 0, rhd from 20): face_descs 12,
# then face, left eye, right eye, sunglasses, left blink, right blink, phone, sleep; then wheel_on_right and features
RELEASE_DM_SLICES = {**{k: slice(o + a, o + b) for s, o in (('lhd', 0), ('rhd', 20)) for k, a, b in (
  (f'face_descs_{s}', 0, 12), (f'face_prob_{s}', 12, 13), (f'left_eye_prob_{s}', 13, 14), (f'right_eye_prob_{s}', 14, 15),
  (f'sunglasses_prob_{s}', 15, 16), (f'left_blink_prob_{s}', 16, 17), (f'right_blink_prob_{s}', 17, 18),
  (f'using_phone_prob_{s}', 18, 19), (f'sleep_prob_{s}', 19, 20))}, 'wheel_on_right': slice(40, 41), 'features': slice(41, 553)}

def encode_slices(slices: dict[str, slice]) -> str:
  """As openpilot stores output_slices: MIME base64 (line breaks included) of a pickled {name: slice}."""
  return codecs.encode(pickle.dumps(slices), 'base64').decode()

# ***** the known outputs *****

def _vision_known(rng: np.random.Generator) -> dict[str, np.ndarray]:
  v = {k: rng.normal(0, 0.5, h.width).astype(np.float32) for k, h in ROAD_V0_11_1.vision.heads.items()}   # means and log-stds alike
  p = 0.005 + 0.015 * np.arange(55)     # meta: a probability of its own for every entry (the interleaving shows)
  v['meta'] = np.log(p / (1 - p)).astype(np.float32)
  v['meta'][[ROAD_Y_META, WIDE_Y_META]] = Y_BIAS
  v['hidden_state'][:] = 0
  return v

def _policy_known(rng: np.random.Generator) -> dict[str, np.ndarray]:
  """A plan braking at 1 m/s^2 from 15 m/s on a left curve whose yaw grows 0.01 rad/s; desire state with a lane change
  to the left likely enough (0.15) that the lane-change state machine never finishes it."""
  mean = rng.normal(0, 0.1, (33, 15))
  t = T_IDXS.astype(np.float64)
  mean[:, 0], mean[:, 3], mean[:, 6] = 15 * t - 0.5 * t * t, 15 - t, -1.0       # position, velocity, acceleration x
  mean[:, 11], mean[:, 14] = 0.01 * t, 0.01                                      # yaw, yaw rate
  plan = np.concatenate([mean.ravel(), rng.normal(-1, 0.3, 33 * 15)]).astype(np.float32)
  return {'plan': plan, 'desire_state': np.array([2, 0, 0, 1, 0, -1, -1, -2], np.float32)}

def _dm_known(rng: np.random.Generator) -> dict[str, np.ndarray]:
  d = {k: rng.normal(0, 1, h.width).astype(np.float32) for k, h in DM_V0_11_1.dm.heads.items()}
  d['features'][:] = 0   # the taps alone
  return d

def release_layout(model: Model, known: dict[str, np.ndarray], widths: dict[str, int],
                   order: tuple[str, ...] | None = None) -> tuple[dict[str, slice], np.ndarray]:
  """Slices back to back in the contract's order, the release's (or in `order`; a head's width overridden by `widths`,
  then zeros), the constant vector."""
  parts = {k: known[k] if k not in widths else np.zeros(widths[k], np.float32) for k in order or model.heads}
  slices, start = {}, 0
  for k, a in parts.items(): slices[k], start = slice(start, start + a.size), start + a.size
  spare = model.built_width - model.heads_width   # entries after the slices
  if spare: slices['pad'] = slice(start, start + spare)   # as the release's policy names its last 2 entries
  return slices, np.concatenate([*parts.values(), np.zeros(spare, np.float32)])

_rng = np.random.default_rng(1211)
KNOWN_SLICES = {'vision': _vision_known(_rng), 'policy': _policy_known(_rng), 'dm': _dm_known(_rng)}
SLICES, KNOWN = {}, {}
for _k, _m in (('vision', ROAD_V0_11_1.vision), ('policy', ROAD_V0_11_1.policy), ('dm', DM_V0_11_1.dm)):
  SLICES[_k], KNOWN[_k] = release_layout(_m, KNOWN_SLICES[_k], {})

# ***** the graphs *****

def save_model(path, nodes, inputs: dict, bias: np.ndarray, weights: dict, output_slices, extra_inputs=(), drop_input=None) -> pathlib.Path:
  """inputs: {name: (shape, dtype)}; drop_input: baked into the file as a constant instead of being an input."""
  ins = [helper.make_tensor_value_info(k, _DT[dt], shape) for k, (shape, dt) in inputs.items() if k != drop_input]
  ins += [helper.make_tensor_value_info(k, TensorProto.FLOAT, shape) for k, shape in extra_inputs]
  weights = {**weights, 'bias': bias[None]}
  if drop_input is not None:
    shape, dt = inputs[drop_input]
    weights[drop_input] = np.zeros(shape, dt)
  out = helper.make_tensor_value_info('outputs', TensorProto.FLOAT, (1, bias.size))
  graph = helper.make_graph([*nodes, helper.make_node('Add', ['taps', 'bias'], ['outputs'])], 'release_io', ins, [out],
                            [numpy_helper.from_array(w, k) for k, w in weights.items()])
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', OPSET)], ir_version=8)
  if output_slices is not None:   # the release writes its unused tail counted from the end: 'pad': slice(-2, None)
    pad = {'pad': slice(p.start - bias.size, None)} if (p := output_slices.get('pad')) and p.stop == bias.size else {}
    model.metadata_props.add(key='output_slices', value=encode_slices({**output_slices, **pad}))
  onnx.checker.check_model(model)
  onnx.save(model, path)
  return pathlib.Path(path)

def _channel_mean(src: str, channel: int, out: str) -> list:
  """(1, 1) float mean of one channel of a (1, 12, 128, 256) uint8 image."""
  return [helper.make_node('Slice', [src, f'c{channel}', f'c{channel + 1}', 'axis1'], [f'{out}_s']),
          helper.make_node('Cast', [f'{out}_s'], [f'{out}_f'], to=TensorProto.FLOAT),
          helper.make_node('ReduceMean', [f'{out}_f'], [f'{out}_m'], axes=[1, 2, 3], keepdims=0),
          helper.make_node('Reshape', [f'{out}_m', 'shape_11'], [out])]

def _taps(n_in: int, width: int, cols: dict[int, dict[int, float]]) -> np.ndarray:
  """(n_in, width) weights: cols[output entry] = {input entry: weight}."""
  w = np.zeros((n_in, width), np.float32)
  for o, ws in cols.items():
    for i, x in ws.items(): w[i, o] = x
  return w

def _consts(**kw) -> dict[str, np.ndarray]: return {k: np.asarray(v, np.int64) for k, v in kw.items()}

def _dense(nodes: list, weights: dict, features: list, n_in: int, n_out: int, seed: int) -> None:
  """taps += relu(features) @ W, W random (n_in, n_out): the lin output of `nodes` becomes taps."""
  w = (np.random.default_rng(seed).standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
  weights['dense_w'] = w
  nodes += [helper.make_node('Concat', features, ['dense_x'], axis=1), helper.make_node('Relu', ['dense_x'], ['dense_r']),
            helper.make_node('MatMul', ['dense_r', 'dense_w'], ['dense']), helper.make_node('Add', ['lin', 'dense'], ['taps'])]

def _lin_is_taps(nodes: list) -> None: nodes.append(helper.make_node('Identity', ['lin'], ['taps']))

def vision_onnx(path, widths: dict[str, int] | None = None, output_slices=..., dense: bool = False, order: tuple[str, ...] | None = None,
                **kw) -> pathlib.Path:
  """driving_vision.onnx's I/O with the outputs above. widths: heads of another width (zeros), as another release's
  model would have; output_slices: other metadata (None: none); order: the heads laid out in this order instead."""
  m = ROAD_V0_11_1.vision
  slices, bias = release_layout(m, KNOWN_SLICES['vision'], widths or {}, order)
  hid, meta = slices['hidden_state'].start, slices['meta'].start
  w = _taps(4, bias.size, {meta + ROAD_Y_META: {0: Y_SCALE}, meta + WIDE_Y_META: {1: Y_SCALE}, hid: {2: 1.}, hid + 1: {3: 1.}})
  nodes = [*_channel_mean('img', 6, 'road_y'), *_channel_mean('big_img', 6, 'wide_y'), *_channel_mean('img', 10, 'road_u'),
           *_channel_mean('img', 4, 'road_u_old'),
           helper.make_node('Concat', ['road_y', 'wide_y', 'road_u', 'road_u_old'], ['x'], axis=1), helper.make_node('MatMul', ['x', 'w'], ['lin'])]
  weights = {'w': w, **_consts(axis1=[1], shape_11=[1, 1], **{f'c{c}': [c] for c in (4, 5, 6, 7, 10, 11)})}
  if dense:   # a 16x16 stride-16 conv of each image to 4 channels: 2 x 4 x 8 x 16 features
    weights |= {f'{k}_cw': np.random.default_rng(i).standard_normal((4, 12, 16, 16)).astype(np.float32) / (255 * 48) for i, k in enumerate(('img', 'big_img'))}
    for k in ('img', 'big_img'):
      nodes += [helper.make_node('Cast', [k], [f'{k}_cf'], to=TensorProto.FLOAT),
                helper.make_node('Conv', [f'{k}_cf', f'{k}_cw'], [f'{k}_c'], kernel_shape=[16, 16], strides=[16, 16]),
                helper.make_node('Flatten', [f'{k}_c'], [f'{k}_flat'])]
    _dense(nodes, weights, ['img_flat', 'big_img_flat'], 1024, bias.size, 2)
  else: _lin_is_taps(nodes)
  return save_model(path, nodes, {k: (i.shape, i.dtype) for k, i in m.inputs.items()}, bias, weights,
               slices if output_slices is ... else output_slices, **kw)

def policy_onnx(path, widths: dict[str, int] | None = None, output_slices=..., dtype: str = 'float32', dense: bool = False, **kw) -> pathlib.Path:
  """driving_policy.onnx's I/O (inputs declared `dtype`) with the outputs above."""
  m = ROAD_V0_11_1.policy
  slices, bias = release_layout(m, KNOWN_SLICES['policy'], widths or {})
  n, j = bias.size, np.arange(25)
  w = _taps(52, n, {n - 2: {i: float(i + 1) for i in j}, n - 1: {**{25 + i: float(i + 1) for i in j}, 50: TRAFFIC_WEIGHTS[0], 51: TRAFFIC_WEIGHTS[1]}})
  nodes = [*[helper.make_node('Cast', [k], [f'{k}_f'], to=TensorProto.FLOAT) for k in m.inputs],
           helper.make_node('Slice', ['features_buffer_f', 'c0', 'c1', 'axis2'], ['f0']), helper.make_node('Reshape', ['f0', 'shape_125'], ['f']),
           helper.make_node('Mul', ['desire_pulse_f', 'desire_w'], ['dw']), helper.make_node('ReduceSum', ['dw', 'axis2'], ['d'], keepdims=0),
           helper.make_node('Concat', ['f', 'd', 'traffic_convention_f'], ['x'], axis=1), helper.make_node('MatMul', ['x', 'w'], ['lin'])]
  weights = {'w': w, **_consts(c0=[0], c1=[1], axis2=[2], shape_125=[1, 25]), 'desire_w': np.arange(1, 9, dtype=np.float32)[None, None]}
  if dense:   # the features' mean over time
    nodes.append(helper.make_node('ReduceMean', ['features_buffer_f'], ['features_mean'], axes=[1], keepdims=0))
    _dense(nodes, weights, ['features_mean', 'x'], 512 + 52, n, 3)
  else: _lin_is_taps(nodes)
  return save_model(path, nodes, {k: (i.shape, dtype) for k, i in m.inputs.items()}, bias, weights,
               slices if output_slices is ... else output_slices, **kw)

def dm_onnx(path, widths: dict[str, int] | None = None, output_slices=..., **kw) -> pathlib.Path:
  """dmonitoring_model.onnx's I/O with the outputs above, laid out as the release's metadata says."""
  m = DM_V0_11_1.dm
  slices, bias = release_layout(m, KNOWN_SLICES['dm'], widths or {})
  f = slices['features'].start
  w = _taps(4, bias.size, {f: {0: 1 / 255}, f + 1: {1: 1.}, f + 2: {2: 1.}, f + 3: {3: 1.}})
  nodes = [helper.make_node('Cast', ['input_img'], ['img_f'], to=TensorProto.FLOAT),
           helper.make_node('ReduceMean', ['img_f'], ['img_m'], axes=[1], keepdims=1),
           helper.make_node('Cast', ['calib'], ['calib_f'], to=TensorProto.FLOAT),
           helper.make_node('Concat', ['img_m', 'calib_f'], ['x'], axis=1), helper.make_node('MatMul', ['x', 'w'], ['taps'])]
  return save_model(path, nodes, {k: (i.shape, i.dtype) for k, i in m.inputs.items()}, bias, {'w': w},
               slices if output_slices is ... else output_slices, **kw)
