"""modeld: road (+ wide road) camera -> road model -> modelV2, drivingModelData, cameraOdometry at the camera's rate.

Start-up (openpilot's order): wait for the camera server's streams (polled every 0.1 s); main camera = road (wide
road when there is none, conflated), extra = wide road (not conflated); connect; then load the road artifact for the
connected buffer layouts and run one warm-up replay; then READY=1. Every frame: sync main and extra by start of
frame, count drops (a frame after a drop only feeds the history), run, check, parse, publish.
Calibration (liveCalibration.rpyCalib) and camera geometry (the camera-state message's sensor, or --sensor) give the
warp transforms; until a good calibration arrives the default one is used and outputs are published valid=False.
A camera server restart drops the tensors over the old buffers, unmaps them, reconnects and resets the history; a
buffer layout the artifact has no warp for ends the process with exit code 78 (EX_CONFIG) and the build command.
"""
from __future__ import annotations
import argparse, logging, os, sys, time
from typing import NoReturn
import numpy as np
from common.service import Stats, StopFlag, Watchdog, exit_now, notify, set_process_title, setup_logging

log = logging.getLogger('modeld')
EX_CONFIG = 78   # sysexits: the configuration (artifact vs camera) is wrong; restarting will not help
PUBLISHES = ['modelV2', 'drivingModelData', 'cameraOdometry']
SUBSCRIBES = ['deviceState', 'carState', 'roadCameraState', 'wideRoadCameraState', 'liveCalibration', 'driverMonitoringState',
              'carControl', 'liveDelay']
RECV_TIMEOUT_MS = 100   # the loop checks the stop flag and kicks the watchdog at least this often

def parse_args(argv: list[str] | None, prog: str = 'modeld', doc: str = __doc__) -> argparse.Namespace:
  """The options both daemons share (dmonitoringd calls this with its own name and description)."""
  ap = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""
