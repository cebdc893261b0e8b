"""modeld-demo: the whole service on a synthetic scene, live in the terminal, compared with the scene's ground truth:
the artifacts built (skipped when unchanged), camerad, modeld, dmonitoringd and modeld-record started on a private
OPENPILOT_PREFIX, their outputs shown against the truth of each frame, then a summary and an overlay MP4."""
from __future__ import annotations
import argparse, ctypes, json, math, os, signal, subprocess, sys, time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
import numpy as np
from service.extras import needs_extra
from service.owned import private_umask
from dmonitoringd.fill_msgs import awareness

HELP = """modeld-demo: the whole service on a synthetic scene, live in the terminal, compared with the scene's ground truth.

Builds the default artifacts (modeld-compile --reference, skipped when unchanged; artifacts built from ONNX files in
that folder are used as they are), then starts camerad (every camera
of one scene, looping), modeld, dmonitoringd and modeld-record as child processes on a private OPENPILOT_PREFIX, and
subscribes to their outputs itself: a live view (a few times a second; a line every few seconds when stdout is not a
terminal) shows the ego lane lines and the lead against the truth of the frame each output belongs to, the driver
state, execution times, rates and drops. Ctrl-C or --seconds ends it: SIGTERM to every child, SIGKILL only for one
that has not exited in time, the prefix's socket directory removed; then a summary, and an overlay MP4 of the
recorded route (modeld-overlay) whose path is printed last.
"""

# the default scene: 12 s that repeat seamlessly (every track has period 12 s), so camerad loops it and frame f shows
# scene frame f % 240: a curve; a lead that appears, then closes in and falls back on the straight (a near lead on a
# curve hides the far lane lines from any camera model); a driver who blinks, then turns to a phone
PERIOD = 12.0
DEMO_SCENE = {
  "name": "demo", "description": "modeld-demo: curve, closing lead, blinking driver with a phone", "sensor": "ar0231",
  "calib": [0.01, 0.02, -0.015], "duration": PERIOD, "seed": 7,
  "road": {"lane_width": 3.7, "speed": 22.0,
           "curvature": {"keys": [[0, 0.0], [1, 0.0], [2.5, 0.002], [4.5, 0.002], [6, 0.0]], "period": PERIOD},
           "ego_offset": {"keys": [[0, 0.0], [6, 0.15], [12, 0.0]], "period": PERIOD}},
  "lead": {"present": {"keys": [[0, False], [2.5, True]], "period": PERIOD},
           "distance": {"keys": [[0, 60.0], [6, 60.0], [8.5, 25.0], [10, 25.0], [12, 60.0]], "period": PERIOD}},
  "driver": {"wheel": "left",
             "face": {"x": {"keys": [[0, 0.36], [6, 0.41], [12, 0.36]], "period": PERIOD}, "y": 0.45, "size": 0.4,
                      "yaw": {"keys": [[0, 0.0], [6, 0.0], [6.5, 0.5], [9, 0.5], [9.5, 0.0]], "period": PERIOD}},
             "eyes_closed": {"keys": [[0, False], [1.5, True], [1.8, False]], "period": 3.0},
             "phone": {"present": {"keys": [[0, False], [6, True], [9.5, False]], "period": PERIOD}}}}
OUTPUTS = ['modelV2', 'driverStateV2', 'driverMonitoringState', 'roadCameraState', 'driverCameraState']
SHOW_X = (10., 20., 40.)            # m: lane line positions shown at these distances
NEAR = (10., 50.)                   # m: lane line error range
STARTUP_TIMEOUT = 120.              # s for the daemons' first outputs (artifact load and warm-up)
STOP_TIMEOUT = 10.                  # s after SIGTERM before SIGKILL
RATE_WINDOW = 2.                    # s of arrivals a rate is measured over
OVERLAY_FRAMES = 120                # at most: one pass of the scene, re-rendered per frame

