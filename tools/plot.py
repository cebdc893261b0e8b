"""modeld-plot: timing and quality plots of a recorded route, as PNG files.

timing.png  execution time of both models, frameDropPerc, frames skipped between outputs
lanes.png   lane line positions at a few distances ahead, and their probabilities
lead.png    the lead's distance, speed and probability
driver.png  face, eye, blink and phone probabilities of the driver's side, and awareness

Charts are drawn with Pillow (a project dependency already): stacked panels sharing the time axis (seconds from the
route's first event), each with its own y scale, grid and legend. A missing value (no lead, NaN) breaks a line.
"""
from __future__ import annotations
import argparse, math, sys
from dataclasses import dataclass, field
from pathlib import Path
import numpy as np
from PIL import Image, ImageDraw, ImageFont
from modelrt.constants import X_IDXS

LANE_DISTANCES = (10., 30., 60.)   # m ahead where lane positions are plotted
PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75)]
LANE_NAMES = ('left far', 'left', 'right', 'right far')

@dataclass
class Series:
  label: str
  t: np.ndarray
  y: np.ndarray
  points: bool = False   # markers instead of a line (events)

@dataclass
class Panel:
  title: str
  series: list[Series]
  ylim: tuple[float, float] | None = None

def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
  """Round tick values (1, 2, 5 x 10^k steps) covering [lo, hi]."""
  if not math.isfinite(lo) or not math.isfinite(hi): return []
  if hi - lo < 1e-12: lo, hi = lo - 0.5, hi + 0.5
  raw = (hi - lo) / n
  mag = 10 ** math.floor(math.log10(raw))
  step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
  return [i * step for i in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)]

def _fmt(v: float) -> str: return f"{v:.10g}" if abs(v) >= 1e-9 else "0"

def draw_figure(title: str, panels: list[Panel], path: Path, width: int = 1400, panel_height: int = 240) -> None:
  font, small = ImageFont.load_default(size=18), ImageFont.load_default(size=14)
  left, right, top, gap = 90, 30, 50, 56
  height = top + len(panels) * (panel_height + gap) + 20
  img = Image.new('RGB', (width, height), 'white')
  d = ImageDraw.Draw(img)
  d.text((left, 14), title, fill='black', font=font)
  ts = [s.t for p in panels for s in p.series if len(s.t)]
  t0, t1 = 0., max((t.max() for t in ts), default=1.)   # from the route's start
  if t1 - t0 < 1e-9: t1 = t0 + 1
  x_of = lambda t: left + (np.asarray(t) - t0) / (t1 - t0) * (width - left - right)
  for k, p in enumerate(panels):
    y0 = top + k * (panel_height + gap) + 24
    y1 = y0 + panel_height - 24
    d.text((left, y0 - 22), p.title, fill='black', font=font)
    vals = np.concatenate([s.y[np.isfinite(s.y)] for s in p.series] or [np.zeros(0)])
    lo, hi = p.ylim if p.ylim else ((vals.min(), vals.max()) if len(vals) else (0., 1.))
    if hi - lo < 1e-9: lo, hi = lo - max(abs(lo) * 0.1, 0.5), hi + max(abs(hi) * 0.1, 0.5)
    pad = 0 if p.ylim else (hi - lo) * 0.06
    lo, hi = lo - pad, hi + pad
    y_of = lambda v: y1 - (np.asarray(v) - lo) / (hi - lo) * (y1 - y0)
    for v in nice_ticks(lo, hi):
      yy = float(y_of(v))
      d.line((left, yy, width - right, yy), fill=(225, 225, 225))
      d.text((left - 8, yy), _fmt(v), fill=(60, 60, 60), font=small, anchor='rm')
    for v in nice_ticks(t0, t1, 10):
      xx = float(x_of(v))
      d.line((xx, y0, xx, y1), fill=(235, 235, 235))
      d.text((xx, y1 + 4), _fmt(v), fill=(60, 60, 60), font=small, anchor='mt')
    d.rectangle((left, y0, width - right, y1), outline=(120, 120, 120))
    lx = width - right - 8 - sum(d.textlength(s.label, font=small) + 30 for s in p.series)
    for i, s in enumerate(p.series):
      c = PALETTE[i % len(PALETTE)]
      ok = np.isfinite(s.y) & (s.y >= lo) & (s.y <= hi) if s.points else np.isfinite(s.y)
      xs, ys = x_of(s.t), y_of(np.clip(s.y, lo, hi))
      if s.points:
        for x, y in zip(xs[ok], ys[ok]): d.ellipse((x - 3, y - 3, x + 3, y + 3), fill=c)
      else:   # one polyline per run of finite values
        breaks = np.flatnonzero(np.diff(ok.astype(np.int8)) != 0) + 1
        for run in np.split(np.arange(len(ok)), breaks):
          if len(run) and ok[run[0]]:
            pts = list(zip(xs[run].tolist(), ys[run].tolist()))
            if len(pts) == 1: d.ellipse((pts[0][0] - 2, pts[0][1] - 2, pts[0][0] + 2, pts[0][1] + 2), fill=c)
            else: d.line(pts, fill=c, width=2)
    # legend: right-aligned inside the panel's top, in series order, on white over the series
    d.rectangle((lx - 6, y0 + 2, width - right - 2, y0 + 22), fill='white')
    for i, s in enumerate(p.series):
      c = PALETTE[i % len(PALETTE)]
      if s.points: d.ellipse((lx + 6, y0 + 9, lx + 12, y0 + 15), fill=c)
      else: d.line((lx, y0 + 12, lx + 18, y0 + 12), fill=c, width=4)
      d.text((lx + 22, y0 + 5), s.label, fill='black', font=small)
      lx += d.textlength(s.label, font=small) + 30
  d.text((width - right, height - 6), 'time (s)', fill=(60, 60, 60), font=small, anchor='rb')
  img.save(path)

