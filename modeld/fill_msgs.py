"""Parsed road model outputs -> modelV2, drivingModelData and cameraOdometry, filled as openpilot fills them for the
artifact's contract, plus the action read off the plan.

What openpilot v0.11.1 leaves empty stays empty, and a frame whose values no Float32 field holds is published invalid
(fits_float32); docs/REFERENCE_MODELS.md lists both."""
from __future__ import annotations
from dataclasses import dataclass, field
import capnp
import numpy as np
from cereal.messaging import new_message
from modelrt.constants import T_IDXS, X_IDXS, LEAD_T_IDXS, LEAD_T_OFFSETS, META_T_IDXS, MODEL_RUN_FREQ, DT
from modelrt.contracts import RoadContract

POLY_PATH_DEGREE = 4
# action: the plan is read at the actuator delay plus the smoothing time constant plus ACTION_T_OFFSET from now (no
# earlier than MIN_STABLE_DELAY: a shorter time scales the change up to it down); no lateral smoothing in this release
ACTION_T_OFFSET, MIN_STABLE_DELAY = 0.075, 0.3            # s
LAT_SMOOTH_SECONDS, LONG_SMOOTH_SECONDS = 0.0, 0.3        # s
LONG_ACTUATOR_DELAY = 0.15   # s: openpilot reads CarParams.longitudinalActuatorDelay, which this stack has not; a typical car's
MAX_LAT_DELAY = 1.0          # s: liveDelay.lateralDelay is clipped to [0, this] (garbage must not reach the messages)
MIN_LAT_CONTROL_SPEED, MIN_SPEED = 0.3, 1.0               # m/s: curvature held below the first; speeds below the second count as it
STOP_SPEED, STOP_ACCEL = 0.3, 0.1                         # shouldStop: the plan's speed now and the wanted acceleration below these
# modelV2.meta.disengagePredictions fields, filled from the contract's meta predictions of the same name
DISENGAGE_FIELDS = ('brakeDisengageProbs', 'gasDisengageProbs', 'steerOverrideProbs', 'brake3MetersPerSecondSquaredProbs',
                    'brake4MetersPerSecondSquaredProbs', 'brake5MetersPerSecondSquaredProbs', 'gasPressProbs', 'brakePressProbs')
# confidence: each push (every 2 s) holds the independent disengage probability of each 2 s step ahead
DISENGAGE_WIDTH = len(META_T_IDXS)   # steps per push
CONFIDENCE_BUFFER_LEN = 5            # pushes kept: the last 10 s
FLOAT32_MAX = float(np.finfo(np.float32).max)

@dataclass
class Action:
  desiredCurvature: float = 0.
  desiredAcceleration: float = 0.
  shouldStop: bool = False

@dataclass
class PublishState:
  """What the messages carry from frame to frame."""
  disengage_buffer: np.ndarray = field(default_factory=lambda: np.zeros(CONFIDENCE_BUFFER_LEN * DISENGAGE_WIDTH, np.float32))
  hard_brake: dict[str, np.ndarray] = field(default_factory=dict)   # meta prediction -> its first value over the last frames, oldest first
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

def fits_float32(*values: float | np.ndarray) -> bool:
  """Whether every value is finite and within a Float32 message field's range (a larger one would be written as inf).
  The derived values are computed in float64 from finite model outputs (the daemon zeroes the others and marks the
  frame invalid), yet the action and the path polynomial can exceed Float32 on a plan near float32's own limit: modeld
  then publishes the frame invalid, with the previous action and a zero path, and does not feed it back."""
  return all(bool((np.abs(np.asarray(v, np.float64)) <= FLOAT32_MAX).all()) for v in values)

def smooth_value(val: float, prev: float, tau: float) -> float:
  """One step (DT) of a first-order filter with time constant tau; tau 0: val."""
  alpha = 1 - np.exp(-DT / tau) if tau > 0 else 1.
  return alpha * val + (1 - alpha) * prev

def action_times(lateral_delay: float) -> tuple[float, float]:
  """(lateral, longitudinal) action times from liveDelay.lateralDelay and LONG_ACTUATOR_DELAY."""
  lat = float(np.clip(np.nan_to_num(lateral_delay), 0., MAX_LAT_DELAY))
  return lat + LAT_SMOOTH_SECONDS + ACTION_T_OFFSET, LONG_ACTUATOR_DELAY + LONG_SMOOTH_SECONDS + ACTION_T_OFFSET

