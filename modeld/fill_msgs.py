"""Parsed road model outputs -> modelV2, drivingModelData and cameraOdometry (REFERENCE §4), plus the action.

Every float written comes from finite numbers: the daemon zeroes non-finite model outputs before parsing (and marks
the frame invalid), and the derived values here (times along the plan, polynomials, action) stay finite for finite
inputs.
"""
from __future__ import annotations
from dataclasses import dataclass, field
import numpy as np
from cereal.messaging import new_message
from modelrt.constants import (T_IDXS, X_IDXS, LEAD_T_IDXS, LEAD_T_OFFSETS, META_T_IDXS, MODEL_RUN_FREQ, PLAN_POSITION, PLAN_VELOCITY,
                               PLAN_ACCELERATION, PLAN_T_FROM_CURRENT_EULER, PLAN_ORIENTATION_RATE)

DT = 1 / MODEL_RUN_FREQ
POLY_PATH_DEGREE = 4
# action: the plan is read at the actuator delay plus the smoothing time constant, as openpilot's modeld does
LAT_SMOOTH_SECONDS, LONG_SMOOTH_SECONDS = 0.1, 0.3
DEFAULT_LAT_DELAY, LONG_DELAY = 0.2, 0.15    # s; liveDelay.lateralDelay replaces the first once it is sane
MIN_LAT_CONTROL_SPEED, MIN_SPEED, STOP_SPEED = 0.3, 1.0, 0.05   # m/s
# confidence: independent disengage probability per 2 s slice, kept over the last 5 slices, scored on the diagonal
DISENGAGE_WIDTH = CONFIDENCE_BUFFER_LEN = len(META_T_IDXS)
RYG_GREEN, RYG_YELLOW = 0.01965, 0.0985
HARD_BRAKE_PROB = 0.15   # brake >= 5 m/s^2 within the first two slices (4 s)

@dataclass
class Action:
  desiredCurvature: float = 0.
  desiredAcceleration: float = 0.
  shouldStop: bool = False

@dataclass
class PublishState:
  """What the messages carry from frame to frame."""
  disengage_buffer: np.ndarray = field(default_factory=lambda: np.zeros(CONFIDENCE_BUFFER_LEN * DISENGAGE_WIDTH, np.float32))
  prev_action: Action = field(default_factory=Action)

@dataclass
class FrameInfo:
  frame_id: int
  frame_id_extra: int
  frame_age: int
  frame_drop_perc: float
  timestamp_eof: int
  execution_time: float
  valid: bool
  lane_change_state: str = 'off'
  lane_change_direction: str = 'none'

def smooth_value(val: float, prev: float, tau: float, dt: float = DT) -> float:
  alpha = 1 - np.exp(-dt / tau) if tau > 0 else 1.
  return alpha * val + (1 - alpha) * prev

def lateral_action_time(lateral_delay: float) -> float:
  """liveDelay.lateralDelay (when in a sane range) plus the smoothing constant."""
  return (lateral_delay if 0. < lateral_delay < 1. else DEFAULT_LAT_DELAY) + LAT_SMOOTH_SECONDS

def get_action(plan: np.ndarray, prev: Action, lat_action_t: float, v_ego: float, long_action_t: float = LONG_DELAY + LONG_SMOOTH_SECONDS) -> Action:
  """plan (33, 15). Acceleration: the one that reaches the plan's speed at long_action_t from now; stop when the plan
  is below STOP_SPEED then and 1 s later. Curvature: from the plan's yaw at lat_action_t and its yaw rate now
  (2*yaw/(v*t) - yaw_rate/v), held at its previous value below MIN_LAT_CONTROL_SPEED."""
  v, a = plan[:, PLAN_VELOCITY][:, 0], plan[:, PLAN_ACCELERATION][:, 0]
  v_target = np.interp(long_action_t, T_IDXS, v)
  accel = 2 * (v_target - v[0]) / long_action_t - a[0]
  should_stop = bool(v_target < STOP_SPEED and np.interp(long_action_t + 1., T_IDXS, v) < STOP_SPEED)
  accel = smooth_value(accel, prev.desiredAcceleration, LONG_SMOOTH_SECONDS)

  yaw = np.interp(lat_action_t, T_IDXS, plan[:, PLAN_T_FROM_CURRENT_EULER][:, 2])
  yaw_rate = plan[0, PLAN_ORIENTATION_RATE][2]
  v_clip = max(v_ego, MIN_SPEED)
  curvature = 2 * yaw / (v_clip * lat_action_t) - yaw_rate / v_clip
  curvature = smooth_value(curvature, prev.desiredCurvature, LAT_SMOOTH_SECONDS) if v_ego > MIN_LAT_CONTROL_SPEED else prev.desiredCurvature
  return Action(float(curvature), float(accel), should_stop)