@dataclass
class RouteData:
  """The plotted values of a route, one list per quantity, times in s from the route's first event."""
  model: dict[str, list] = field(default_factory=lambda: {k: [] for k in ('t', 'frame', 'exec', 'drop', 'lanes', 'probs', 'lead_x', 'lead_v', 'lead_p')})
  dm: dict[str, list] = field(default_factory=lambda: {k: [] for k in ('t', 'exec', 'face', 'leye', 'reye', 'lblink', 'rblink', 'phone')})
  dms: dict[str, list] = field(default_factory=lambda: {k: [] for k in ('t', 'awareness', 'distracted')})

def read_route(path: str) -> RouteData:
  from oproute import LogReader
  r, t0, rhd = RouteData(), None, None
  for ev in LogReader(path, 'a', sort_by_time=True):
    t0 = ev.logMonoTime if t0 is None else t0
    t, w = (ev.logMonoTime - t0) / 1e9, ev.which()
    if w == 'modelV2':
      m, md = r.model, ev.modelV2
      m['t'].append(t); m['frame'].append(md.frameId); m['exec'].append(md.modelExecutionTime * 1e3); m['drop'].append(md.frameDropPerc)
      lanes = np.full((4, len(LANE_DISTANCES)), np.nan)
      for i, line in enumerate(list(md.laneLines)[:4]):
        xs = np.asarray(line.x) if len(line.x) == len(line.y) else X_IDXS
        if len(line.y) == len(xs) and len(xs) > 1: lanes[i] = np.interp(LANE_DISTANCES, xs, np.asarray(line.y), right=np.nan)
      m['lanes'].append(lanes)
      m['probs'].append((list(md.laneLineProbs) + [np.nan] * 4)[:4])
      lead = md.leadsV3[0] if len(md.leadsV3) else None
      p = float(lead.prob) if lead is not None else np.nan
      m['lead_p'].append(p)
      m['lead_x'].append(float(lead.x[0]) if lead is not None and len(lead.x) and p >= 0.5 else np.nan)
      m['lead_v'].append(float(lead.v[0]) if lead is not None and len(lead.v) and p >= 0.5 else np.nan)
    elif w == 'driverMonitoringState':
      s = ev.driverMonitoringState
      rhd = s.isRHD
      r.dms['t'].append(t); r.dms['awareness'].append(s.awarenessStatus); r.dms['distracted'].append(1.0 if s.isDistracted else np.nan)
    elif w == 'driverStateV2':
      s = ev.driverStateV2
      dd = s.rightDriverData if (rhd if rhd is not None else s.wheelOnRightProb > 0.5) else s.leftDriverData
      for k, v in (('t', t), ('exec', s.modelExecutionTime * 1e3), ('face', dd.faceProb), ('leye', dd.leftEyeProb), ('reye', dd.rightEyeProb),
                   ('lblink', dd.leftBlinkProb), ('rblink', dd.rightBlinkProb), ('phone', dd.phoneProb)):
        r.dm[k].append(v)
  return r

