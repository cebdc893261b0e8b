"""Lane-change state machine (openpilot's DesireHelper): carState blinkers and steering torque -> the model's desire.

The desire index is a one-hot position; the runner turns it into a rising-edge pulse. DesireHelper gives the states.
"""
from __future__ import annotations
from typing import Protocol
import numpy as np
from modelrt.constants import DESIRE_LEN, DT

LANE_CHANGE_SPEED_MIN = 20 * 0.44704   # 20 mph in m/s
LANE_CHANGE_TIME_MAX = 10.

# openpilot's Desire enum (the model's desire input and desireState positions)
class Desire:
  none, turnLeft, turnRight, laneChangeLeft, laneChangeRight, keepLeft, keepRight = range(7)


class CarState(Protocol):
  """What the lane-change logic reads of carState (the message's reader, or any object with these fields)."""
  vEgo: float
  leftBlinker: bool
  rightBlinker: bool
  steeringPressed: bool
  steeringTorque: float
  leftBlindspot: bool
  rightBlindspot: bool

class DesireHelper:
  """off -> preLaneChange on a new single blinker above LANE_CHANGE_SPEED_MIN; -> laneChangeStarting when the driver
  nudges the wheel towards the blinker with no car in that blind spot; -> laneChangeFinishing once the model is 98%
  sure the change is done (lane-change desire probability < 0.02) and the lane lines have faded out; then off (or
  preLaneChange if the blinker is still on). Steering off, the blinker released or LANE_CHANGE_TIME_MAX in a change
  cancels it."""
  def __init__(self):
    self.lane_change_state = 'off'
    self.lane_change_direction = 'none'
    self.lane_change_timer = 0.
    self.lane_change_ll_prob = 1.   # lane line weight: fades out while changing, back in when done
    self.prev_one_blinker = False
    self.desire = Desire.none

  def update(self, cs: CarState, lateral_active: bool, lane_change_prob: float) -> None:
    one_blinker = cs.leftBlinker != cs.rightBlinker
    below_speed = not cs.vEgo >= LANE_CHANGE_SPEED_MIN   # NaN speed counts as too slow
    direction = 'left' if cs.leftBlinker else 'right'
    state = self.lane_change_state

    if not lateral_active or self.lane_change_timer > LANE_CHANGE_TIME_MAX:
      state, self.lane_change_direction = 'off', 'none'
    elif state == 'off':
      if one_blinker and not self.prev_one_blinker and not below_speed:
        state, self.lane_change_direction, self.lane_change_ll_prob = 'preLaneChange', direction, 1.
    elif state == 'preLaneChange':
      self.lane_change_direction = direction
      # torque > 0 turns left
      torque_applied = cs.steeringPressed and ((cs.steeringTorque > 0 and direction == 'left') or (cs.steeringTorque < 0 and direction == 'right'))
      blindspot = (cs.leftBlindspot and direction == 'left') or (cs.rightBlindspot and direction == 'right')
      if not one_blinker or below_speed: state, self.lane_change_direction = 'off', 'none'
      elif torque_applied and not blindspot: state = 'laneChangeStarting'
    elif state == 'laneChangeStarting':
      self.lane_change_ll_prob = max(self.lane_change_ll_prob - 2 * DT, 0.)   # fade the lines out over 0.5 s
      if lane_change_prob < 0.02 and self.lane_change_ll_prob < 0.01: state = 'laneChangeFinishing'
    elif state == 'laneChangeFinishing':
      self.lane_change_ll_prob = min(self.lane_change_ll_prob + DT, 1.)       # and back in over 1 s
      if self.lane_change_ll_prob > 0.99:
        self.lane_change_direction = 'none'
        state = 'preLaneChange' if one_blinker else 'off'

    self.lane_change_state = state
    self.lane_change_timer = 0. if state in ('off', 'preLaneChange') else self.lane_change_timer + DT
    self.prev_one_blinker = one_blinker
    changing = state in ('laneChangeStarting', 'laneChangeFinishing')
    self.desire = {'left': Desire.laneChangeLeft, 'right': Desire.laneChangeRight}.get(self.lane_change_direction, Desire.none) if changing else Desire.none

  def vector(self) -> np.ndarray:
    v = np.zeros(DESIRE_LEN, np.float32)
    v[self.desire] = 1
    return v
