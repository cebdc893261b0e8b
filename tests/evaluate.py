"""The reference models on synthetic scenes as the daemons run them, without processes or sockets: frames rendered into
host buffers, modelrt.runner's RoadRunner / DMRunner on the daemons' artifact (histories from zeros), the daemons' parsers.
Shared by tests/test_reference_models.py and bench/accuracy.py. The inputs modeld takes from messages are fixed: the
scene's calibration (`calib` overrides it, to show what a wrong one does), no desire, left-hand traffic.
"""
import functools, time
from collections.abc import Sequence
import numpy as np
from camerad.render import SceneRenderer
from camerad.scene import Scene
from modelrt.artifact import Artifact, load_artifact
from modelrt.constants import DESIRE_LEN
from transformations.model import road_warp_matrix, dm_warp_matrix
from modelrt.runner import DMRunner, HostBuf, RoadRunner
from msgq.visionipc import DRIVER, ROAD, WIDE_ROAD
from msgq.visionipc.layout import NV12Layout
from modeld.parse import parse_outputs
from dmonitoringd.parse import parse_dm_outputs
from tests.artifacts import CACHE, build

@functools.cache
def _artifacts(sizes: tuple[tuple[int, int], ...]) -> dict[str, Artifact]:
  out = build(CACHE.parent / f"scenes-{'-'.join(f'{w}x{h}' for w, h in sizes)}", tuple(NV12Layout.packed(w, h) for w, h in sizes))
  return {family: load_artifact(out, family) for family in ('road', 'dm')}

def scene_artifacts(scene: Scene) -> dict[str, Artifact]:
  """The reference models' artifacts ('road', 'dm') for the scene's camera sizes in packed layouts (camerad's default),
  built once into .cache/scenes-<sizes> and loaded once per process."""
  return _artifacts(tuple(sorted({(c.width, c.height) for c in scene.cameras.values()})))

def _layout(scene: Scene, camera: str) -> NV12Layout:
  cam = scene.cameras[camera]
  return NV12Layout.packed(cam.width, cam.height)

def run_road(scene: Scene, frames: range, calib: Sequence[float] | None = None) -> list[dict]:
  """Parsed vision + policy outputs of each frame of `frames`, with 'frame', 'truth' and 'run_time' (seconds of the
  runner's call: warps, models, copy-out). The runner sees every frame from 0 to the last of `frames`, as modeld sees a
  camera from its first frame: the history of a frame is the frames before it."""
  art = scene_artifacts(scene)['road']
  layouts = {c: _layout(scene, c) for c in ('road', 'wide')}
  runner = RoadRunner(art, layouts['road'], layouts['wide'])
  rpy = scene.calib if calib is None else calib
  runner.set_transforms(road_warp_matrix(rpy, scene.cameras['road']), road_warp_matrix(rpy, scene.cameras['wide'], wide=True))
  render = {c: SceneRenderer(scene, c, layouts[c]) for c in layouts}
  # one buffer per camera, rendered into in place: the runner's tensor over it is made once, as over a camera's buffers
  bufs = {c: HostBuf(layouts[c], stream=s, idx=0) for c, s in (('road', ROAD), ('wide', WIDE_ROAD))}
  desire, traffic = np.zeros(DESIRE_LEN, np.float32), np.array([1, 0], np.float32)
  wanted, res = set(frames), []
  for i in range(max(frames) + 1):
    for c, r in render.items(): r.render(i, bufs[c].data)
    t = time.perf_counter()
    out = runner.run(bufs['road'], bufs['wide'], desire, traffic)
    run_time = time.perf_counter() - t
    if i in wanted: res.append({'frame': i, 'truth': scene.truth(i), 'run_time': run_time, **parse_outputs(out.outputs, art.contract)})
  return res

def run_dm(scene: Scene, frames: range) -> list[dict]:
  """Parsed driver-monitoring outputs of each frame of `frames`, with 'frame', 'truth' and 'run_time' (the driver model
  keeps no history: each frame is run alone)."""
  art = scene_artifacts(scene)['dm']
  layout = _layout(scene, 'driver')
  runner, render = DMRunner(art, layout), SceneRenderer(scene, 'driver', layout)
  buf = HostBuf(layout, stream=DRIVER, idx=0)
  transform, calib = dm_warp_matrix(scene.cameras['driver']), np.asarray(scene.calib, np.float32)
  res = []
  for i in frames:
    render.render(i, buf.data)
    t = time.perf_counter()
    out = runner.run(buf, calib, transform)
    run_time = time.perf_counter() - t
    res.append({'frame': i, 'truth': scene.truth(i), 'run_time': run_time, **parse_dm_outputs(out.outputs, art.contract)})
  return res
