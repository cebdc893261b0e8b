"""Road model outputs (flat vision + policy vectors cut by output_slices) -> structured numpy arrays, by the contract.

Input: {name: (1, n) float32 array} as the runtime copies them out. Output arrays drop the batch axis.
"""
import numpy as np
from modelrt.contracts import RoadContract
from modelrt.parse import parse_heads

def parse_outputs(outs: dict[str, np.ndarray], contract: RoadContract) -> dict:
  """Every head of the vision and policy models (their names do not overlap): MDN heads as NAME and NAME_std (lane_lines
  (4,33,2), road_edges (2,33,2), lead (3,6,4), plan (33,15), pose ...), probabilities (lane_lines_prob (8,), lead_prob,
  desire_pred (4,8), desire_state (8,)), hidden_state; and meta as {prediction: probabilities} by the contract's map."""
  out = {**parse_heads(outs, contract.vision), **parse_heads(outs, contract.policy)}
  out['meta'] = {k: out['meta'][s] for k, s in contract.meta.items()}
  return out
