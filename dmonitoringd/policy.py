"""Driver monitoring policy: parsed driver-model outputs (+ carState, selfdriveState, liveCalibration) ->
driverMonitoringState, following openpilot's monitoring rules (selfdrive/monitoring) step for step, except where said.

DriverMonitoring's methods give each rule (side, pose, distraction, awareness); docs/REFERENCE_MODELS.md lists where
it departs from openpilot."""
from __future__ import annotations
import math
from dataclasses import dataclass
import numpy as np
from modelrt.constants import DT as DT_DMON, DM_FACE_EFL as EFL, DM_FACE_W as PICTURE_W, DM_FACE_H as PICTURE_H   # DT: a step per driver frame

@dataclass(frozen=True)
class Settings:
  FACE_THRESHOLD: float = 0.7
  EYE_THRESHOLD: float = 0.65
  SG_THRESHOLD: float = 0.9
  BLINK_THRESHOLD: float = 0.865
  PHONE_THRESH: float = 0.4                 # until the phone offset is learned (0.75 for the os04c10 camera)
  PHONE_THRESH2: float = 15.                # then: the learned offset times this
  PHONE_MAX_OFFSET: float = 0.06
  PHONE_MIN_OFFSET: float = 0.025
  POSE_PITCH_THRESHOLD: float = 0.3237      # rad, slack (openpilot's with a low brake-disengage probability)
  POSE_YAW_THRESHOLD: float = 0.5042
  PITCH_NATURAL_OFFSET: float = 0.029       # until the driver's own offset is learned
  PITCH_NATURAL_THRESHOLD: float = 0.449
  YAW_NATURAL_OFFSET: float = 0.097
  PITCH_MAX_OFFSET: float = 0.124           # the learned offsets are used within these
  PITCH_MIN_OFFSET: float = -0.0881
  YAW_MAX_OFFSET: float = 0.289
  YAW_MIN_OFFSET: float = -0.0246
  POSESTD_THRESHOLD: float = 0.3
  DCAM_UNCERTAIN_ALERT_THRESHOLD: float = 0.1
  DCAM_UNCERTAIN_RESET_COUNT: int = int(20 / DT_DMON)
  HI_STD_FALLBACK_TIME: int = int(10 / DT_DMON)   # frames of an unsure pose before passive mode
  DISTRACTED_FILTER_TS: float = 0.25
  POSE_CALIB_MIN_SPEED: float = 13.         # m/s
  POSE_OFFSET_MIN_COUNT: int = int(60 / DT_DMON)
  POSE_OFFSET_MAX_COUNT: int = int(360 / DT_DMON)   # later samples weigh as the last of this many
  DISTRACTED_TIME: float = 11.              # s from full awareness to none while distracted (active mode)
  DISTRACTED_PROMPT_TIME_TILL_TERMINAL: float = 6.
  AWARENESS_TIME: float = 30.               # the same without a face (passive mode)
  AWARENESS_PROMPT_TIME_TILL_TERMINAL: float = 6.
  RECOVERY_FACTOR_MAX: float = 5.
  RECOVERY_FACTOR_MIN: float = 1.25
  WHEELPOS_CALIB_MIN_SPEED: float = 11.     # m/s
  WHEELPOS_THRESHOLD: float = 0.5
  WHEELPOS_FILTER_MIN_COUNT: int = int(15 / DT_DMON)


class DistractedType:
  POSE, EYES, PHONE = 1, 2, 4

class RunningMean:
  """Mean of the samples pushed, counting at most max_n (later ones then weigh as the last of max_n)."""
  def __init__(self, max_n: int = -1): self.max_n, self.mean, self.m2, self.n = max_n, 0., 0., 0
  def push(self, v: float) -> None:
    if self.max_n < 0 or self.n < self.max_n: self.n += 1
    last = self.mean
    self.mean = last + (v - last) / self.n
    self.m2 += (v - last) * (v - self.mean)
  def std(self) -> float: return math.sqrt(self.m2 / (self.n - 1)) if self.n >= 2 else 0.

