"""Reference road models: vision and policy in plain tinygrad, computed from the pixels, with the I/O of openpilot
v0.11.1's driving_vision.onnx and driving_policy.onnx (modelrt.contracts.ROAD_V0_11_1).

Vision finds paint, lane lines, road edges, the lead and the ego speed in the calibrated model frame and hands them to
the policy in hidden_state (HIDDEN); docs/REFERENCE_MODELS.md says how each is found."""
import functools, hashlib, itertools, math
from collections.abc import Callable
from pathlib import Path
import numpy as np
from tinygrad import Tensor, dtypes
from transformations.model import MODEL_WIDTH, MODEL_HEIGHT, MEDMODEL_INTRINSICS
from modelrt.constants import IDX_N, X_IDXS, T_IDXS, LEAD_T_IDXS, LEAD_T_OFFSETS, FRAME_SKIP, MODEL_RUN_FREQ
from modelrt.contracts import ROAD_V0_11_1 as CONTRACT
from transformations.camera import CAM_HEIGHT
from modelrt.modeldef import ModelDef

FL, CX, CY = float(MEDMODEL_INTRINSICS[0, 0]), float(MEDMODEL_INTRINSICS[0, 2]), float(MEDMODEL_INTRINSICS[1, 2])
FRAME_DT = FRAME_SKIP / MODEL_RUN_FREQ   # 0.2 s between the two frames of img
V0 = 52                              # first row used (x = 253 m); rows above are sky
XS = 50.0                            # fit basis x/XS keeps the normal equations well conditioned in float32
DEFAULT_SPEED = 20.0                 # m/s, assumed by the policy while no dashes have been seen to move
SHOULDER = 0.8                       # m of asphalt beyond the outer lines (the synthetic scenes' default)
_X10 = int(np.argmin(np.abs(X_IDXS - 10.0)))
SOURCE_SHA256 = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
VISION_HEADS = CONTRACT.vision.heads
HISTORY_LEN = CONTRACT.policy.inputs['features_buffer'].shape[1]

# hidden_state layout: what the policy reads from each history entry, in order (widths), then zeros. HIDDEN: where
# each sits (a slice, or the index of a single value)
HIDDEN_WIDTHS = {'centre': IDX_N, 'centre_std': IDX_N, 'centre_fit': 3, 'lane_width': 1, 'speed': 1, 'speed_conf': 1, 'lead_found': 1,
                 'lead_x': 1, 'lead_y': 1, 'lead_v_rel': 1, 'lead_v_rel_std': 1, 'lines_found': 1, 'wide_brightness': 1}
HIDDEN = {k: slice(end - w, end) if w > 1 else end - 1 for (k, w), end in zip(HIDDEN_WIDTHS.items(), itertools.accumulate(HIDDEN_WIDTHS.values()))}
HIDDEN_USED = sum(HIDDEN_WIDTHS.values())

@functools.cache
def grid() -> dict[str, Tensor]:
  """Realized index constants: u (512,) column, xs (R,) row distance (m), ppm (R,) pixels per metre across, idx (R,)
  row number, shift (DASH_SHIFTS,). Built once outside any JIT (tinygrad computes a lazy arange with a reduction,
  which fused into every consumer made the model several times slower)."""
  v = np.arange(V0, MODEL_HEIGHT, dtype=np.float64)
  c = lambda a: Tensor(np.asarray(a, np.float32)).realize()
  return {'u': c(np.arange(MODEL_WIDTH)), 'xs': c(CAM_HEIGHT * FL / (ROWS - CY)), 'ppm': c((ROWS - CY) / CAM_HEIGHT),
          'xs_full': c(CAM_HEIGHT * FL / (v - CY)), 'ppm_full': c((v - CY) / CAM_HEIGHT), 'idx': c(np.arange(len(v))),
          'shift': c(np.arange(DASH_SHIFTS)), 'lr': c([[-1.0], [1.0]])}

# The lines and edges look at every row far away and at every 2nd / 3rd row near by, where rows are 3-10 cm apart
# (a third fewer rows, a third less time); the lead looks at every row.
ROWS = np.concatenate([np.arange(V0, 120), np.arange(120, 170, 2), np.arange(170, MODEL_HEIGHT, 3)]).astype(np.float64)
def _row(x: float) -> int: return int(np.searchsorted(ROWS, CY + FL * CAM_HEIGHT / x))   # first sampled row at distance <= x
def _full_row(x: float) -> int: return int(round(CY + FL * CAM_HEIGHT / x)) - V0

