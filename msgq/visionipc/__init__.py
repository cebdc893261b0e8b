"""VisionIPC: zero-copy camera ringbuffers in shared memory (buffer lifecycle: docs/VISIONIPC.md)."""
from enum import IntEnum
from msgq.visionipc.layout import NV12Layout
from msgq.visionipc.buffers import VisionBuf
from msgq.visionipc.server import VisionIpcServer
from msgq.visionipc.client import VisionIpcClient

class VisionStreamType(IntEnum):
  ROAD = 0
  DRIVER = 1
  WIDE_ROAD = 2
  VISION_STREAM_ROAD = 0        # openpilot's names
  VISION_STREAM_DRIVER = 1
  VISION_STREAM_WIDE_ROAD = 2

ROAD, DRIVER, WIDE_ROAD = VisionStreamType.ROAD, VisionStreamType.DRIVER, VisionStreamType.WIDE_ROAD

__all__ = ["NV12Layout", "VisionBuf", "VisionIpcServer", "VisionIpcClient", "VisionStreamType", "ROAD", "DRIVER", "WIDE_ROAD"]
