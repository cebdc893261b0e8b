"""modeld: road (+ wide road) camera -> road model -> modelV2, drivingModelData, cameraOdometry at the camera's rate.

Start-up: verify the road artifact and load its models (a bad one exits 78 at once); then, in openpilot's order, wait
for the camera server's streams (polled every 0.1 s); main camera = road (wide road when there is none, conflated),
extra = wide road (not conflated); connect; then load the warps for the connected buffer layouts and run one warm-up
replay; then READY=1. Every frame: sync main and extra by start of frame, count drops (a frame after a drop only feeds
the history), run, check, parse, publish (a frame whose outputs cannot be parsed is skipped; 20 in a row exit 78).
Calibration (liveCalibration.rpyCalib) and camera geometry (the camera-state message's sensor, or --sensor) give the
warp transforms; until a good calibration arrives the default one is used and outputs are published valid=False.
A camera server restart drops the tensors over the old buffers, unmaps them, reconnects and resets the history; a
buffer layout the artifact has no warp for ends the process with exit code 78 (EX_CONFIG) and the build command.
"""
from __future__ import annotations
import logging, sys, time
import numpy as np
from common.daemon import RECV_TIMEOUT_MS, ModelDaemon, finite_outputs, main as daemon_main

log = logging.getLogger('modeld')
class ModelD(ModelDaemon):
  name, family = 'modeld', 'road'
  PUBLISHES = ['modelV2', 'drivingModelData', 'cameraOdometry']
  SUBSCRIBES = ['deviceState', 'carState', 'roadCameraState', 'wideRoadCameraState', 'liveCalibration', 'driverMonitoringState',
                'carControl', 'liveDelay']

  def __init__(self, args, stop):
    super().__init__(args, stop)
    from modeld.desire import DesireHelper
    from modeld.fill_msgs import PublishState
    self.desire, self.publish_state = DesireHelper(), PublishState()
    self.geometry = None   # (rpy, sensor, main layout, extra layout) the transforms were computed for

  def clients(self, streams: set[int]) -> list | None:
    """main = road (conflated; wide road when there is no road), extra = wide road (not conflated), as openpilot."""
    from msgq.visionipc import VisionIpcClient, ROAD, WIDE_ROAD
    main_stream = ROAD if ROAD in streams else WIDE_ROAD
    if main_stream not in streams:
      log.error("camera server %r serves streams %s, neither road (%d) nor wide road (%d); waiting", self.args.camera_server,
                sorted(streams), ROAD, WIDE_ROAD)
      return None
    clients = [VisionIpcClient(self.args.camera_server, main_stream, True)]
    if main_stream == ROAD and WIDE_ROAD in streams: clients.append(VisionIpcClient(self.args.camera_server, WIDE_ROAD, False))
    return clients

  def make_runner(self, layouts: tuple):
    from modelrt.runner import RoadRunner
    return RoadRunner(self.artifact, layouts[0], layouts[1] if len(layouts) > 1 else None)

  def update_transforms(self, runner, main_stream: int, main, extra) -> None:
    from msgq.visionipc import WIDE_ROAD
    from modelrt.geometry import road_warp_matrix
    from modelrt.calibration import sensor_name, camera_for
    state = self.sm['wideRoadCameraState' if main_stream == WIDE_ROAD else 'roadCameraState']
    sensor = sensor_name(str(state.sensor), self.args.sensor)
    geometry = (tuple(self.calib.rpy), sensor, str(main.layout), str(extra.layout))
    if geometry == self.geometry: return
    if self.geometry is None or geometry[1] != self.geometry[1]: log.info("camera sensor %s", sensor)
    main_cam = camera_for(sensor, 'wide' if main_stream == WIDE_ROAD else 'road', main.width, main.height)
    wide_cam = camera_for(sensor, 'wide', extra.width, extra.height)
    # main: the road model frame (from the wide camera when it is the only one); extra: the wide model frame
    runner.set_transforms(road_warp_matrix(self.calib.rpy, main_cam), road_warp_matrix(self.calib.rpy, wide_cam, wide=True))
    self.geometry = geometry

  def serve(self, runner, watch, clients: list) -> None:
    """Frames until the stop flag or a camera server restart (a client disconnects)."""
    from msgq.visionipc import WIDE_ROAD
    from modelrt.guard import InputSpecError
    from modeld.sync import FrameSync, FrameDrops
    from modeld.parse import parse_outputs
    from modeld.desire import Desire
    from modeld.fill_msgs import FrameInfo, fill_model_msgs, get_action, action_times
    main_client, extra_client = clients[0], clients[1] if len(clients) > 1 else None
    contract = runner.artifact.contract
    main_stream = main_client.stream
    runner.reset()   # a new connection: history from another camera session is meaningless
    self.geometry = None
    sync = FrameSync(main_client.recv, extra_client and extra_client.recv, RECV_TIMEOUT_MS)
    drops, state_name = FrameDrops(), 'wideRoadCameraState' if main_stream == WIDE_ROAD else 'roadCameraState'

    def messages(out: dict, raw: np.ndarray, main, extra, exec_time: float, valid: bool, finite: bool) -> list:
      parsed = parse_outputs(out, contract)
      cs = self.sm['carState']
      v_ego = max(float(cs.vEgo), 0.) if np.isfinite(cs.vEgo) else 0.
      action = get_action(parsed['plan'], self.publish_state.prev_action, *action_times(self.sm['liveDelay'].lateralDelay), v_ego, contract.plan)
      lane_change_prob = float(parsed['desire_state'][Desire.laneChangeLeft] + parsed['desire_state'][Desire.laneChangeRight])
      self.desire.update(cs, self.sm['carControl'].latActive, lane_change_prob)
      frame_age = max(0, self.sm[state_name].frameId - main.frame_id)
      info = FrameInfo(main.frame_id, extra.frame_id, frame_age, drops.frame_drop_perc, main.timestamp_eof, exec_time, valid=valid,
                       lane_change_state=self.desire.lane_change_state, lane_change_direction=self.desire.lane_change_direction)
      msgs = fill_model_msgs(parsed, info, action, self.publish_state, contract, np.nan_to_num(raw, nan=0., posinf=0., neginf=0.) if self.args.raw_predictions else None)
      if finite: self.publish_state.prev_action = action
      return msgs

    while not self.stop:
      self.tick()
      if not all(c.is_connected() for c in clients):
        log.warning("camera server %r restarted or went away: reconnecting", self.args.camera_server)
        return
      if (frames := sync.next()) is None:
        if watch.changed(): return
        continue
      watch.frame()
      t_frame = time.perf_counter()
      main, extra, out_of_sync = frames
      if out_of_sync:
        self.stats.count('out_of_sync')
        log.debug("frames out of sync: main %d (%.5f s), extra %d (%.5f s)", main.frame_id, main.timestamp_sof / 1e9, extra.frame_id, extra.timestamp_sof / 1e9)

      self.update_inputs()
      self.update_transforms(runner, main_stream, main, extra)
      traffic = np.array([0, 1] if self.sm['driverMonitoringState'].isRHD else [1, 0], np.float32)
      dropped = drops.update(main.frame_id)
      self.stats.gauge('frame_drop_perc', drops.frame_drop_perc)

      t0 = time.perf_counter()
      try: out = runner.run(main, extra if extra_client else None, self.desire.vector(), traffic, prepare_only=dropped > 0)
      except InputSpecError as e:
        self.stats.count('bad_input')
        log.error("frame %d skipped: %s", main.frame_id, e)
        continue
      exec_time = time.perf_counter() - t0
      torn = main.overwritten() or extra.overwritten()   # checked after the run: False means what the warp read was this frame
      if torn:
        self.stats.count('torn')
        log.debug("frame %d torn: the camera reused its buffer during the run", main.frame_id)
      if out is None:
        self.stats.count('dropped', dropped)
        self.stats.count('prepare_only')
        log.debug("prepare-only frame %d: %d frames dropped before it", main.frame_id, dropped)
        continue

      raw = out.pop('raw')
      out, finite = finite_outputs(out)
      if not finite:
        self.stats.count('nonfinite')
        log.debug("frame %d: non-finite model outputs, published invalid", main.frame_id)
      valid = self.calib.valid and finite and not torn
      if (msgs := self.guard(main.frame_id, out, messages, raw, main, extra, exec_time, valid, finite)) is None: continue
      for name, msg in zip(self.PUBLISHES, msgs): self.pm.send(name, msg)
      self.stats.count('frames')
      self.stats.timing('exec', exec_time)
      self.stats.timing('frame', time.perf_counter() - t_frame)   # frame in hand -> messages sent: exec + the daemon's own work
      if not valid: self.stats.count('invalid')

def main(argv: list[str] | None = None) -> None:
  daemon_main(ModelD, argv, __doc__)

if __name__ == '__main__': sys.exit(main())