def parse_args(argv: list[str] | None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(prog='modeld-demo', description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                               epilog="""examples:
  modeld-demo                              the default scene until Ctrl-C
  modeld-demo --scene lead_braking --seconds 20
  modeld-demo --seconds 10 --no-overlay    a quick check that everything runs
  modeld-demo --view                       with modeld-view beside it (rerun: camera pictures, projected outputs, time series)
  modeld-demo --view-save demo.rrd         what modeld-view would show, written to demo.rrd (open it later: rerun demo.rrd)""")
  ap.add_argument('--scene', default='demo', help="synthetic scene: 'demo' (the default, built in), a shipped scene name "
                  "(straight, curve, lead_braking, lane_change, driver_distracted, driver_blinking) or a scene file; it loops")
  ap.add_argument('--seconds', type=float, metavar='N', help="stop N seconds after the first outputs (default: run until Ctrl-C)")
  ap.add_argument('--artifacts', default='artifacts', metavar='DIR', help="model artifacts: the reference models, built here "
                  "when missing or out of date; models built from ONNX files are used as built, never overwritten (default: ./artifacts)")
  ap.add_argument('--out', metavar='DIR', help="run folder: logs, recorded route, overlay.mp4 (default: ./out/demo-<date>--<time>)")
  ap.add_argument('--fps', type=float, metavar='F', help="camera rate (default: the scene's, 20); lower it when "
                  "the machine cannot run the models that often: a dropped frame makes the next one prepare-only")
  ap.add_argument('--no-overlay', action='store_true', help="do not render the overlay MP4 at the end")
  ap.add_argument('--view', action='store_true', help="watch the stack in modeld-view (pip install 'tinymodeld[view]'): rerun's "
                  "native viewer where there is a display, else its web viewer on 127.0.0.1, whose URL is shown")
  ap.add_argument('--view-save', metavar='FILE.rrd', type=Path, help="modeld-view writes what it shows to FILE.rrd (open it later: "
                  "rerun FILE.rrd) instead of showing it; implies --view")
  args = ap.parse_args(argv)
  if args.seconds is not None and args.seconds <= 0: ap.error(f"--seconds: expected > 0, got {args.seconds}")
  args.view = args.view or args.view_save is not None
  if args.fps is not None and not 0 < args.fps <= 100: ap.error(f"--fps: expected 0 < F <= 100, got {args.fps}")
  args.out = Path(args.out or Path('out') / f"demo-{datetime.now():%Y-%m-%d--%H-%M-%S}")
  return args

# ***** child processes *****

def _die_with_parent() -> None:
  """In the child before exec: SIGTERM when the demo dies, even by SIGKILL (Linux prctl PR_SET_PDEATHSIG)."""
  try: ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
  except (OSError, AttributeError): pass

class Child:
  """A child process (python -m MODULE) in its own process group (a terminal's Ctrl-C reaches only the demo, which
  stops the children in order), its output in a log file."""
  def __init__(self, name: str, module: str, args: list[str], env: dict, logdir: Path):
    self.name, self.log = name, logdir / f"{name}.log"
    with open(self.log, 'wb') as f:
      self.proc = subprocess.Popen([sys.executable, '-m', module, *args], stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True, preexec_fn=_die_with_parent)

  def alive(self) -> bool: return self.proc.poll() is None
  def tail(self, n: int = 15) -> str: return '\n'.join(self.log.read_text(errors='replace').splitlines()[-n:])

def stop_children(children: list[Child], timeout: float = STOP_TIMEOUT) -> dict[str, int]:
  """SIGTERM all, wait up to `timeout`, SIGKILL the rest; {name: exit code} (negative: killed by that signal)."""
  for c in children:
    if c.alive(): c.proc.send_signal(signal.SIGTERM)
  deadline, rcs = time.monotonic() + timeout, {}
  for c in children:
    try: rcs[c.name] = c.proc.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      print(f"modeld-demo: {c.name} did not stop within {timeout:g} s of SIGTERM: SIGKILL", file=sys.stderr)
      c.proc.kill()
      rcs[c.name] = c.proc.wait()
  return rcs

# ***** comparing with the truth *****

@dataclass
class Series:
  """Values of one quantity over the run."""
  v: list[float] = field(default_factory=list)
  def add(self, x: float) -> None: self.v.append(float(x))
  def __len__(self) -> int: return len(self.v)
  def mean(self) -> float: return float(np.mean(self.v)) if self.v else math.nan
  def max(self) -> float: return float(np.max(self.v)) if self.v else math.nan

class Rate:
  """Arrivals per second over the last RATE_WINDOW seconds."""
  def __init__(self): self.t: deque[float] = deque()
  def hit(self, now: float) -> None:
    self.t.append(now)
    while self.t and self.t[0] < now - RATE_WINDOW: self.t.popleft()
  def hz(self, now: float) -> float:
    while self.t and self.t[0] < now - RATE_WINDOW: self.t.popleft()
    return len(self.t) / RATE_WINDOW

class Monitor:
  """Every output the demo receives, compared with the truth of its frame (frame id modulo the scene's length)."""
  def __init__(self, scene):
    from modelrt.constants import IMG_QUEUE_LEN, X_IDXS
    self.scene, self.x = scene, X_IDXS.astype(np.float64)
    self.near = (self.x >= NEAR[0]) & (self.x <= NEAR[1])
    self.counts = dict.fromkeys(OUTPUTS, 0)
    self.rates = {s: Rate() for s in OUTPUTS}
    self.s = {k: Series() for k in ('lane', 'lead_rel', 'lead_prob_none', 'face_pos', 'eyes_ok', 'phone_ok', 'model_ms', 'dm_ms',
                                     'drop_perc')}
    self.road = self.driver = self.dms = None   # what the view shows: the newest of each
    self.first_output: float | None = None
    # outputs published invalid (as before the first calibration) and a model's warm-up are shown and counted, but left
    # out of the errors: the road model's first IMG_QUEUE_LEN - 1 valid ones see an image queue that still holds frames
    # warped without the calibration (no lead, lane lines metres off); the driver model keeps no history
    self.warmup = {'modelV2': IMG_QUEUE_LEN - 1, 'driverStateV2': 0}
    self.valid, self.left_out = dict.fromkeys(self.warmup, 0), dict.fromkeys(self.warmup, 0)
    self.last_road_frame = None
    self.skipped = 0                            # camera frames modeld published nothing for

  def truth(self, frame_id: int) -> dict: return self.scene.truth(frame_id % self.scene.n_frames)

  def update(self, svc: str, ev, now: float) -> None:
    self.counts[svc] += 1
    self.rates[svc].hit(now)
    if svc in self.warmup:
      self.valid[svc] += ev.valid
      if (warming := not ev.valid or self.valid[svc] <= self.warmup[svc]): self.left_out[svc] += 1
    if svc == 'modelV2': self.on_model(ev.modelV2, not warming)
    elif svc == 'driverStateV2': self.on_driver(ev.driverStateV2, not warming)
    elif svc == 'driverMonitoringState': self.dms = ev.driverMonitoringState
    if svc in ('modelV2', 'driverStateV2') and self.first_output is None: self.first_output = now

  def on_model(self, m, warm: bool) -> None:
    t = self.truth(m.frameId)
    lines = [np.asarray(m.laneLines[i].y, np.float64) for i in (1, 2)] if len(m.laneLines) == 4 else None
    truth_lines = [np.asarray(t['road']['lane_lines'][i]['y']) for i in (1, 2)]
    lane_err = max(np.abs(l - tl)[self.near].max() for l, tl in zip(lines, truth_lines)) if lines else math.nan
    lead, tl = m.leadsV3[0] if len(m.leadsV3) else None, t['lead']
    lead_x, lead_prob = (float(lead.x[0]) if lead is not None and len(lead.x) else math.nan), (float(lead.prob) if lead is not None else math.nan)
    if warm:
      if lines: self.s['lane'].add(lane_err)
      if tl['present'] and 10 <= tl['x'] <= 80: self.s['lead_rel'].add(abs(lead_x - tl['x']) / tl['x'])
      elif not tl['present']: self.s['lead_prob_none'].add(lead_prob)
    self.s['model_ms'].add(m.modelExecutionTime * 1e3)
    self.s['drop_perc'].add(m.frameDropPerc)
    if self.last_road_frame is not None and m.frameId > self.last_road_frame + 1: self.skipped += m.frameId - self.last_road_frame - 1
    self.last_road_frame = m.frameId
    at = lambda y: np.interp(SHOW_X, self.x, y)
    self.road = dict(frame=m.frameId, truth=t, lines=[at(l) for l in lines] if lines else None, truth_lines=[at(l) for l in truth_lines],
                     lane_err=lane_err, probs=list(m.laneLineProbs), lead_x=lead_x, lead_prob=lead_prob, exec_ms=m.modelExecutionTime * 1e3,
                     drop=m.frameDropPerc)

  def on_driver(self, d, warm: bool) -> None:
    from transformations.model import DM_WIDTH, DM_HEIGHT
    t = self.truth(d.frameId)['driver']
    side = d.rightDriverData if t['wheel_on_right'] else d.leftDriverData
    pos = np.asarray(side.facePosition, np.float64)
    face_err = math.nan
    if t['face']['present'] and len(pos) == 2:
      face_err = float(np.hypot(*((pos - t['face']['position']) * (DM_WIDTH, DM_HEIGHT))) / DM_WIDTH)
      if warm: self.s['face_pos'].add(face_err)
    blink = side.leftBlinkProb > 0.5 and side.rightBlinkProb > 0.5
    if warm: self.s['eyes_ok'].add(blink == t['eyes_closed'])
    if warm: self.s['phone_ok'].add((side.phoneProb > 0.5) == t['phone'])
    self.s['dm_ms'].add(d.modelExecutionTime * 1e3)
    self.driver = dict(frame=d.frameId, truth=t, side='right' if t['wheel_on_right'] else 'left', face_prob=side.faceProb, pos=pos,
                       face_err=face_err, eyes=(side.leftEyeProb, side.rightEyeProb), blink=(side.leftBlinkProb, side.rightBlinkProb),
                       phone=side.phoneProb, exec_ms=d.modelExecutionTime * 1e3, gpu_ms=d.gpuExecutionTime * 1e3)

# ***** the view *****

def _f(x: float, fmt: str = '.2f') -> str: return '  -  ' if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)
def _yes(b) -> str: return 'yes' if b else 'no'

