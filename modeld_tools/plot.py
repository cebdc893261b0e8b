"""modeld-plot: timing and quality plots of a recorded route, as PNG, SVG or PDF files.

Each plot (PLOTS) is one figure of stacked panels (matplotlib) sharing the time axis (seconds from the route's first
model output), each with its own y scale, grid and legend. A missing value (no lead, NaN) breaks a line.
"""
from __future__ import annotations
import argparse, sys
from dataclasses import dataclass, field
from pathlib import Path
import numpy as np
from service.extras import needs_extra
from service.owned import private_umask
from modelrt.constants import X_IDXS
from dmonitoringd.fill_msgs import awareness

PLOTS = """timing      execution time of both models, frameDropPerc, frames skipped between outputs
lanes       lane line positions at a few distances ahead, and their probabilities
lead        the lead's distance, speed and probability
driver      face, eye, blink and phone probabilities of the driver's side, and awareness"""

LANE_DISTANCES = (10., 30., 60.)   # m ahead where lane positions are plotted
LANE_NAMES = ('left far', 'left', 'right', 'right far')
FORMATS = ('png', 'svg', 'pdf')

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

def draw_figure(title: str, panels: list[Panel], path: Path, width_in: float = 14., panel_in: float = 2.4) -> None:
  """One figure, a panel per row, 100 dpi (PNG: 1400 px wide); the format is the path's suffix."""
  import matplotlib
  matplotlib.use('Agg')   # files only, no display
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False, figsize=(width_in, panel_in * len(panels) + 0.6), dpi=100)
  fig.suptitle(title, x=0.01, ha='left')
  for ax, p in zip(axes[:, 0], panels):
    for s in p.series:
      if s.points: ax.plot(s.t, s.y, 'o', markersize=4, label=s.label)
      else: ax.plot(s.t, s.y, linewidth=1.5, label=s.label)
    ax.set_title(p.title, loc='left', fontsize=10)
    if p.ylim is not None: ax.set_ylim(*p.ylim)
    ax.grid(True, alpha=0.3)
    ax.legend(loc='upper right', fontsize=8)
  axes[-1, 0].set_xlabel('time (s)')
  axes[-1, 0].set_xlim(left=0)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)

@dataclass
class RouteData:
  """The plotted values of a route, one list per quantity, times in s from the route's first model output."""
  model: dict[str, list] = field(default_factory=lambda: {k: [] for k in ('t', 'frame', 'exec', 'drop', 'lanes', 'probs', 'lead_x', 'lead_v', 'lead_p')})
  dm: dict[str, list] = field(default_factory=lambda: {k: [] for k in ('t', 'exec', 'face', 'leye', 'reye', 'lblink', 'rblink', 'phone')})
  dms: dict[str, list] = field(default_factory=lambda: {k: [] for k in ('t', 'awareness', 'distracted')})

def read_route(path: str) -> RouteData:
  from oproute import LogReader
  r, t0, rhd = RouteData(), None, None
  for ev in LogReader(path, 'a', sort_by_time=True):
    if (w := ev.which()) not in ('modelV2', 'driverMonitoringState', 'driverStateV2'): continue
    # from the first output on: a recorded replay's republished messages keep their drive's clock, the outputs are on
    # this machine's, and times from the first event of all would put hours between them
    t0 = ev.logMonoTime if t0 is None else t0
    t = (ev.logMonoTime - t0) / 1e9
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
      r.dms['t'].append(t); r.dms['awareness'].append(awareness(s)); r.dms['distracted'].append(1.0 if s.visionPolicyState.isDistracted else np.nan)
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

def plots(r: RouteData, out: Path, name: str, fmt: str = 'png') -> list[Path]:
  """Write the figures that the route has data for; returns their paths."""
  written = []
  def fig(stem: str, title: str, panels: list[Panel]) -> None:
    draw_figure(f"{name}: {title}", panels, path := out / f"{stem}.{fmt}")
    written.append(path)
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
    fig('timing', f"timing  (modelV2 {_stats(m['exec'])};  driverStateV2 {_stats(dm['exec'])})", panels)
  if m['t']:
    t, lanes, probs = A(m['t']), np.stack(m['lanes']), A(m['probs'])
    panels = [Panel(f'lane line y at {d:g} m ahead (m, right positive)', [Series(n, t, lanes[:, i, k]) for i, n in enumerate(LANE_NAMES)])
              for k, d in enumerate(LANE_DISTANCES)]
    panels.append(Panel('lane line probability', [Series(n, t, probs[:, i]) for i, n in enumerate(LANE_NAMES)], ylim=(0, 1)))
    fig('lanes', 'lane lines', panels)
    fig('lead', 'lead (leadsV3[0] now; distance and speed shown where prob >= 0.5)',
        [Panel('lead distance (m)', [Series('x', t, A(m['lead_x']))]), Panel('lead speed (m/s)', [Series('v', t, A(m['lead_v']))]),
         Panel('lead probability', [Series('prob', t, A(m['lead_p']))], ylim=(0, 1))])
  if dm['t'] or dms['t']:
    t = A(dm['t'])
    panels = [Panel('face and phone probability', [Series('face', t, A(dm['face'])), Series('phone', t, A(dm['phone']))], ylim=(0, 1)),
              Panel('eyes: open and blink probability', [Series('left eye', t, A(dm['leye'])), Series('right eye', t, A(dm['reye'])),
                                                         Series('left blink', t, A(dm['lblink'])), Series('right blink', t, A(dm['rblink']))], ylim=(0, 1))]
    if dms['t']:
      series = [Series('awareness', A(dms['t']), A(dms['awareness'])), Series('distracted', A(dms['t']), A(dms['distracted']), points=True)]
      panels.append(Panel('driverMonitoringState awareness (dots: distracted)', series, ylim=(0, 1.05)))
    fig('driver', 'driver monitoring (the driver\'s side)', panels)
  return written

@needs_extra('modeld-plot', 'tools')   # zstandard for the route, matplotlib for the figures: imported as they are needed
def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog='modeld-plot', description='Timing and quality plots of a recorded route, as PNG, SVG or PDF files.',
                              epilog=PLOTS, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('route', help='route folder or name, segment folder or rlog/qlog file')
  p.add_argument('--out', help='folder for the figures (default: ROUTE/plots, or plots/ next to a log file)')
  p.add_argument('--format', choices=FORMATS, default='png', help='file format (default: png)')
  args = p.parse_args(argv)
  private_umask()
  route = Path(args.route)
  from oproute import log_files
  try: log_files(route, 'a')
  except (OSError, ValueError) as e: p.error(str(e))
  out = Path(args.out) if args.out else (route if route.is_dir() else route.parent) / 'plots'
  try: r = read_route(str(route))
  except (OSError, ValueError) as e:
    print(f"modeld-plot: {e}", file=sys.stderr)
    return 1
  if not (r.model['t'] or r.dm['t'] or r.dms['t']):
    print(f"modeld-plot: {route}: no modelV2, driverStateV2 or driverMonitoringState messages to plot", file=sys.stderr)
    return 1
  out.mkdir(parents=True, exist_ok=True)
  for f in plots(r, out, route.name, args.format): print(f)
  return 0

if __name__ == '__main__':
  sys.exit(main())
