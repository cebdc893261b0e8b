"""dmonitoringd: driver camera -> driver monitoring model -> driverStateV2, then openpilot's monitoring policy ->
driverMonitoringState, at the camera's rate: openpilot's dmonitoringmodeld and dmonitoringd in one process, so the
policy sees each frame's driver state without a hop. Start-up, restarts and exit codes as modeld's
(docs/ARCHITECTURE.md, Processes)."""
from __future__ import annotations
import sys
from typing import NoReturn
from modeld_common.daemon import RECV_TIMEOUT_MS, Daemon, parse_args
from dmonitoringd.model import DriverModel

def wanted(streams: set[int]) -> list[tuple[int, bool]] | str:
  from msgq.visionipc import DRIVER
  return [(DRIVER, True)] if DRIVER in streams else f"not the driver camera ({DRIVER})"   # conflated: always the newest frame

def main(argv: list[str] | None = None) -> NoReturn:
  args = parse_args(argv, 'dmonitoringd', __doc__)
  with Daemon('dmonitoringd', args, DriverModel.outputs(monitoring := not args.model_only), DriverModel.SUBSCRIBES) as d:
    from modelrt.runner import DMRunner   # tinygrad reads DEV once: after the options set it
    artifact, models = d.load_artifact('dm'), {}
    for cam in d.cameras(wanted):
      (client,) = cam.clients
      if (model := models.get(cam.layouts)) is None:   # one per buffer layout: its warp, warmed up
        runner = DMRunner(artifact, client.layout, threads=d.args.threads)
        runner.warmup()
        model = models[cam.layouts] = DriverModel(runner, d.subscribe(), d.stats, d.log, d.args.raw_predictions, d.args.sensor, monitoring=monitoring)
      d.ready()
      model.reset()
      try:
        while cam.active():
          if (buf := client.recv(RECV_TIMEOUT_MS)) is None: continue   # timed out
          cam.frame()
          for name, msg in model.step(buf): d.pm.send(name, msg)
      finally: model.runner.release_camera_tensors()   # the tensors over the camera's buffers go before their mappings

if __name__ == '__main__': sys.exit(main())
