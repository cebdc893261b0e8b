"""modeld-replay: a route's frames through the daemons, compared with the outputs the route logged (openpilot's
model_replay, on this machine): a private stack with camerad --lockstep records a new route, whose modelV2 and
driverStateV2 are compared with the logged ones, field by field. HELP says more; docs/CAMERAD.md says all.
"""
from __future__ import annotations
import argparse, contextlib, logging, os, re, shutil, signal, subprocess, sys, tempfile, time
from datetime import datetime
from pathlib import Path
from cereal.services import ANSWERS, CAMERA_OF_STREAM, CAMERA_STATE_SERVICES, CAMERAS, STREAM_OF_STATE, answer_streams
from msgq import remove_stack
from service.extras import needs_extra
from service.owned import private_umask
from modelrt.artifact import ArtifactError, camerad_layouts

HELP = """modeld-replay: a route's frames through the daemons, compared with the outputs the route logged (openpilot's
model_replay, on this machine).

It starts a private stack (its own OPENPILOT_PREFIX): modeld for a route with road or wide road video, dmonitoringd
for one with driver video, modeld-record writing the new route, and `camerad --source ROUTE --lockstep`, which sends
each frame once the daemons answered the previous one, in buffers of a layout the artifacts were built for (the one
modeld-batch picks). A replay that fails leaves no route behind. Then it compares the new outputs with the route's logged
modelV2 and driverStateV2, frame by frame (a replayed frame is tied to its source frame by the camera state's
frameIdSensor), and prints per field the frames compared and missing and the largest and mean difference. A camera
is replayed when camerad serves it: its states, its EncodeIdx events and its video (openpilot logs the driver
camera's states and index without dcamera.hevc unless RecordFront is on); the outputs that answer only cameras not
replayed are not compared, and the report says so.
"""
with needs_extra("modeld-replay", "tools"):   # zstandard and PyAV: the route's logs and video
  from camerad.sources import LogSource, SourceError
  from modeld_tools.compare import FIELDS, FieldDiff, compare, route_outputs, table

STOP_TIMEOUT_S = 20.
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}

@contextlib.contextmanager
def signals_held():
  """SIGINT and SIGTERM wait until the block ends, so that a clean-up runs to its end (a signal that came meanwhile then
  stops modeld-replay as usual)."""
  signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
  try: yield
  finally: signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

def route_cameras(route: list[str]) -> tuple[dict[int, tuple[int, int]], dict[str, str]]:
  """The streams camerad serves frames of from the route, decided by its route source itself (camera states,
  EncodeIdx events and the video file), with their sizes, and {camera: why} of the cameras with states it does not
  serve. SourceError when there is none."""
  src = LogSource(route)
  return src.streams, src.unserved

class Stack:
  """The replay's processes, each with its stderr in a file of logs/."""
  def __init__(self, logs: Path, env: dict):
    self.logs, self.env, self.procs = logs, env, {}

  def start(self, name: str, module: str, *args) -> subprocess.Popen:
    with open(self.logs / f"{name}.log", "w") as err:   # not under signals_held: the child would inherit the blocked signals
      self.procs[name] = p = subprocess.Popen([sys.executable, "-m", module, *map(str, args)], stdout=subprocess.DEVNULL, stderr=err, env=self.env)
    return p

  def stop(self, name: str) -> int:
    p = self.procs[name]
    if p.poll() is None: p.send_signal(signal.SIGTERM)
    try: return p.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      p.kill()
      return p.wait()

  def tail(self, name: str, n: int = 15) -> str:
    return "\n".join((self.logs / f"{name}.log").read_text().splitlines()[-n:])

def wait_ready(stack: Stack, name: str, what: str, timeout: float) -> bool:
  deadline = time.monotonic() + timeout
  while what not in (stack.logs / f"{name}.log").read_text():
    if stack.procs[name].poll() is not None or time.monotonic() > deadline: return False
    time.sleep(0.05)
  return True

