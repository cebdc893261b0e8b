"""The services table: the single source of truth for every pub/sub topic's rate, logging and queue size, and for the
cameras. Names, rates, logging, qlog decimation and queue sizes are openpilot's for the services listed here: both
sides of an endpoint must map queue files of one size.
"""
from dataclasses import dataclass
from msgq.visionipc import VisionStreamType

BIG, SMALL = 10 * 1024 * 1024, 250 * 1024   # openpilot's QueueSize tiers (bytes of queue per endpoint)

@dataclass(frozen=True)
class Service:
  frequency: float   # Hz the producer publishes at (SubMaster's alive/freq checks use it)
  should_log: bool   # the recorder records it by default
  decimation: int | None = None   # qlog keeps every Nth message (None: not in the qlog)
  queue_size: int = SMALL         # bytes of queue (msgq's segment size); a message may take a third of it

SERVICES: dict[str, Service] = {
  # model outputs
  "modelV2": Service(20., True, None, BIG),   # drivingModelData is the model's qlog message
  "drivingModelData": Service(20., True, 10),
  "cameraOdometry": Service(20., True, 10),
  "driverStateV2": Service(20., True, 10),
  "driverMonitoringState": Service(20., True, 10),
  # camera states, one per VisionIPC frame
  "roadCameraState": Service(20., True, 20),
  "wideRoadCameraState": Service(20., True, 20),
  "driverCameraState": Service(20., True, 20),
  # where each encoded frame is in a segment's video: the recorder writes them with the video, nobody subscribes
  "roadEncodeIdx": Service(20., False, 1),
  "wideRoadEncodeIdx": Service(20., False, 1),
  "driverEncodeIdx": Service(20., False, 1),
  # the encoded frames themselves, as a comma device's encoder publishes them (camerad's bridge source reads them)
  "roadEncodeData": Service(20., False, None, BIG),
  "wideRoadEncodeData": Service(20., False, None, BIG),
  "driverEncodeData": Service(20., False, None, BIG),
  # what the daemons read
  "liveCalibration": Service(4., True, 4),
  "carState": Service(100., True, 10),
  "carControl": Service(100., True, 10),
  "selfdriveState": Service(100., True, 10),
  "deviceState": Service(2., True, 1),
  "liveDelay": Service(4., True, 1),
}

# what each model daemon publishes for a frame it runs, the answer first: its frameId is the frame's (modeld's: its main
# camera's, see road_streams; the wide frame's id is modelV2.frameIdExtra when there is a road camera)
MODELD_OUTPUTS = ("modelV2", "drivingModelData", "cameraOdometry")
DMONITORINGD_OUTPUTS = ("driverStateV2", "driverMonitoringState")
DAEMON_OUTPUTS = MODELD_OUTPUTS + DMONITORINGD_OUTPUTS
# what each model daemon subscribes to: messages from the car and the other daemons, and the camera states
MODELD_INPUTS = ("deviceState", "carState", "roadCameraState", "wideRoadCameraState", "liveCalibration", "driverMonitoringState",
                 "carControl", "liveDelay")
DMONITORINGD_INPUTS = ("liveCalibration", "carState", "selfdriveState", "driverCameraState")

@dataclass(frozen=True)
class Camera:
  stream: int        # VisionIPC stream type
  state: str         # camera-state service, one FrameData per frame
  encode_idx: str    # EncodeIndex service of its video
  encode_data: str   # EncodeData service of its encoded frames on a device
  video: str         # the video file in a route segment (HEVC)
  outputs: tuple[str, ...]   # what the daemon that runs its frames publishes (MODELD_OUTPUTS or DMONITORINGD_OUTPUTS)

  @property
  def answer(self) -> str:
    """The output whose frameId names the frame it was computed from."""
    return self.outputs[0]

# openpilot's cameras
CAMERAS: dict[str, Camera] = {
  "road": Camera(VisionStreamType.ROAD, "roadCameraState", "roadEncodeIdx", "roadEncodeData", "fcamera.hevc", MODELD_OUTPUTS),
  "driver": Camera(VisionStreamType.DRIVER, "driverCameraState", "driverEncodeIdx", "driverEncodeData", "dcamera.hevc", DMONITORINGD_OUTPUTS),
  "wide": Camera(VisionStreamType.WIDE_ROAD, "wideRoadCameraState", "wideRoadEncodeIdx", "wideRoadEncodeData", "ecamera.hevc", MODELD_OUTPUTS),
}
CAMERA_OF_STREAM = {c.stream: name for name, c in CAMERAS.items()}
CAMERA_STATE_SERVICES = {c.stream: c.state for c in CAMERAS.values()}
STREAM_OF_STATE = {c.state: c.stream for c in CAMERAS.values()}
ANSWERS = tuple(dict.fromkeys(c.answer for c in CAMERAS.values()))   # modelV2, driverStateV2: one per frame a daemon runs

def road_streams(streams) -> tuple[int, ...] | None:
  """The streams the road model takes of those served, main first: road (wide road when there is no road), then wide
  road as the extra camera; None without either. modelV2 answers the main camera's frame, and with two streams modeld
  runs a frame of each together. The one place that decides the one-camera case: with one stream, the frame sync and
  the runner read the same buffer for both."""
  road, wide = CAMERAS["road"].stream, CAMERAS["wide"].stream
  if road in streams: return (road, wide) if wide in streams else (road,)
  return (wide,) if wide in streams else None

def answer_streams(services, streams) -> dict[str, int]:
  """The stream whose frame id each of `services` carries when the daemons run frames of `streams`: dmonitoringd's
  outputs the driver's, any other the road model's main stream (see road_streams). Services whose stream is not
  served are left out."""
  main, driver = (road_streams(streams) or (None,))[0], CAMERAS["driver"].stream
  return {s: st for s in services if (st := driver if s in DMONITORINGD_OUTPUTS else main) in streams}
