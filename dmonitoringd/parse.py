"""Driver monitoring outputs (flat vector cut by output_slices) -> per driver side structured values.

face_descs: 6 means (orientation roll/pitch/yaw 0:3, position x/y 3:5, size 5), then 6 log-stds in the same order.
"""
import numpy as np
from modelrt.constants import DM_SIDE_PROBS
from modelrt.parse import safe_exp, sigmoid

SIDES = ('lhd', 'rhd')

def parse_side(outs: dict[str, np.ndarray], side: str) -> dict[str, np.ndarray | float]:
  d = outs[f'face_descs_{side}'][0]
  std = safe_exp(d[6:12])
  return {'face_orientation': d[0:3], 'face_orientation_std': std[0:3], 'face_position': d[3:5],
          'face_position_std': std[3:5], 'face_size': float(d[5]),
          **{p: float(sigmoid(outs[f'{p}_{side}'][0, 0])) for p in DM_SIDE_PROBS}}

def parse_dm_outputs(outs: dict[str, np.ndarray]) -> dict:
  """{'lhd': side dict, 'rhd': side dict, 'wheel_on_right_prob': float}; side dict: face_orientation (3,),
  face_orientation_std, face_position (2,), face_position_std, face_size, and the probabilities of DM_SIDE_PROBS."""
  return {**{s: parse_side(outs, s) for s in SIDES}, 'wheel_on_right_prob': float(sigmoid(outs['wheel_on_right'][0, 0]))}