def run_stack(route: list[str], out: Path, artifacts: Path, cameras: list[str], layouts: list[str], logs: Path, frames: int | None,
              timeout: float) -> str | None:
  """Replay route into out; None on success, else what failed."""
  stack = Stack(logs, {**os.environ, "PYTHONUNBUFFERED": "1"})
  daemons = (["modeld"] if {"road", "wide"} & set(cameras) else []) + (["dmonitoringd"] if "driver" in cameras else [])
  try:
    for d in daemons: stack.start(d, d, "--artifacts", artifacts)
    stack.start("record", "modeld_tools.record", "--route", out)
    if not wait_ready(stack, "record", "recording", timeout): return f"modeld-record did not start:\n{stack.tail('record')}"
    cam = stack.start("camerad", "camerad", "--source", *route, "--lockstep", "--lockstep-timeout", timeout, *(["--frames", frames] if frames else []),
                      *(a for l in layouts for a in ("--layout", l)))
    while cam.poll() is None:
      if failed := [d for d in daemons if stack.procs[d].poll() is not None]:
        return f"{failed[0]} exited with {stack.procs[failed[0]].returncode}:\n{stack.tail(failed[0])}"
      time.sleep(0.1)
    if cam.returncode != 0: return f"camerad exited with {cam.returncode}:\n{stack.tail('camerad')}"
    time.sleep(0.5)   # the recorder takes in the last outputs
    for name in ["record", *daemons]:
      if (rc := stack.stop(name)) != 0: return f"{name} exited with {rc}:\n{stack.tail(name)}"
    return None
  finally:
    with signals_held():
      for name in stack.procs: stack.stop(name)
      remove_stack()   # the stack's queues, sockets and locks go with it

