"""Camera frame sync and dropped-frame accounting, as openpilot's modeld does them.

Sync: receive main frames until main.sof >= extra.sof + 25 ms (at least one new main frame), then extra frames
until main.sof < extra.sof + 25 ms; more than 10 ms apart is out of sync. One camera: extra is main. A main frame under
25 ms ahead is used when no newer one comes within 25 ms: a camera faster than 40 Hz would have sent one, so this is a
lockstep camera waiting for the answer to this frame, which openpilot would wait for forever.
Drops: dropped = max(0, frame_id - last_frame_id - 1); a first-order filter (10 s, a model period DT per step) of min(dropped, 10),
held at 0 for the first 10 runs, gives f; frameDropPerc = 100 f / (1 + f). A frame after any drop is prepare-only. The
first frame of a camera session follows no frame, so nothing was dropped before it (openpilot counts from frame id 0,
which would make a replay that starts mid-route skip its first frame and a lockstep camera wait for it forever).
"""
from __future__ import annotations
from typing import Protocol
from collections.abc import Callable
from modelrt.constants import DT

SYNC_AHEAD_NS = 25_000_000
OUT_OF_SYNC_NS = 10_000_000
DROP_FILTER_RC, DROP_MAX, DROP_WARMUP_RUNS = 10., 10, 10

class Frame(Protocol):
  frame_id: int
  timestamp_sof: int

class FrameSync:
  """next() -> (main, extra, out_of_sync) or None when a receive timed out (nothing to run this time).
  recv_*: (timeout_ms) -> frame | None, as VisionIpcClient.recv; timeout_ms: how long a receive waits."""
  def __init__(self, recv_main: Callable[[int], Frame | None], recv_extra: Callable[[int], Frame | None] | None, timeout_ms: int):
    self.recv_main, self.recv_extra, self.timeout_ms = recv_main, recv_extra, timeout_ms
    self.main_sof = self.extra_sof = 0
    self.pending: Frame | None = None   # a main frame whose extra frame has not come yet

  def next(self) -> tuple[Frame, Frame, bool] | None:
    main, self.pending = self.pending, None
    while main is None or self.main_sof < self.extra_sof + SYNC_AHEAD_NS:
      if (newer := self.recv_main(self.timeout_ms if main is None else SYNC_AHEAD_NS // 1_000_000)) is None:
        if main is None: return None
        break   # holding a main frame under 25 ms ahead and no newer one within 25 ms: use it
      main, self.main_sof = newer, newer.timestamp_sof
    if self.recv_extra is None:
      self.extra_sof = main.timestamp_sof
      return main, main, False
    while True:
      if (extra := self.recv_extra(self.timeout_ms)) is None:
        # keep the main frame: a camera that sends the next frame only once this one is answered (lockstep) would
        # otherwise wait for us forever; a newer main frame replaces it at the next call anyway if one comes
        self.pending = main
        return None
      self.extra_sof = extra.timestamp_sof
      if self.main_sof < self.extra_sof + SYNC_AHEAD_NS: break
    return main, extra, abs(self.main_sof - self.extra_sof) > OUT_OF_SYNC_NS

class FrameDrops:
  """update(frame_id) -> frames dropped before this one; frame_drop_perc is the filtered percentage."""
  def __init__(self):
    self.last_frame_id, self.runs, self.x, self.frame_drop_perc = None, 0, 0., 0.
    self.alpha = DT / (DROP_FILTER_RC + DT)   # stepped once per main camera frame received

  def update(self, frame_id: int) -> int:
    dropped = 0 if self.last_frame_id is None else max(0, frame_id - self.last_frame_id - 1)
    self.x = (1 - self.alpha) * self.x + self.alpha * min(dropped, DROP_MAX)
    if self.runs < DROP_WARMUP_RUNS: self.x = 0.   # the first frames after a (re)start: no drop history yet
    self.runs += 1
    self.last_frame_id = frame_id
    self.frame_drop_perc = 100 * self.x / (1 + self.x)
    return dropped
