import numpy as np
import pytest
from modelrt.contracts import ROAD_V0_11_1, DM_V0_11_1
from tests.onnx_models import RELEASE_DM_SLICES
from modelrt.parse import safe_exp, sigmoid, softmax, parse_mdn, parse_binary_crossentropy, parse_categorical_crossentropy
from modeld.parse import parse_outputs
from dmonitoringd.parse import parse_dm_outputs

def cut(vec: np.ndarray, model) -> dict: return {k: vec[None, s] for k, s in model.slices().items()}

def test_primitives_stay_finite():
  x = np.array([-1e30, -1e4, -50, 0, 50, 1e4, 1e30], np.float32)
  with np.errstate(over='raise', invalid='raise', divide='raise'):   # underflow to 0 is fine
    assert safe_exp(x)[-1] == pytest.approx(np.exp(11)) and safe_exp(np.float32(0)) == 1
    s = sigmoid(x)
    p = softmax(np.stack([x, x[::-1]]), axis=0)
  floor = 1 / (1 + np.exp(11))
  np.testing.assert_allclose(s, [floor, floor, floor, 0.5, 1, 1, 1], rtol=1e-6, atol=1e-12)
  assert np.isfinite(p).all() and np.allclose(p.sum(0), 1)
  np.testing.assert_allclose(parse_binary_crossentropy(np.float32([0.3])), 1 / (1 + np.exp(-0.3)), rtol=1e-6)
  q = parse_categorical_crossentropy(np.arange(8, dtype=np.float32)[None], (2, 4))
  assert q.shape == (1, 2, 4) and np.allclose(q.sum(-1), 1) and q[0, 0, 3] == pytest.approx(q[0, 1, 3])

def test_sigmoid_is_openpilots():
  """1 / (1 + exp(min(-x, 11))): a logit below -11 gives 1/(1+e^11) ~ 1.67e-5, not the exact sigmoid (2e-9 at -20)."""
  x = np.float32([-1e4, -20, -11, -5, 0, 5, 20, 1e4])
  want = 1 / (1 + np.exp(np.minimum(-x.astype(np.float64), 11)))
  got = sigmoid(x)
  assert got.dtype == np.float32
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
  assert got[1] == pytest.approx(1.67e-5, rel=1e-2) and got[0] == got[1] == got[2] and got[-1] == 1
  assert sigmoid(np.float64(-20)) == np.float32(1 / (1 + np.exp(11)))   # float32 out whatever comes in

def openpilot_mdn(raw, in_N, out_N, out_shape):
  """openpilot's loop-and-argsort formulation, to check the vectorised one against."""
  raw = raw.reshape(raw.shape[0], max(in_N, 1), -1)
  n = (raw.shape[2] - out_N) // 2
  mu, std = raw[:, :, :n], np.exp(np.minimum(raw[:, :, n:2 * n], 11))
  w = np.zeros((raw.shape[0], in_N, out_N))
  for i in range(out_N): w[:, :, i - out_N] = softmax(raw[:, :, i - out_N], axis=-1)
  mf, sf = np.zeros((raw.shape[0], out_N, n)), np.zeros((raw.shape[0], out_N, n))
  for b in range(raw.shape[0]):
    for h in range(out_N):
      best = np.argsort(w[b, :, h])[::-1][0]
      mf[b, h], sf[b, h] = mu[b, best], std[b, best]
  shape = (raw.shape[0], *out_shape) if out_N == 1 else (raw.shape[0], out_N, *out_shape)
  return mf.reshape(shape), sf.reshape(shape)

# the multi-hypothesis heads of earlier releases: plan 5 hypotheses, lead 2 hypotheses for 3 selections
@pytest.mark.parametrize("in_N,out_N,shape", [(5, 1, (33, 15)), (2, 3, (6, 4))])
def test_parse_mdn_hypotheses(in_N, out_N, shape):
  rng = np.random.default_rng(0)
  raw = rng.normal(size=(3, in_N * (2 * int(np.prod(shape)) + out_N))).astype(np.float32) * 5
  mu, std = parse_mdn(raw, shape, in_N, out_N)
  want_mu, want_std = openpilot_mdn(raw, in_N, out_N, shape)
  np.testing.assert_array_equal(mu, want_mu)
  np.testing.assert_allclose(std, want_std, rtol=1e-6)

def test_parse_mdn_plain():
  raw = np.concatenate([np.arange(6), np.log(np.arange(1, 7))]).astype(np.float32)[None]
  mu, std = parse_mdn(raw, (2, 3))
  np.testing.assert_array_equal(mu[0], [[0, 1, 2], [3, 4, 5]])
  np.testing.assert_allclose(std[0], [[1, 2, 3], [4, 5, 6]], rtol=1e-6)

