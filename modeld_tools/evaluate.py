"""Run the reference models on synthetic scenes without the daemons: render -> numpy warp -> model -> parse.

Shared by tests/test_reference_models.py and bench/accuracy.py. `calib` overrides the calibration the warp uses
(the scene's own by default), so a caller can show what a wrong calibration does.
"""
from collections.abc import Callable, Iterator
import numpy as np
from tinygrad import Tensor
from camerad.render import SceneRenderer
from camerad.scene import Scene
from modelrt.constants import FRAME_SKIP
from modelrt.contracts import ROAD_V0_11_1, DM_V0_11_1
from modelrt.geometry import road_warp_matrix, dm_warp_matrix
from modelrt.modeldef import ModelDef
from modelrt.warp import road_warp_np, dm_warp_np
from msgq.visionipc.layout import NV12Layout
from modeld.parse import parse_outputs
from dmonitoringd.parse import parse_dm_outputs

def _cut(out: np.ndarray, md: ModelDef) -> dict[str, np.ndarray]: return {k: out[:, s] for k, s in md.output_slices.items()}

def road_inputs(scene: Scene, frames: range, calib=None, layout: NV12Layout | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
  """(frame, img, big_img) per frame of `frames`: the packed model inputs (1, 12, 128, 256) of the road and wide
  cameras, newest frame and the one FRAME_SKIP earlier (the first frames repeat frame max(i - 4, 0))."""
  rpy = scene.calib if calib is None else calib
  cams = {c: scene.cameras[c] for c in ('road', 'wide')}
  layouts = {c: layout or NV12Layout.packed(cam.width, cam.height) for c, cam in cams.items()}
  rend = {c: SceneRenderer(scene, c, layouts[c]) for c in cams}
  M = {c: road_warp_matrix(rpy, cams[c], wide=(c == 'wide')) for c in cams}
  packed = {}
  def frame(c: str, i: int) -> np.ndarray:
    if (c, i) not in packed: packed[(c, i)] = road_warp_np(rend[c].render(i), M[c], layouts[c])
    return packed[(c, i)]
  for i in frames:
    yield i, *(np.concatenate([frame(c, max(i - FRAME_SKIP, 0)), frame(c, i)])[None] for c in ('road', 'wide'))
    for k in [k for k in packed if k[1] <= i - FRAME_SKIP]: del packed[k]

def run_road(vision: ModelDef, policy: ModelDef, scene: Scene, frames: range, run: Callable | None = None, calib=None) -> list[dict]:
  """Parsed vision + policy outputs per frame (with 'frame' and 'truth'). `run(md, **inputs) -> (1, N) np.ndarray`
  runs a model (eager by default). The policy sees every 4th hidden state as the daemon queues them."""
  run = run or (lambda md, **kw: md.fn(**{k: Tensor(v) for k, v in kw.items()}).numpy())
  shapes = {k: i.shape for k, i in ROAD_V0_11_1.policy.inputs.items()}
  _, history, feature_len = shapes['features_buffer']
  hidden = np.zeros((1, (history - 1) * FRAME_SKIP + 1, feature_len), np.float32)
  desire = np.zeros(shapes['desire_pulse'], np.float32)
  tc = np.zeros(shapes['traffic_convention'], np.float32); tc[0, 0] = 1.0
  res = []
  for i, img, big in road_inputs(scene, frames, calib):
    v = _cut(run(vision, img=img, big_img=big), vision)
    hidden[0, :-1] = hidden[0, 1:]; hidden[0, -1] = v['hidden_state'][0]
    p = _cut(run(policy, features_buffer=np.ascontiguousarray(hidden[:, ::FRAME_SKIP]), desire_pulse=desire, traffic_convention=tc), policy)
    res.append({'frame': i, 'truth': scene.truth(i), **parse_outputs({**v, **p}, ROAD_V0_11_1)})
  return res

def dm_inputs(scene: Scene, frames: range) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
  cam = scene.cameras['driver']
  layout = NV12Layout.packed(cam.width, cam.height)
  rend, M = SceneRenderer(scene, 'driver', layout), dm_warp_matrix(cam)
  calib = np.asarray(scene.calib, np.float32)[None]
  for i in frames: yield i, dm_warp_np(rend.render(i), M, layout), calib

def run_dm(dm: ModelDef, scene: Scene, frames: range, run: Callable | None = None) -> list[dict]:
  run = run or (lambda md, **kw: md.fn(**{k: Tensor(v) for k, v in kw.items()}).numpy())
  return [{'frame': i, 'truth': scene.truth(i), **parse_dm_outputs(_cut(run(dm, input_img=img, calib=calib), dm), DM_V0_11_1)}
          for i, img, calib in dm_inputs(scene, frames)]
