import numpy as np
import pytest
from modelrt.constants import (VISION_OUTPUT_SIZES, POLICY_OUTPUT_SIZES, DM_OUTPUT_SIZES, DM_SIDE_PROBS, META_DISENGAGE_TYPES,
                               IDX_N, PLAN_WIDTH, PLAN_MHP_N, LEAD_MHP_N, LEAD_MHP_SELECTION, LEAD_TRAJ_LEN, LEAD_WIDTH, slices_from_sizes)
from modelrt.parse import safe_exp, sigmoid, softmax, parse_mdn, parse_binary_crossentropy, parse_categorical_crossentropy
from modeld.parse import parse_vision_outputs, parse_policy_outputs, parse_outputs
from dmonitoringd.parse import parse_dm_outputs

def cut(vec: np.ndarray, sizes: dict) -> dict: return {k: vec[None, s] for k, s in slices_from_sizes(sizes).items()}

def test_primitives_stay_finite():
  x = np.array([-1e30, -1e4, -50, 0, 50, 1e4, 1e30], np.float32)
  with np.errstate(over='raise', invalid='raise', divide='raise'):   # underflow to 0 is fine
    assert safe_exp(x)[-1] == pytest.approx(np.exp(11)) and safe_exp(np.float32(0)) == 1
    s = sigmoid(x)
    p = softmax(np.stack([x, x[::-1]]), axis=0)
  np.testing.assert_allclose(s, [0, 0, 0, 0.5, 1, 1, 1], atol=1e-12)
  assert np.isfinite(p).all() and np.allclose(p.sum(0), 1)
  np.testing.assert_allclose(parse_binary_crossentropy(np.float32([0.3])), 1 / (1 + np.exp(-0.3)), rtol=1e-6)
  q = parse_categorical_crossentropy(np.arange(8, dtype=np.float32)[None], (2, 4))
  assert q.shape == (1, 2, 4) and np.allclose(q.sum(-1), 1) and q[0, 0, 3] == pytest.approx(q[0, 1, 3])

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

@pytest.mark.parametrize("in_N,out_N,shape", [(PLAN_MHP_N, 1, (IDX_N, PLAN_WIDTH)), (LEAD_MHP_N, LEAD_MHP_SELECTION, (LEAD_TRAJ_LEN, LEAD_WIDTH))])
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