def test_road_outputs_v0_11_1():
  v, p = np.zeros(ROAD_V0_11_1.vision.built_width, np.float32), np.zeros(ROAD_V0_11_1.policy.built_width, np.float32)
  sv, sp = ROAD_V0_11_1.vision.slices(), ROAD_V0_11_1.policy.slices()
  assert (v.size, p.size, sv['lead'], sv['meta'], sp['plan']) == (1576, 1000, slice(917, 1061), slice(0, 55), slice(0, 990))
  v[sv['lane_lines_prob']] = [5, -5, -5, -5, -5, 5, 5, -5]   # per line (absent, present)
  ll = np.arange(4 * 33 * 2, dtype=np.float32)
  v[sv['lane_lines']] = np.concatenate([ll, np.full_like(ll, np.log(0.5))])   # means (4, 33, 2), then log-stds
  lead = np.arange(3 * 6 * 4, dtype=np.float32)
  v[sv['lead']] = np.concatenate([lead, np.log(lead + 1)])   # one trajectory per LEAD_T_OFFSETS, no hypotheses
  v[sv['meta']] = np.arange(55) - 27.                        # logit of entry k: k - 27
  p[sp['plan']] = np.concatenate([np.arange(33 * 15), np.zeros(33 * 15)])
  p[sp['desire_state']][2] = 10
  out = parse_outputs({**cut(v, ROAD_V0_11_1.vision), **cut(p, ROAD_V0_11_1.policy)}, ROAD_V0_11_1)
  np.testing.assert_allclose(out['lane_lines_prob'][1::2], sigmoid(np.float32([-5, -5, 5, -5])))
  np.testing.assert_array_equal(out['lane_lines'], ll.reshape(4, 33, 2))
  np.testing.assert_allclose(out['lane_lines_std'], 0.5, rtol=1e-6)
  np.testing.assert_array_equal(out['lead'], lead.reshape(3, 6, 4))
  np.testing.assert_allclose(out['lead_std'], (lead + 1).reshape(3, 6, 4), rtol=1e-5)
  # meta interleaved: engaged 0; from 1, six predictions per 2 s step (2..10 s); from 31, four per step (0..10 s)
  m, logit = out['meta'], lambda *k: sigmoid(np.float32(k) - 27)
  np.testing.assert_allclose(m['engagedProb'], logit(0))
  np.testing.assert_allclose(m['gasDisengageProbs'], logit(1, 7, 13, 19, 25))
  np.testing.assert_allclose(m['brake5MetersPerSecondSquaredProbs'], logit(6, 12, 18, 24, 30))
  np.testing.assert_allclose(m['gasPressProbs'], logit(31, 35, 39, 43, 47, 51))
  np.testing.assert_allclose(m['rightBlinkerProbs'], logit(34, 38, 42, 46, 50, 54))
  np.testing.assert_array_equal(out['plan'], np.arange(33 * 15).reshape(33, 15))
  np.testing.assert_array_equal(out['plan_std'], 1)
  assert out['desire_state'].argmax() == 2 and out['desire_state'].sum() == pytest.approx(1)
  assert out['desire_pred'].shape == (4, 8) and np.allclose(out['desire_pred'].sum(-1), 1)
  assert out['hidden_state'].shape == (512,)
  for k in ('pose', 'road_transform'): assert out[k].shape == out[k + '_std'].shape == (6,)
  assert out['wide_from_device_euler'].shape == (3,)

def test_dm_default_slices_are_the_releases():
  """The v0.11.1 contract lays the driver model's heads out as the release's metadata does: sunglasses before the
  blinks, the features named at 41:553 (a real file's own metadata is read by name either way)."""
  assert DM_V0_11_1.dm.slices() == RELEASE_DM_SLICES and DM_V0_11_1.dm.built_width == 553

def test_dm_outputs_both_sides():
  d = np.zeros(DM_V0_11_1.dm.built_width, np.float32)
  s = DM_V0_11_1.dm.slices()
  d[s['face_descs_rhd']] = [0.1, 0.2, 0.3, -0.2, 0.1, 0.5, *np.log([1, 2, 3, 4, 5, 6])]
  d[s['using_phone_prob_rhd']] = 8
  d[s['sleep_prob_lhd']] = -8
  d[s['wheel_on_right']] = 3
  out = parse_dm_outputs(cut(d, DM_V0_11_1.dm), DM_V0_11_1)
  r = out['rhd']
  np.testing.assert_allclose(r['face_orientation'], [0.1, 0.2, 0.3])
  np.testing.assert_allclose(r['face_position'], [-0.2, 0.1])
  np.testing.assert_allclose(r['face_orientation_std'], [1, 2, 3], rtol=1e-6)
  np.testing.assert_allclose(r['face_position_std'], [4, 5], rtol=1e-6)
  assert r['using_phone_prob'] > 0.99 and out['lhd']['using_phone_prob'] == 0.5 and out['lhd']['sleep_prob'] < 0.001
  assert out['wheel_on_right_prob'] == pytest.approx(1 / (1 + np.exp(-3)))
  assert set(r) == {'face_orientation', 'face_orientation_std', 'face_position', 'face_position_std', *DM_V0_11_1.side_probs}

@pytest.mark.parametrize("scale", [1.0, 1e4, 1e30])
def test_no_nan_from_finite(scale):
  rng = np.random.default_rng(1)
  def rand(model): return cut((rng.standard_normal(model.built_width) * scale).astype(np.float32), model)
  with np.errstate(over='raise', invalid='raise', divide='raise'):
    road = parse_outputs({**rand(ROAD_V0_11_1.vision), **rand(ROAD_V0_11_1.policy)}, ROAD_V0_11_1)
    dm = parse_dm_outputs(rand(DM_V0_11_1.dm), DM_V0_11_1)
  def leaves(x):
    if isinstance(x, dict):
      for v in x.values(): yield from leaves(v)
    else: yield np.asarray(x, dtype=np.float64)
  assert all(np.isfinite(a).all() for a in [*leaves(road), *leaves(dm)])
