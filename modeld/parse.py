"""Road model outputs (flat vision + policy vectors cut by output_slices) -> structured numpy arrays.

Input: {name: (1, n) float32 array} as the runtime copies them out. Output arrays drop the batch axis.
"""
import numpy as np
from modelrt.constants import (IDX_N, POSE_WIDTH, NUM_LANE_LINES, NUM_ROAD_EDGES, LANE_LINES_WIDTH, LEAD_MHP_N,
                               LEAD_MHP_SELECTION, LEAD_TRAJ_LEN, LEAD_WIDTH, DESIRE_PRED_LEN, DESIRE_LEN, PLAN_MHP_N,
                               PLAN_MHP_SELECTION, PLAN_WIDTH, META_DISENGAGE_TYPES, META_T_IDXS)
from modelrt.parse import parse_mdn, sigmoid, parse_categorical_crossentropy

def _mdn(out: dict, outs: dict, name: str, shape: tuple[int, ...], in_N: int = 0, out_N: int = 0) -> None:
  mu, std = parse_mdn(outs[name], shape, in_N, out_N)
  out[name], out[name + '_std'] = mu[0], std[0]

def parse_vision_outputs(outs: dict[str, np.ndarray]) -> dict[str, np.ndarray | dict]:
  """pose, wide_from_device_euler, road_transform (+_std); lane_lines (4,33,2) y,z + _std; lane_lines_prob (4,);
  road_edges (2,33,2) + _std; lead (3,6,4) x,y,v,a per LEAD_T_IDXS + _std, lead_prob (3,) per LEAD_T_OFFSETS;
  desire_pred (4,8); meta {'engagedProb': float, <META_DISENGAGE_TYPES>: (5,) per META_T_IDXS}; hidden_state (512,)."""
  out: dict = {}
  _mdn(out, outs, 'pose', (POSE_WIDTH,))
  _mdn(out, outs, 'wide_from_device_euler', (3,))
  _mdn(out, outs, 'road_transform', (POSE_WIDTH,))
  _mdn(out, outs, 'lane_lines', (NUM_LANE_LINES, IDX_N, LANE_LINES_WIDTH))
  _mdn(out, outs, 'road_edges', (NUM_ROAD_EDGES, IDX_N, LANE_LINES_WIDTH))
  _mdn(out, outs, 'lead', (LEAD_TRAJ_LEN, LEAD_WIDTH), in_N=LEAD_MHP_N, out_N=LEAD_MHP_SELECTION)
  out['lane_lines_prob'] = sigmoid(outs['lane_lines_prob'][0, 1::2])   # odd entries: "line present" logits
  out['lead_prob'] = sigmoid(outs['lead_prob'][0])
  out['desire_pred'] = parse_categorical_crossentropy(outs['desire_pred'], (DESIRE_PRED_LEN, DESIRE_LEN))[0]
  meta = sigmoid(outs['meta'][0])
  n = len(META_T_IDXS)
  out['meta'] = {'engagedProb': float(meta[0]), **{k: meta[1 + i * n:1 + (i + 1) * n] for i, k in enumerate(META_DISENGAGE_TYPES)}}
  out['hidden_state'] = outs['hidden_state'][0]
  return out

def parse_policy_outputs(outs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """plan (33,15) of the most likely hypothesis + plan_std; desire_state (8,) probabilities."""
  out: dict = {}
  _mdn(out, outs, 'plan', (IDX_N, PLAN_WIDTH), in_N=PLAN_MHP_N, out_N=PLAN_MHP_SELECTION)
  out['desire_state'] = parse_categorical_crossentropy(outs['desire_state'], (DESIRE_LEN,))[0]
  return out

def parse_outputs(outs: dict[str, np.ndarray]) -> dict:
  """Vision and policy outputs together (the names do not overlap)."""
  return {**parse_vision_outputs(outs), **parse_policy_outputs(outs)}
