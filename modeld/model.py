"""What modeld does with one road (+ wide road) frame, with no socket (modeld feeds it live frames, modeld-batch
recorded ones): the inputs from the newest messages (warps from the calibration and the sensor, desire, traffic
convention), drops counted, the run, and modelV2, drivingModelData, cameraOdometry filled as openpilot fills them. Valid
once a good calibration arrived, for a finite, untorn frame whose action and path fit their Float32 fields."""
from __future__ import annotations
import time
import numpy as np
from cereal.services import CAMERA_OF_STREAM, CAMERA_STATE_SERVICES, MODELD_INPUTS, MODELD_OUTPUTS
from transformations.camera import sensor_name, camera_for
from transformations.model import road_warp_matrix
from modelrt.constants import DT
from modeld_common.frame import FrameModel, FrameRun
from modeld.desire import Desire, DesireHelper
from modeld.fill_msgs import Action, FrameInfo, PublishState, action_times, fill_model_msgs, fits_float32, get_action, path_coefficients
from modeld.parse import parse_outputs

DROP_FILTER_RC, DROP_MAX, DROP_WARMUP_RUNS = 10., 10, 10

class FrameDrops:
  """update(frame_id) -> frames dropped before this one (a frame after a drop only feeds the history). frame_drop_perc:
  100 f / (1 + f), f a first-order filter (10 s) of min(dropped, 10), held at 0 for the first 10 runs. The first frame of
  a camera session follows none: nothing was dropped before it (openpilot counts from frame id 0, which would make a
  replay that starts mid-route skip its first frame, and a lockstep camera wait for it forever)."""
  def __init__(self):
    self.last_frame_id, self.runs, self.x, self.frame_drop_perc = None, 0, 0., 0.
    self.alpha = DT / (DROP_FILTER_RC + DT)   # stepped once per main camera frame received

  def update(self, frame_id: int) -> int:
    dropped = 0 if self.last_frame_id is None else max(0, frame_id - self.last_frame_id - 1)
    self.x = (1 - self.alpha) * self.x + self.alpha * min(dropped, DROP_MAX)
    if self.runs < DROP_WARMUP_RUNS: self.x = 0.   # the first frames after a (re)start: no drop history yet
    self.runs += 1
    self.last_frame_id = frame_id
    self.frame_drop_perc = 100 * self.x / (1 + self.x)
    return dropped

class RoadModel(FrameModel):
  PUBLISHES, SUBSCRIBES = list(MODELD_OUTPUTS), list(MODELD_INPUTS)   # the services table's

  def __init__(self, runner, main_stream: int, *args, **kwargs):
    super().__init__(runner, *args, **kwargs)
    self.main_stream = main_stream
    self.state_name = CAMERA_STATE_SERVICES[main_stream]
    self.reset()

  def reset(self) -> None:
    super().reset()
    self.desire, self.publish_state, self.drops = DesireHelper(), PublishState(), FrameDrops()
    self.geometry = None   # (rpy, sensor, main layout, extra layout) the transforms were computed for

  def update_transforms(self, main, extra) -> None:
    sensor = sensor_name(str(self.sm[self.state_name].sensor), self.sensor, (main.width, main.height))
    geometry = (tuple(self.calib.rpy), sensor, str(main.layout), str(extra.layout))
    if geometry == self.geometry: return
    if self.geometry is None or geometry[1] != self.geometry[1]: self.log.info("camera sensor %s", sensor)
    main_cam = camera_for(sensor, CAMERA_OF_STREAM[self.main_stream], main.width, main.height)
    wide_cam = camera_for(sensor, 'wide', extra.width, extra.height)
    # main: the road model frame (from the wide camera when it is the only one); extra: the wide model frame
    self.runner.set_transforms(road_warp_matrix(self.calib.rpy, main_cam), road_warp_matrix(self.calib.rpy, wide_cam, wide=True))
    self.geometry = geometry

  def step(self, main, extra) -> list:
    """One frame (main and extra camera buffers; the newest messages already in sm): [(service, message)] to publish."""
    self.update_calibration()
    self.update_transforms(main, extra)
    traffic = np.array([0, 1] if self.sm['driverMonitoringState'].isRHD else [1, 0], np.float32)
    dropped = self.drops.update(main.frame_id)
    self.stats.gauge('frame_drop_perc', self.drops.frame_drop_perc)
    if dropped:
      self.stats.count('dropped', dropped)
      self.log.debug("prepare-only frame %d: %d frames dropped before it", main.frame_id, dropped)
    run = self.run((main, extra), main_buf=main, extra_buf=extra, desire=self.desire.vector(), traffic_convention=traffic, prepare_only=dropped > 0)
    if run is None: return []
    return self.messages(run, self.fill, self.calib.valid and run.out.finite and not run.torn)

  def fill(self, outputs: dict, run: FrameRun, valid: bool) -> list:
    """The outputs parsed, the action and desire updated, the messages filled."""
    main, extra = run.frames
    parsed = parse_outputs(outputs, self.contract)
    execution_time = time.perf_counter() - run.t0   # through the parsing, as openpilot times its model run
    cs = self.sm['carState']
    v_ego = max(float(cs.vEgo), 0.) if np.isfinite(cs.vEgo) else 0.
    prev = self.publish_state.prev_action
    action = get_action(parsed['plan'], prev, *action_times(self.sm['liveDelay'].lateralDelay), v_ego, self.contract.plan)
    path = path_coefficients(parsed['plan'], self.contract.plan['position'])
    # a finite plan near float32's limit: an action or path no Float32 field holds. Published invalid with the previous
    # action and no path, and not fed back (the smoothing would carry it into every later frame)
    if not (fits := fits_float32(action.desiredCurvature, action.desiredAcceleration, path)):
      self.stats.count('overflow')
      self.log.debug("frame %d: the plan's action or path overflows a Float32, published invalid", main.frame_id)
      valid, action, path = False, prev, np.zeros_like(path)
    lane_change_prob = float(parsed['desire_state'][Desire.laneChangeLeft] + parsed['desire_state'][Desire.laneChangeRight])
    self.desire.update(cs, self.sm['carControl'].latActive, lane_change_prob)
    frame_age = max(0, self.sm[self.state_name].frameId - main.frame_id)
    info = FrameInfo(main.frame_id, extra.frame_id, frame_age, self.drops.frame_drop_perc, main.timestamp_eof, execution_time, valid=valid,
                     lane_change_state=self.desire.lane_change_state, lane_change_direction=self.desire.lane_change_direction)
    msgs = fill_model_msgs(parsed, info, action, path, self.publish_state, self.contract, run.out.raw if self.raw_predictions else None)
    # the next frame smooths from the action as published (Float32 fields), as openpilot does reading its last message
    if run.out.finite and fits:
      self.publish_state.prev_action = Action(float(np.float32(action.desiredCurvature)), float(np.float32(action.desiredAcceleration)), action.shouldStop)
    return list(zip(self.PUBLISHES, msgs))
