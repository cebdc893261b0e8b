"""Driver monitoring policy: parsed driver-model outputs (+ carState) -> driverMonitoringState, openpilot's logic simplified.

- Side: the driver sits on the side of `isRHD`, openpilot's rule: wheelOnRightProb is averaged (a running mean of every
  sample) over the frames with a face on either side while driving faster than WHEELPOS_CALIB_MIN_SPEED; once
  WHEELPOS_MIN_COUNT such frames (15 s) were seen, isRHD is that mean above WHEELPOS_THRESHOLD, before that LHD.
- Face detected: faceProb of the driver's side above FACE_THRESHOLD. Confident (isLowStd): the pose std is small.
- Distracted (distractedType bits): 1 pose (pitch or yaw beyond a threshold around the learned natural offset),
  2 eyes (both eyes closed: blink probability, weighted by eye visibility, without sunglasses), 4 phone.
- Awareness: 1 attentive .. 0 alert. It decays while distracted (1 -> 0 in DISTRACTED_TIME with a confident face),
  while no face is visible it decays slower (AWARENESS_TIME), and recovers when attentive, faster the lower it is.
  At standstill it holds. The pose offsets are learned (running mean) while driving faster than POSE_CALIB_MIN_SPEED.
"""
from __future__ import annotations
from dataclasses import dataclass
import numpy as np
from modelrt.constants import DT as DT_DMON   # the policy steps once per driver frame it runs on

@dataclass(frozen=True)
class Settings:
  FACE_THRESHOLD: float = 0.7
  EYE_THRESHOLD: float = 0.65
  SG_THRESHOLD: float = 0.9
  BLINK_THRESHOLD: float = 0.865
  PHONE_THRESHOLD: float = 0.5
  POSE_PITCH_THRESHOLD: float = 0.3133      # rad around the natural offset
  POSE_YAW_THRESHOLD: float = 0.4020
  PITCH_NATURAL_OFFSET: float = 0.029       # until the driver's own offset is learned
  YAW_NATURAL_OFFSET: float = 0.097
  POSESTD_THRESHOLD: float = 0.3            # mean orientation std above this: the model is unsure of the pose
  POSE_CALIB_MIN_SPEED: float = 13.         # m/s
  POSE_OFFSET_MIN_COUNT: int = int(60 / DT_DMON)
  POSE_OFFSET_TAU: float = 60.              # s, time constant of the learned offsets
  DISTRACTED_TIME: float = 11.              # s from full awareness to none while distracted
  AWARENESS_TIME: float = 35.               # s, the same while no face is seen
  RECOVERY_FACTOR_MAX: float = 5.
  RECOVERY_FACTOR_MIN: float = 1.25
  WHEELPOS_MIN_COUNT: int = int(15 / DT_DMON)
  WHEELPOS_CALIB_MIN_SPEED: float = 11.     # m/s
  WHEELPOS_THRESHOLD: float = 0.5

class DistractedType:
  POSE, EYES, PHONE = 1, 2, 4

class _Ema:
  def __init__(self, tau: float, x0: float = 0.):
    self.alpha, self.x, self.n = DT_DMON / (tau + DT_DMON), x0, 0
  def update(self, v: float) -> None:
    self.x = v if self.n == 0 else (1 - self.alpha) * self.x + self.alpha * v
    self.n += 1

class _RunningMean:
  def __init__(self): self.x, self.n = 0., 0
  def update(self, v: float) -> None:
    self.n += 1
    self.x += (v - self.x) / self.n

class DriverMonitoring:
  def __init__(self, settings: Settings = Settings()):
    self.s = s = settings
    self.awareness, self.is_rhd, self.rhd_checked = 1., False, False
    self.wheelpos = _RunningMean()
    self.pitch_offset, self.yaw_offset = _Ema(s.POSE_OFFSET_TAU), _Ema(s.POSE_OFFSET_TAU)
    self.hi_std_count = self.uncertain_count = 0

  def update(self, dm: dict, v_ego: float = 0., standstill: bool = False) -> dict:
    """dm: dmonitoringd.parse.parse_dm_outputs(...). Returns the driverMonitoringState fields; `rhd_checked` says
    whether enough frames were seen to decide isRHD."""
    s = self.s
    if v_ego > s.WHEELPOS_CALIB_MIN_SPEED and max(dm['lhd']['face_prob'], dm['rhd']['face_prob']) > s.FACE_THRESHOLD:
      self.wheelpos.update(dm['wheel_on_right_prob'])
    self.rhd_checked = self.wheelpos.n >= s.WHEELPOS_MIN_COUNT   # decided once that many samples are in, as openpilot
    if self.rhd_checked: self.is_rhd = self.wheelpos.x > s.WHEELPOS_THRESHOLD
    d = dm['rhd' if self.is_rhd else 'lhd']
    face = d['face_prob'] > s.FACE_THRESHOLD

    pitch, yaw = float(d['face_orientation'][0]), float(d['face_orientation'][1])
    low_std = float(np.mean(d['face_orientation_std'])) < s.POSESTD_THRESHOLD
    if face and not low_std: self.hi_std_count += 1
    if face and low_std and v_ego > s.POSE_CALIB_MIN_SPEED:
      self.pitch_offset.update(pitch)
      self.yaw_offset.update(yaw)
    learned = self.pitch_offset.n >= s.POSE_OFFSET_MIN_COUNT
    pitch_off = self.pitch_offset.x if learned else s.PITCH_NATURAL_OFFSET
    yaw_off = self.yaw_offset.x if learned else s.YAW_NATURAL_OFFSET

    distracted_type = 0
    if face:
      if low_std and (abs(pitch - pitch_off) > s.POSE_PITCH_THRESHOLD or abs(yaw - yaw_off) > s.POSE_YAW_THRESHOLD):
        distracted_type |= DistractedType.POSE
      no_sg = d['sunglasses_prob'] < s.SG_THRESHOLD
      blink = [d[f'{e}_blink_prob'] * (d[f'{e}_eye_prob'] > s.EYE_THRESHOLD) * no_sg for e in ('left', 'right')]
      if (blink[0] + blink[1]) / 2 > s.BLINK_THRESHOLD: distracted_type |= DistractedType.EYES
      if d['using_phone_prob'] > s.PHONE_THRESHOLD: distracted_type |= DistractedType.PHONE
    elif d['face_prob'] > s.FACE_THRESHOLD / 2: self.uncertain_count += 1   # something face-like, not sure enough

    active = face and low_std
    step = DT_DMON / (s.DISTRACTED_TIME if active else s.AWARENESS_TIME)
    if not standstill:
      if distracted_type or not face: self.awareness = max(self.awareness - step, 0.)
      else:
        factor = (s.RECOVERY_FACTOR_MAX - s.RECOVERY_FACTOR_MIN) * (1. - self.awareness) + s.RECOVERY_FACTOR_MIN
        self.awareness = min(self.awareness + factor * step, 1.)
    return {'faceDetected': bool(face), 'isDistracted': bool(distracted_type), 'distractedType': distracted_type,
            'awarenessStatus': self.awareness, 'isRHD': self.is_rhd, 'isActiveMode': bool(active),
            'isLowStd': bool(low_std), 'posePitchOffset': pitch_off, 'posePitchValidCount': self.pitch_offset.n,
            'poseYawOffset': yaw_off, 'poseYawValidCount': self.yaw_offset.n, 'stepChange': step,
            'hiStdCount': self.hi_std_count, 'uncertainCount': self.uncertain_count}