def _at(t: float, ys: np.ndarray, y0: float) -> float:
  """The plan's value at t; before MIN_STABLE_DELAY the change up to it, scaled by t / MIN_STABLE_DELAY."""
  return float(np.interp(t, T_IDXS, ys)) if t >= MIN_STABLE_DELAY else y0 + t / MIN_STABLE_DELAY * (float(np.interp(MIN_STABLE_DELAY, T_IDXS, ys)) - y0)

def get_action(plan: np.ndarray, prev: Action, lat_action_t: float, long_action_t: float, v_ego: float, cols: dict[str, slice]) -> Action:
  """plan (33, 15), cols: the contract's plan columns. Acceleration: the one that reaches the plan's speed at
  long_action_t (2 (v(t) - v0) / t - a0), smoothed; stop when the plan's speed now is below STOP_SPEED and that
  acceleration below STOP_ACCEL. Curvature: from the plan's yaw at lat_action_t and its yaw rate now
  (2 yaw / (v t) - yaw_rate / v, v >= MIN_SPEED), held at its previous value at MIN_LAT_CONTROL_SPEED or below.
  In float64: float32 plan values near their limit would overflow (fits_float32 tells whether the result fits the
  messages)."""
  plan = np.asarray(plan, np.float64)
  v, a = plan[:, cols['velocity']][:, 0], plan[:, cols['acceleration']][:, 0]
  accel = 2 * (_at(long_action_t, v, v[0]) - v[0]) / long_action_t - a[0]
  should_stop = bool(v[0] < STOP_SPEED and accel < STOP_ACCEL)
  accel = smooth_value(accel, prev.desiredAcceleration, LONG_SMOOTH_SECONDS)
  v_clip = max(v_ego, MIN_SPEED)
  yaw, yaw_rate = plan[:, cols['orientation']][:, 2], plan[0, cols['orientationRate']][2]
  curvature = 2 * _at(lat_action_t, yaw, 0.) / (v_clip * lat_action_t) - yaw_rate / v_clip
  curvature = smooth_value(curvature, prev.desiredCurvature, LAT_SMOOTH_SECONDS) if v_ego > MIN_LAT_CONTROL_SPEED else prev.desiredCurvature
  return Action(float(curvature), float(accel), should_stop)

def path_coefficients(plan: np.ndarray, cols: slice) -> np.ndarray:
  """The plan's position (its `cols`) fitted over T_IDXS by a degree POLY_PATH_DEGREE polynomial: (degree + 1, 3),
  lowest power first. In float64: a float32 fit of plan values near their limit overflows."""
  return np.polynomial.polynomial.polyfit(T_IDXS.astype(np.float64), np.asarray(plan[:, cols], np.float64), POLY_PATH_DEGREE)

def _fill_xyzt(b, t, x, y, z, x_std=None, y_std=None, z_std=None) -> None:
  b.t, b.x, b.y, b.z = (np.asarray(v, np.float32).tolist() for v in (t, x, y, z))
  if x_std is not None: b.xStd, b.yStd, b.zStd = (np.asarray(v, np.float32).tolist() for v in (x_std, y_std, z_std))

def _fill_lead(b, lead: np.ndarray, std: np.ndarray, prob: float, prob_time: float) -> None:
  b.t = LEAD_T_IDXS
  b.x, b.y, b.v, b.a = (lead[:, i].tolist() for i in range(4))
  b.xStd, b.yStd, b.vStd, b.aStd = (std[:, i].tolist() for i in range(4))
  b.prob, b.probTime = float(prob), prob_time

def hard_brake_predicted(state: PublishState, meta: dict, thresholds: dict[str, tuple[float, ...]]) -> bool:
  """Each prediction's first value kept over the last len(thresholds) frames; true when every kept value of every
  prediction is above its threshold."""
  for k, th in thresholds.items():
    q = state.hard_brake.setdefault(k, np.zeros(len(th), np.float32))
    q[:-1], q[-1] = q[1:], meta[k][0]
  return all(bool((state.hard_brake[k] > np.array(th, np.float32)).all()) for k, th in thresholds.items())

