"""The model I/O contracts this project runs, as data: one entry per openpilot release whose models it supports.

A contract names each model's inputs, output heads and the index maps inside them, plus the release's fill numbers;
modeld-compile identifies it from the models' own metadata and records its name in the artifact (docs/RUNTIME.md).
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import ClassVar, Protocol
from modelrt.constants import IDX_N, DESIRE_LEN, TRAFFIC_CONVENTION_LEN, IMG_INPUT_SHAPE, DM_INPUT_SHAPE

class ContractError(ValueError):
  """Models that follow no known contract: the message names each mismatch, expected vs actual."""

@dataclass(frozen=True)
class Input:
  shape: tuple[int, ...]
  dtype: str                          # numpy dtype name of what the daemon feeds
  graph_dtypes: tuple[str, ...] = ()  # other element types the graph may declare: cast inside the captured program
  warped: bool = False                # a camera frame the warp JIT writes on the device, not fed from the host

  def accepts(self) -> tuple[str, ...]: return (self.dtype, *self.graph_dtypes)

@dataclass(frozen=True)
class Head:
  """A named slice of the flat output vector. kind 'mdn': per value a mean, then as many log-stds (with in_N > 1
  hypotheses, each also carries out_N selection logits); 'sigmoid': logits; 'softmax': logits, normalised over the
  last axis of shape; 'raw': passed on as is."""
  kind: str
  shape: tuple[int, ...]
  in_N: int = 0
  out_N: int = 0

  @property
  def width(self) -> int:
    n = math.prod(self.shape)
    return max(self.in_N, 1) * (2 * n + self.out_N) if self.kind == 'mdn' else n

@dataclass(frozen=True)
class Model:
  inputs: dict[str, Input]   # in call order
  heads: dict[str, Head]     # in the order of the release's output vector; a slice named 'pad' (openpilot's name for an
                             # output's unused tail) is allowed too
  width: int | None = None   # the output vector's width; None: any that holds the slices

  @property
  def heads_width(self) -> int: return sum(h.width for h in self.heads.values())
  @property
  def built_width(self) -> int:
    """The output vector's width of a model built to this contract: the release's, else just the heads."""
    return self.width or self.heads_width

  def slices(self) -> dict[str, slice]:
    """The heads back to back from 0: the release's offsets, as a model built to this contract lays them out."""
    out, start = {}, 0
    for k, h in self.heads.items(): out[k], start = slice(start, start + h.width), start + h.width
    return out

class ModelIO(Protocol):   # what identification reads of a model (modelrt.modeldef.ModelDef)
  inputs: dict[str, tuple[tuple[int, ...], str]]
  output_slices: dict[str, slice]
  width: int

@dataclass(frozen=True)
class RoadContract:
  name: str
  vision: Model
  policy: Model
  meta: dict[str, slice]                    # meta head entries of each prediction (disengagePredictions field names)
  plan: dict[str, slice]                    # plan columns of each modelV2 field
  plan_stds: tuple[str, ...]                # plan fields published with their stds
  hard_brake: dict[str, tuple[float, ...]]  # meta prediction -> thresholds its first value must exceed in each of the last frames, oldest first
  confidence: tuple[float, float]           # disengage score below the first: green, below the second: yellow, else red
  family: ClassVar[str] = 'road'
  MODELS: ClassVar[tuple[str, ...]] = ('vision', 'policy')   # its Model fields, in the order they run

  @property
  def models(self) -> dict[str, Model]: return {k: getattr(self, k) for k in self.MODELS}

@dataclass(frozen=True)
class DMContract:
  name: str
  dm: Model
  sides: tuple[str, ...]         # output name suffixes: the driver on the left (LHD), on the right (RHD)
  face_descs: dict[str, slice]   # face_descs means (and stds) of each published quantity
  side_probs: tuple[str, ...]    # per side sigmoid heads
  family: ClassVar[str] = 'dm'
  MODELS: ClassVar[tuple[str, ...]] = ('dm',)

  @property
  def models(self) -> dict[str, Model]: return {k: getattr(self, k) for k in self.MODELS}

Contract = RoadContract | DMContract
FAMILY_MODELS: dict[str, tuple[str, ...]] = {c.family: c.MODELS for c in (RoadContract, DMContract)}   # family -> its models

# ***** openpilot v0.11.1 (2026-05-18): driving_vision.onnx + driving_policy.onnx, dmonitoring_model.onnx *****

_F16 = ('float16',)   # openpilot feeds its host inputs as float32; a float16 graph gets them cast
_DM_PROBS = ('face_prob', 'left_eye_prob', 'right_eye_prob', 'sunglasses_prob', 'left_blink_prob', 'right_blink_prob',
             'using_phone_prob', 'sleep_prob')   # per driver side, in the order of the release's dmonitoring_model_metadata.pkl

