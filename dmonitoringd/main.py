"""dmonitoringd: driver camera -> driver monitoring model -> driverStateV2 and driverMonitoringState at the camera's rate.

Start-up: wait for the camera server's driver stream (polled every 0.1 s), connect (conflated: always the newest
frame), load the dm artifact for the buffer layout, one warm-up replay, READY=1. Every frame: Y-plane warp to the
model's 1440x960 input with liveCalibration.rpyCalib as the model's calib input, parse both driver sides, publish
driverStateV2, then the policy's driverMonitoringState (face, distraction, awareness, isRHD; modeld reads isRHD).
gpuExecutionTime is the wall time of the warp + model replays and the copy-out (on the CPU backend there is no separate
device clock); modelExecutionTime adds parsing. A bad calibration, a torn frame or non-finite outputs publish valid=False.
"""
from __future__ import annotations
import logging, sys, time
from typing import NoReturn
import numpy as np
from common.service import Stats, StopFlag, Watchdog, exit_now, notify, set_process_title, setup_logging
from modeld.main import EX_CONFIG, RECV_TIMEOUT_MS, finite_outputs, parse_args

log = logging.getLogger('dmonitoringd')
PUBLISHES = ['driverStateV2', 'driverMonitoringState']
SUBSCRIBES = ['liveCalibration', 'carState', 'driverCameraState']

class DMonitoringD:
  def __init__(self, args, stop: StopFlag):
    from cereal import messaging
    from modeld.calibration import Calibration
    from dmonitoringd.policy import DriverMonitoring
    self.args, self.stop, self.watchdog = args, stop, Watchdog()
    self.stats = Stats(log, args.stats_interval)
    self.pm, self.sm = messaging.PubMaster(PUBLISHES), messaging.SubMaster(SUBSCRIBES)
    self.calib, self.policy, self.state = Calibration(), DriverMonitoring(), None
    self.artifact, self.runners, self.ready = None, {}, False

  def tick(self) -> None:
    self.watchdog.kick()
    self.stats.tick()

  def run(self) -> int:
    from msgq.visionipc import VisionIpcClient, DRIVER
    from modelrt.artifact import load_artifact
    from modelrt.runner import DMRunner
    from common.camera import StreamWatch, wait_for_streams, connect
    try:
      while not self.stop:
        if (streams := wait_for_streams(self.args.camera_server, self.stop, self.tick)) is None: break
        if DRIVER not in streams:
          log.error("camera server %r serves streams %s, not the driver camera (%d); waiting", self.args.camera_server, sorted(streams), DRIVER)
          time.sleep(1)
          continue
        client = VisionIpcClient(self.args.camera_server, DRIVER, True)
        try:
          if not connect([client], self.stop, self.tick): continue
          log.info("connected to %r: driver stream %d (%s)", self.args.camera_server, DRIVER, client.layout)
          if self.artifact is None:
            t = time.perf_counter()
            self.artifact = load_artifact(self.args.artifacts, 'dm')
            log.info("loaded %s in %.2f s (layouts: %s)", self.artifact.dir, time.perf_counter() - t, ', '.join(self.artifact.layouts))
          if (runner := self.runners.get(key := str(client.layout))) is None:
            runner = self.runners[key] = DMRunner(self.artifact, client.layout)
            runner.warmup()
          if not self.ready:
            notify('READY=1', f'STATUS=running on {self.args.camera_server} stream {DRIVER}')
            self.ready = True
            log.info("ready")
          self.serve(runner, StreamWatch(self.args.camera_server, streams), client)
        finally:
          for r in self.runners.values(): r.release_camera_tensors()   # tensors over the buffers go before the mappings
          client.close()
    finally:
      self.pm.close()
      self.sm.close()
    log.info("stopped; totals: %s", self.stats.totals_line())
    return 0

  def serve(self, runner, watch, client) -> None:
    from modelrt.geometry import dm_warp_matrix
    from modelrt.guard import InputSpecError
    from modeld.calibration import sensor_name, camera_for
    from dmonitoringd.parse import parse_dm_outputs
    from dmonitoringd.fill_msgs import fill_driver_state, fill_monitoring_state
    geometry, transform = None, None
    while not self.stop:
      self.tick()
      if not client.is_connected():
        log.warning("camera server %r restarted or went away: reconnecting", self.args.camera_server)
        return
      if (buf := client.recv(RECV_TIMEOUT_MS)) is None:
        if watch.changed(): return
        continue
      watch.frame()
      self.sm.update(0)
      if self.sm.updated['liveCalibration']: self.calib.update(self.sm['liveCalibration'].rpyCalib)
      sensor = sensor_name(str(self.sm['driverCameraState'].sensor), self.args.sensor)
      if geometry != (g := (sensor, buf.width, buf.height)):
        geometry, transform = g, dm_warp_matrix(camera_for(sensor, 'driver', buf.width, buf.height))
        log.info("camera sensor %s", sensor)

      t0 = time.perf_counter()
      try: out = runner.run(buf, self.calib.rpy.astype(np.float32), transform)
      except InputSpecError as e:
        self.stats.count('bad_input')
        log.error("frame %d skipped: %s", buf.frame_id, e)
        continue
      gpu_time = time.perf_counter() - t0
      torn = buf.overwritten()
      raw = out.pop('raw')
      out, finite = finite_outputs(out)
      dm = parse_dm_outputs(out)
      exec_time = time.perf_counter() - t0
      valid = finite and not torn and (self.calib.valid or not self.calib.errors)   # no calibration yet is fine, a bad one is not
      self.pm.send('driverStateV2', fill_driver_state(dm, buf.frame_id, exec_time, gpu_time, valid,
                                                      np.nan_to_num(raw, nan=0., posinf=0., neginf=0.) if self.args.raw_predictions else None))
      cs = self.sm['carState']
      # the policy learns only from good frames; a bad one repeats the last state, marked invalid
      if finite and not torn: self.state = self.policy.update(dm, float(cs.vEgo) if np.isfinite(cs.vEgo) else 0., bool(cs.standstill))
      if self.state is not None: self.pm.send('driverMonitoringState', fill_monitoring_state(self.state, buf.frame_id, valid))
      self.stats.count('frames')
      self.stats.timing('exec', exec_time)
      self.stats.timing('frame', time.perf_counter() - t0)   # run -> both messages sent
      for k, bad in (('torn', torn), ('nonfinite', not finite), ('invalid', not valid)):
        if bad: self.stats.count(k)

def main(argv: list[str] | None = None) -> NoReturn:
  args = parse_args(argv, 'dmonitoringd', __doc__)
  setup_logging(args.log_level)
  set_process_title('dmonitoringd')
  stop = StopFlag()
  from modelrt.artifact import ArtifactError
  try: rc = DMonitoringD(args, stop).run()
  except ArtifactError as e:
    log.error("ArtifactError: %s", e)
    rc = EX_CONFIG
  exit_now(rc)   # sockets closed and mappings released by now

if __name__ == '__main__': sys.exit(main())
