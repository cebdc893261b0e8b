"""What the route benchmarks share: a route of a shipped synthetic scene written with the project's route writer, and
bare runner replays as the baseline."""
import time
import numpy as np

def write_route(path, scene_name: str, frames: int, segments: int = 1) -> None:
  """Road, wide road and driver at the scene's size (HEVC), with camera states, EncodeIdx, carState (every frame) and
  liveCalibration (every 5th) events; `frames` per segment."""
  from camerad.render import SceneRenderer
  from camerad.scene import load_scene
  from cereal import messaging
  from cereal.services import CAMERAS
  from msgq.visionipc.layout import NV12Layout
  from oproute.video import HevcWriter, picture
  from oproute.writer import RouteWriter
  scene, route, t0 = load_scene(scene_name), RouteWriter(path), time.monotonic_ns()
  renderers = {c: SceneRenderer(scene, c, NV12Layout.packed(scene.cameras[c].width, scene.cameras[c].height)) for c in ('road', 'wide', 'driver')}
  def event(seg: int, svc: str, t: int, **fields) -> None:
    msg = messaging.new_message(svc, logMonoTime=t)
    for k, v in fields.items(): setattr(getattr(msg, svc), k, v)
    route.write(seg, svc, msg.to_bytes())
  for seg in range(segments):
    route.open_segment(seg)
    writers = {c: HevcWriter(route.segment_dir(seg) / CAMERAS[c].video, r.layout.width, r.layout.height) for c, r in renderers.items()}
    def index(seg: int, c: str, encoded) -> None:
      for e in encoded: route.write(seg, CAMERAS[c].encode_idx, e.index_event(c, seg, e.frame_id, e.timestamp_eof + 1))
    for i in range(seg * frames, (seg + 1) * frames):
      t = t0 + i * 50_000_000
      event(seg, 'carState', t, vEgo=scene.truth(i % scene.n_frames)['v_ego'])
      if i % 5 == 0: event(seg, 'liveCalibration', t, rpyCalib=list(scene.calib), calStatus='calibrated')
      for c, r in renderers.items():
        event(seg, CAMERAS[c].state, t + 1, frameId=i, timestampSof=t, timestampEof=t + 1, sensor=scene.sensor)
        index(seg, c, writers[c].write(picture(r.render(i % scene.n_frames), r.layout), i, t, t + 1))
    for c, w in writers.items(): index(seg, c, w.close())
    route.close_segment(seg)

def bare_rates(art, layout, n: int = 40) -> dict[str, float]:
  """Frames/s of bare RoadRunner / DMRunner replays on host buffers (after warm-up)."""
  from msgq.visionipc import ROAD, WIDE_ROAD, DRIVER
  from modelrt.artifact import load_artifact
  from modelrt.runner import RoadRunner, DMRunner, HostBuf
  rng = np.random.default_rng(0)
  bufs = {s: [HostBuf(layout, rng.integers(0, 256, layout.size, dtype=np.uint8), s, i) for i in range(4)] for s in (ROAD, WIDE_ROAD, DRIVER)}
  road, dm = RoadRunner(load_artifact(art, 'road'), layout, layout), DMRunner(load_artifact(art, 'dm'), layout)
  road.set_transforms(np.eye(3), np.eye(3))
  road.warmup(), dm.warmup()
  desire, traffic, out = np.zeros(8, np.float32), np.array([1, 0], np.float32), {}
  for name, run in (('modeld', lambda i: road.run(bufs[ROAD][i % 4], bufs[WIDE_ROAD][i % 4], desire, traffic)),
                    ('dmonitoringd', lambda i: dm.run(bufs[DRIVER][i % 4], np.zeros(3, np.float32), np.eye(3)))):
    t = time.perf_counter()
    for i in range(n): run(i)
    out[name] = n / (time.perf_counter() - t)
  return out

