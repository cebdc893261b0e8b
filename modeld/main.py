"""modeld: road (+ wide road) camera -> road model -> modelV2, drivingModelData, cameraOdometry at the camera's rate.

Start-up: verify the road artifact and load its models (a bad one exits 78 at once); then, in openpilot's order, wait
for the camera server's streams (polled every 0.1 s); main camera = road (wide road when there is none, conflated),
extra = wide road (not conflated); connect; then load the warps for the connected buffer layouts and run one warm-up
replay; then READY=1. Every frame: sync main and extra by start of frame, then the road model's step (modeld/model.py):
count drops (a frame after a drop only feeds the history), run, check, parse, publish (a frame whose outputs cannot
be parsed is skipped; 20 in a row exit 78). Until a good calibration arrives the default one is used and outputs are
published valid=False. A camera server restart drops the tensors over the old buffers, unmaps them, reconnects and
resets the history; a buffer layout the artifact has no warp for ends the process with exit code 78 (EX_CONFIG) and
the build command.
"""
from __future__ import annotations
import sys
from modeld_common.daemon import RECV_TIMEOUT_MS, ModelDaemon, main as daemon_main
from cereal.services import road_streams
from modeld.model import RoadModel

class ModelD(ModelDaemon):
  name, family, MODEL = 'modeld', 'road', RoadModel

  def clients(self, streams: set[int]) -> list | None:
    """main conflated (openpilot: always the newest frame), extra not (the sync pairs it with main)."""
    from msgq.visionipc import VisionIpcClient, ROAD, WIDE_ROAD
    if (use := road_streams(streams)) is None:
      self.log.error("camera server %r serves streams %s, neither road (%d) nor wide road (%d); waiting", self.args.camera_server,
                     sorted(streams), ROAD, WIDE_ROAD)
      return None
    return [VisionIpcClient(self.args.camera_server, s, i == 0) for i, s in enumerate(use)]

  def make_model(self, clients: list) -> RoadModel:
    from modelrt.runner import RoadRunner
    return RoadModel(RoadRunner(self.artifact, *(c.layout for c in clients)), clients[0].stream, self.sm, self.stats, self.log,
                     self.args.raw_predictions, self.args.sensor)

  def receiver(self, clients: list):
    """(main, extra) synced by start of frame; with one camera, (main, main)."""
    from modeld.sync import FrameSync
    sync = FrameSync(clients[0].recv, clients[1].recv if len(clients) > 1 else None, RECV_TIMEOUT_MS)
    def receive():
      if (frames := sync.next()) is None: return None
      main, extra, out_of_sync = frames
      if out_of_sync:
        self.stats.count('out_of_sync')
        self.log.debug("frames out of sync: main %d (%.5f s), extra %d (%.5f s)", main.frame_id, main.timestamp_sof / 1e9,
                       extra.frame_id, extra.timestamp_sof / 1e9)
      return main, extra
    return receive

def main(argv: list[str] | None = None) -> None:
  daemon_main(ModelD, argv, __doc__)

if __name__ == '__main__': sys.exit(main())