environment: NOTIFY_SOCKET, WATCHDOG_USEC (service-manager protocol: READY=1 after load + warm-up + camera connect,
WATCHDOG=1 from the frame loop, STATUS=<stats>); OPENPILOT_PREFIX (message prefix, as --prefix); DEV (tinygrad device,
as --device); JOURNAL_STREAM (set by systemd: log lines carry syslog priorities). SIGTERM/SIGINT: finish the frame, exit 0.
exit codes: 0 stopped by a signal; 78 the artifact cannot serve this machine or camera (the message says how to build it).""")
  ap.add_argument('--artifacts', required=True, metavar='DIR', help="artifact directory built by modeld-compile (its "
                  f"{'road' if prog == 'modeld' else 'dm'}/ subdirectory is used)")
  ap.add_argument('--device', help="tinygrad device the artifact was built for (default: $DEV, else tinygrad's default); e.g. CPU")
  ap.add_argument('--camera-server', default='camerad', metavar='NAME', help="VisionIPC server name of the camera process (default: camerad)")
  ap.add_argument('--prefix', help="message prefix (OPENPILOT_PREFIX): isolates this stack's topics and camera buffers from others")
  ap.add_argument('--sensor', choices=['ar0231', 'ox03c10', 'os04c10'],
                  help="camera sensor for the intrinsics, overriding the camera-state message's (default: the message's, else ar0231)")
  ap.add_argument('--raw-predictions', action='store_true', default=os.environ.get('SEND_RAW_PRED') == '1',
                  help="also send the flat model outputs as rawPredictions (default: off, or on with SEND_RAW_PRED=1)")
  ap.add_argument('--stats-interval', type=float, default=10., metavar='S', help="seconds between stats log lines and STATUS= updates (default 10)")
  ap.add_argument('--log-level', default='INFO', choices=['DEBUG', 'INFO', 'WARNING', 'ERROR'],
                  help="stderr log level (default INFO; DEBUG adds a line per dropped or bad frame)")
  args = ap.parse_args(argv)
  # before anything imports tinygrad or opens a socket: both read these once
  if args.prefix is not None: os.environ['OPENPILOT_PREFIX'] = args.prefix
  if args.device: os.environ['DEV'] = args.device
  return args

def finite_outputs(out: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool]:
  """Outputs with every non-finite value zeroed, and whether they were all finite: NaN never reaches a message."""
  out = {k: v.reshape(1, -1) for k, v in out.items()}   # the parsers take (batch, n)
  if all(np.isfinite(v).all() for v in out.values()): return out, True
  return {k: np.nan_to_num(v, nan=0., posinf=0., neginf=0.) for k, v in out.items()}, False

class ModelD:
  def __init__(self, args: argparse.Namespace, stop: StopFlag):
    from cereal import messaging
    from modeld.calibration import Calibration
    from modeld.desire import DesireHelper
    from modeld.fill_msgs import PublishState
    self.args, self.stop, self.watchdog = args, stop, Watchdog()
    self.stats = Stats(log, args.stats_interval)
    self.pm, self.sm = messaging.PubMaster(PUBLISHES), messaging.SubMaster(SUBSCRIBES)
    self.calib, self.desire, self.publish_state = Calibration(), DesireHelper(), PublishState()
    self.artifact, self.runners, self.ready = None, {}, False
    self.geometry = None   # (rpy, sensor, main layout, extra layout) the transforms were computed for

  def tick(self) -> None:
    self.watchdog.kick()
    self.stats.tick()

  def run(self) -> int:
    from msgq.visionipc import VisionIpcClient, ROAD, WIDE_ROAD
    from modelrt.artifact import load_artifact
    from modelrt.runner import RoadRunner
    from common.camera import StreamWatch, wait_for_streams, connect
    try:
      while not self.stop:
        if (streams := wait_for_streams(self.args.camera_server, self.stop, self.tick)) is None: break
        main_stream = ROAD if ROAD in streams else WIDE_ROAD
        if main_stream not in streams:
          log.error("camera server %r serves streams %s, neither road (%d) nor wide road (%d); waiting", self.args.camera_server,
                    sorted(streams), ROAD, WIDE_ROAD)
          time.sleep(1)
          continue
        clients = [VisionIpcClient(self.args.camera_server, main_stream, True)]
        if main_stream == ROAD and WIDE_ROAD in streams: clients.append(VisionIpcClient(self.args.camera_server, WIDE_ROAD, False))
        try:
          if not connect(clients, self.stop, self.tick): continue
          layouts = tuple(c.layout for c in clients)
          log.info("connected to %r: main stream %d (%s)%s", self.args.camera_server, main_stream, layouts[0],
                   f", extra stream {WIDE_ROAD} ({layouts[1]})" if len(clients) > 1 else ", no extra camera")
          if self.artifact is None:   # after connecting, as openpilot: the warp depends on the camera
            t = time.perf_counter()
            self.artifact = load_artifact(self.args.artifacts, 'road')
            log.info("loaded %s in %.2f s (layouts: %s)", self.artifact.dir, time.perf_counter() - t, ', '.join(self.artifact.layouts))
          key = tuple(str(l) for l in layouts)
          if (runner := self.runners.get(key)) is None:
            runner = self.runners[key] = RoadRunner(self.artifact, layouts[0], layouts[1] if len(layouts) > 1 else None)
            runner.warmup()
          runner.reset()
          self.geometry = None
          if not self.ready:
            notify('READY=1', f'STATUS=running on {self.args.camera_server} stream {main_stream}')
            self.ready = True
            log.info("ready")
          self.serve(runner, StreamWatch(self.args.camera_server, streams), main_stream, *clients)
        finally:
          for r in self.runners.values(): r.release_camera_tensors()   # tensors over the buffers go before the mappings
          for c in clients: c.close()
    finally:
      self.pm.close()
      self.sm.close()
    log.info("stopped; totals: %s", self.stats.totals_line())
    return 0

  def update_transforms(self, runner, main_stream: int, main, extra) -> None:
    from msgq.visionipc import WIDE_ROAD
    from modelrt.geometry import road_warp_matrix
    from modeld.calibration import sensor_name, camera_for
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

  def serve(self, runner, watch, main_stream: int, main_client, extra_client=None) -> None:
    """Frames until the stop flag or a camera server restart (a client disconnects)."""
    from msgq.visionipc import WIDE_ROAD
    from modelrt.guard import InputSpecError
    from modeld.sync import FrameSync, FrameDrops
    from modeld.parse import parse_outputs
    from modeld.desire import Desire
    from modeld.fill_msgs import FrameInfo, fill_model_msgs, get_action, lateral_action_time
    sync = FrameSync(lambda: main_client.recv(RECV_TIMEOUT_MS), extra_client and (lambda: extra_client.recv(RECV_TIMEOUT_MS)))
    drops, state_name = FrameDrops(), 'wideRoadCameraState' if main_stream == WIDE_ROAD else 'roadCameraState'
    clients = [c for c in (main_client, extra_client) if c is not None]
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

      self.sm.update(0)
      if self.sm.updated['liveCalibration']: self.calib.update(self.sm['liveCalibration'].rpyCalib)
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
      parsed = parse_outputs(out)
      cs = self.sm['carState']
      v_ego = float(cs.vEgo) if np.isfinite(cs.vEgo) else 0.
      action = get_action(parsed['plan'], self.publish_state.prev_action, lateral_action_time(float(self.sm['liveDelay'].lateralDelay)), v_ego)
      lane_change_prob = float(parsed['desire_state'][Desire.laneChangeLeft] + parsed['desire_state'][Desire.laneChangeRight])
      self.desire.update(cs, self.sm['carControl'].latActive, lane_change_prob)
      frame_age = max(0, self.sm[state_name].frameId - main.frame_id)
      info = FrameInfo(main.frame_id, extra.frame_id, frame_age, drops.frame_drop_perc, main.timestamp_eof, exec_time,
                       valid=self.calib.valid and finite and not torn, lane_change_state=self.desire.lane_change_state,
                       lane_change_direction=self.desire.lane_change_direction)
      msgs = fill_model_msgs(parsed, info, action, self.publish_state, np.nan_to_num(raw, nan=0., posinf=0., neginf=0.) if self.args.raw_predictions else None)
      if finite: self.publish_state.prev_action = action
      for name, msg in zip(PUBLISHES, msgs): self.pm.send(name, msg)
      self.stats.count('frames')
      self.stats.timing('exec', exec_time)
      self.stats.timing('frame', time.perf_counter() - t_frame)   # frame in hand -> messages sent: exec + the daemon's own work
      if not info.valid: self.stats.count('invalid')

def main(argv: list[str] | None = None) -> NoReturn:
  args = parse_args(argv)
  setup_logging(args.log_level)
  set_process_title('modeld')
  stop = StopFlag()
  from modelrt.artifact import ArtifactError
  try: rc = ModelD(args, stop).run()
  except ArtifactError as e:
    log.error("ArtifactError: %s", e)
    rc = EX_CONFIG
  exit_now(rc)   # sockets closed and mappings released by now

if __name__ == '__main__': sys.exit(main())
