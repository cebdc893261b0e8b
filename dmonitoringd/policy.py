"""Driver monitoring policy: driverStateV2 (+ carState, selfdriveState, the calibration) -> driverMonitoringState, the
rules of openpilot v0.11.1's selfdrive/monitoring/policy.py step for step, a step per driver frame.

DriverMonitoring's methods give each rule (side, pose, distraction, policy, awareness, alerts, lockout);
docs/REFERENCE_MODELS.md lists where dmonitoringd departs from openpilot."""
from __future__ import annotations
import math
from dataclasses import dataclass
import numpy as np
from cereal import car
from modelrt.constants import DT as DT_DMON, DM_FACE_EFL as EFL, DM_FACE_W as PICTURE_W, DM_FACE_H as PICTURE_H   # DT: a step per driver frame

def frames(seconds: float) -> int: return int(seconds / DT_DMON)

VISION, WHEELTOUCH = 'vision', 'wheeltouch'     # activePolicy: the driver's face, or touching the wheel or the gas
FORWARD = (car.CarState.GearShifter.drive, car.CarState.GearShifter.low)   # gears always-on monitoring counts in (by number: a peer's unknown one is not)
ALERT_LEVELS = ('none', 'one', 'two', 'three')   # alertLevel by its number; three: terminal, disengage

@dataclass(frozen=True)
class Settings:
  VISION_ALERT_TIMEOUTS: tuple[float, float, float] = (3., 5., 11.)         # s of distraction to alert one, two, three
  WHEELTOUCH_ALERT_TIMEOUTS: tuple[float, float, float] = (15., 24., 30.)   # s without a face or a touch to each
  RECOVERY_FACTOR_MAX: float = 5.
  RECOVERY_FACTOR_MIN: float = 1.25
  MAX_TERMINAL_ALERTS: int = 3                 # lockout: engaging refused after this many terminal alerts
  MAX_TERMINAL_DURATION: int = frames(30)      # or this many frames of them
  FACE_THRESHOLD: float = 0.7
  EYE_THRESHOLD: float = 0.65
  SG_THRESHOLD: float = 0.9
  BLINK_THRESHOLD: float = 0.865
  PHONE_THRESH: float = 0.5
  POSE_PITCH_THRESHOLD: float = 0.3133         # rad, strict; slack while a brake disengagement is unlikely
  POSE_PITCH_THRESHOLD_SLACK: float = 0.3237
  POSE_YAW_THRESHOLD: float = 0.4020
  POSE_YAW_THRESHOLD_SLACK: float = 0.5042
  POSE_YAW_MIN_STEER_DEG: float = 30.          # steering past this turns the allowed yaw that way ...
  POSE_YAW_STEER_FACTOR: float = 0.15          # ... by this share of the steering angle past it ...
  POSE_YAW_STEER_MAX_OFFSET: float = 0.3927    # ... up to this, rad
  PITCH_NATURAL_OFFSET: float = 0.011          # until the driver's own offsets are learned, and the pose filters' priors
  PITCH_NATURAL_THRESHOLD: float = 0.449
  YAW_NATURAL_OFFSET: float = 0.075
  PITCH_NATURAL_VAR: float = 3 * 0.01
  YAW_NATURAL_VAR: float = 3 * 0.05
  PITCH_MAX_OFFSET: float = 0.124              # the learned offsets are used within these
  PITCH_MIN_OFFSET: float = -0.0881
  YAW_MAX_OFFSET: float = 0.289
  YAW_MIN_OFFSET: float = -0.0246
  DCAM_UNCERTAIN_ALERT_THRESHOLD: float = 0.1
  DCAM_UNCERTAIN_ALERT_COUNT: int = frames(60)
  DCAM_UNCERTAIN_RESET_COUNT: int = frames(2)
  HI_STD_THRESHOLD: float = 0.3
  HI_STD_FALLBACK_TIME: int = frames(10)       # frames of an unsure pose before the wheel-touch policy
  DISTRACTED_FILTER_TS: float = 0.25
  POSE_CALIB_MIN_SPEED: float = 13.            # m/s
  POSE_OFFSET_MIN_COUNT: int = frames(60)
  POSE_OFFSET_MAX_COUNT: int = frames(360)     # later samples weigh as the last of this many
  WHEELPOS_CALIB_MIN_SPEED: float = 11.        # m/s
  WHEELPOS_THRESHOLD: float = 0.5
  WHEELPOS_FILTER_MIN_COUNT: int = frames(15)
  WHEELPOS_DATA_AVG: float = 0.03              # the wheel-side filter's prior
  WHEELPOS_DATA_VAR: float = 3 * 5.5e-5

  def timeouts(self, policy: str) -> tuple[float, float, float]:
    return self.VISION_ALERT_TIMEOUTS if policy == VISION else self.WHEELTOUCH_ALERT_TIMEOUTS

