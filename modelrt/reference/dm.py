"""Reference driver monitoring model in plain tinygrad, computed from the pixels, with the I/O of openpilot v0.11.1's
dmonitoring_model.onnx (modelrt.contracts.DM_V0_11_1; its feature vector is zeros: nothing reads it).

Each driver side looks at its half of the pooled Y plane for the face, eyes, phone and skin; docs/REFERENCE_MODELS.md
says how each output is found and in which frame the orientation is given."""
import hashlib, math
from collections.abc import Callable
from pathlib import Path
import numpy as np
from tinygrad import Tensor, dtypes
from transformations.model import DM_WIDTH, DM_HEIGHT
from modelrt.constants import DM_FACE_EFL as EFL, DM_FACE_W as EFL_W, DM_FACE_H as EFL_H
from modelrt.contracts import DM_V0_11_1 as CONTRACT
from modelrt.modeldef import ModelDef

SOURCE_SHA256 = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
POOL = 4
PW, PH = DM_WIDTH // POOL, DM_HEIGHT // POOL
SKIN = (130.0, 200.0)      # skin 160; cabin 60, closed eye 105, open eye 25, phone 235
EYE_DARK = 130.0           # eye spots (open or closed) are darker than this inside the face
EYE_OPEN = 70.0            # open eyes are darker than this
PHONE = 215.0
FACE_AREA_MIN = 1000.0     # pooled pixels: a face of 0.4 camera heights covers ~8600
EYE_AREA = math.pi * 0.17 * 0.375 * 0.08 * 0.5   # one open eye, in face heights^2

LANES = 8
def sums(*xs: Tensor) -> list[Tensor]:
  """The sums of same-shaped images, in one pass, each in LANES independent partial sums combined at the end:
  tinygrad gives each output of a reduction one accumulator, a serial chain of dependent adds (3-4x slower here)."""
  t = Tensor.stack(*xs).reshape(len(xs), -1, LANES).sum(1).sum(-1)
  return [t[i] for i in range(len(xs))]

