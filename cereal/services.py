"""The services table: the single source of truth for every pub/sub topic's rate, logging and size."""
from dataclasses import dataclass

@dataclass(frozen=True)
class Service:
  frequency: float   # Hz the producer publishes at (SubMaster's alive/freq checks use it)
  should_log: bool   # the recorder records it by default
  decimation: int | None = None   # record every Nth message in a decimated log (None: not in it)
  max_size: int = 64 * 1024       # bytes: larger messages are refused by subscribers of this service

MiB = 1024 * 1024
SERVICES: dict[str, Service] = {
  # model outputs; rawPredictions can make modelV2/driverStateV2 large
  "modelV2": Service(20., True, 20, 4 * MiB),
  "drivingModelData": Service(20., True, 10),
  "cameraOdometry": Service(20., True, 5),
  "driverStateV2": Service(20., True, 10, 4 * MiB),
  "driverMonitoringState": Service(20., True, 20),
  # camera states, one per VisionIPC frame
  "roadCameraState": Service(20., True, 20),
  "wideRoadCameraState": Service(20., True, 20),
  "driverCameraState": Service(20., True, 20),
  # what the daemons read
  "liveCalibration": Service(4., True, 4),
  "carState": Service(100., True, 10),
  "carControl": Service(100., True, 10),
  "deviceState": Service(2., True, 1),
  "liveDelay": Service(4., True, 1),
}
# camera-state service of each VisionIPC stream (ROAD=0, DRIVER=1, WIDE_ROAD=2)
CAMERA_STATE_SERVICES = {0: "roadCameraState", 1: "driverCameraState", 2: "wideRoadCameraState"}