class FilteredMean:
  """openpilot's RunningStatFilter: every sample enters `raw`; `filtered` takes only those that do not raise raw's std."""
  def __init__(self, max_n: int = -1): self.raw, self.filtered = RunningMean(), RunningMean(max_n)
  def push(self, v: float) -> None:
    before = self.raw.std()
    self.raw.push(v)
    if self.raw.std() - before <= 0: self.filtered.push(v)

def face_pose(orientation, position, rpy_calib) -> tuple[float, float]:
  """(pitch, yaw) of the driver's face as seen from the road ahead: the model's angles plus the direction of the face's
  place in the picture, less the calibration's pitch and yaw."""
  pitch = float(orientation[0]) + math.atan2((float(position[1]) + .5) * PICTURE_H - PICTURE_H // 2, EFL) - float(rpy_calib[1])
  yaw = -float(orientation[1]) + math.atan2((float(position[0]) + .5) * PICTURE_W - PICTURE_W // 2, EFL) - float(rpy_calib[2])
  return pitch, yaw

class DriverMonitoring:
  """openpilot's DriverMonitoring, a step per driver frame (update).
  Side: wheelOnRightProb enters a FilteredMean on frames with a face on either side while faster than
  WHEELPOS_CALIB_MIN_SPEED; with more than WHEELPOS_FILTER_MIN_COUNT samples isRHD is its mean above WHEELPOS_THRESHOLD,
  before that LHD (openpilot: the side saved on an earlier drive). While engaged the side does not change.
  Pose (face_pose): the model's angles as the driver's view of the road, yaw flipped again for a right-hand driver;
  confident (isLowStd) when the larger of the pitch and yaw stds is below POSESTD_THRESHOLD."""
  def __init__(self, settings: Settings = Settings()):
    self.s = s = settings
    self.wheelpos = FilteredMean()
    self.pitch_offset, self.yaw_offset, self.phone_offset = (FilteredMean(s.POSE_OFFSET_MAX_COUNT) for _ in range(3))
    self.rhd_last = None
    self.pose_calibrated = self.phone_calibrated = False
    self.distraction = 0.   # the distracted flag through a first-order filter
    self.hi_stds = self.uncertain_count = self.uncertain_reset = 0
    self.awareness = self.awareness_active = self.awareness_passive = 1.
    self.active_mode, self.step_change = True, DT_DMON / s.DISTRACTED_TIME
    self.threshold_prompt = s.DISTRACTED_PROMPT_TIME_TILL_TERMINAL / s.DISTRACTED_TIME

  def update(self, dm: dict, v_ego: float = 0., standstill: bool = False, rpy_calib=(0., 0., 0.), engaged: bool = False,
             driver_engaged: bool = False, phone_thresh: float | None = None) -> dict:
    """One driver frame. dm: dmonitoringd.parse.parse_dm_outputs(...); engaged: openpilot engaged (selfdriveState.enabled);
    driver_engaged: the driver touches the wheel or the gas (carState.steeringPressed or gasPressed). Returns the
    driverMonitoringState fields."""
    s = self.s
    if v_ego > s.WHEELPOS_CALIB_MIN_SPEED and max(dm['lhd']['face_prob'], dm['rhd']['face_prob']) > s.FACE_THRESHOLD:
      self.wheelpos.push(dm['wheel_on_right_prob'])
    rhd = self.wheelpos.filtered.mean > s.WHEELPOS_THRESHOLD if self.wheelpos.filtered.n > s.WHEELPOS_FILTER_MIN_COUNT else False
    if engaged and self.rhd_last is not None: rhd = self.rhd_last   # never changes sides while engaged
    self.rhd_last = rhd
    d = dm['rhd' if rhd else 'lhd']

    face = d['face_prob'] > s.FACE_THRESHOLD
    pitch, yaw = face_pose(d['face_orientation'], d['face_position'], rpy_calib)
    if rhd: yaw = -yaw
    std_max = max(float(d['face_orientation_std'][0]), float(d['face_orientation_std'][1]))
    low_std = std_max < s.POSESTD_THRESHOLD

    types = self._distracted_types(d, pitch, yaw, phone_thresh if phone_thresh is not None else s.PHONE_THRESH)
    distracted = bool(types) and face and low_std
    k = DT_DMON / (s.DISTRACTED_FILTER_TS + DT_DMON)
    self.distraction = (1. - k) * self.distraction + k * distracted
    if face and v_ego > s.POSE_CALIB_MIN_SPEED and low_std and (not engaged or not distracted):
      self.pitch_offset.push(pitch)
      self.yaw_offset.push(yaw)
      self.phone_offset.push(float(d['using_phone_prob']))
    self.pose_calibrated = min(self.pitch_offset.filtered.n, self.yaw_offset.filtered.n) > s.POSE_OFFSET_MIN_COUNT
    self.phone_calibrated = self.phone_offset.filtered.n > s.POSE_OFFSET_MIN_COUNT

    if face and not distracted:   # a face the model is not sure of, while driving: the camera may be dirty or aimed badly
      if std_max > s.DCAM_UNCERTAIN_ALERT_THRESHOLD:
        if not standstill: self.uncertain_count, self.uncertain_reset = self.uncertain_count + 1, 0
      else:
        self.uncertain_reset += 1
        if self.uncertain_reset > s.DCAM_UNCERTAIN_RESET_COUNT: self.uncertain_count = 0
    self._set_mode(active=face and self.hi_stds <= s.HI_STD_FALLBACK_TIME)
    if face and not low_std and not distracted: self.hi_stds += 1
    elif face and low_std: self.hi_stds = 0
    self._update_awareness(engaged, driver_engaged, standstill, face, low_std, distracted)

    return {'faceDetected': bool(face), 'isDistracted': distracted, 'distractedType': sum(types), 'awarenessStatus': self.awareness,
            'posePitchOffset': self.pitch_offset.filtered.mean, 'posePitchValidCount': self.pitch_offset.filtered.n,
            'poseYawOffset': self.yaw_offset.filtered.mean, 'poseYawValidCount': self.yaw_offset.filtered.n,
            'stepChange': self.step_change, 'awarenessActive': self.awareness_active, 'awarenessPassive': self.awareness_passive,
            'isLowStd': low_std, 'hiStdCount': self.hi_stds, 'isActiveMode': self.active_mode, 'isRHD': rhd,
            'uncertainCount': self.uncertain_count}

  def _distracted_types(self, d: dict, pitch: float, yaw: float, phone_thresh: float) -> list[int]:
    """distractedType bits (counted only with a face and a confident pose): POSE, looking down or sideways beyond the
    thresholds around the driver's learned natural offsets (before they are learned, PITCH_NATURAL_THRESHOLD); EYES,
    both closed (blink probability weighted by eye visibility, without sunglasses); PHONE, above phone_thresh until the
    driver's phone offset is learned. The pose thresholds are openpilot's slack ones, which it uses while modelV2's
    brake-disengage probability is low: modelV2 is not read, as which daemon answered a frame first would change the state."""
    s, types = self.s, []
    if self.pose_calibrated:
      pitch_err = pitch - float(np.clip(self.pitch_offset.filtered.mean, s.PITCH_MIN_OFFSET, s.PITCH_MAX_OFFSET))
      yaw_err = yaw - float(np.clip(self.yaw_offset.filtered.mean, s.YAW_MIN_OFFSET, s.YAW_MAX_OFFSET))
    else: pitch_err, yaw_err = pitch - s.PITCH_NATURAL_OFFSET, yaw - s.YAW_NATURAL_OFFSET
    pitch_err = -pitch_err if pitch_err < 0 else 0.   # looking down only: looking up is no distraction
    if pitch_err > (s.POSE_PITCH_THRESHOLD if self.pose_calibrated else s.PITCH_NATURAL_THRESHOLD) or abs(yaw_err) > s.POSE_YAW_THRESHOLD:
      types.append(DistractedType.POSE)
    no_sg = d['sunglasses_prob'] < s.SG_THRESHOLD
    blink = [d[f'{e}_blink_prob'] * (d[f'{e}_eye_prob'] > s.EYE_THRESHOLD) * no_sg for e in ('left', 'right')]
    if (blink[0] + blink[1]) * 0.5 > s.BLINK_THRESHOLD: types.append(DistractedType.EYES)
    if self.phone_calibrated:
      phone = d['using_phone_prob'] > min(max(self.phone_offset.filtered.mean, s.PHONE_MIN_OFFSET), s.PHONE_MAX_OFFSET) * s.PHONE_THRESH2
    else: phone = d['using_phone_prob'] > phone_thresh
    if phone: types.append(DistractedType.PHONE)
    return types

  def _set_mode(self, active: bool) -> None:
    """Active mode (a face the model is sure of) or passive; each keeps its awareness. Past the prompt in active mode
    the mode stays (no escape from an alert by hiding the face)."""
    s = self.s
    if self.active_mode and self.awareness <= self.threshold_prompt:
      self.step_change = DT_DMON / s.DISTRACTED_TIME if active else 0.
      return
    if self.awareness <= 0.: return
    if active:
      if not self.active_mode: self.awareness_passive, self.awareness = self.awareness, self.awareness_active
      self.threshold_prompt, self.step_change = s.DISTRACTED_PROMPT_TIME_TILL_TERMINAL / s.DISTRACTED_TIME, DT_DMON / s.DISTRACTED_TIME
    else:
      if self.active_mode: self.awareness_active, self.awareness = self.awareness, self.awareness_passive
      self.threshold_prompt, self.step_change = s.AWARENESS_PROMPT_TIME_TILL_TERMINAL / s.AWARENESS_TIME, DT_DMON / s.AWARENESS_TIME
    self.active_mode = active

  def _update_awareness(self, engaged: bool, driver_engaged: bool, standstill: bool, face: bool, low_std: bool, distracted: bool) -> None:
    """Awareness: 1 attentive .. 0 alert (-0.1 at most). It decays over DISTRACTED_TIME while distracted (active mode),
    over AWARENESS_TIME while no face is seen or the pose is unsure too long (passive). Attentive (distraction filtered
    over DISTRACTED_FILTER_TS below 0.37), it recovers, faster the lower it is. Reset to 1 while not engaged, when the
    driver touches the wheel or the gas in passive mode, or while attentive in active mode. At standstill it stops
    short of the prompt."""
    s = self.s
    if not engaged or (driver_engaged and self.awareness > 0 and not self.active_mode):
      self.awareness = self.awareness_active = self.awareness_passive = 1.
      return
    if self.distraction < 0.37 and face and low_std and self.awareness > 0:   # attentive
      if driver_engaged:
        self.awareness = self.awareness_active = self.awareness_passive = 1.
        return
      factor = (s.RECOVERY_FACTOR_MAX - s.RECOVERY_FACTOR_MIN) * (1. - self.awareness) + s.RECOVERY_FACTOR_MIN
      self.awareness = min(self.awareness + factor * self.step_change, 1.)
      if self.awareness == 1.: self.awareness_passive = min(self.awareness_passive + self.step_change, 1.)
      if self.awareness > self.threshold_prompt: return
    certainly = self.distraction > 0.63 and distracted and face
    maybe = self.hi_stds > s.HI_STD_FALLBACK_TIME or not face
    if (certainly or maybe) and not (standstill and self.awareness - self.step_change <= self.threshold_prompt):
      self.awareness = max(self.awareness - self.step_change, -0.1)
