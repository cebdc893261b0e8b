"""Parsed driver-model outputs -> driverStateV2; policy state -> driverMonitoringState."""
from __future__ import annotations
import capnp
import numpy as np
from cereal.messaging import new_message

def fill_driver_state(dm: dict, frame_id: int, execution_time: float, gpu_time: float, valid: bool,
                      raw: np.ndarray | None = None) -> capnp.lib.capnp._DynamicStructBuilder:
  """dm: dmonitoringd.parse.parse_dm_outputs(...). gpu_time: the input preparation and the replays of the warp + model
  JITs, a wall time (on the CPU backend there is no separate device clock)."""
  msg = new_message('driverStateV2')
  msg.valid = valid
  ds = msg.driverStateV2
  ds.frameId, ds.modelExecutionTime, ds.gpuExecutionTime = frame_id, execution_time, gpu_time
  ds.wheelOnRightProb = dm['wheel_on_right_prob']
  if raw is not None: ds.rawPredictions = np.asarray(raw, np.float32).tobytes()
  for side, b in (('lhd', ds.leftDriverData), ('rhd', ds.rightDriverData)):   # the driver on the left, on the right
    d = dm[side]
    b.faceOrientation, b.faceOrientationStd = d['face_orientation'].tolist(), d['face_orientation_std'].tolist()
    b.facePosition, b.facePositionStd = d['face_position'].tolist(), d['face_position_std'].tolist()
    b.faceProb, b.leftEyeProb, b.rightEyeProb = d['face_prob'], d['left_eye_prob'], d['right_eye_prob']
    b.leftBlinkProb, b.rightBlinkProb = d['left_blink_prob'], d['right_blink_prob']
    b.sunglassesProb, b.phoneProb, b.sleepProb = d['sunglasses_prob'], d['using_phone_prob'], d['sleep_prob']
  return msg

def fill_monitoring_state(state: dict, valid: bool) -> capnp.lib.capnp._DynamicStructBuilder:
  """state: DriverMonitoring.state(), openpilot v0.11.1's driverMonitoringState (Event @151). It carries no frame id: it
  follows its driverStateV2."""
  msg = new_message('driverMonitoringState')
  msg.valid = valid
  msg.driverMonitoringState = state
  return msg

def awareness(dms) -> float:
  """A driverMonitoringState's awareness, 1 attentive .. 0 terminal: its active policy's."""
  p = dms.visionPolicyState if dms.activePolicy == 'vision' else dms.wheeltouchPolicyState
  return p.awarenessPercent / 100
