"""modeld: road (+ wide road) camera -> road model -> modelV2, drivingModelData, cameraOdometry at the camera's rate.

The artifact first (a bad one exits 78), then the camera server's streams in openpilot's order: main = road (wide road
when there is none), extra = wide road; each frame synced, run, parsed, filled and published. A camera server restart
reconnects; a layout the artifact has no warp for exits 78 with the build command (docs/ARCHITECTURE.md, Processes)."""
from __future__ import annotations
import sys
from typing import NoReturn, Protocol
from collections.abc import Callable
from cereal.services import road_streams
from modeld_common.daemon import RECV_TIMEOUT_MS, Daemon, parse_args
from modeld.model import RoadModel

SYNC_AHEAD_NS = 25_000_000
OUT_OF_SYNC_NS = 10_000_000

class Frame(Protocol):
  frame_id: int
  timestamp_sof: int

class FrameSync:
  """Main and extra frames paired as openpilot's modeld pairs them: main frames until main.sof >= extra.sof + 25 ms,
  then extra frames until main.sof < extra.sof + 25 ms; more than 10 ms apart is out of sync. A main frame under 25 ms
  ahead is used when no newer one comes within 25 ms (a lockstep camera waits for its answer). next() -> (main, extra,
  out_of_sync), or None when a receive timed out; recv_*: (timeout_ms) -> frame | None, as VisionIpcClient.recv."""
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

def wanted(streams: set[int]) -> list[tuple[int, bool]] | str:
  """main conflated (openpilot: always the newest frame), extra not (the sync pairs it with main)."""
  from msgq.visionipc import ROAD, WIDE_ROAD
  if (use := road_streams(streams)) is None: return f"neither road ({ROAD}) nor wide road ({WIDE_ROAD})"
  return [(s, i == 0) for i, s in enumerate(use)]

def main(argv: list[str] | None = None) -> NoReturn:
  with Daemon('modeld', parse_args(argv, 'modeld', __doc__), RoadModel.PUBLISHES, RoadModel.SUBSCRIBES) as d:
    from modelrt.runner import RoadRunner   # tinygrad reads DEV once: after the options set it
    artifact, models = d.load_artifact('road'), {}
    for cam in d.cameras(wanted):
      main_c, extra_c = cam.clients[0], cam.clients[-1]
      if (model := models.get(cam.layouts)) is None:   # one per set of buffer layouts: its warps, warmed up
        runner = RoadRunner(artifact, main_c.layout, extra_c.layout, threads=d.args.threads)
        runner.warmup()
        model = models[cam.layouts] = RoadModel(runner, main_c.stream, d.subscribe(), d.stats, d.log, d.args.raw_predictions, d.args.sensor)
      d.ready()
      model.reset()
      sync = FrameSync(main_c.recv, extra_c.recv if extra_c is not main_c else None, RECV_TIMEOUT_MS)
      try:
        while cam.active():
          if (frames := sync.next()) is None: continue   # a receive timed out
          main_buf, extra_buf, out_of_sync = frames
          if out_of_sync:
            d.stats.count('out_of_sync')
            d.log.debug("frames out of sync: main %d (%.5f s), extra %d (%.5f s)", main_buf.frame_id, main_buf.timestamp_sof / 1e9,
                        extra_buf.frame_id, extra_buf.timestamp_sof / 1e9)
          cam.frame()
          for name, msg in model.step(main_buf, extra_buf): d.pm.send(name, msg)
      finally: model.runner.release_camera_tensors()   # the tensors over the camera's buffers go before their mappings

if __name__ == '__main__': sys.exit(main())