def view(mon: Monitor, children: list[Child], now: float, t0: float, seconds: float | None, prefix: str, viewer: str = '') -> list[str]:
  """The live view as lines of text."""
  rate = lambda s: f"{mon.rates[s].hz(now):4.1f}/s"
  run = f"{now - mon.first_output:5.1f} s" if mon.first_output else f"starting ({now - t0:.0f} s)"
  out = [f"modeld-demo  scene {mon.scene.name} ({mon.scene.n_frames} frames, looping)  {run}"
         f"{f' of {seconds:g} s' if seconds and mon.first_output else ''}  prefix {prefix}   Ctrl-C stops",
         "processes  " + '  '.join(f"{c.name} {'running' if c.alive() else f'EXITED {c.proc.returncode}'}" for c in children),
         *([f"viewer     {viewer}"] if viewer else []),
         f"rates      camera {rate('roadCameraState')}  modelV2 {rate('modelV2')}  driverStateV2 {rate('driverStateV2')}  "
         f"driverMonitoringState {rate('driverMonitoringState')}", ""]
  r = mon.road
  if r is None: out += ["ROAD    waiting for modelV2 ..."]
  else:
    t = r['truth']
    out.append(f"ROAD    frame {r['frame']} (scene frame {t['frame']}, t {t['t']:.2f} s)   curvature {t['road']['curvature']:.4f} 1/m  "
               f"ego offset {t['road']['ego_offset']:+.2f} m")
    out.append(f"  lane line y at {'/'.join(f'{x:g}' for x in SHOW_X)} m        model                  truth           max |err| 10-50 m")
    for i, name in enumerate(('left ', 'right')):
      got = '  '.join(f"{v:+6.2f}" for v in r['lines'][i]) if r['lines'] else '   -'
      out.append(f"    ego {name}  prob {_f(r['probs'][i + 1] if len(r['probs']) == 4 else math.nan)}   {got}    "
                 f"{'  '.join(f'{v:+6.2f}' for v in r['truth_lines'][i])}")
    out[-2] += f"   {_f(r['lane_err'])} m"
    tl = t['lead']
    lead_truth = f"{tl['x']:5.1f} m" if tl['present'] else 'none'
    err = f"{abs(r['lead_x'] - tl['x']) / tl['x'] * 100:4.1f} %" if tl['present'] else ''
    out.append(f"  lead          prob {_f(r['lead_prob'])}   x {_f(r['lead_x'], '5.1f')} m   truth {lead_truth}   {err}")
    out.append(f"  execution {r['exec_ms']:6.1f} ms (mean {_f(mon.s['model_ms'].mean(), '.1f')}, max {_f(mon.s['model_ms'].max(), '.1f')})"
               f"   frameDropPerc {r['drop']:4.1f} %   camera frames without output {mon.skipped}")
  out.append("")
  d = mon.driver
  if d is None: out += ["DRIVER  waiting for driverStateV2 ..."]
  else:
    t = d['truth']
    tp = t['face'].get('position')
    out.append(f"DRIVER  frame {d['frame']}   {d['side']}-hand side   face prob {d['face_prob']:.2f}   position "
               f"({d['pos'][0]:+.3f}, {d['pos'][1]:+.3f}) truth " + (f"({tp[0]:+.3f}, {tp[1]:+.3f})  error {d['face_err'] * 100:.1f} % of width"
                                                                     if tp else "no face"))
    out.append(f"  eyes open {d['eyes'][0]:.2f} {d['eyes'][1]:.2f}  blink {d['blink'][0]:.2f} {d['blink'][1]:.2f} (truth: eyes "
               f"{'closed' if t['eyes_closed'] else 'open'})   phone {d['phone']:.2f} (truth: {_yes(t['phone'])})")
    if (s := mon.dms) is not None:
      out.append(f"  awareness {awareness(s):.2f} ({s.activePolicy})   alert {s.alertLevel}   distracted {_yes(s.visionPolicyState.isDistracted)}   "
                 f"face detected {_yes(s.visionPolicyState.faceDetected)}   RHD {_yes(s.isRHD)}")
    out.append(f"  execution {d['exec_ms']:6.1f} ms (gpu {d['gpu_ms']:.1f} ms; mean {_f(mon.s['dm_ms'].mean(), '.1f')}, "
               f"max {_f(mon.s['dm_ms'].max(), '.1f')})")
  return out