def side(Y: Tensor, u: Tensor, v: Tensor, half: Tensor, calib: Tensor) -> dict[str, Tensor]:
  """Everything of one driver side; Y (PH, PW) pooled, u/v pixel-centre coordinates (full-res px), half a 0/1 mask."""
  skin = ((Y > SKIN[0]) & (Y < SKIN[1])).float() * half
  n, su, sv = sums(skin, skin * u, skin * v)
  cu, cv = su / (n + 1e-3), sv / (n + 1e-3)
  H = (n * POOL * POOL / (math.pi * 0.375 * 0.5)).sqrt()          # face height from the ellipse area
  a, b = 0.375 * H, 0.5 * H
  # eye spots: darker than skin inside the face's ellipse (shrunk off its blurred rim), above the mouth
  du, dv = u - cu, v - cv
  box = (((du / (a + 1e-3)) ** 2 + (dv / (b + 1e-3)) ** 2 < 0.8) & (dv < 0.35 * b)).float() * half
  eye = (Y < EYE_DARK).float() * box
  ne, su, sv = sums(eye, eye * u, eye * v)
  eu, ev = su / (ne + 1e-3), sv / (ne + 1e-3)
  left_img, right_img = eye * (u < eu).float(), eye * (u >= eu).float()
  nl, nr, rv, lv, ru, lu = sums(left_img, right_img, right_img * v, left_img * v, right_img * u, left_img * u)
  roll = ((rv / (nr + 1e-3) - lv / (nl + 1e-3)) / (ru / (nr + 1e-3) - lu / (nl + 1e-3) + 1e-3)).clip(-1, 1)
  roll = roll.atan()
  # the eye pair's offset from the face centre in face-local axes (undo the roll)
  c, s = roll.cos(), roll.sin()
  ou, ov = c * (eu - cu) + s * (ev - cv), -s * (eu - cu) + c * (ev - cv)
  yaw = (ou / (0.6 * a + 1e-3)).clip(-0.99, 0.99)
  pitch = ((ov + 0.15 * b) / (0.6 * b + 1e-3)).clip(-0.99, 0.99)
  yaw, pitch = _asin(yaw), _asin(pitch)
  face = n > FACE_AREA_MIN
  eyes_seen = face & (ne * POOL * POOL > 0.5 * EYE_AREA * H * H)
  # openness per eye: the driver's left eye is on the image's right (the camera faces the driver)
  want = EYE_AREA * H * H / (POOL * POOL) + 1
  dark, near = (Y < EYE_OPEN).float(), ((du.abs() < 1.3 * H) & (dv.abs() < H)).float()
  open_l, open_r, phone = sums(dark * right_img, dark * left_img, (Y > PHONE).float() * near)
  open_l, open_r = open_l / want, open_r / want
  blink_logit = lambda o: face.where(((0.3 - o) * 12).clip(-6, 6), -4.0)
  phone = phone / (0.02 * H * H / (POOL * POOL) + 1)
  orient_std = eyes_seen.where(0.1, 1.0)
  pu, pv = cu / DM_WIDTH - 0.5, cv / DM_HEIGHT - 0.5
  # the device frame: the direction of the face's place in the picture, less the turn off the road (yaw to the
  # driver's right is to the image's left; pitch up is the image's up)
  focal_yaw, focal_pitch = (((pu + 0.5) * EFL_W - EFL_W // 2) / EFL).atan(), (((pv + 0.5) * EFL_H - EFL_H // 2) / EFL).atan()
  return {'face_descs': Tensor.stack(-pitch - focal_pitch, focal_yaw + yaw, roll - calib[0, 0], pu, pv, H / DM_HEIGHT,
                                     orient_std.log(), orient_std.log(), orient_std.log(),
                                     face.where(math.log(0.01), 0.0), face.where(math.log(0.01), 0.0), face.where(math.log(0.02), 0.0)),
          'face_prob': ((n - FACE_AREA_MIN) / 300).clip(-6, 6), 'left_eye_prob': face.where(4.0, -4.0), 'right_eye_prob': face.where(4.0, -4.0),
          'left_blink_prob': blink_logit(open_l), 'right_blink_prob': blink_logit(open_r), 'sunglasses_prob': n * 0 - 4.0,
          'using_phone_prob': face.where(((phone - 0.3) * 10).clip(-6, 6), -4.0), 'sleep_prob': blink_logit((open_l + open_r) / 2) - 2.0,
          'n': n}

def _asin(x: Tensor) -> Tensor: return (x / (1 - x * x).sqrt()).atan()

def constants() -> dict[str, Tensor]:
  """Realized pixel-centre coordinates (full-resolution px) of the pooled image (a lazy arange costs a reduction)."""
  u, v = np.meshgrid(np.arange(PW) * POOL + (POOL - 1) / 2, np.arange(PH) * POOL + (POOL - 1) / 2)
  return {'u': Tensor(u.astype(np.float32)).realize(), 'v': Tensor(v.astype(np.float32)).realize()}

def dm_fn(C: dict[str, Tensor]) -> Callable[..., Tensor]:
  def fn(input_img: Tensor, calib: Tensor) -> Tensor:
    Y = input_img.reshape(PH, POOL, PW, POOL).cast(dtypes.float32).mean((1, 3))
    u, v = C['u'], C['v']
    left = (u < DM_WIDTH / 2).float()
    sides = {'lhd': side(Y, u, v, left, calib), 'rhd': side(Y, u, v, 1 - left, calib)}
    heads = {f'{k}_{s}': sides[s][k] for s in sides for k in sides[s] if k != 'n'}
    heads['wheel_on_right'] = ((sides['rhd']['n'] - sides['lhd']['n']) / 300).clip(-6, 6)
    heads['features'] = Tensor.zeros(CONTRACT.dm.heads['features'].width)
    return Tensor.cat(*[heads[k].reshape(-1).cast(dtypes.float32) for k in CONTRACT.dm.heads]).reshape(1, -1)
  return fn

def dm_model() -> ModelDef:
  return ModelDef.to_contract('dm', CONTRACT.dm, dm_fn(constants()), SOURCE_SHA256)