class RunningMean:
  """Mean (and spread) of the samples pushed, counting at most max_n (later ones then weigh as the last of max_n),
  starting from a prior of n samples of that mean whose squared deviations sum to m2."""
  def __init__(self, max_n: int = -1, mean: float = 0., m2: float = 0., n: int = 0): self.max_n, self.mean, self.m2, self.n = max_n, mean, m2, n
  def push(self, v: float) -> None:
    if self.max_n < 0 or self.n < self.max_n: self.n += 1
    last = self.mean
    self.mean = last + (v - last) / self.n
    self.m2 += (v - last) * (v - self.mean)
  def std(self) -> float: return math.sqrt(self.m2 / (self.n - 1)) if self.n >= 2 else 0.

class FilteredMean:
  """openpilot's RunningStatFilter: every sample enters `raw` (which may start from a prior of (mean, variance) as 2
  samples); `filtered` takes only those that do not raise raw's std."""
  def __init__(self, max_n: int = -1, prior: tuple[float, float] | None = None):
    self.raw, self.filtered = RunningMean(-1, prior[0], prior[1], 2) if prior else RunningMean(), RunningMean(max_n)
  def push(self, v: float) -> None:
    before = self.raw.std()
    self.raw.push(v)
    if self.raw.std() - before <= 0: self.filtered.push(v)

