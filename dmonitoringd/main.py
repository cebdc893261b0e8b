"""dmonitoringd: driver camera -> driver monitoring model -> driverStateV2 and driverMonitoringState at the camera's rate.

Start-up: verify the dm artifact and load its model (a bad one exits 78 at once), wait for the camera server's driver
stream (polled every 0.1 s), connect (conflated: always the newest frame), load the warp for the buffer layout, one
warm-up replay, READY=1. Every frame: Y-plane warp to the model's 1440x960 input with liveCalibration.rpyCalib as the
model's calib input, parse both driver sides, publish driverStateV2, then the policy's driverMonitoringState (face,
distraction, awareness, isRHD; modeld reads isRHD). A frame whose outputs cannot be parsed is skipped; 20 in a row exit 78.
gpuExecutionTime is the wall time of the warp + model replays and the copy-out (on the CPU backend there is no separate
device clock); modelExecutionTime adds parsing. A bad calibration, a torn frame or non-finite outputs publish valid=False.
"""
from __future__ import annotations
import logging, sys, time
import numpy as np
from common.daemon import RECV_TIMEOUT_MS, ModelDaemon, finite_outputs, main as daemon_main

log = logging.getLogger('dmonitoringd')

class DMonitoringD(ModelDaemon):
  name, family = 'dmonitoringd', 'dm'
  PUBLISHES = ['driverStateV2', 'driverMonitoringState']
  SUBSCRIBES = ['liveCalibration', 'carState', 'driverCameraState']

  def __init__(self, args, stop):
    super().__init__(args, stop)
    from dmonitoringd.policy import DriverMonitoring
    self.policy, self.state = DriverMonitoring(), None

  def clients(self, streams: set[int]) -> list | None:
    from msgq.visionipc import VisionIpcClient, DRIVER
    if DRIVER not in streams:
      log.error("camera server %r serves streams %s, not the driver camera (%d); waiting", self.args.camera_server, sorted(streams), DRIVER)
      return None
    return [VisionIpcClient(self.args.camera_server, DRIVER, True)]   # conflated: always the newest frame

  def make_runner(self, layouts: tuple):
    from modelrt.runner import DMRunner
    return DMRunner(self.artifact, layouts[0])

  def serve(self, runner, watch, clients: list) -> None:
    client = clients[0]
    from modelrt.geometry import dm_warp_matrix
    from modelrt.guard import InputSpecError
    from modelrt.calibration import sensor_name, camera_for
    from dmonitoringd.parse import parse_dm_outputs
    from dmonitoringd.fill_msgs import fill_driver_state, fill_monitoring_state
    geometry, transform = None, None

    def messages(out: dict, raw: np.ndarray, buf, t0: float, gpu_time: float, valid: bool, learn: bool) -> tuple[list, float]:
      dm = parse_dm_outputs(out, runner.artifact.contract)
      exec_time = time.perf_counter() - t0
      msgs = [('driverStateV2', fill_driver_state(dm, buf.frame_id, exec_time, gpu_time, valid,
                                                  np.nan_to_num(raw, nan=0., posinf=0., neginf=0.) if self.args.raw_predictions else None))]
      cs = self.sm['carState']
      # the policy learns only from good frames; a bad one repeats the last state, marked invalid
      if learn: self.state = self.policy.update(dm, float(cs.vEgo) if np.isfinite(cs.vEgo) else 0., bool(cs.standstill))
      if self.state is not None: msgs.append(('driverMonitoringState', fill_monitoring_state(self.state, valid)))
      return msgs, exec_time

    while not self.stop:
      self.tick()
      if not client.is_connected():
        log.warning("camera server %r restarted or went away: reconnecting", self.args.camera_server)
        return
      if (buf := client.recv(RECV_TIMEOUT_MS)) is None:
        if watch.changed(): return
        continue
      watch.frame()
      self.update_inputs()
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
      valid = finite and not torn and (self.calib.valid or not self.calib.errors)   # no calibration yet is fine, a bad one is not
      if (done := self.guard(buf.frame_id, out, messages, raw, buf, t0, gpu_time, valid, finite and not torn)) is None: continue
      msgs, exec_time = done
      for name, msg in msgs: self.pm.send(name, msg)
      self.stats.count('frames')
      self.stats.timing('exec', exec_time)
      self.stats.timing('frame', time.perf_counter() - t0)   # run -> both messages sent
      for k, bad in (('torn', torn), ('nonfinite', not finite), ('invalid', not valid)):
        if bad: self.stats.count(k)

def main(argv: list[str] | None = None) -> None:
  daemon_main(DMonitoringD, argv, __doc__)

if __name__ == '__main__': sys.exit(main())