def plan_t_at_x(plan: np.ndarray) -> np.ndarray:
  """When the plan reaches each X_IDXS distance (lane lines are on X_IDXS; their t is this). Past the plan's end: its
  last time. The plan's x is made non-decreasing first, so a jittery plan still gives an ordered, finite grid."""
  return np.interp(X_IDXS, np.maximum.accumulate(plan[:, PLAN_POSITION][:, 0]), T_IDXS).astype(np.float32)

def _fill_xyzt(b, t, x, y, z, x_std=None, y_std=None, z_std=None) -> None:
  b.t, b.x, b.y, b.z = (np.asarray(v, np.float32).tolist() for v in (t, x, y, z))
  if x_std is not None: b.xStd, b.yStd, b.zStd = (np.asarray(v, np.float32).tolist() for v in (x_std, y_std, z_std))

def _fill_lead(b, lead: np.ndarray, std: np.ndarray, prob: float, prob_time: float) -> None:
  b.t = LEAD_T_IDXS
  b.x, b.y, b.v, b.a = (lead[:, i].tolist() for i in range(4))
  b.xStd, b.yStd, b.vStd, b.aStd = (std[:, i].tolist() for i in range(4))
  b.prob, b.probTime = float(prob), prob_time

def update_confidence(state: PublishState, meta: dict, frame_id: int) -> str:
  """openpilot's red/yellow/green: every 2 s, the chance of any disengagement in each 2 s slice is pushed into a
  rolling buffer; the score averages, for each slice of the last 10 s, the prediction made when it was that far out."""
  if frame_id % (2 * MODEL_RUN_FREQ) == 0:
    any_dis = 1 - (1 - meta['brakeDisengageProbs']) * (1 - meta['gasDisengageProbs']) * (1 - meta['steerOverrideProbs'])
    ind = np.r_[any_dis[0], np.diff(any_dis) / np.maximum(1 - any_dis[:-1], 1e-6)]
    buf = state.disengage_buffer
    buf[:-DISENGAGE_WIDTH] = buf[DISENGAGE_WIDTH:]
    buf[-DISENGAGE_WIDTH:] = ind
  score = sum(state.disengage_buffer[i * DISENGAGE_WIDTH + DISENGAGE_WIDTH - 1 - i] for i in range(DISENGAGE_WIDTH)) / DISENGAGE_WIDTH
  return 'green' if score < RYG_GREEN else 'yellow' if score < RYG_YELLOW else 'red'