def line(mon: Monitor, now: float) -> str:
  """One line for a log (stdout not a terminal)."""
  r, d = mon.road, mon.driver
  parts = [f"t {now - mon.first_output:6.1f} s" if mon.first_output else "starting", f"camera {mon.rates['roadCameraState'].hz(now):.1f}/s",
           f"modelV2 {mon.rates['modelV2'].hz(now):.1f}/s", f"driverStateV2 {mon.rates['driverStateV2'].hz(now):.1f}/s"]
  if r: parts.append(f"frame {r['frame']}: lane err {_f(r['lane_err'])} m, lead {_f(r['lead_x'], '.1f')} m p {_f(r['lead_prob'])}, "
                     f"exec {r['exec_ms']:.0f} ms, drop {r['drop']:.1f} %")
  if d: parts.append(f"face p {d['face_prob']:.2f} err {_f(d['face_err'] * 100, '.1f')} %, blink {d['blink'][0]:.2f}, phone {d['phone']:.2f}")
  if mon.dms: parts.append(f"awareness {awareness(mon.dms):.2f}")
  return ' | '.join(parts)

def summary(mon: Monitor, seconds: float) -> list[str]:
  s, c = mon.s, mon.counts
  hz = lambda n: f"{n / seconds:.1f}/s" if seconds > 0 else '-'
  return [
    f"summary ({seconds:.1f} s of outputs)",
    f"  frames        camera {c['roadCameraState']} ({hz(c['roadCameraState'])}), modelV2 {c['modelV2']} ({hz(c['modelV2'])}), "
    f"driverStateV2 {c['driverStateV2']} ({hz(c['driverStateV2'])}), driverMonitoringState {c['driverMonitoringState']}",
    f"  drops         camera frames without modelV2 from its first on {mon.skipped} (before it: modeld's start-up), "
    f"frameDropPerc mean {_f(s['drop_perc'].mean(), '.1f')} % "
    f"max {_f(s['drop_perc'].max(), '.1f')} %",
    "  left out      of the errors: " + ', '.join(f"{n} {svc}" for svc, n in mon.left_out.items()) + " (published invalid, "
    f"as before the first calibration, and the road model's warm-up: its first {mon.warmup['modelV2']} valid, the image queue filling)",
    f"  lane lines    ego left/right |error| over 10-50 m: mean {_f(s['lane'].mean(), '.3f')} m, worst {_f(s['lane'].max(), '.3f')} m "
    f"({len(s['lane'])} frames)",
    f"  lead          distance error (10-80 m): mean {_f(s['lead_rel'].mean() * 100, '.1f')} %, worst {_f(s['lead_rel'].max() * 100, '.1f')} % "
    f"({len(s['lead_rel'])} frames); prob without a lead: max {_f(s['lead_prob_none'].max())} ({len(s['lead_prob_none'])} frames)",
    f"  driver        face position error: mean {_f(s['face_pos'].mean() * 100, '.1f')} %, worst {_f(s['face_pos'].max() * 100, '.1f')} % "
    f"of the width; eyes right in {_f(s['eyes_ok'].mean() * 100, '.0f')} %, phone right in {_f(s['phone_ok'].mean() * 100, '.0f')} % "
    f"of {len(s['eyes_ok'])} frames",
    f"  execution     modelV2 mean {_f(s['model_ms'].mean(), '.1f')} ms, max {_f(s['model_ms'].max(), '.1f')} ms; "
    f"driverStateV2 mean {_f(s['dm_ms'].mean(), '.1f')} ms, max {_f(s['dm_ms'].max(), '.1f')} ms"]