def sample(Y: Tensor) -> Tensor:
  """The sampled rows (ROWS) of a (256 - V0, 512) plane."""
  return Y[:120 - V0].cat(Y[120 - V0:170 - V0:2], Y[170 - V0::3])

def y_plane(img: Tensor, frame: int) -> Tensor:
  """The (256, 512) float Y plane of frame 0 (older) or 1 (newest) of a (1, 12, 128, 256) packed input, rows >= V0."""
  ch = img[0, 6 * frame:6 * frame + 4].cast(dtypes.float32)          # Y[a::2, b::2] is channel a + 2b
  return ch.reshape(2, 2, MODEL_HEIGHT // 2, MODEL_WIDTH // 2).permute(2, 1, 3, 0).reshape(MODEL_HEIGHT, MODEL_WIDTH)[V0:]

# Sums and maxima over a row's 512 pixels, in LANES independent partial results combined at the end: tinygrad gives
# each output of a reduction one accumulator, a serial chain of dependent adds (3-4x slower here)
LANES = 8
def row_sum(x: Tensor) -> Tensor: return x.reshape(*x.shape[:-1], -1, LANES).sum(-2).sum(-1)
def row_max(x: Tensor) -> Tensor: return x.reshape(*x.shape[:-1], -1, LANES).max(-2).max(-1)

RIDGE_SCALES = ((2, 2), (5, 4), (12, 8))   # (gap, window) px: paint is ~1 px wide far away and ~20 px at 6 m
PAD = 20

def ridge(Y: Tensor) -> Tensor:
  """How much brighter each pixel is than the means of both of its horizontal neighbourhoods (best of three widths).
  Box sums of 2, 4, 8 px build on each other; the border is padded bright so it never looks like paint."""
  box = {1: Y.pad((None,) * (Y.ndim - 1) + ((PAD, PAD),), value=255.0)}
  for w in (2, 4, 8): box[w] = (box[w // 2][..., :-(w // 2)] + box[w // 2][..., w // 2:]).contiguous()
  def mean(a: int, w: int) -> Tensor: return box[w][..., PAD + a:PAD + a + MODEL_WIDTH] / w   # mean of Y[u+a .. u+a+w-1]
  return Tensor.stack(*[Y - mean(-g - w + 1, w).maximum(mean(g, w)) for g, w in RIDGE_SCALES]).max(0)

def paint_weight(Y: Tensor) -> Tensor:
  """Per-pixel paint evidence >= 0 of (frames, R, 512) planes: a ridge above a threshold set by the strongest paint
  in the frame's near rows, on a pixel clearly brighter than the road. The brightness gate keeps out road pixels
  between dark ones (the jagged bottom edge of a lead, where a ridge detector alone sees a bright stripe)."""
  E = ridge(Y)
  top = E[:, _row(25.0):].max((1, 2), keepdim=True)
  road = Y[:, _row(9.0):_row(6.0)].mean((1, 2), keepdim=True)
  return (E - (top * 0.35).maximum(12.0)).relu() * (Y > road + 0.4 * top).float()

def edge_weight(Y: Tensor) -> Tensor:
  """Road edge evidence (R, 512): the two pixels at an asphalt/grass border (grass: clearly darker than the road,
  but not as dark as a lead; asphalt: within 10% of the road). Left edges have grass on the left; right edges
  on the right: the sign of the weight tells which (+ left, - right)."""
  road = Y[_row(9.0):_row(6.0)].mean()
  P = (Y - road).pad((None, (4, 4))) + road                          # beyond the image: road, not an edge
  def three(a: int) -> tuple[Tensor, Tensor]:                          # min and max of Y[u+a .. u+a+2]
    t = [P[:, 4 + a + k:4 + a + k + MODEL_WIDTH] for k in range(3)]
    return t[0].minimum(t[1]).minimum(t[2]), t[0].maximum(t[1]).maximum(t[2])
  lm, rm = three(-4), three(1)                                         # Y[u-4..u-2], Y[u+1..u+3]
  # every pixel of the run must qualify: a mean would call the blend of a dark lead and asphalt grass
  grass = lambda m: (m[1] < road * 0.85) & (m[0] > road * 0.45)
  asphalt = lambda m: (m[1] < road * 1.1) & (m[0] > road * 0.9)
  return (grass(lm) & asphalt(rm)).float() * EDGE_WEIGHT - (asphalt(lm) & grass(rm)).float() * EDGE_WEIGHT

def _solve3(A: list[list[Tensor]], b: list[Tensor]) -> list[Tensor]:
  """Cramer's rule for a batch of symmetric 3x3 systems (entries are same-shaped tensors)."""
  def det(m): return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
                      + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
  d = det(A)
  return [det([[b[r] if c == k else A[r][c] for c in range(3)] for r in range(3)]) / d for k in range(3)]

def fit(y: Tensor, q: Tensor, xs: Tensor, quadratic: bool) -> Tensor:
  """Weighted least squares y ~ a + b*s + c*s^2 (s = x/XS) per line; y, q (L, R); returns coefficients (L, 3).
  A weak ridge on b and c keeps the systems solvable when a line has few rows."""
  s = xs / XS
  S = [(q * s ** k).sum(-1) for k in range(5)]
  T = [(q * y * s ** k).sum(-1) for k in range(3)]
  lam = 1e-3
  if quadratic: A, b = [[S[0] + 1e-3, S[1], S[2]], [S[1], S[2] + lam, S[3]], [S[2], S[3], S[4] + lam]], T
  else: A, b = [[S[0] + 1e-3, S[1], 0], [S[1], S[2] + lam, 0], [0, 0, 1]], [T[0], T[1], 0]
  return Tensor.stack(*_solve3(A, b), dim=-1)

def fit_parallel(y: Tensor, q: Tensor, xs: Tensor) -> Tensor:
  """Weighted least squares of parallel lines y_j ~ a_j + b*s + c*s^2 (one shape, an offset per line): the lines
  beside a lead, which it does not hide, carry the shape of the ones behind it. Eliminating each a_j leaves a
  2x2 system for (b, c). Returns (L, 3)."""
  s = xs / XS
  S = [(q * s ** k).sum(-1) for k in range(5)]
  T = [(q * y * s ** k).sum(-1) for k in range(3)]
  n = S[0] + 1e-3
  A11, A12, A22 = (S[2] - S[1] * S[1] / n).sum() + 1e-3, (S[3] - S[1] * S[2] / n).sum(), (S[4] - S[2] * S[2] / n).sum() + 1e-3
  B1, B2 = (T[1] - S[1] * T[0] / n).sum(), (T[2] - S[2] * T[0] / n).sum()
  det = A11 * A22 - A12 * A12
  b, c = (B1 * A22 - B2 * A12) / det, (A11 * B2 - A12 * B1) / det
  return Tensor.stack((T[0] - b * S[1] - c * S[2]) / n, b + S[0] * 0, c + S[0] * 0, dim=-1)

def evaluate(coef: Tensor, x: Tensor) -> Tensor:
  """(L, 3) coefficients at distances x (N,) -> (L, N)."""
  s = x / XS
  return coef[:, 0:1] + coef[:, 1:2] * s + coef[:, 2:3] * s * s

def nearest_paint(w: Tensor, lim_u: Tensor) -> tuple[Tensor, Tensor]:
  """Per line and row, the paint pixel nearest to lim_u (L, R), on the left for line 0 and on the right for line 1:
  (u, found) (2, R). w (R, 512), or (2, R, 512) one per line."""
  u = grid()['u']
  # paint needs two adjacent pixels: single noise pixels do not seed a line
  edge = (None,) * (w.ndim - 1)
  p = (w > 0) & ((w.pad(edge + ((1, 0),))[..., :-1] > 0) | (w.pad(edge + ((0, 1),))[..., 1:] > 0))
  kl = ((p if w.ndim == 2 else p[0]) & (u < lim_u[0][:, None])).float() * (u + 1)
  kr = ((p if w.ndim == 2 else p[1]) & (u > lim_u[1][:, None])).float() * (MODEL_WIDTH - u)
  k = row_max(Tensor.stack(kl, kr))
  return Tensor.stack(k[0] - 1, MODEL_WIDTH - k[1]), k > 0

def seed(w: Tensor, xs: Tensor, ppm: Tensor, lim_y: Tensor, gap: float) -> tuple[Tensor, Tensor]:
  """Linear fits (2, 3) of the line nearest to lim_y (2, R) per row on the left (line 0) and on the right (line 1),
  and the number of rows each rests on. A row whose nearest paint lies more than `gap` beyond the nearest of all
  rows saw the next line through a dash gap: left out."""
  side = grid()['lr']                                                  # (2, 1): -1 left, +1 right
  # search from half a line width beyond the limit (the paint of a line centred on the limit is on neither side)
  u, found = nearest_paint(w, CX + (lim_y + side * 0.1) * ppm)
  # the centroid of the paint just beyond that pixel: the nearest pixel of a ridge sits up to its width off centre
  y = window_centroids(w, (u - CX) / ppm + side * 0.2, 0.25 + xs * 0, ppm)[0]
  d = (y - lim_y) * side                                             # how far beyond the limit
  found = found & (d > 0)                                            # paint centred on the other side: not this line
  ok = found & (d < found.where(d, 1e3).min(-1, keepdim=True) + gap)
  return fit(y, ok.float(), xs, quadratic=False), ok.float().sum(-1)

def window_centroids(w: Tensor, prior: Tensor, half_m: Tensor, ppm: Tensor) -> tuple[Tensor, Tensor]:
  """Per line and row, the paint centroid within +-half_m of the prior (L, R): (y (L, R), evidence (L, R))."""
  u = grid()['u']
  up = (CX + prior * ppm)[..., None]
  W = (w if w.ndim == 3 else w[None]) * ((u - up).abs() < (half_m * ppm)[..., None]).float()
  e, m = row_sum(Tensor.stack(W, W * u))
  return (m / (e + 1e-6) - CX) / ppm, e

EVIDENCE_MIN = 20.0
EDGE_WEIGHT = 50.0   # per border pixel, so that a row's two border pixels pass EVIDENCE_MIN

def refine(w: Tensor, coef: Tensor, xs: Tensor, ppm: Tensor, x_max: float, half: tuple[float, float],
           parallel: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  """Windowed centroids around the fits, rows up to x_max, refit quadratically: (coef, y, q, evidence)."""
  y, e = window_centroids(w, evaluate(coef, xs), half[0] + half[1] * xs, ppm)
  q = ((e > EVIDENCE_MIN) & (xs <= x_max)[None]).float()
  return (fit_parallel(y, q, xs) if parallel else fit(y, q, xs, quadratic=True)), y, q, e

def detect_lines(w: Tensor, xs: Tensor, ppm: Tensor) -> tuple[Tensor, Tensor, Tensor]:
  """Fits (4, 3) of left adjacent, ego left, ego right, right adjacent; per-row centroids and weights (4, R)."""
  b = slice(_row(25.0), _row(6.0))
  wb, xb, pb = w[b], xs[b], ppm[b]
  # ego lines: the nearest paint on either side of the ego's line along the lanes (y = heading * x, the heading
  # from a first look straight ahead), so that a line crossed at an angle (a lane change) counts on the side it
  # is at the ego (x = 0), as in the ground truth, not on the side it is at 6..25 m
  zero = xb * 0
  first = seed(wb, xb, pb, Tensor.stack(zero, zero), 1.5)[0]
  heading = first[:, 1].mean() * xb / XS
  ego = seed(wb, xb, pb, Tensor.stack(heading, heading), 1.5)[0]
  ego = refine(w, ego, xs, ppm, 35.0, (0.5, 0.015))[0]
  ego = refine(w, ego, xs, ppm, 60.0, (0.4, 0.008))[0]
  # adjacent lines: seeded beyond the ego lines, shaped like them (lanes are parallel), shifted to the seed at 12 m;
  # with no paint in the near rows (out of view, dash gaps), one lane width further out
  x12 = Tensor.full((1,), 12.0)
  width = (evaluate(ego[1:2], x12) - evaluate(ego[0:1], x12))[0, 0].clip(2.5, 5.0)
  s, n = seed(wb, xb, pb, evaluate(ego, xb) + grid()['lr'], 1.5)
  off = (n[:, None] > 3).where(evaluate(s, x12) - evaluate(ego, x12), grid()['lr'] * width)
  adj_l, adj_r = ego[0:1] + off[0:1].pad((None, (0, 2))), ego[1:2] + off[1:2].pad((None, (0, 2)))
  coef = Tensor.cat(adj_l, ego, adj_r)
  coef = refine(w, coef, xs, ppm, 100.0, (0.4, 0.005), parallel=True)[0]
  coef, y, q, _ = refine(w, coef, xs, ppm, 1e3, (0.3, 0.003), parallel=True)
  return coef, y, q

def detect_edges(w: Tensor, lines: Tensor, found: Tensor, xs: Tensor, ppm: Tensor) -> tuple[Tensor, Tensor, Tensor]:
  """Fits (2, 3) of the left and right road edge: the outermost line found, shifted by the mean offset of the
  border pixels around it (a road's borders run parallel to its lines, and one offset extrapolates far better
  than a curve fitted to the few far rows where a border enters the picture). Seeded in the rows 6..60 m."""
  b = slice(_row(60.0), _row(6.0))                                    # a border lanes away enters the picture far out
  xb, pb = xs[b], ppm[b]
  outer = Tensor.stack(found[0].where(lines[0], lines[1]), found[3].where(lines[3], lines[2]))
  ob = evaluate(outer, xb)
  wlr = Tensor.stack(w.relu(), (-w).relu())                           # left borders, right borders
  sd, n = seed(wlr[:, b], xb, pb, ob, 1.0)
  # the prior: the outer line shifted onto the seed at 30 m, or by the shoulder when no border was seen
  x30 = Tensor.full((1,), 30.0)
  off = (n[:, None] > 3).where(evaluate(sd, x30) - evaluate(outer, x30), grid()['lr'] * SHOULDER)
  coef = outer + off.pad((None, (0, 2)))
  for half in ((0.5, 0.01), (0.3, 0.003)):
    y, e = window_centroids(wlr, evaluate(coef, xs), half[0] + half[1] * xs, ppm)
    q = (e > EVIDENCE_MIN).float()
    d = (q * (y - evaluate(outer, xs))).sum(-1) / (q.sum(-1) + 1e-3)
    coef = outer + d[:, None].pad((None, (0, 2)))
  return coef, y, q

def line_stats(coef: Tensor, y: Tensor, q: Tensor, xs: Tensor, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
  """Per line: means at X (X_IDXS) (L, 33), stds (L, 33), presence logit (L,)."""
  mean = evaluate(coef, X)
  n = q.sum(-1)
  resid = ((q * (y - evaluate(coef, xs)) ** 2).sum(-1) / (n + 1)).sqrt()
  x_far = (q * xs).max(-1)
  x_near = (q * (1e3 - xs)).max(-1) * -1 + 1e3
  beyond = (X[None] - x_far[:, None]).relu()
  before = (x_near[:, None] - X[None]).relu()
  std = 0.04 + resid[:, None] + 0.002 * beyond ** 2 + 0.03 * before + (n[:, None] < 8).float() * 3.0
  logit = ((n - 8) * 0.5).clip(-6, 6)
  return mean, std, logit

def lead(Y: Tensor, coef: Tensor, xs: Tensor, ppm: Tensor) -> tuple[Tensor, Tensor, Tensor]:
  """The lowest row (>= 3 rows high) whose ego-lane interior is mostly darker than the road: (found, x, y)."""
  u = grid()['u']
  ego = evaluate(coef[1:3], xs)                                      # (2, R)
  lo, hi = CX + (ego[0] + 0.25) * ppm, CX + (ego[1] - 0.25) * ppm
  inside = ((u >= lo[:, None]) & (u <= hi[:, None])).float()        # (R, 512)
  near = slice(_full_row(9.0), _full_row(6.0))
  road = row_sum(Y[near] * inside[near]).sum() / (row_sum(inside[near]).sum() + 1)
  dark = (Y < road * 0.6).float() * inside
  want = (hi - lo).clip(1, None).minimum(1.5 * ppm)
  row = (row_sum(dark) / want) > 0.5                                  # (R,)
  tall = row & row.pad((2, 0))[:-2] & row.pad((4, 0))[:-4]           # dark 2 and 4 rows higher too
  idx = grid()['idx']
  bottom = (tall.float() * (idx + 1)).max() - 1                      # -1: none
  found = bottom >= 0
  x = CAM_HEIGHT * FL / (bottom + V0 + 0.5 - CY).maximum(1.0)
  sel = ((idx <= bottom) & (idx >= bottom - 2)).float()[:, None] * dark
  uc, n = row_sum(Tensor.stack(sel * u, sel)).sum(-1)
  uc = uc / (n + 1e-6)
  return found, x, (uc - CX) * x / FL

DASH_X = np.arange(6.0, 30.0, 0.25)
DASH_SHIFTS = 41                     # 0 .. 10 m in 0.25 m steps: up to 50 m/s, below one 12 m dash period

def dash_interp() -> Tensor:
  """Constant (len(DASH_X), rows) linear interpolation from the rows' distances onto a regular x grid."""
  xr = CAM_HEIGHT * FL / (ROWS - CY)
  M = np.zeros((len(DASH_X), len(xr)), np.float32)
  for i, x in enumerate(DASH_X):
    j = int(np.searchsorted(-xr, -x))       # xr decreases with the row: xr[j-1] > x >= xr[j]
    t = (xr[j - 1] - x) / (xr[j - 1] - xr[j])
    M[i, j - 1], M[i, j] = 1 - t, t
  return Tensor(M).realize()

def ego_speed(e_new: Tensor, e_old: Tensor, interp: Tensor) -> tuple[Tensor, Tensor]:
  """Speed (m/s) from the shift of the ego lines' dash pattern between the frames, and a confidence in 0..1.
  Solid paint (no pattern to align) gives confidence 0."""
  a, b = (((e > EVIDENCE_MIN).float() @ interp.T) for e in (e_new, e_old))   # (2, N) paint present along each ego line
  a, b = a - a.mean(-1, keepdim=True), b - b.mean(-1, keepdim=True)
  n = len(DASH_X) - DASH_SHIFTS + 1
  # a dash at x in the older frame is at x - d in the newest: newest(x) ~ older(x + d)
  bu = b.unfold(-1, n, 1)                                                    # (2, shifts, n)
  an = a[:, None, :n]
  corr = (an * bu).sum((0, 2)) / (((an * an).sum() * (bu * bu).sum((0, 2))).sqrt() + 1e-3)
  k = corr.argmax()
  c0 = corr.max()
  ks = grid()['shift']
  cm, cp = (corr * (ks == k - 1)).sum(), (corr * (ks == k + 1)).sum()
  off = ((cm - cp) / (2 * (cm - 2 * c0 + cp) - 1e-6)).clip(-0.5, 0.5)
  d = (k.float() + off) * (DASH_X[1] - DASH_X[0])
  pattern = (a * a).mean().sqrt()                                            # ~0.4 for dashes, ~0 for solid paint
  conf = ((c0 - 0.5) * 4).clip(0, 1) * ((pattern - 0.1) * 10).clip(0, 1)
  return d / FRAME_DT, conf

def constants() -> dict[str, Tensor]:
  """Realized constant tensors the model closes over (lazy constants inside a cat misbehave in tinygrad 0.14)."""
  def c(a) -> Tensor: return Tensor(np.asarray(a, np.float32)).realize()
  desire = np.zeros(VISION_HEADS['desire_pred'].shape); desire[:, 0] = 1.0   # "none" somewhat more likely, nothing sure
  pose_n = VISION_HEADS['pose'].shape[0]
  grid()
  return {'X': c(X_IDXS), 'lead_t': c(np.add.outer(LEAD_T_OFFSETS, LEAD_T_IDXS)), 'interp': dash_interp(),
          'wide_from_device': c([0, 0, 0, *[math.log(0.05)] * 3]),
          'road_transform': c([0] * pose_n + [math.log(1.0)] * pose_n),
          'desire_pred': c(desire.ravel()), 'pose_rest': c([0] * (pose_n - 1)), 'pose_rest_logstd': c([math.log(1.0)] * 2 + [math.log(0.1)] * 3),
          'meta_rest': c([-3.0] * (VISION_HEADS['meta'].width - 1)), 'hidden_rest': c(np.zeros(VISION_HEADS['hidden_state'].width - HIDDEN_USED))}

def vision_fn(C: dict[str, Tensor]) -> Callable[..., Tensor]:
  def fn(img: Tensor, big_img: Tensor) -> Tensor:
    xs, ppm = grid()['xs'], grid()['ppm']
    Yo_full, Yn_full = Tensor.stack(y_plane(img, 0), y_plane(img, 1)).contiguous()
    Ys = sample(Yo_full.stack(Yn_full).permute(1, 0, 2)).permute(1, 0, 2).contiguous()
    Yn = Ys[1]
    wo, wn = paint_weight(Ys)
    coef, y, q = detect_lines(wn, xs, ppm)
    mean, std, logit = line_stats(coef, y, q, xs, C['X'])
    # ego speed from the dash pattern along the ego lines in both frames
    _, e_new = window_centroids(wn, evaluate(coef[1:3], xs), 0.3 + 0.003 * xs, ppm)
    _, e_old = window_centroids(wo, evaluate(coef[1:3], xs), 0.3 + 0.003 * xs, ppm)
    speed, speed_conf = ego_speed(e_new, e_old, C['interp'])
    speed_std = (speed_conf > 0.3).where(1.0, 10.0)
    # lead in both frames: relative speed from the change of distance
    found, lx, ly = lead(Yn_full, coef, grid()['xs_full'], grid()['ppm_full'])
    found_o, lx_o, _ = lead(Yo_full, coef, grid()['xs_full'], grid()['ppm_full'])
    both = found & found_o
    v_rel = both.where((lx - lx_o) / FRAME_DT, 0.0)
    lx, ly = found.where(lx, 0.0), found.where(ly, 0.0)                # nothing found: no position, a huge std
    x_std = found.where(0.02 * lx + lx * lx / (FL * CAM_HEIGHT), 100.0)   # 2% plus one row of quantisation
    v_rel_std = both.where(x_std * 1.5 / FRAME_DT, 10.0)
    lead_v = v_rel + (speed_conf > 0.3).where(speed, DEFAULT_SPEED)
    lead_v_std = (v_rel_std ** 2 + speed_std ** 2).sqrt()
    lead_logit = found.where(6.0, -6.0)

    centre = (mean[1] + mean[2]) / 2
    centre_std = (std[1] ** 2 + std[2] ** 2).sqrt() / 2
    lane_width = (mean[2] - mean[1])[_X10]
    lines_found = ((logit[1] > 0) & (logit[2] > 0)).float()
    # road edges: the asphalt/grass borders beyond the outermost lines; none seen: SHOULDER beyond those lines
    ecoef, ey, eq = detect_edges(edge_weight(Yn), coef, logit > 0, xs, ppm)
    emean, estd, elogit = line_stats(ecoef, ey, eq, xs, C['X'])
    seen = elogit > 0
    edge_l = seen[0].where(emean[0], (logit[0] > 0).where(mean[0], mean[1]) - SHOULDER)
    edge_r = seen[1].where(emean[1], (logit[3] > 0).where(mean[3], mean[2]) + SHOULDER)
    edge_std = Tensor.stack(seen[0].where(estd[0], (logit[0] > 0).where(std[0], std[1]) + 1.0),
                            seen[1].where(estd[1], (logit[3] > 0).where(std[3], std[2]) + 1.0))

    z = mean * 0 + CAM_HEIGHT
    lane_lines = Tensor.cat(Tensor.stack(mean, z, dim=-1).flatten(), Tensor.stack(std, std * 0 + 0.2, dim=-1).log().flatten())
    road_edges = Tensor.cat(Tensor.stack(Tensor.stack(edge_l, edge_r), z[:2], dim=-1).flatten(),
                            Tensor.stack(edge_std, edge_std * 0 + 0.2, dim=-1).log().flatten())
    lane_lines_prob = Tensor.stack(-logit, logit, dim=-1).flatten()

    # lead trajectory at LEAD_T_IDXS from each of LEAD_T_OFFSETS on: constant relative speed; stds grow with time
    t = C['lead_t']                                                                                   # (3, 6)
    traj = Tensor.stack((lx + v_rel * t).relu(), ly + t * 0, lead_v + t * 0, t * 0, dim=-1)           # (3, 6, 4) x, y, v, a
    traj_std = Tensor.stack(x_std + v_rel_std * t, 0.3 + 0.1 * t + found.where(0.0, 3.0), lead_v_std + 0.5 * t, 1.0 + 0.2 * t, dim=-1)
    lead_out = Tensor.cat(traj.flatten(), traj_std.maximum(1e-3).log().flatten())
    lead_prob = lead_logit.reshape(1).expand(len(LEAD_T_OFFSETS))

    # pose: forward speed from the dashes; the rest (and the other transforms) are unknown to this model
    pose = Tensor.cat(speed.reshape(1), C['pose_rest'], speed_std.log().reshape(1), C['pose_rest_logstd'])
    meta = Tensor.cat((lines_found * 4 - 2).reshape(1), C['meta_rest'])

    hidden = {'centre': centre, 'centre_std': centre_std, 'centre_fit': (coef[1] + coef[2]) / 2, 'lane_width': lane_width, 'speed': speed,
              'speed_conf': speed_conf, 'lead_found': found.float(), 'lead_x': lx, 'lead_y': ly, 'lead_v_rel': v_rel, 'lead_v_rel_std': v_rel_std,
              'lines_found': lines_found, 'wide_brightness': big_img[0, 6:10].cast(dtypes.float32).mean() / 255}
    hidden = Tensor.cat(*[hidden[k].reshape(w) for k, w in HIDDEN_WIDTHS.items()], C['hidden_rest'])   # reshape: each part its width
    heads = {'pose': pose, 'wide_from_device_euler': C['wide_from_device'], 'road_transform': C['road_transform'], 'desire_pred': C['desire_pred'],
             'meta': meta, 'lane_lines': lane_lines, 'lane_lines_prob': lane_lines_prob, 'road_edges': road_edges, 'lead': lead_out,
             'lead_prob': lead_prob, 'hidden_state': hidden}
    return Tensor.cat(*[heads[k].cast(dtypes.float32).flatten() for k in VISION_HEADS]).reshape(1, -1)
  return fn

def vision_model() -> ModelDef: return ModelDef.to_contract('vision', CONTRACT.vision, vision_fn(constants()), SOURCE_SHA256)

PLAN_TAU = 2.0   # s: the plan returns to the lane centre with this time constant
LC_RATE = 0.3    # m/s of lateral drift relative to the lane that reads as a lane change

def policy_fn(C: dict[str, Tensor]) -> Callable[..., Tensor]:
  def fn(features_buffer: Tensor, desire_pulse: Tensor, traffic_convention: Tensor) -> Tensor:
    f = features_buffer[0]                                               # (25, 512), newest last
    new = f[-1]
    # speed: the dash-based estimates of the history, the newer and more confident the more weight
    wgt = f[:, HIDDEN['speed_conf']] * C['recency']
    speed = (wgt.sum() > 0.5).where((wgt * f[:, HIDDEN['speed']]).sum() / (wgt.sum() + 1e-6), DEFAULT_SPEED).maximum(0.0)
    speed_std = (wgt.sum() > 0.5).where(1.0, 10.0)
    fit0 = HIDDEN['centre_fit'].start
    a, b, c = new[fit0], new[fit0 + 1] / XS, new[fit0 + 2] / (XS * XS)   # centre y = a + b*x + c*x^2
    lines = new[HIDDEN['lines_found']].clip(0, 1)   # a fraction; any features_buffer must give finite stds
    t = C['T']
    x = speed * t
    decay = (t * (-1 / PLAN_TAU)).exp()
    # from the ego (y = 0 now) onto the lane centre: y(t) = centre(x(t)) - a*exp(-t/tau), times lines found
    y = (a + b * x + c * x * x - a * decay) * lines
    vy = ((b + 2 * c * x) * speed + a * decay / PLAN_TAU) * lines
    ay = (2 * c * speed * speed - a * decay / PLAN_TAU ** 2) * lines
    v = speed.maximum(1.0)
    yaw, yaw_rate = vy / v, ay / v
    zero = t * 0
    mean = Tensor.stack(x, y, zero, speed + zero, vy, zero, zero, ay, zero, zero, zero, yaw, zero, zero, yaw_rate, dim=-1)   # (33, 15)
    y_std = 0.1 + 0.03 * t * t + (1 - lines) * 3.0
    x_std = 0.5 + speed_std * t
    std = Tensor.stack(x_std, y_std, zero + 0.5, speed_std + 0.3 * t, 0.2 + 0.05 * t, zero + 0.5, 0.5 + 0.1 * t, 0.3 + 0.1 * t, zero + 0.5,
                       zero + 0.05, zero + 0.05, 0.02 + 0.01 * t + (1 - lines) * 0.3, zero + 0.05, zero + 0.05, 0.01 + 0.005 * t + (1 - lines) * 0.1, dim=-1)
    plan = Tensor.cat(mean.flatten(), std.maximum(1e-3).log().flatten())
    # desire state: drift across the lane over the last 0.4 s (wrapped where the ego lane switches), plus pulses
    d = f[-1, fit0] - f[-3, fit0]
    width = new[HIDDEN['lane_width']]
    d = (d > width / 2).where(d - width, (d < -width / 2).where(d + width, d))
    rate = d / (2 * FRAME_DT) * f[-3, HIDDEN['lines_found']] * lines   # no lines then or now: no drift known
    pulse = desire_pulse[0].max(0)
    lcl, lcr = ((rate - LC_RATE) * 8).clip(-4, 4), ((-rate - LC_RATE) * 8).clip(-4, 4)
    # none, turnLeft, turnRight, laneChangeLeft, laneChangeRight, keepLeft, keepRight (, reserved); keeping to the
    # traffic convention's side is slightly more likely than to the other
    desire = Tensor.stack(2.0 - lcl.relu() - lcr.relu() + zero[0], zero[0] - 4, zero[0] - 4, lcl, lcr,
                          zero[0] - 4 + traffic_convention[0, 1] * 0.5, zero[0] - 4 + traffic_convention[0, 0] * 0.5, zero[0] - 6) + pulse * 2
    return Tensor.cat(plan, desire, C['unused']).reshape(1, -1).cast(dtypes.float32)
  return fn

def policy_constants() -> dict[str, Tensor]:
  def c(a) -> Tensor: return Tensor(np.asarray(a, np.float32)).realize()
  return {'T': c(T_IDXS), 'recency': c(np.exp((np.arange(HISTORY_LEN) - HISTORY_LEN + 1) / 5.0)),
          'unused': c(np.zeros(CONTRACT.policy.width - CONTRACT.policy.heads_width))}   # the release's vector has spare entries

def policy_model() -> ModelDef: return ModelDef.to_contract('policy', CONTRACT.policy, policy_fn(policy_constants()), SOURCE_SHA256)
