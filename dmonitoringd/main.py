"""dmonitoringd: driver camera -> driver monitoring model -> driverStateV2 and driverMonitoringState at the camera's rate.

Start-up: verify the dm artifact and load its model (a bad one exits 78 at once), wait for the camera server's driver
stream (polled every 0.1 s), connect (conflated: always the newest frame), load the warp for the buffer layout, one
warm-up replay, READY=1. Every frame: the driver model's step (dmonitoringd/model.py): Y-plane warp to the model's
1440x960 input with liveCalibration.rpyCalib as the model's calib input, parse both driver sides, publish
driverStateV2, then openpilot's monitoring policy's driverMonitoringState (face, distraction, awareness, isRHD; modeld
reads isRHD). A frame whose outputs cannot be parsed is skipped; 20 in a row exit 78. A bad calibration, a torn frame
or non-finite outputs publish valid=False.
"""
from __future__ import annotations
import sys
from modeld_common.daemon import RECV_TIMEOUT_MS, ModelDaemon, main as daemon_main
from dmonitoringd.model import DriverModel

class DMonitoringD(ModelDaemon):
  name, family, MODEL = 'dmonitoringd', 'dm', DriverModel

  def clients(self, streams: set[int]) -> list | None:
    from msgq.visionipc import VisionIpcClient, DRIVER
    if DRIVER not in streams:
      self.log.error("camera server %r serves streams %s, not the driver camera (%d); waiting", self.args.camera_server, sorted(streams), DRIVER)
      return None
    return [VisionIpcClient(self.args.camera_server, DRIVER, True)]   # conflated: always the newest frame

  def make_model(self, clients: list) -> DriverModel:
    from modelrt.runner import DMRunner
    return DriverModel(DMRunner(self.artifact, clients[0].layout), self.sm, self.stats, self.log, self.args.raw_predictions, self.args.sensor)

  def receiver(self, clients: list):
    client = clients[0]
    return lambda: None if (buf := client.recv(RECV_TIMEOUT_MS)) is None else (buf,)

def main(argv: list[str] | None = None) -> None:
  daemon_main(DMonitoringD, argv, __doc__)

if __name__ == '__main__': sys.exit(main())
