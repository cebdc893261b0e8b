"""The frames camerad serves: each stream's frame written into a buffer, with the id and SOF/EOF times it goes out with,
and its camera-state message. modeld-batch serves its segments through these too."""
from __future__ import annotations
import time
from typing import TYPE_CHECKING
import numpy as np
from cereal import log as capnp_log, messaging
from cereal.services import CAMERA_OF_STREAM as CAMERA_OF, road_streams
from msgq.visionipc import NV12Layout
if TYPE_CHECKING: from camerad.sources import Source, Tick

SENSORS = set(capnp_log.FrameData.ImageSensor.schema.enumerants)

class SourceClock:
  """Lockstep frame times: the source's own, not the send time. A log's frames keep their recorded timestamps; other
  sources' start at the first frame's send time and advance by source time. So modeld's frame sync sees the source's
  frame spacing whatever pace the daemons set (and does not wait for a newer frame that lockstep will not send), and
  a replay's outputs carry the log's times. A new loop pass continues one frame period after the last frame."""
  def __init__(self, fps: float):
    self.period, self.shift, self.last = int(1e9 / fps), None, None

  def new_pass(self) -> None: self.shift = None

  def times(self, tick: Tick, stream: int, fill_ns: int) -> tuple[int, int]:
    st = tick.states.get(stream)
    sof, eof = (st.timestampSof, st.timestampEof) if st is not None else (round(tick.t * 1e9), round(tick.t * 1e9) + fill_ns)
    if self.shift is None:
      self.shift = 0 if self.last is None and st is not None else (time.monotonic_ns() if self.last is None else self.last + self.period) - sof
    self.last = sof + self.shift
    return sof + self.shift, eof + self.shift

class FrameWriter:
  """What camerad serves of a tick: each stream's frame written into a buffer, with the frame id and SOF/EOF times it
  goes out with. A frame that cannot be written (a damaged picture) is skipped and counted in the source's `skipped`.
  Ids are the source's index, continued across loop passes; in lockstep each stream's ids are consecutive from its
  first frame on (a log's own up to its first gap): modeld takes a frame after a gap in the ids for one after a drop
  and answers it with nothing, so lockstep would wait forever; for the same reason a road or wide frame whose partner
  is missing (both served) is skipped and counted. Times: the write's own, in lockstep the source's
  (SourceClock). modeld-batch serves its segments through this too, so its frames are numbered and timed as a
  lockstep replay's."""
  def __init__(self, source: Source, lockstep: bool):
    self.source, self.lockstep, self.clock = source, lockstep, SourceClock(source.fps) if lockstep else None
    self.last: dict[int, int] = {}   # each stream's last frame id
    self.offset: int | None = None   # this pass's frame id less the source's index
    pair = set(road_streams(source.streams) or ())
    self.pair = pair if lockstep and len(pair) == 2 else set()   # road and wide, both served: in lockstep, only together

  def new_pass(self) -> None:
    self.offset = None
    if self.clock is not None: self.clock.new_pass()

  def write(self, tick: Tick, bufs: dict[int, tuple[np.ndarray, NV12Layout]]) -> dict[int, tuple[int, int, int]]:
    """Writes the tick's frames into bufs ({stream: (buffer, its layout)}); {stream: (frame id, SOF, EOF)} of those written."""
    if self.offset is None: self.offset = 0 if not self.last else max(self.last.values()) + 1 - tick.index
    sof, written = time.monotonic_ns(), []
    for s, (out, layout) in bufs.items():
      try:
        tick.frames[s](out, layout)
        written.append(s)
      except ValueError as e: self.source.skipped[f"{CAMERA_OF[s]}: {e}"] += 1
    if len(alone := self.pair & set(written)) == 1:   # modeld runs a road frame only with its wide one: alone, it would never be answered
      written.remove(s := alone.pop())
      self.source.skipped[f"{CAMERA_OF[s]}: frame without its {CAMERA_OF[(self.pair - {s}).pop()]} frame (lockstep serves them together)"] += 1
    eof = time.monotonic_ns()
    if tick.ids:   # a device's own ids and times
      self.last.update({s: tick.ids[s][0] for s in written})
      return {s: tick.ids[s] for s in written}
    ids = {s: self.last[s] + 1 if self.lockstep and s in self.last else tick.index + self.offset for s in written}
    self.last.update(ids)
    return {s: (i, *((sof, eof) if self.clock is None else self.clock.times(tick, s, eof - sof))) for s, i in ids.items()}

def camera_state(svc: str, frame_id: int, source_index: int, sof: int, eof: int, processing_s: float, sensor: str, recorded=None):
  """The camera-state message of a frame served as frame_id. frameIdSensor is the frame's index in the source (scene
  frame, video frame, the log's frame id): frame ids can differ from it (a loop continues them, lockstep closes a
  log's gaps), so this is what ties an output back to its source frame."""
  msg = messaging.new_message(svc)
  if recorded is not None: setattr(msg, svc, recorded)   # keep the recorded fields; this run's id and times below
  st = getattr(msg, svc)
  st.frameId, st.frameIdSensor, st.timestampSof, st.timestampEof, st.processingTime = frame_id, source_index, sof, eof, processing_s
  st.sensor = sensor if sensor in SENSORS else "unknown"
  return msg