# ***** the run *****

def scene_layouts(scene) -> list:
  """The buffer layouts the demo's reference artifacts serve: every camera size of the scene, packed (camerad's
  default) and aligned (rows padded like real camera buffers: camerad --layout aligned)."""
  from msgq.visionipc.layout import NV12Layout
  return [f(w, h) for w, h in sorted({(c.width, c.height) for c in scene.cameras.values()}) for f in (NV12Layout.packed, NV12Layout.aligned)]

def prepare_artifacts(artifacts: str, scene) -> list[str]:
  """The artifacts the daemons will load; returns camerad's --layout arguments for them. Reference models are built
  (or found unchanged) here; models built from model files (ONNX) are used as they are, never overwritten, in the
  layouts modeld-replay and modeld-batch would run them in."""
  from cereal.services import CAMERAS
  from modelrt.artifact import FAMILIES, ArtifactError, camerad_layouts, read_manifest
  commands = {}
  for fam in FAMILIES:
    try: commands[fam] = read_manifest(artifacts, fam).manifest['command']
    except ArtifactError: pass
  if not (foreign := {f: c for f, c in commands.items() if '--reference' not in c}):
    build_artifacts(artifacts, scene)
    return []
  try: layouts = camerad_layouts(artifacts, {CAMERAS[c].stream: (cam.width, cam.height) for c, cam in scene.cameras.items()})
  except (ArtifactError, ValueError) as e:
    raise SystemExit(f"modeld-demo: {artifacts} holds models built from model files ({', '.join(foreign)}), which the demo does not overwrite "
                     f"with its reference models, and they cannot serve its cameras: {e}; or give the demo another --artifacts folder") from None
  built = '; '.join(f"{f}: {' '.join(c)}" for f, c in foreign.items())
  print(f"modeld-demo: artifacts: {artifacts} as built ({built})", flush=True)
  return [a for l in layouts for a in ('--layout', l)]