def fill_model_msgs(out: dict, info: FrameInfo, action: Action, state: PublishState, raw: np.ndarray | None = None):
  """out: modeld.parse.parse_outputs(...). Returns (modelV2, drivingModelData, cameraOdometry) Event builders.
  cameraOdometry is valid only when the frame is (it is never sent for a frame after a drop)."""
  plan, plan_std = out['plan'], out['plan_std']
  mv2_msg, dmd_msg, odo_msg = new_message('modelV2'), new_message('drivingModelData'), new_message('cameraOdometry')
  for m in (mv2_msg, dmd_msg, odo_msg): m.valid = info.valid
  mv2, dmd, odo = mv2_msg.modelV2, dmd_msg.drivingModelData, odo_msg.cameraOdometry

  for b in (mv2, dmd):
    b.frameId, b.frameIdExtra, b.frameDropPerc, b.modelExecutionTime = info.frame_id, info.frame_id_extra, info.frame_drop_perc, info.execution_time
    b.action.desiredCurvature, b.action.desiredAcceleration, b.action.shouldStop = action.desiredCurvature, action.desiredAcceleration, action.shouldStop
    b.meta.laneChangeState, b.meta.laneChangeDirection = info.lane_change_state, info.lane_change_direction
  mv2.frameAge, mv2.timestampEof = info.frame_age, info.timestamp_eof
  if raw is not None: mv2.rawPredictions = np.asarray(raw, np.float32).tobytes()

  for name, cols, std in (('position', PLAN_POSITION, True), ('velocity', PLAN_VELOCITY, True), ('acceleration', PLAN_ACCELERATION, True),
                          ('orientation', PLAN_T_FROM_CURRENT_EULER, True), ('orientationRate', PLAN_ORIENTATION_RATE, True)):
    _fill_xyzt(getattr(mv2, name), T_IDXS, *plan[:, cols].T, *(plan_std[:, cols].T if std else ()))
  coeffs = np.polyfit(T_IDXS, plan[:, PLAN_POSITION], POLY_PATH_DEGREE)   # (degree+1, 3), highest power first
  dmd.path.xCoefficients, dmd.path.yCoefficients, dmd.path.zCoefficients = (coeffs[:, i].astype(np.float32).tolist() for i in range(3))

  t_at_x = plan_t_at_x(plan)
  lines = mv2.init('laneLines', len(out['lane_lines']))
  for b, ll in zip(lines, out['lane_lines']): _fill_xyzt(b, t_at_x, X_IDXS, ll[:, 0], ll[:, 1])
  mv2.laneLineStds = out['lane_lines_std'][:, 0, 0].tolist()
  mv2.laneLineProbs = out['lane_lines_prob'].tolist()
  edges = mv2.init('roadEdges', len(out['road_edges']))
  for b, re in zip(edges, out['road_edges']): _fill_xyzt(b, t_at_x, X_IDXS, re[:, 0], re[:, 1])
  mv2.roadEdgeStds = out['road_edges_std'][:, 0, 0].tolist()
  llm = dmd.laneLineMeta
  llm.leftY, llm.rightY = float(out['lane_lines'][1, 0, 0]), float(out['lane_lines'][2, 0, 0])
  llm.leftProb, llm.rightProb = float(out['lane_lines_prob'][1]), float(out['lane_lines_prob'][2])

  leads = mv2.init('leadsV3', len(LEAD_T_OFFSETS))
  for i, b in enumerate(leads): _fill_lead(b, out['lead'][i], out['lead_std'][i], out['lead_prob'][i], LEAD_T_OFFSETS[i])

  meta, m = mv2.meta, out['meta']
  meta.engagedProb = m['engagedProb']
  meta.desireState = out['desire_state'].tolist()
  meta.desirePrediction = out['desire_pred'].reshape(-1).tolist()
  dp = meta.init('disengagePredictions')
  dp.t = META_T_IDXS
  for k, v in m.items():
    if k != 'engagedProb': setattr(dp, k, v.tolist())
  meta.hardBrakePredicted = bool(m['brake5MetersPerSecondSquaredProbs'][:2].max() > HARD_BRAKE_PROB)
  mv2.confidence = update_confidence(state, m, info.frame_id)

  pose = out['pose'][:3].tolist(), out['pose'][3:].tolist(), out['pose_std'][:3].tolist(), out['pose_std'][3:].tolist()
  tp = mv2.temporalPose
  tp.trans, tp.rot, tp.transStd, tp.rotStd = pose
  odo.frameId, odo.timestampEof = info.frame_id, info.timestamp_eof
  odo.trans, odo.rot, odo.transStd, odo.rotStd = pose
  odo.wideFromDeviceEuler, odo.wideFromDeviceEulerStd = out['wide_from_device_euler'].tolist(), out['wide_from_device_euler_std'].tolist()
  odo.roadTransformTrans, odo.roadTransformTransStd = out['road_transform'][:3].tolist(), out['road_transform_std'][:3].tolist()
  return mv2_msg, dmd_msg, odo_msg
