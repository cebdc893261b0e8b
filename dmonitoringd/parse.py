"""Driver monitoring outputs (flat vector cut by output_slices) -> per driver side structured values, by the contract.

Per side (the contract's suffixes: lhd, the driver on the left; rhd, on the right) face_descs is an MDN head of 6
means (orientation pitch, yaw, roll; position x, y; size) and their stds; the rest are sigmoid probabilities.
"""
import numpy as np
from modelrt.contracts import DMContract
from modelrt.parse import parse_heads

def parse_dm_outputs(outs: dict[str, np.ndarray], contract: DMContract) -> dict:
  """{side: {face_orientation (3,), face_orientation_std, face_position (2,), face_position_std, <side_probs>: float}
  for each side, 'wheel_on_right_prob': float}."""
  h = parse_heads(outs, contract.dm)
  def side(s: str) -> dict:
    mu, std = h[f'face_descs_{s}'], h[f'face_descs_{s}_std']
    return {**{k: mu[sl] for k, sl in contract.face_descs.items()}, **{f'{k}_std': std[sl] for k, sl in contract.face_descs.items()},
            **{p: float(h[f'{p}_{s}'][0]) for p in contract.side_probs}}
  return {**{s: side(s) for s in contract.sides}, 'wheel_on_right_prob': float(h['wheel_on_right'][0])}
