"""What the daemons run every frame: camera buffers in, numpy outputs out, through guarded JITs loaded from an artifact.

RoadRunner (modeld): road and wide warps, vision, the frame history, policy; DMRunner (dmonitoringd): driver warp + DM
model. Camera buffers are CameraBuffers: VisionIPC's VisionBuf, or a HostBuf.
"""
from __future__ import annotations
import os
from dataclasses import dataclass
import numpy as np
from tinygrad import Tensor, dtypes
from tinygrad.device import Buffer
from msgq.visionipc.layout import NV12Layout
from modelrt.artifact import Artifact, load_artifact
from transformations.model import MODEL_HEIGHT, MODEL_WIDTH
from modelrt.constants import DESIRE_LEN, TRAFFIC_CONVENTION_LEN, FRAME_SKIP, IMG_CHANNELS, IMG_QUEUE_LEN
from modelrt.replay import ALIGN, CameraBuffer, CameraTensors, Replay, buffer_of

IMG_QUEUE_SHAPE = (1, IMG_QUEUE_LEN * IMG_CHANNELS, MODEL_HEIGHT // 2, MODEL_WIDTH // 2)   # 5 packed frames, in the warp JIT's state

def aligned_empty(nbytes: int, align: int = ALIGN) -> np.ndarray:
  """A uint8 array whose data pointer is `align`-byte aligned, as from_blob kernels need."""
  raw = np.empty(nbytes + align, np.uint8)
  off = -raw.ctypes.data % align
  return raw[off:off + nbytes]

def host_tensor(arr: np.ndarray) -> Tensor:
  """A Tensor sharing a numpy array's memory (NPY device): in-place writes to the array are seen at the next replay."""
  return Tensor(arr, device='NPY')

def zero_tensor(t: Tensor) -> None:
  (b := buffer_of(t)).copy_from(Buffer('PYTHON', b.size, b.dtype, opaque=memoryview(bytearray(b.nbytes))))

class HostBuf:
  """A camera buffer in host memory offering what the runners read of VisionIPC's VisionBuf: for warm-up, batch replays,
  benchmarks and tests. image: its bytes (default zeros); idx < 0: never cached; offset: the address this many bytes
  past an ALIGN boundary."""
  def __init__(self, layout: NV12Layout, image: np.ndarray | None = None, stream: int = -1, idx: int = -1, offset: int = 0):
    self.data = aligned_empty(layout.size + offset)[offset:]
    self.data[:] = 0 if image is None else image
    self.addr, self.idx, self.stream, self.layout = self.data.ctypes.data, idx, stream, layout
    self.width, self.height, self.stride, self.uv_offset, self.size = layout.width, layout.height, layout.stride, layout.uv_offset, layout.size

def _host(*shape: int) -> tuple[np.ndarray, Tensor]:
  a = np.zeros(shape, np.float32)
  return a, host_tensor(a)

def _open(artifact: Artifact | str | os.PathLike, family: str) -> Artifact:
  return artifact if isinstance(artifact, Artifact) else load_artifact(artifact, family)

@dataclass
class ModelOutput:
  """One frame's outputs, freshly copied (nothing here is touched by later frames): `outputs` cut by output_slices, each
  (1, n) as the parsers take them; `raw` the flat output vectors end to end (rawPredictions). Every non-finite value
  is zeroed in both (NaN never reaches a message); `finite` says whether there was none."""
  outputs: dict[str, np.ndarray]
  raw: np.ndarray
  finite: bool

def _output(*vectors: tuple[np.ndarray, dict[str, slice]]) -> ModelOutput:
  finite = all(np.isfinite(v).all() for v, _ in vectors)
  if not finite: vectors = tuple((np.nan_to_num(v, nan=0., posinf=0., neginf=0.), sl) for v, sl in vectors)
  return ModelOutput({k: v[s].reshape(1, -1) for v, sl in vectors for k, s in sl.items()}, np.concatenate([v for v, _ in vectors]), finite)

class RoadRunner:
  """Road model (vision + policy) with its frame history. `run` returns a ModelOutput (raw: the vision then the policy
  vector). Two warp JITs: road -> `img`, wide -> `big_img` (one camera: both on the same buffer).

  History, as openpilot keeps it: the image queues (in the warp JITs) advance every frame; the hidden states queue
  (HISTORY - 1) * FRAME_SKIP + 1 deep, appended after the vision run, and the policy sees every FRAME_SKIP-th, newest
  last; the desire pulses queue HISTORY * FRAME_SKIP deep and the policy sees the max over each block of FRAME_SKIP.
  Both queues advance only on frames the policy runs on (a frame after a drop only updates the images).
  threads: how many threads share each kernel's launches (set_threads)"""
  def __init__(self, artifact: Artifact | str | os.PathLike, main_layout: NV12Layout, extra_layout: NV12Layout | None = None, threads: int = 1):
    self.artifact = art = _open(artifact, 'road')
    self.main_layout, self.extra_layout = main_layout, extra_layout or main_layout
    self.warps: dict[str, Replay] = {k: art.load_jit(art.warp_name(str(l))) for k, l in (('img', self.main_layout), ('big_img', self.extra_layout))}
    self.vision, self.policy = art.models['vision'], art.models['policy']
    self.vision_slices, self.policy_slices = art.output_slices('vision'), art.output_slices('policy')
    device = art.manifest['target']['device']
    self.queues = {k: Tensor.zeros(*IMG_QUEUE_SHAPE, dtype=dtypes.uint8, device=device).contiguous().realize() for k in self.warps}
    self.transforms = {k: _host(3, 3) for k in self.warps}
    policy = art.contract.policy.inputs
    self.features_buffer, self.desire_pulse, self.traffic_convention = (_host(*policy[k].shape) for k in
                                                                        ('features_buffer', 'desire_pulse', 'traffic_convention'))
    self.history, feature_len = policy['features_buffer'].shape[1:]   # load_artifact checked hidden_state's width against it
    self.full_features = np.zeros(((self.history - 1) * FRAME_SKIP + 1, feature_len), np.float32)
    self.full_desire = np.zeros((self.history * FRAME_SKIP, DESIRE_LEN), np.float32)
    self.prev_desire = np.zeros(DESIRE_LEN, np.float32)
    self.cameras = CameraTensors(art.layouts)
    self.set_threads(threads)

  def set_threads(self, n: int) -> None:
    """Replay every JIT of this runner with n threads sharing each kernel's launches (the models are the artifact's:
    other runners over it see the change)."""
    for g in (*self.warps.values(), self.vision, self.policy): g.threads = n

  def set_transforms(self, road_M: np.ndarray, wide_M: np.ndarray) -> None:
    """Model pixel -> camera pixel maps for `img` (main camera) and `big_img` (extra camera); read at the next replay."""
    for k, m in (('img', road_M), ('big_img', wide_M)):
      if np.shape(m) != (3, 3): raise ValueError(f"{k} transform: expected shape (3, 3), got {np.shape(m)}")
      self.transforms[k][0][:] = m

  def run(self, main_buf: CameraBuffer, extra_buf: CameraBuffer, desire: np.ndarray, traffic_convention: np.ndarray,
          prepare_only: bool = False) -> ModelOutput | None:
    """One camera frame: main_buf feeds `img`, extra_buf `big_img` (with one camera, the same buffer). prepare_only (a
    frame after a drop) updates the image history only. Bad input raises before any state changes."""
    desire, traffic_convention = np.asarray(desire, np.float32), np.asarray(traffic_convention, np.float32)
    if desire.shape != (DESIRE_LEN,): raise ValueError(f"desire: expected shape ({DESIRE_LEN},), got {desire.shape}")
    if traffic_convention.shape != (TRAFFIC_CONVENTION_LEN,):
      raise ValueError(f"traffic_convention: expected shape ({TRAFFIC_CONVENTION_LEN},), got {traffic_convention.shape}")
    frames = {k: self.cameras.get(b, self.warps[k]) for k, b in (('img', main_buf), ('big_img', extra_buf))}
    warp_in = {k: {'queue': self.queues[k], 'frame': frames[k], 'transform': self.transforms[k][1]} for k in self.warps}
    for k, w in self.warps.items(): w.check(warp_in[k])   # both before either replays: a bad input must not advance a queue
    imgs = {k: w.run(warp_in[k], copy=False) for k, w in self.warps.items()}

    # desire is a pulse on the rising edge (index 0, no desire, never pulses), seen by the frame's edge detection even
    # when the frame only prepares
    desire = desire.copy()
    desire[0] = 0
    pulse = np.where(desire - self.prev_desire > .99, desire, 0)
    self.prev_desire[:] = desire
    if prepare_only: return None

    vision_out = self.run_vision(imgs)
    self.full_features[:-1] = self.full_features[1:]
    self.full_features[-1] = vision_out[self.vision_slices['hidden_state']]
    self.features_buffer[0][0] = self.full_features[::FRAME_SKIP]
    self.full_desire[:-1] = self.full_desire[1:]
    self.full_desire[-1] = pulse
    self.desire_pulse[0][0] = self.full_desire.reshape(self.history, FRAME_SKIP, DESIRE_LEN).max(axis=1)
    self.traffic_convention[0][0] = traffic_convention
    return _output((vision_out, self.vision_slices), (self.run_policy(), self.policy_slices))

  def run_vision(self, imgs: dict[str, Tensor]) -> np.ndarray:
    """The vision model on the warps' outputs: its flat output vector."""
    return self.vision.run(imgs)

  def run_policy(self) -> np.ndarray:
    """The policy on the host inputs as run() filled them: its flat output vector."""
    return self.policy.run({'features_buffer': self.features_buffer[1], 'desire_pulse': self.desire_pulse[1], 'traffic_convention': self.traffic_convention[1]})

  def reset(self) -> None:
    """Forget all frame history (camera restart): image queues, feature and desire queues."""
    for q in self.queues.values(): zero_tensor(q)
    for a in (self.full_features, self.full_desire, self.prev_desire, self.features_buffer[0], self.desire_pulse[0]): a[:] = 0

  def warmup(self) -> None:
    """One full replay on zeroed frames, so the first real frame runs at steady-state latency; then a reset."""
    self.run(HostBuf(self.main_layout), HostBuf(self.extra_layout), np.zeros(DESIRE_LEN), np.zeros(TRAFFIC_CONVENTION_LEN))
    self.reset()

  def release_camera_tensors(self) -> None:
    """Drop the from_blob tensors: call before the camera client unmaps its buffers."""
    self.cameras.release()

class DMRunner:
  """Driver monitoring model: driver camera buffer, calibration and warp transform in; a ModelOutput out. threads: as
  RoadRunner's."""
  def __init__(self, artifact: Artifact | str | os.PathLike, layout: NV12Layout, threads: int = 1):
    self.artifact = art = _open(artifact, 'dm')
    self.layout = layout
    self.warp, self.model = art.load_jit(art.warp_name(str(layout))), art.models['dm']
    self.slices = art.output_slices('dm')
    self.transform, self.calib = _host(3, 3), _host(1, 3)
    self.cameras = CameraTensors(art.layouts)
    self.set_threads(threads)

  def set_threads(self, n: int) -> None:
    for g in (self.warp, self.model): g.threads = n

  def run(self, buf: CameraBuffer, calib: np.ndarray, transform: np.ndarray) -> ModelOutput:
    if np.size(calib) != 3: raise ValueError(f"calib: expected 3 values (rpyCalib), got shape {np.shape(calib)}")
    if np.shape(transform) != (3, 3): raise ValueError(f"transform: expected shape (3, 3), got {np.shape(transform)}")
    frame = self.cameras.get(buf, self.warp)
    self.calib[0][:] = np.reshape(calib, (1, 3))
    self.transform[0][:] = transform
    img = self.warp.run({'frame': frame, 'transform': self.transform[1]}, copy=False)
    return _output((self.run_model(img), self.slices))

  def run_model(self, img: Tensor) -> np.ndarray:
    """The model on the warp's output and the calibration as run() filled it: its flat output vector."""
    return self.model.run({'input_img': img, 'calib': self.calib[1]})

  def reset(self) -> None:
    """Nothing to forget: the driver model keeps no frame history."""

  def warmup(self) -> None:
    self.run(HostBuf(self.layout), np.zeros(3), np.eye(3))

  def release_camera_tensors(self) -> None: self.cameras.release()