def face_pose(orientation, position, rpy_calib) -> tuple[float, float]:
  """(pitch, yaw) of the driver's face as seen from the road ahead: the model's angles plus the direction of the face's
  place in the picture, less the calibration's pitch and yaw."""
  o, p, rpy = [float(x) for x in orientation], [float(x) for x in position], [float(x) for x in rpy_calib]   # float32 values in float64
  pitch = o[0] + math.atan2((p[1] + .5) * PICTURE_H - PICTURE_H // 2, EFL) - rpy[1]
  yaw = -o[1] + math.atan2((p[0] + .5) * PICTURE_W - PICTURE_W // 2, EFL) - rpy[2]
  return pitch, yaw

def percent(v: float) -> int: return int(min(max(v * 100., 0.), 100.))

class DriverMonitoring:
  """openpilot's DriverMonitoring: step() per driver frame, state() the driverMonitoringState it publishes.
  rhd_saved: the side until the model's is learned (openpilot: saved on an earlier drive); always_on: monitoring while
  not engaged too; lockout: engaging already refused (openpilot: DriverTooDistracted, kept through the drive)."""
  def __init__(self, settings: Settings = Settings(), rhd_saved: bool = False, always_on: bool = False, lockout: bool = False):
    self.s = s = settings
    self.wheelpos = FilteredMean(-1, (s.WHEELPOS_DATA_AVG, s.WHEELPOS_DATA_VAR))
    self.pitch_offset = FilteredMean(s.POSE_OFFSET_MAX_COUNT, (s.PITCH_NATURAL_OFFSET, s.PITCH_NATURAL_VAR))
    self.yaw_offset = FilteredMean(s.POSE_OFFSET_MAX_COUNT, (s.YAW_NATURAL_OFFSET, s.YAW_NATURAL_VAR))
    self.rhd_saved, self.always_on, self.lockout = rhd_saved, always_on, lockout
    self.rhd, self.rhd_last = False, None
    self.pitch = self.yaw = self.steer_yaw_offset = self.std_max = self.phone = 0.
    self.blink = (0., 0.)
    self.pitch_factor = self.yaw_factor = 1.   # the pose thresholds' strictness
    self.pose_calibrated, self.low_std, self.face = False, True, False
    self.types = {'pose': False, 'eye': False, 'phone': False}   # distractedTypes
    self.distracted, self.distraction = False, 0.   # distraction: the distracted flag through a first-order filter
    self.hi_stds = self.uncertain_count = self.uncertain_reset = 0
    self.model_uncertain = self.interacting = False
    self.terminal_alerts = self.terminal_frames = 0
    self.level = 0
    self.policy, self.step_change, self.thresholds = VISION, 0., (0., 0.)
    self._reset_awareness()
    self._set_policy(VISION)

  def _reset_awareness(self) -> None:
    self.awareness = 1.
    self.held = {VISION: 1., WHEELTOUCH: 1.}   # each policy's awareness while the other one is active

  def step(self, ds, cs, enabled: bool, rpy_calib, brake_disengage_prob: float = 0.) -> None:
    """One driver frame. ds: its driverStateV2; cs: carState (vEgo, standstill, steeringAngleDeg, steeringPressed,
    gasPressed, gearShifter); enabled: openpilot engaged (selfdriveState.enabled); rpy_calib: liveCalibration's;
    brake_disengage_prob: modelV2's first brakeDisengageProbs (0: the slack pose thresholds)."""
    v_ego = float(cs.vEgo) if math.isfinite(cs.vEgo) else 0.   # NaN would loosen the pose thresholds to nothing
    self._set_pose_strictness(brake_disengage_prob, v_ego)
    self._update_driver(ds, rpy_calib, v_ego, enabled, bool(cs.standstill), float(cs.steeringAngleDeg))
    self._update_awareness(bool(cs.steeringPressed or cs.gasPressed), enabled, bool(cs.standstill), cs.gearShifter.raw not in FORWARD)

  def _set_pose_strictness(self, brake_disengage_prob: float, v_ego: float) -> None:
    """The pose thresholds go from slack to strict as the road model's brake-disengage probability rises to half of
    a speed-dependent scale (0.6 at 16 m/s, at least 0.2)."""
    s = self.s
    scale = max(-0.00156 * ((v_ego - 16) ** 2) + 0.6, 0.2)
    p = max(min(brake_disengage_prob / scale, 0.5), 0)
    self.pitch_factor = np.interp(p, [0, 0.5], [s.POSE_PITCH_THRESHOLD_SLACK, s.POSE_PITCH_THRESHOLD]) / s.POSE_PITCH_THRESHOLD
    self.yaw_factor = np.interp(p, [0, 0.5], [s.POSE_YAW_THRESHOLD_SLACK, s.POSE_YAW_THRESHOLD]) / s.POSE_YAW_THRESHOLD

  def _update_driver(self, ds, rpy_calib, v_ego: float, engaged: bool, standstill: bool, steering_angle_deg: float) -> None:
    """Side: wheelOnRightProb enters the wheel-side filter on frames with a face on either side while faster than
    WHEELPOS_CALIB_MIN_SPEED; with at least WHEELPOS_FILTER_MIN_COUNT samples in, isRHD is its mean above
    WHEELPOS_THRESHOLD, before that rhd_saved; while engaged the side does not change. The side's driver data then
    gives the face, the pose (face_pose, yaw flipped for a driver on the right), the pose's confidence (the larger of
    the pitch and yaw stds below HI_STD_THRESHOLD), the eyes and the phone; a message without a face pose changes
    nothing more."""
    s = self.s
    if v_ego > s.WHEELPOS_CALIB_MIN_SPEED and (ds.leftDriverData.faceProb > s.FACE_THRESHOLD or ds.rightDriverData.faceProb > s.FACE_THRESHOLD):
      self.wheelpos.push(ds.wheelOnRightProb)
    learned = self.wheelpos.filtered.n >= s.WHEELPOS_FILTER_MIN_COUNT
    self.rhd = self.wheelpos.filtered.mean > s.WHEELPOS_THRESHOLD if learned else self.rhd_saved
    if engaged and self.rhd_last is not None: self.rhd = self.rhd_last
    d = ds.rightDriverData if self.rhd else ds.leftDriverData
    if not all(len(x) for x in (d.faceOrientation, d.facePosition, d.faceOrientationStd, d.facePositionStd)): return

    self.face = d.faceProb > s.FACE_THRESHOLD
    self.pitch, self.yaw = face_pose(d.faceOrientation, d.facePosition, rpy_calib)
    # steering past POSE_YAW_MIN_STEER_DEG allows looking that way (the steering angle is positive to the left)
    self.steer_yaw_offset = math.radians(max(abs(steering_angle_deg) - s.POSE_YAW_MIN_STEER_DEG, 0.)) * -np.sign(steering_angle_deg) * s.POSE_YAW_STEER_FACTOR
    if self.rhd: self.yaw, self.steer_yaw_offset = -self.yaw, -self.steer_yaw_offset
    self.rhd_last = self.rhd
    self.std_max = max(d.faceOrientationStd[0], d.faceOrientationStd[1])
    self.low_std = self.std_max < s.HI_STD_THRESHOLD
    no_sg = d.sunglassesProb < s.SG_THRESHOLD
    self.blink = (d.leftBlinkProb * (d.leftEyeProb > s.EYE_THRESHOLD) * no_sg, d.rightBlinkProb * (d.rightEyeProb > s.EYE_THRESHOLD) * no_sg)
    self.phone = d.phoneProb

    self._set_distracted_types()
    self.distracted = any(self.types.values()) and d.faceProb > s.FACE_THRESHOLD and self.low_std
    k = DT_DMON / (s.DISTRACTED_FILTER_TS + DT_DMON)
    self.distraction = (1. - k) * self.distraction + k * self.distracted
    if self.face and v_ego > s.POSE_CALIB_MIN_SPEED and self.low_std and (not engaged or not self.distracted):
      self.pitch_offset.push(self.pitch)
      self.yaw_offset.push(self.yaw)
    self.pose_calibrated = min(self.pitch_offset.filtered.n, self.yaw_offset.filtered.n) >= s.POSE_OFFSET_MIN_COUNT

    if self.face and not self.distracted:   # a face the model is unsure of, while moving: the camera may be dirty or aimed badly
      if self.std_max > s.DCAM_UNCERTAIN_ALERT_THRESHOLD and not standstill: self.uncertain_count, self.uncertain_reset = self.uncertain_count + 1, 0
      else:
        self.uncertain_reset += 1
        if self.uncertain_reset > s.DCAM_UNCERTAIN_RESET_COUNT: self.uncertain_count = 0
    self.model_uncertain = self.hi_stds >= s.HI_STD_FALLBACK_TIME
    self._set_policy(VISION if self.face and not self.model_uncertain else WHEELTOUCH)
    if self.face and not self.low_std and not self.distracted: self.hi_stds += 1
    elif self.face and self.low_std: self.hi_stds = 0

  def _set_distracted_types(self) -> None:
    """pose: looking down (never up) or sideways beyond the thresholds around the driver's learned offsets (within
    their bounds; before they are learned, the natural offsets and PITCH_NATURAL_THRESHOLD); steering allows that much
    more yaw towards where the car turns. eye: both closed (blink probability where the eye is visible, without
    sunglasses). phone: above PHONE_THRESH."""
    s = self.s
    if self.pose_calibrated:
      pitch_err = self.pitch - min(max(self.pitch_offset.filtered.mean, s.PITCH_MIN_OFFSET), s.PITCH_MAX_OFFSET)
      yaw_err = self.yaw - min(max(self.yaw_offset.filtered.mean, s.YAW_MIN_OFFSET), s.YAW_MAX_OFFSET)
    else: pitch_err, yaw_err = self.pitch - s.PITCH_NATURAL_OFFSET, self.yaw - s.YAW_NATURAL_OFFSET
    pitch_err = 0 if pitch_err > 0 else abs(pitch_err)
    if yaw_err * self.steer_yaw_offset > 0: yaw_err = max(abs(yaw_err) - min(abs(self.steer_yaw_offset), s.POSE_YAW_STEER_MAX_OFFSET), 0.)
    else: yaw_err = abs(yaw_err)
    pitch_limit = s.POSE_PITCH_THRESHOLD * self.pitch_factor if self.pose_calibrated else s.PITCH_NATURAL_THRESHOLD
    self.types = {'pose': bool(pitch_err > pitch_limit or yaw_err > s.POSE_YAW_THRESHOLD * self.yaw_factor),
                  'eye': bool((self.blink[0] + self.blink[1]) * 0.5 > s.BLINK_THRESHOLD),
                  'phone': bool(self.phone > s.PHONE_THRESH)}

  def _set_policy(self, target: str) -> None:
    """Vision (a face the model is sure of) or wheel-touch; each keeps its own awareness, its thresholds and step. Once
    vision has reached alert two it stays, its awareness frozen while the face is gone (no escape from an alert by
    hiding the face); at terminal nothing changes."""
    if self.policy == VISION and self.awareness <= self.thresholds[1]:
      self.step_change = DT_DMON / self.s.VISION_ALERT_TIMEOUTS[2] if target == VISION else 0.
      return
    if self.awareness <= 0.: return
    if target != self.policy:
      self.held[self.policy], self.awareness = self.awareness, self.held[target]
    t1, t2, t3 = self.s.timeouts(target)
    self.thresholds, self.step_change, self.policy = (1. - t1 / t3, 1. - t2 / t3), DT_DMON / t3, target

  def _update_awareness(self, interacting: bool, engaged: bool, standstill: bool, wrong_gear: bool) -> None:
    """Awareness: 1 attentive .. 0 terminal (-0.1 at most). Reset to 1 while not engaged (always on: once terminal
    while not engaged) and when the driver touches the wheel or the gas under the wheel-touch policy. It recovers, the
    faster the lower it is, while attentive (distraction filtered below 0.37 with a face the model is sure of) or
    stopped short of alert one, where a touch resets it; it falls by a step while certainly distracted (filtered above
    0.63) or maybe (no face, an unsure model), except stopped short of alert one or, always on and not engaged, short
    of terminal. Alert one, two, three at or below each threshold and 0, none while recovering above alert two."""
    s = self.s
    self.level, self.interacting = 0, interacting
    if self.terminal_alerts >= s.MAX_TERMINAL_ALERTS or self.terminal_frames >= s.MAX_TERMINAL_DURATION: self.lockout = True
    always_on = self.always_on and not wrong_gear
    if (interacting and self.awareness > 0 and self.policy == WHEELTOUCH) or (not always_on and not engaged) or \
       (always_on and not engaged and self.awareness <= 0):
      self._reset_awareness()
      return
    before = self.awareness
    stopped_exempt = standstill and self.awareness - self.step_change <= self.thresholds[0]
    always_on_exempt = always_on and not engaged and self.awareness - self.step_change <= 0
    if self.awareness > 0 and ((self.distraction < 0.37 and self.face and self.low_std) or stopped_exempt):
      if interacting:
        self._reset_awareness()
        return
      factor = (s.RECOVERY_FACTOR_MAX - s.RECOVERY_FACTOR_MIN) * (1. - self.awareness) + s.RECOVERY_FACTOR_MIN
      self.awareness = min(self.awareness + factor * self.step_change, 1.)
      if self.awareness == 1.: self.held[WHEELTOUCH] = min(self.held[WHEELTOUCH] + self.step_change, 1.)
      if self.awareness > self.thresholds[1]: return
    certainly = self.distraction > 0.63 and self.distracted and self.face
    if (certainly or self.model_uncertain or not self.face) and not (stopped_exempt or always_on_exempt):
      self.awareness = max(self.awareness - self.step_change, -0.1)
    if self.awareness <= 0.:
      self.level, self.terminal_frames = 3, self.terminal_frames + 1
      if before > 0.: self.terminal_alerts += 1
    elif self.awareness <= self.thresholds[1]: self.level = 2
    elif self.awareness <= self.thresholds[0]: self.level = 1

  def state(self) -> dict:
    """The driverMonitoringState fields (Event @151, openpilot v0.11.1's), as a nested dict."""
    s, vision = self.s, self.policy == VISION
    def calib(f: FilteredMean, need: int) -> dict: return {'calibratedPercent': percent(f.filtered.n / need), 'offset': f.filtered.mean}
    return {'lockout': self.lockout, 'alertCountLockoutPercent': percent(self.terminal_alerts / s.MAX_TERMINAL_ALERTS),
            'alertTimeLockoutPercent': percent(self.terminal_frames / s.MAX_TERMINAL_DURATION), 'alwaysOn': self.always_on,
            'alwaysOnLockout': self.always_on and self.awareness <= self.thresholds[1], 'alertLevel': ALERT_LEVELS[self.level],
            'activePolicy': self.policy, 'isRHD': self.rhd, 'rhdCalibration': calib(self.wheelpos, s.WHEELPOS_FILTER_MIN_COUNT),
            'visionPolicyState': {
              'awarenessPercent': percent(self.awareness if vision else self.held[VISION]), 'awarenessStep': self.step_change if vision else 0.,
              'isDistracted': self.distracted, 'distractedTypes': dict(self.types), 'faceDetected': self.face,
              'pose': {'pitch': self.pitch, 'yaw': self.yaw, 'calibrated': self.pose_calibrated, 'uncertainty': self.std_max,
                       'pitchCalib': calib(self.pitch_offset, s.POSE_OFFSET_MIN_COUNT), 'yawCalib': calib(self.yaw_offset, s.POSE_OFFSET_MIN_COUNT)},
              'wheeltouchFallbackPercent': percent(self.hi_stds / s.HI_STD_FALLBACK_TIME),
              'uncertainOffroadAlertPercent': percent(self.uncertain_count / s.DCAM_UNCERTAIN_ALERT_COUNT)},
            'wheeltouchPolicyState': {'awarenessPercent': percent(self.held[WHEELTOUCH] if vision else self.awareness),
                                      'awarenessStep': 0. if vision else self.step_change, 'driverInteracting': self.interacting}}