def build_artifacts(artifacts: str, scene) -> None:
  """modeld-compile --reference for the scene's cameras; it skips an unchanged build itself. Progress on stderr."""
  cmd = [sys.executable, '-m', 'modelrt.compile', '--reference', '--out', artifacts, *[a for l in scene_layouts(scene) for a in ('--camera', str(l))]]
  print(f"modeld-demo: artifacts: {' '.join(['modeld-compile', *cmd[3:]])}", flush=True)
  t = time.monotonic()
  if subprocess.run(cmd, stdin=subprocess.DEVNULL).returncode != 0: raise SystemExit("modeld-demo: the artifact build failed (above)")
  print(f"modeld-demo: artifacts ready in {time.monotonic() - t:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
  args = parse_args(argv)
  private_umask()   # its logs, scene, recording and video, and those of the stack it starts
  with needs_extra('modeld-demo', 'tools'):   # before anything is built or written: the stack it starts needs them
    import camerad.main, modeld_tools.record, modeld_tools.overlay  # noqa: F401
  if args.view:
    with needs_extra('modeld-demo', 'view'): from modeld_tools.view import GRPC_PORT, WEB_PORT, web_url
  from camerad.scene import load_scene, parse_scene, SceneError
  try: scene = parse_scene(DEMO_SCENE, 'demo') if args.scene == 'demo' else load_scene(args.scene)
  except (OSError, SceneError) as e:
    print(f"modeld-demo: scene {args.scene!r}: {e}", file=sys.stderr)
    return 2
  (logdir := args.out / 'logs').mkdir(parents=True, exist_ok=True)
  scene_spec = args.scene
  if args.scene == 'demo':   # camerad and modeld-overlay read scenes from files
    (scene_file := args.out / 'scene.json').write_text(json.dumps(DEMO_SCENE, indent=1))
    scene_spec = str(scene_file)
  try: camera_layout = prepare_artifacts(args.artifacts, scene)
  except KeyboardInterrupt:
    print("\nmodeld-demo: interrupted while building the artifacts", file=sys.stderr)
    return 130

  prefix = f"demo{os.getpid()}"
  os.environ['OPENPILOT_PREFIX'] = prefix   # before any socket: this process and its children use the private prefix
  env = {**os.environ, 'DEV': os.environ.get('DEV', 'CPU')}
  from cereal import messaging
  from service import StopFlag
  stop = StopFlag()
  mon, children, socks = Monitor(scene), [], {}
  tty, t0, exit_code = sys.stdout.isatty(), time.monotonic(), 0
  try:
    socks = {s: messaging.sub_sock(s, timeout=0) for s in OUTPUTS}   # before the publishers: their first messages are not missed
    route = args.out / 'route'
    camerad_args = ['--source', f'synthetic:{scene_spec}', '--loop', *camera_layout, *(['--fps', str(args.fps)] if args.fps else [])]
    children = [Child('camerad', 'camerad', camerad_args, env, logdir),
                Child('modeld', 'modeld', ['--artifacts', args.artifacts], env, logdir),
                Child('dmonitoringd', 'dmonitoringd', ['--artifacts', args.artifacts], env, logdir),
                Child('record', 'modeld_tools.record', ['--route', str(route)], env, logdir)]
    viewer = ''
    if args.view:   # stopped with the recorder; the native viewer it opens stays open
      web = not (os.environ.get('DISPLAY') or os.environ.get('WAYLAND_DISPLAY'))
      where = ['--save', str(args.view_save)] if args.view_save else ['--web'] if web else []
      children.append(Child('view', 'modeld_tools.view', ['--live', *where], env, logdir))
      viewer = str(args.view_save) if args.view_save else web_url(GRPC_PORT, WEB_PORT) if web else "rerun's native viewer"
    print(f"modeld-demo: started {', '.join(f'{c.name} (pid {c.proc.pid})' for c in children)} with OPENPILOT_PREFIX={prefix}; "
          f"logs in {logdir}; {f'stops after {args.seconds:g} s of outputs or on Ctrl-C' if args.seconds else 'Ctrl-C stops'}"
          f"{f'; viewer: {viewer}' if viewer else ''}", flush=True)
    if tty: sys.stdout.write('\x1b[?25l')   # hide the cursor while redrawing
    next_draw = 0.
    while not stop:
      now = time.monotonic()
      for svc, sock in socks.items():
        for ev in messaging.drain_sock(sock): mon.update(svc, ev, now)
      if dead := [c for c in children if not c.alive()]:
        print(f"\nmodeld-demo: {dead[0].name} exited with code {dead[0].proc.returncode}; its log ({dead[0].log}) ends:\n{dead[0].tail()}",
              file=sys.stderr)
        exit_code = 1
        break
      if mon.first_output is None and now - t0 > STARTUP_TIMEOUT:
        print(f"\nmodeld-demo: no outputs within {STARTUP_TIMEOUT:g} s; modeld's log ends:\n{children[1].tail()}", file=sys.stderr)
        exit_code = 1
        break
      if args.seconds is not None and mon.first_output is not None and now - mon.first_output >= args.seconds: break
      if now >= next_draw:
        if tty: sys.stdout.write('\x1b[H\x1b[J' + '\n'.join(view(mon, children, now, t0, args.seconds, prefix, viewer)) + '\n')
        else: print(line(mon, now))
        sys.stdout.flush()
        next_draw = now + (0.25 if tty else 2.)
      time.sleep(0.02)
  finally:
    if tty: sys.stdout.write('\x1b[?25h\n')
    duration = time.monotonic() - mon.first_output if mon.first_output else 0.
    # camera and daemons first, the recorder last so it keeps their final messages
    rcs = stop_children(children[:3]) | stop_children(children[3:])
    for s in socks.values(): s.close()
    from msgq import remove_stack
    remove_stack()   # the private prefix's queues, sockets and locks: nobody uses them now
  bad = {n: rc for n, rc in rcs.items() if rc not in (0, -signal.SIGTERM)}
  print(f"modeld-demo: stopped {', '.join(f'{n} ({rc})' for n, rc in rcs.items())}" +
        (f"; unclean: {bad}, logs in {logdir}" if bad else ''))
  print('\n'.join(summary(mon, duration)))
  if exit_code == 0 and bad: exit_code = 1
  print(f"modeld-demo: recorded route: {route}")
  if not args.no_overlay and mon.counts['modelV2'] and (route / f'{route.name}--0').is_dir():
    out = args.out / 'overlay.mp4'
    # the frames of one pass of the scene at most: the overlay re-renders each frame from the scene
    cmd = [sys.executable, '-m', 'modeld_tools.overlay', str(route), '--scene', scene_spec, '--out', str(out), '--width', '960',
           '--frames', str(min(scene.n_frames, OVERLAY_FRAMES))]
    if subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL).returncode == 0: print(f"modeld-demo: overlay video: {out}")
    else: exit_code = exit_code or 1
  return exit_code

if __name__ == '__main__':
  sys.exit(main())