def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="modeld-replay", formatter_class=argparse.RawDescriptionHelpFormatter, description=HELP, epilog="""
exit codes: 0 replayed (and, with --tolerance, every field within it and no logged frame missing); 1 past the tolerance,
nothing to compare with --tolerance, or the replay failed (the failing process's log is printed); 2 bad options.
example: modeld-replay realdata/2026-11-30--04-00-00--3 --artifacts artifacts --tolerance 1e-3""")
  ap.add_argument("route", nargs="+", help="route folder or name, segment folders or log files (what camerad --source takes)")
  ap.add_argument("--artifacts", required=True, type=Path, help="artifact directory built by modeld-compile for the route's cameras")
  ap.add_argument("--out", type=Path, help="the new route with the replay's outputs (default: routes/replay--<date>--<time>)")
  ap.add_argument("--tolerance", type=float, metavar="X", help="exit 1 if a field's largest difference exceeds X or a logged frame has no new output")
  ap.add_argument("--frames", type=int, metavar="N", help="replay only the first N frames")
  ap.add_argument("--timeout", type=float, default=60., metavar="S", help="seconds to wait for the daemons to start and for each answer (default 60)")
  args = ap.parse_args(argv)
  private_umask()   # the new route and the daemons' logs
  if not args.timeout > 0: ap.error(f"--timeout: expected S > 0, got {args.timeout}")
  if args.frames is not None and args.frames < 1: ap.error(f"--frames: expected >= 1, got {args.frames}")
  if args.tolerance is not None and not args.tolerance >= 0: ap.error(f"--tolerance: expected X >= 0, got {args.tolerance}")
  out = args.out or Path("routes") / datetime.now().strftime("replay--%Y-%m-%d--%H-%M-%S")
  if out.exists(): ap.error(f"--out {out}: already exists; the replay writes a new route")
  logging.getLogger("oproute").setLevel(logging.ERROR)   # what is wrong with the route's logs camerad says, and is passed on below
  try: served, unserved = route_cameras(args.route)
  except SourceError as e: ap.error(f"nothing to replay: {e}")
  cameras = [CAMERA_OF_STREAM[s] for s in served]
  try: layouts = camerad_layouts(args.artifacts, served)
  except (ArtifactError, ValueError) as e:   # before anything starts: nothing to clean up
    print(f"modeld-replay: {e}", file=sys.stderr)
    return 1
  os.environ["OPENPILOT_PREFIX"] = f"replay{os.getpid()}"   # a private stack: its topics and camera buffers are its own
  made = [p for p in (out, *out.parents) if not p.exists()]   # what the recorder will create: a failed replay removes it
  stop_signal = signal.SIGINT
  def stopped(signum, _frame):   # SIGTERM (a service manager, `timeout`, a cancelled job) stops it as Ctrl-C does
    nonlocal stop_signal
    stop_signal = signum
    for sig in STOP_SIGNALS: signal.signal(sig, signal.SIG_IGN)   # once: a second one must not cut the clean-up short
    raise KeyboardInterrupt
  for sig in STOP_SIGNALS: signal.signal(sig, stopped)
  with tempfile.TemporaryDirectory(prefix="modeld-replay-") as logs:
    t0 = time.monotonic()
    try: err = run_stack(args.route, out, args.artifacts, cameras, layouts, Path(logs), args.frames, args.timeout)
    except KeyboardInterrupt: err = "interrupted"
    # the stack is gone: from here a signal ends modeld-replay at once, nothing is left to clean up
    for sig in STOP_SIGNALS: signal.signal(sig, signal.SIG_DFL)
    # what camerad warned of (frames it could not serve, logs cut short) is the replay's to say too: left out, a damaged
    # route would replay as a short one without a word (a failed camerad's log is printed whole below)
    if err is None and (camerad_log := Path(logs) / "camerad.log").exists():
      for m in re.finditer(r"(?:warning|error) (?:camerad|oproute\S*): (.*)", camerad_log.read_text()):
        print(f"modeld-replay: camerad: {m.group(1)}", file=sys.stderr)
    if err is not None:
      shutil.rmtree(out, ignore_errors=True)   # a partial route: nothing to compare, and it would read as a replay
      for p in made[1:]:
        try: p.rmdir()   # the folders above it, when created for it and empty
        except OSError: break
      print(f"modeld-replay: {err}\nno route written (the partial {out} was removed)", file=sys.stderr)
      return 128 + stop_signal if err == "interrupted" else 1
  print(f"replayed {', '.join(cameras)} of {' '.join(args.route)} in {time.monotonic() - t0:.1f} s into {out}")
  compared = [svc for svc in FIELDS if svc in {CAMERAS[c].answer for c in cameras}]
  for svc in FIELDS:
    if svc not in compared:
      cams = [c for c, cam in CAMERAS.items() if cam.answer == svc]
      why = "; ".join(f"{c}: {unserved[c]}" for c in cams if c in unserved) or f"no {' or '.join(cams)} camera states in the route"
      print(f"{svc} not compared, no camera it answers was replayed ({why})")
  ref, _ = route_outputs(args.route, compared)
  new, sources = route_outputs(out, compared)
  streams = {STREAM_OF_STATE[svc] for svc in sources}
  frame_map = {svc: sources[CAMERA_STATE_SERVICES[s]] for svc, s in answer_streams(ANSWERS, streams).items()}
  new = {svc: {frame_map.get(svc, {}).get(fid, fid): v for fid, v in outs.items()} for svc, outs in new.items()}
  if args.frames:   # only the source frames replayed are expected
    ref = {svc: {fid: v for fid, v in outs.items() if fid <= max(frame_map.get(svc, {}).values(), default=-1)} for svc, outs in ref.items()}
  for svc in compared:
    if not ref[svc]: print(f"the route logged no {svc}: {len(new[svc])} new ones, nothing to compare them with")
  diffs = [d for d in compare(ref, new) if ref.get(d.service)]
  if diffs: print(table(diffs))
  if args.tolerance is None: return 0
  missing = {svc: sorted(ref[svc].keys() - new[svc].keys()) for svc in compared if ref[svc]}
  for line in verdict(diffs, missing, args.tolerance): print(f"modeld-replay: {line}", file=sys.stderr)
  return 1 if not diffs or any(d.max > args.tolerance for d in diffs) or any(missing.values()) else 0

def verdict(diffs: list[FieldDiff], missing: dict[str, list[int]], tolerance: float) -> list[str]:
  """Why a replay fails --tolerance: the fields that differ beyond it, each with its largest difference and frame, and
  apart from them, per service, the logged frames without a replayed output (a field's difference is taken over the
  frames both have, so a missing frame shows in no field's)."""
  out = [] if diffs else [f"--tolerance {tolerance:g}: nothing to compare, the route logged none of the outputs replayed"]
  if over := [d for d in diffs if d.max > tolerance]:
    out.append(f"past the tolerance {tolerance:g}: " + ", ".join(f"{d.service}.{d.field} (max diff {d.max:.4g} at frame {d.worst[0][1]})" for d in over))
  for svc, fids in missing.items():
    if fids:
      shown = ", ".join(map(str, fids[:10])) + (", ..." if len(fids) > 10 else "")
      out.append(f"{len(fids)} logged {svc} frame{'s' if len(fids) > 1 else ''} without a replayed output ({shown}): "
                 f"with --tolerance a missing frame fails the replay too")
  return out

if __name__ == "__main__":
  sys.exit(main())
