"""What dmonitoringd does with one driver frame, with no socket (dmonitoringd feeds it live frames, modeld-batch
recorded ones): the warp to the model's 1440x960 Y input and rpyCalib as its calib input, both driver sides parsed into
driverStateV2, then openpilot's monitoring policy (policy.py) into driverMonitoringState. A bad calibration, a torn
frame or non-finite outputs publish valid=False; the policy steps only on finite, untorn frames."""
from __future__ import annotations
import time
import numpy as np
from cereal.services import DMONITORINGD_INPUTS, DMONITORINGD_OUTPUTS
from transformations.camera import sensor_name, camera_for
from transformations.model import dm_warp_matrix
from modeld_common.frame import FrameModel, FrameRun
from dmonitoringd.fill_msgs import fill_driver_state, fill_monitoring_state
from dmonitoringd.parse import parse_dm_outputs
from dmonitoringd.policy import DriverMonitoring

class DriverModel(FrameModel):
  PUBLISHES, SUBSCRIBES = list(DMONITORINGD_OUTPUTS), list(DMONITORINGD_INPUTS)   # the services table's

  def __init__(self, *args, monitoring: bool = True, **kwargs):
    """monitoring: openpilot's monitoring policy after the model, driverMonitoringState (False: the model alone, as
    openpilot's dmonitoringmodeld)."""
    super().__init__(*args, **kwargs)
    self.monitoring = monitoring
    self.reset()

  @classmethod
  def outputs(cls, monitoring: bool = True) -> list[str]: return cls.PUBLISHES if monitoring else cls.PUBLISHES[:1]

  def reset(self) -> None:
    super().reset()
    self.policy, self.geometry, self.transform = DriverMonitoring() if self.monitoring else None, None, None

  def step(self, buf) -> list:
    """One driver frame (the newest messages already in sm): [(service, message)] to publish."""
    self.update_calibration()
    sensor = sensor_name(str(self.sm['driverCameraState'].sensor), self.sensor, (buf.width, buf.height))
    if self.geometry != (g := (sensor, buf.width, buf.height)):
      self.geometry, self.transform = g, dm_warp_matrix(camera_for(sensor, 'driver', buf.width, buf.height))
      self.log.info("camera sensor %s", sensor)
    if (run := self.run((buf,), buf=buf, calib=self.calib.rpy.astype(np.float32), transform=self.transform)) is None: return []
    # no calibration yet is fine, a bad one is not
    return self.messages(run, self.fill, run.out.finite and not run.torn and (self.calib.valid or not self.calib.errors))

  def fill(self, outputs: dict, run: FrameRun, valid: bool) -> list:
    """driverStateV2 from the outputs, then the policy's driverMonitoringState."""
    (buf,) = run.frames
    dm = parse_dm_outputs(outputs, self.contract)
    msgs = [('driverStateV2', fill_driver_state(dm, buf.frame_id, time.perf_counter() - run.t0, run.run_time, valid,
                                                run.out.raw if self.raw_predictions else None))]
    # the policy steps only on good frames; a bad one publishes its state again, marked invalid. Engaged: as openpilot,
    # selfdriveState.enabled, false until one comes
    if self.policy is None: return msgs
    if run.out.finite and not run.torn:
      self.policy.step(msgs[0][1].driverStateV2, self.sm['carState'], bool(self.sm['selfdriveState'].enabled), self.calib.rpy)
    return msgs + [('driverMonitoringState', fill_monitoring_state(self.policy.state(), valid))]
