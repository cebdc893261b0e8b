"""VisionIPC: zero-copy camera ringbuffers in shared memory (buffer lifecycle: docs/VISIONIPC.md)."""
from enum import IntEnum
from msgq.visionipc.layout import NV12Layout
from msgq.visionipc.buffers import VisionBuf
from msgq.visionipc.server import VisionIpcServer
from msgq.visionipc.client import VisionIpcClient
from msgq.visionipc.wire import endpoint as get_endpoint_name

class VisionStreamType(IntEnum):
  """The stream numbers of openpilot's cameras (cereal.services.CAMERAS names each camera's)."""
  ROAD = 0
  DRIVER = 1
  WIDE_ROAD = 2
  VISION_STREAM_ROAD = ROAD     # openpilot's names, aliases of the same members
  VISION_STREAM_DRIVER = DRIVER
  VISION_STREAM_WIDE_ROAD = WIDE_ROAD

ROAD, DRIVER, WIDE_ROAD = VisionStreamType.ROAD, VisionStreamType.DRIVER, VisionStreamType.WIDE_ROAD

__all__ = ["get_endpoint_name", "NV12Layout", "VisionBuf", "VisionIpcServer", "VisionIpcClient", "VisionStreamType", "ROAD", "DRIVER", "WIDE_ROAD"]