def _stats(x: list) -> str:
  a = np.asarray(x, np.float64)
  return f"mean {a.mean():.1f} / p95 {np.percentile(a, 95):.1f} / max {a.max():.1f} ms" if len(a) else "none"

def plots(r: RouteData, out: Path, name: str) -> list[Path]:
  """Write the PNGs that the route has data for; returns their paths."""
  written = []
  def fig(fname: str, title: str, panels: list[Panel]) -> None:
    draw_figure(f"{name}: {title}", panels, out / fname)
    written.append(out / fname)
  A = lambda x: np.asarray(x, np.float64)
  m, dm, dms = r.model, r.dm, r.dms
  if m['t'] or dm['t']:
    panels = [Panel('execution time (ms)', [Series('modelV2', A(m['t']), A(m['exec'])), Series('driverStateV2', A(dm['t']), A(dm['exec']))])]
    if m['t']:
      frames = A(m['frame'])
      skipped = np.concatenate([[0], np.maximum(np.diff(frames) - 1, 0)])
      panels += [Panel('modelV2.frameDropPerc (%)', [Series('frameDropPerc', A(m['t']), A(m['drop']))], ylim=(0, max(5., float(np.max(m['drop'])))))]
      panels += [Panel(f'camera frames skipped before an output ({int(skipped.sum())} in all)',
                       [Series('skipped', A(m['t']), np.where(skipped > 0, skipped, np.nan), points=True)], ylim=(0, max(3., float(skipped.max()))))]
    fig('timing.png', f"timing  (modelV2 {_stats(m['exec'])};  driverStateV2 {_stats(dm['exec'])})", panels)
  if m['t']:
    t, lanes, probs = A(m['t']), np.stack(m['lanes']), A(m['probs'])
    panels = [Panel(f'lane line y at {d:g} m ahead (m, right positive)', [Series(n, t, lanes[:, i, k]) for i, n in enumerate(LANE_NAMES)])
              for k, d in enumerate(LANE_DISTANCES)]
    panels.append(Panel('lane line probability', [Series(n, t, probs[:, i]) for i, n in enumerate(LANE_NAMES)], ylim=(0, 1)))
    fig('lanes.png', 'lane lines', panels)
    fig('lead.png', 'lead (leadsV3[0] now; distance and speed shown where prob >= 0.5)',
        [Panel('lead distance (m)', [Series('x', t, A(m['lead_x']))]), Panel('lead speed (m/s)', [Series('v', t, A(m['lead_v']))]),
         Panel('lead probability', [Series('prob', t, A(m['lead_p']))], ylim=(0, 1))])
  if dm['t'] or dms['t']:
    t = A(dm['t'])
    panels = [Panel('face and phone probability', [Series('face', t, A(dm['face'])), Series('phone', t, A(dm['phone']))], ylim=(0, 1)),
              Panel('eyes: open and blink probability', [Series('left eye', t, A(dm['leye'])), Series('right eye', t, A(dm['reye'])),
                                                         Series('left blink', t, A(dm['lblink'])), Series('right blink', t, A(dm['rblink']))], ylim=(0, 1))]
    if dms['t']:
      panels.append(Panel('driverMonitoringState awareness (dots: distracted)', [Series('awareness', A(dms['t']), A(dms['awareness'])),
                                                                                  Series('distracted', A(dms['t']), A(dms['distracted']), points=True)], ylim=(0, 1.05)))
    fig('driver.png', 'driver monitoring (the driver\'s side)', panels)
  return written

def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog='modeld-plot', description='Timing and quality plots of a recorded route, as PNG files.',
                              epilog=__doc__.split('\n\n')[1], formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('route', help='route folder, segment folder or rlog.zst (modeld-record)')
  p.add_argument('--out', help='folder for the PNGs (default: ROUTE/plots, or plots/ next to a log file)')
  args = p.parse_args(argv)
  route = Path(args.route)
  if not route.exists(): p.error(f"route {args.route!r} does not exist")
  out = Path(args.out) if args.out else (route if route.is_dir() else route.parent) / 'plots'
  try: r = read_route(str(route))
  except (OSError, ValueError) as e:
    print(f"modeld-plot: {e}", file=sys.stderr)
    return 1
  if not (r.model['t'] or r.dm['t'] or r.dms['t']):
    print(f"modeld-plot: {route}: no modelV2, driverStateV2 or driverMonitoringState messages to plot", file=sys.stderr)
    return 1
  out.mkdir(parents=True, exist_ok=True)
  for f in plots(r, out, route.name): print(f)
  return 0

if __name__ == '__main__':
  sys.exit(main())