def test_road_outputs_layout():
  n_v, n_p = sum(VISION_OUTPUT_SIZES.values()), sum(POLICY_OUTPUT_SIZES.values())
  v, p = np.zeros(n_v, np.float32), np.zeros(n_p, np.float32)
  sv, sp = slices_from_sizes(VISION_OUTPUT_SIZES), slices_from_sizes(POLICY_OUTPUT_SIZES)
  # lane line probabilities: the odd ("present") entries; line 2 present, others absent
  v[sv['lane_lines_prob']] = [5, -5, -5, -5, -5, 5, 5, -5]
  # lane lines: means first (4, 33, 2), then log-stds
  ll = np.arange(4 * IDX_N * 2, dtype=np.float32)
  v[sv['lane_lines']] = np.concatenate([ll, np.full_like(ll, np.log(0.5))])
  # lead: hypothesis 1 wins selection 0 and 2, hypothesis 0 selection 1
  lead = np.zeros((LEAD_MHP_N, 2 * LEAD_TRAJ_LEN * LEAD_WIDTH + LEAD_MHP_SELECTION), np.float32)
  lead[0, :24], lead[1, :24] = 10, 20
  lead[1, -3:], lead[0, -3:] = [3, -3, 3], [0, 0, 0]
  v[sv['lead']] = lead.ravel()
  v[sv['meta']][0] = 10
  # plan: hypothesis 3 most likely
  plan = np.zeros((PLAN_MHP_N, 2 * IDX_N * PLAN_WIDTH + 1), np.float32)
  plan[:, :IDX_N * PLAN_WIDTH] = np.arange(PLAN_MHP_N)[:, None]
  plan[3, -1] = 4
  p[sp['plan']] = plan.ravel()
  p[sp['desire_state']][2] = 10
  out = parse_outputs({**cut(v, VISION_OUTPUT_SIZES), **cut(p, POLICY_OUTPUT_SIZES)})
  np.testing.assert_allclose(out['lane_lines_prob'], sigmoid(np.float32([-5, -5, 5, -5])))
  np.testing.assert_array_equal(out['lane_lines'], ll.reshape(4, IDX_N, 2))
  np.testing.assert_allclose(out['lane_lines_std'], 0.5, rtol=1e-6)
  assert out['lead'].shape == (3, LEAD_TRAJ_LEN, LEAD_WIDTH) and out['lead_prob'].shape == (3,)
  np.testing.assert_array_equal(out['lead'][:, 0, 0], [20, 10, 20])
  assert out['meta']['engagedProb'] > 0.99 and set(out['meta']) == {'engagedProb', *META_DISENGAGE_TYPES}
  assert all(out['meta'][k].shape == (5,) for k in META_DISENGAGE_TYPES)
  assert out['plan'].shape == (IDX_N, PLAN_WIDTH) and (out['plan'] == 3).all()
  assert out['desire_state'].argmax() == 2 and out['desire_state'].sum() == pytest.approx(1)
  assert out['desire_pred'].shape == (4, 8) and np.allclose(out['desire_pred'].sum(-1), 1)
  assert out['hidden_state'].shape == (512,)
  for k in ('pose', 'road_transform'): assert out[k].shape == out[k + '_std'].shape == (6,)
  assert out['wide_from_device_euler'].shape == (3,)
  assert set(parse_vision_outputs(cut(v, VISION_OUTPUT_SIZES))) | set(parse_policy_outputs(cut(p, POLICY_OUTPUT_SIZES))) == set(out)

def test_dm_outputs_layout():
  d = np.zeros(sum(DM_OUTPUT_SIZES.values()), np.float32)
  s = slices_from_sizes(DM_OUTPUT_SIZES)
  d[s['face_descs_rhd']] = [0.1, 0.2, 0.3, -0.2, 0.1, 0.5, *np.log([1, 2, 3, 4, 5, 6])]
  d[s['using_phone_prob_rhd']] = 8
  d[s['wheel_on_right']] = 3
  out = parse_dm_outputs(cut(d, DM_OUTPUT_SIZES))
  r = out['rhd']
  np.testing.assert_allclose(r['face_orientation'], [0.1, 0.2, 0.3])
  np.testing.assert_allclose(r['face_position'], [-0.2, 0.1])
  np.testing.assert_allclose(r['face_orientation_std'], [1, 2, 3], rtol=1e-6)
  np.testing.assert_allclose(r['face_position_std'], [4, 5], rtol=1e-6)
  assert r['using_phone_prob'] > 0.99 and out['lhd']['using_phone_prob'] == 0.5
  assert out['wheel_on_right_prob'] == pytest.approx(1 / (1 + np.exp(-3)))
  assert set(r) >= set(DM_SIDE_PROBS)

@pytest.mark.parametrize("scale", [1.0, 1e4, 1e30])
def test_no_nan_from_finite(scale):
  rng = np.random.default_rng(1)
  def rand(sizes): return cut((rng.standard_normal(sum(sizes.values())) * scale).astype(np.float32), sizes)
  with np.errstate(over='raise', invalid='raise', divide='raise'):
    road = parse_outputs({**rand(VISION_OUTPUT_SIZES), **rand(POLICY_OUTPUT_SIZES)})
    dm = parse_dm_outputs(rand(DM_OUTPUT_SIZES))
  def leaves(x):
    if isinstance(x, dict):
      for v in x.values(): yield from leaves(v)
    else: yield np.asarray(x, dtype=np.float64)
  assert all(np.isfinite(a).all() for a in [*leaves(road), *leaves(dm)])