ROAD_V0_11_1 = RoadContract(
  name='openpilot-0.11.1',
  vision=Model(
    inputs={'img': Input(IMG_INPUT_SHAPE, 'uint8', warped=True), 'big_img': Input(IMG_INPUT_SHAPE, 'uint8', warped=True)},
    heads={'meta': Head('sigmoid', (55,)), 'desire_pred': Head('softmax', (4, DESIRE_LEN)), 'pose': Head('mdn', (6,)),
           'wide_from_device_euler': Head('mdn', (3,)), 'road_transform': Head('mdn', (6,)),
           'lane_lines': Head('mdn', (4, IDX_N, 2)),          # left far, left, right, right far; y, z at X_IDXS
           'lane_lines_prob': Head('sigmoid', (8,)),          # per line (absent, present)
           'road_edges': Head('mdn', (2, IDX_N, 2)),
           'lead': Head('mdn', (3, 6, 4)),                    # per LEAD_T_OFFSETS: x, y, v, a at LEAD_T_IDXS
           'lead_prob': Head('sigmoid', (3,)), 'hidden_state': Head('raw', (512,))},
    width=1576),
  policy=Model(
    inputs={'features_buffer': Input((1, 25, 512), 'float32', _F16), 'desire_pulse': Input((1, 25, DESIRE_LEN), 'float32', _F16),
            'traffic_convention': Input((1, TRAFFIC_CONVENTION_LEN), 'float32', _F16)},
    heads={'plan': Head('mdn', (IDX_N, 15)), 'desire_state': Head('softmax', (DESIRE_LEN,))},
    width=1000),   # the last 2 are unused
  # interleaved: engaged; then per 2 s step of 2..10 s six predictions; then per 2 s step of 0..10 s four
  meta={'engagedProb': slice(0, 1), 'gasDisengageProbs': slice(1, 31, 6), 'brakeDisengageProbs': slice(2, 31, 6),
        'steerOverrideProbs': slice(3, 31, 6), 'brake3MetersPerSecondSquaredProbs': slice(4, 31, 6),
        'brake4MetersPerSecondSquaredProbs': slice(5, 31, 6), 'brake5MetersPerSecondSquaredProbs': slice(6, 31, 6),
        'gasPressProbs': slice(31, 55, 4), 'brakePressProbs': slice(32, 55, 4), 'leftBlinkerProbs': slice(33, 55, 4),
        'rightBlinkerProbs': slice(34, 55, 4)},
  plan={'position': slice(0, 3), 'velocity': slice(3, 6), 'acceleration': slice(6, 9), 'orientation': slice(9, 12),
        'orientationRate': slice(12, 15)},
  plan_stds=('position',),
  hard_brake={'brake5MetersPerSecondSquaredProbs': (.05, .05, .15, .15, .15), 'brake3MetersPerSecondSquaredProbs': (.7, .7)},
  confidence=(0.01165, 0.06157))

DM_V0_11_1 = DMContract(
  name='openpilot-0.11.1',
  dm=Model(
    inputs={'input_img': Input(DM_INPUT_SHAPE, 'uint8', warped=True), 'calib': Input((1, 3), 'float32', _F16)},
    heads={**{k: h for s in ('lhd', 'rhd') for k, h in ((f'face_descs_{s}', Head('mdn', (6,))), *((f'{p}_{s}', Head('sigmoid', (1,))) for p in _DM_PROBS))},
           'wheel_on_right': Head('sigmoid', (1,)), 'features': Head('raw', (512,))},
    width=553),    # face_descs_lhd 0:12, its probabilities 12:20, the same of rhd 20:40, wheel_on_right 40, features 41:553
  sides=('lhd', 'rhd'),
  face_descs={'face_orientation': slice(0, 3), 'face_position': slice(3, 5)},   # pitch, yaw, roll; x, y (the 6th, size, is not published)
  side_probs=_DM_PROBS)

CONTRACTS: dict[str, dict[str, Contract]] = {'road': {ROAD_V0_11_1.name: ROAD_V0_11_1}, 'dm': {DM_V0_11_1.name: DM_V0_11_1}}

# ***** identification *****

def mismatches(want: Model, got: ModelIO) -> list[str]:
  """How a model differs from the contract's model, one line each (empty: it follows it)."""
  out = [f"input {k!r}: not in the contract" for k in sorted(got.inputs.keys() - want.inputs.keys())]
  for k, w in want.inputs.items():
    if k not in got.inputs: out.append(f"input {k!r}: missing (expected {'|'.join(w.accepts())}{list(w.shape)})")
    elif (tuple(got.inputs[k][0]), got.inputs[k][1]) not in ((w.shape, d) for d in w.accepts()):
      out.append(f"input {k!r}: expected {'|'.join(w.accepts())}{list(w.shape)}, the model has {got.inputs[k][1]}{list(got.inputs[k][0])}")
  if want.width is not None and got.width != want.width: out.append(f"output vector: expected width {want.width}, the model has {got.width}")
  for k, h in want.heads.items():
    if (s := got.output_slices.get(k)) is None: out.append(f"output slice {k!r}: missing (expected width {h.width})")
    elif s.stop - s.start != h.width: out.append(f"output slice {k!r}: expected width {h.width}, the model has {s.stop - s.start} ({s.start}:{s.stop})")
  out += [f"output slice {k!r}: not in the contract" for k in sorted(got.output_slices.keys() - want.heads.keys() - {'pad'})]
  return out

def identify(family: str, models: dict[str, ModelIO]) -> Contract:
  """The known contract the family's models follow; ContractError naming, per contract, every mismatch."""
  report = []
  for c in CONTRACTS[family].values():
    if not (bad := [f"{k} {m}" for k, want in c.models.items() for m in mismatches(want, models[k])]): return c
    report.append(f"{c.name}:\n    " + '\n    '.join(bad))
  raise ContractError(f"the {family} models follow no known contract:\n  " + '\n  '.join(report))

def lookup(family: str, name: str) -> Contract:
  """A contract by the name an artifact recorded; KeyError if this version does not know it."""
  return CONTRACTS[family][name]