def update_confidence(state: PublishState, meta: dict, frame_id: int, thresholds: tuple[float, float]) -> str:
  """openpilot's red/yellow/green: every 2 s, the chance of any disengagement in each 2 s step is pushed into a
  rolling buffer; the score averages, for each step of the last 10 s, the prediction made when it was that far out."""
  if frame_id % (2 * MODEL_RUN_FREQ) == 0:
    any_dis = 1 - (1 - meta['brakeDisengageProbs']) * (1 - meta['gasDisengageProbs']) * (1 - meta['steerOverrideProbs'])
    ind = np.r_[any_dis[0], np.diff(any_dis) / np.maximum(1 - any_dis[:-1], 1e-6)]
    buf = state.disengage_buffer
    buf[:-DISENGAGE_WIDTH] = buf[DISENGAGE_WIDTH:]
    buf[-DISENGAGE_WIDTH:] = ind
  # summed in float64 term by term, as openpilot does: a float32 sum can land on the other side of a threshold
  score = 0.
  pushes = state.disengage_buffer.reshape(CONFIDENCE_BUFFER_LEN, DISENGAGE_WIDTH)   # oldest first
  for i in range(CONFIDENCE_BUFFER_LEN):   # the push made k = LEN-1-i pushes ago, for its step k ahead: the one now
    score += float(pushes[i, CONFIDENCE_BUFFER_LEN - 1 - i]) / CONFIDENCE_BUFFER_LEN
  return 'green' if score < thresholds[0] else 'yellow' if score < thresholds[1] else 'red'

def fill_model_msgs(out: dict, info: FrameInfo, action: Action, path: np.ndarray, state: PublishState, contract: RoadContract,
                    raw: np.ndarray | None = None) -> tuple[capnp.lib.capnp._DynamicStructBuilder, ...]:
  """out: modeld.parse.parse_outputs(...), action: get_action(...), path: path_coefficients(...). Returns (modelV2,
  drivingModelData, cameraOdometry) Event builders.
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

  for name, cols in contract.plan.items():
    _fill_xyzt(getattr(mv2, name), T_IDXS, *plan[:, cols].T, *(plan_std[:, cols].T if name in contract.plan_stds else ()))
  dmd.path.xCoefficients, dmd.path.yCoefficients, dmd.path.zCoefficients = (path[:, i].tolist() for i in range(3))

  probs = out['lane_lines_prob'][1::2]   # per line (absent, present): the present ones
  lines = mv2.init('laneLines', len(out['lane_lines']))
  for b, ll in zip(lines, out['lane_lines']): _fill_xyzt(b, [], X_IDXS, ll[:, 0], ll[:, 1])
  mv2.laneLineStds = out['lane_lines_std'][:, 0, 0].tolist()
  mv2.laneLineProbs = probs.tolist()
  edges = mv2.init('roadEdges', len(out['road_edges']))
  for b, re in zip(edges, out['road_edges']): _fill_xyzt(b, [], X_IDXS, re[:, 0], re[:, 1])
  mv2.roadEdgeStds = out['road_edges_std'][:, 0, 0].tolist()
  llm = dmd.laneLineMeta
  llm.leftY, llm.rightY = float(out['lane_lines'][1, 0, 0]), float(out['lane_lines'][2, 0, 0])
  llm.leftProb, llm.rightProb = float(probs[1]), float(probs[2])

  leads = mv2.init('leadsV3', len(LEAD_T_OFFSETS))
  for i, b in enumerate(leads): _fill_lead(b, out['lead'][i], out['lead_std'][i], out['lead_prob'][i], LEAD_T_OFFSETS[i])

  meta, m = mv2.meta, out['meta']
  meta.engagedProb = float(m['engagedProb'][0])
  meta.desireState = out['desire_state'].tolist()
  meta.desirePrediction = out['desire_pred'].reshape(-1).tolist()
  dp = meta.init('disengagePredictions')
  dp.t = META_T_IDXS
  for k in DISENGAGE_FIELDS: setattr(dp, k, m[k].tolist())
  meta.hardBrakePredicted = hard_brake_predicted(state, m, contract.hard_brake)
  mv2.confidence = update_confidence(state, m, info.frame_id, contract.confidence)

  odo.frameId, odo.timestampEof = info.frame_id, info.timestamp_eof
  odo.trans, odo.rot, odo.transStd, odo.rotStd = out['pose'][:3].tolist(), out['pose'][3:].tolist(), out['pose_std'][:3].tolist(), out['pose_std'][3:].tolist()
  odo.wideFromDeviceEuler, odo.wideFromDeviceEulerStd = out['wide_from_device_euler'].tolist(), out['wide_from_device_euler_std'].tolist()
  odo.roadTransformTrans, odo.roadTransformTransStd = out['road_transform'][:3].tolist(), out['road_transform_std'][:3].tolist()
  return mv2_msg, dmd_msg, odo_msg
