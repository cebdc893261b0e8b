"""modeld-batch: the road and driver-monitoring models over every segment of many routes, on Ray (this machine or a
cluster), and `modeld-batch diff`, which compares two runs. The driver lists the segments, checks the artifacts against
the routes' cameras, hands the segments to its workers (pool.py) and sums up; a worker runs a segment through the
daemons' own frame code (segment.py). Design, faults survived and figures: docs/BATCH.md."""
from __future__ import annotations
import argparse, json, math, os, shutil, signal, socket, sys, time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from service import reader_left
from service.extras import needs_extra
from service.owned import private_umask

HELP = """  modeld-batch ROUTE... --artifacts DIR --out DIR [--workers N] [--threads N] [--batch-frames N] [--gpus-per-worker F] [--address ADDR]
                      [--resume]
  modeld-batch diff OUT_A OUT_B [--top N]

One Ray task per segment, served by long-lived actors (one per worker) that load the artifacts once, as a daemon does.
A segment's frames go through the daemons' own frame code (modeld_batch/segment.py); its outputs and input camera states go
to OUT/<route>/<route>--<n>/rlog.zst, its counts beside it (counts.json), written under a temporary name and renamed when
complete. A worker lost with its process or node costs the segment it ran a re-run, not the job. Ctrl-C and SIGTERM
stop the job cleanly (exit 130, 143): --resume goes on from there. Before Ray starts, the artifacts' manifests are
checked against each route's camera sizes. Without --address, ray.init() starts a local Ray with --workers workers
(default: one per core, or per --threads cores); with it, the job joins that cluster, and ROUTE, --artifacts and --out
must be paths every node reads, this machine included (a shared file system). Artifacts built for a GPU (modeld-compile
--device CUDA) run on workers Ray gives --gpus-per-worker of a card (default 1; 0.25: four workers share one)."""

# how long --address gets to accept a connection: ray.init() would retry an address where nothing listens for many
# minutes, in native code that holds off SIGTERM and Ctrl-C; this check waits in Python, where both stop it
CONNECT_TIMEOUT_S = 10.

@dataclass
class Job:
  route: str        # the route's name: OUT/<route>/
  n: int            # segment number
  src: str          # the segment folder
  out: str          # OUT/<route>/<route>--<n>

@dataclass
class RouteSummary:
  route: str
  segments: int = 0
  done: int = 0
  resumed: int = 0              # complete from an earlier run (--resume)
  frames: int = 0               # camera frames served (a tick's road, wide road and driver frames count once)
  lost: int = 0                 # camera frames the segments could not serve (missing from the video, undecodable, or a
                                #   road/wide frame whose partner is missing: lockstep serves them together)
  lost_why: dict[str, int] = field(default_factory=dict)   # reason -> frames
  unserved: dict[str, int] = field(default_factory=dict)   # "camera: why it has no frames" -> segments (its model not run there)
  invalid: int = 0              # frames with a modelV2 or driverStateV2 published valid = False
  bad_output: int = 0           # model runs whose outputs could not be parsed: skipped, nothing published
  model_s: float = 0.           # sum of modelExecutionTime and driverStateV2's
  wall_s: float = 0.            # sum of the segments' wall times on their workers
  unrecorded: int = 0           # resumed segments without their counts (an older modeld-batch's): not in the counts above
  rerun: int = 0                # this run's segment runs lost with their worker (its node or process died), and run again
  rerun_why: dict[str, int] = field(default_factory=dict)  # reason -> runs
  errors: list[str] = field(default_factory=list)

  def add(self, r: dict) -> None:
    """A finished segment's counts (its worker's result, or the COUNTS file beside its output): the counts above cover
    every finished segment, resumed ones included."""
    self.frames, self.invalid, self.lost = self.frames + r["frames"], self.invalid + r["invalid"], self.lost + r["lost"]
    self.bad_output += r["bad_output"]
    self.lost_why, self.unserved = dict(Counter(self.lost_why) + Counter(r["lost_why"])), dict(Counter(self.unserved) + Counter(r["unserved"]))
    self.model_s, self.wall_s = self.model_s + r["model_s"], self.wall_s + r["wall_s"]

def remove_partial(out: Path) -> None:
  """The temporary outputs of segments not completed (a segment's run writes .<route>--<n>.<id>.tmp, renamed when whole)."""
  for tmp in out.glob("*/.*.tmp"): shutil.rmtree(tmp, ignore_errors=True)

def route_jobs(routes: list[str], out: Path) -> list[Job]:
  """A job per segment of each route (a segment range after a route, as openpilot writes it, picks some: ROUTE/2:4),
  named as openpilot names them: a route folder or a route name gives its name; a segment folder its route's."""
  from oproute.logreader import route_name, route_segments, segment_number
  jobs = []
  for r in routes:
    for seg in route_segments(r)[0]:
      n, name = max(segment_number(seg), 0), route_name(seg)
      jobs.append(Job(name, n, str(seg), str(out / name / f"{name}--{n}")))
  if len({j.out for j in jobs}) != len(jobs): raise ValueError("two segments map to the same output (a route given twice?)")
  return jobs

def manifests(artifacts: Path) -> dict:
  """Both families' artifacts as their manifests describe them (nothing loaded): what this machine checks before Ray."""
  from modelrt.artifact import FAMILIES, ArtifactError, read_manifest
  try: return {f: read_manifest(artifacts, f) for f in FAMILIES}
  except ArtifactError as e: raise ValueError(str(e)) from None

def check_layouts(jobs: list[Job], arts: dict) -> None:
  """Every route's cameras have a buffer layout in the artifacts: each camera's size from the first of its segments
  whose video opens (a video that does not is its segment's error, later)."""
  from cereal.services import CAMERAS
  from oproute.video import VideoError, video_size
  from modelrt.artifact import stream_layouts
  seen = set()
  for j in jobs:
    sizes = {}
    for c in CAMERAS.values():
      if (j.route, c.stream) in seen or not (v := Path(j.src) / c.video).is_file(): continue
      try: sizes[c.stream] = video_size(v)
      except VideoError: continue
      seen.add((j.route, c.stream))
    try: stream_layouts(arts, sizes)
    except ValueError as e: raise ValueError(f"{j.src}: {e}") from None

def cluster_endpoint(address: str) -> tuple[str, int]:
  """The host and port ray.init(address=...) connects to, found as Ray finds them: auto is RAY_ADDRESS or the Ray
  running on this machine; a ray:// address is a Ray Client server (port 10001 unless given); localhost becomes this
  node's IP address. ConnectionError where auto finds no cluster."""
  from ray._private.services import canonicalize_bootstrap_address_or_die
  if address == "auto" and os.environ.get("RAY_ADDRESS"): address = os.environ["RAY_ADDRESS"]
  if "://" in address: hostport, default = address.split("://", 1)[1].rstrip("/"), "10001"
  else: hostport, default = canonicalize_bootstrap_address_or_die(address), None
  host, sep, port = hostport.rpartition(":")
  if not sep and default: host, port = hostport, default
  if not host or not port.isdigit(): raise ValueError(f"--address: expected HOST:PORT, auto or ray://HOST[:PORT], got {address!r}")
  return host, int(port)

def check_cluster(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
  """ConnectionError naming the address unless something accepts a connection where Ray would connect for it within
  timeout seconds (a cluster there is then up to ray.init to find)."""
  host, port = cluster_endpoint(address)
  seen_as = "" if address == f"{host}:{port}" else f" (Ray connects to it as {host}:{port})"
  try: socket.create_connection((host, port), timeout=timeout).close()
  except OSError as e:
    raise ConnectionError(f"no Ray cluster answers at {address}{seen_as}: {e.strerror or f'no answer in {timeout:.0f} s'}; "
                          "start one there (ray start --head) or give its address") from None

def segment_counts(j: Job) -> dict | None:
  """The counts a worker left beside a complete segment's output; None where there are none (an older modeld-batch's)."""
  from modeld_batch.segment import COUNTS
  try: return json.loads((Path(j.out) / COUNTS).read_text())
  except (OSError, ValueError): return None

def run(args) -> int:
  # a local Ray is this machine's alone: its node address is loopback, and so every process it starts (the GCS, the
  # raylet, the agents, the workers) listens on 127.0.0.1 only, not on every interface (Ray's setting for Windows and
  # macOS, where it starts no cluster); read when ray is imported
  if not args.address: os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
  import ray
  from tqdm import tqdm
  from modeld_batch.pool import Pool
  from modeld_batch.segment import SegmentWorker
  out = Path(args.out)
  jobs = route_jobs(args.routes, out)
  remove_partial(out)   # what an interrupted run left
  done = {j.out for j in jobs if (Path(j.out) / "rlog.zst").is_file()}
  if done and not args.resume:
    sys.exit(f"modeld-batch: {out} already holds {len(done)} of these segments' outputs: give --resume to skip them, or another --out")
  todo = [j for j in jobs if j.out not in done]
  summary = {j.route: RouteSummary(j.route) for j in jobs}
  for j in jobs:
    (s := summary[j.route]).segments += 1
    if j.out not in done: continue
    s.resumed += 1
    if (r := segment_counts(j)) is None: s.unrecorded += 1
    else: s.add(r)
  if not todo:   # --resume after a complete run: nothing for Ray and the workers to start for
    report(summary, out, dict.fromkeys(("wall_s", "ray_s", "start_s", "job_s"), 0.))
    return 0
  local = {} if args.address else {"num_cpus": (args.workers or max(1, (os.cpu_count() or 1) // args.threads)) * args.threads,
                                   "include_dashboard": False}
  # SIGTERM (kill, timeout, systemd) stops the job as Ctrl-C does. The first of either raises KeyboardInterrupt, unless
  # deferred (while a local Ray starts: ray.init() cut short leaves processes behind that ray.shutdown() does not know
  # of; while a finished segment is counted); later ones are only noted, so that nothing cuts the clean-up short
  caught, deferred = [], False
  def on_signal(signum, frame):
    caught.append(signum)
    if len(caught) == 1 and not deferred: raise KeyboardInterrupt
  handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
  t0, t_ray, t_workers, t1 = time.monotonic(), None, None, None   # t_*: when Ray's start-up, the workers' and the segments' began
  pool, reported = None, set()
  # Ray's driver prints its notices (a worker died, a task failed) to stdout: they go to stderr, with the progress bar,
  # and stdout holds the summary table alone
  stdout, sys.stdout = sys.stdout, sys.stderr
  try:   # from here on a Ctrl-C or SIGTERM (checking the inputs, Ray starting, the segments) stops cleanly
    arts = manifests(args.artifacts)
    # workers run where Ray puts them: they get the artifact's tinygrad device from here, not from their node's default
    device = args.device or arts["road"].manifest["target"]["device"]
    if args.gpus_per_worker is None: args.gpus_per_worker = 0. if device.split(":")[0] == "CPU" else 1.
    check_layouts(todo, arts)
    for art in arts.values():
      if args.batch_frames not in art.batches:
        raise ValueError(f"--batch-frames {args.batch_frames}: {art.dir} has batches of {', '.join(map(str, art.batches))} frames; "
                         f"build it with: {art.rebuild_command(extra_batch=args.batch_frames)}")
    if args.address: check_cluster(args.address)
    # ray.init() would set its own SIGTERM handler (sys.exit, wherever its start-up is), its core worker a native one
    # (a crash dump on stderr): ours stays, and replaces the native one after
    ray_sigterm, ray._private.utils.set_sigterm_handler = ray._private.utils.set_sigterm_handler, lambda handler: None
    t_ray, deferred = time.monotonic(), not args.address   # joining a cluster starts no process here: a signal stops it at once
    try: ray.init(address=args.address, log_to_driver=False, runtime_env={"env_vars": {"DEV": device.split(":")[0]}}, **local)
    except Exception as e:
      # a signal to the whole process group (systemd's stop) stops Ray's own processes too: its start-up fails, later
      if caught: raise KeyboardInterrupt from None
      if not args.address or not isinstance(e, ConnectionError | RuntimeError): raise
      raise ConnectionError(f"could not join the Ray cluster at {args.address}: {str(e).strip().splitlines()[0][:300]}") from None
    finally:
      deferred, ray._private.utils.set_sigterm_handler = False, ray_sigterm
      signal.signal(signal.SIGTERM, on_signal)
    if caught: raise KeyboardInterrupt   # the signal that came while Ray started
    t_workers = time.monotonic()
    cpus = [int(n["Resources"].get("CPU", 0)) for n in ray.nodes() if n["Alive"]]   # a worker's cores are on one node
    if args.threads > max(cpus, default=0):
      raise ValueError(f"--threads {args.threads}: a worker takes that many cores of one node, expected at most the {max(cpus, default=0)} "
                       "of the cluster's largest")
    if (gpu := args.gpus_per_worker) > 0:
      gpus = [float(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n["Alive"]]
      if gpu > max(gpus, default=0):
        raise ValueError(f"--gpus-per-worker {gpu:g}: a worker takes that much of one node's GPUs, the cluster's nodes have "
                         f"{', '.join(f'{g:g}' for g in gpus) or 'none'} (Ray counts the GPUs it sees: CUDA_VISIBLE_DEVICES, or ray start --num-gpus)")
      cpus = [min(c // args.threads, math.floor(g / gpu + 1e-9)) * args.threads for c, g in zip(cpus, gpus)]
    n_workers = args.workers or max(1, sum(c // args.threads for c in cpus))
    print(f"ray: {'joined ' + args.address if args.address else 'local'}, {n_workers} workers of {args.threads} core(s) in {t_workers - t_ray:.1f} s",
          file=sys.stderr)
    # no restart by Ray, no retry of a call: a lost worker is replaced at once by a new one, wherever a core is free,
    # and the pool, not Ray, counts what its loss costs (Ray's retries all go to the dead worker's address)
    pool = Pool(lambda: SegmentWorker.options(num_cpus=args.threads, num_gpus=args.gpus_per_worker, max_restarts=0, max_task_retries=0,
                                              max_concurrency=args.batch_frames).remote(str(args.artifacts), args.threads, device, args.batch_frames),
                min(n_workers, -(-len(todo) // args.batch_frames)) or 1, list(todo), lambda line: tqdm.write(line, file=sys.stderr), args.batch_frames)
    with tqdm(total=len(jobs), initial=len(done), unit="segment", desc="modeld-batch", disable=args.quiet) as bar:
      while pool.queue or pool.pending:
        pool.dispatch()
        if (ref := pool.wait()) is None:   # no worker left, and none may start again
          for j in pool.queue: summary[j.route].errors.append(f"{Path(j.src).name}: not run: no worker could start")
          break
        if ref in pool.starting:   # the segments' time starts with the first worker ready
          try: w = pool.started(ref)
          except ray.exceptions.RayActorError as e: sys.exit(f"modeld-batch: the workers could not start: {str(e).splitlines()[0][:300]}")
          if w and t1 is None:
            t1 = time.monotonic()
            print(f"first worker ready (artifacts loaded) in {t1 - t_workers:.1f} s", file=sys.stderr)
          continue
        deferred = True   # a signal waits until this result is counted whole, and once
        j, r = pool.result(ref)
        if r is not None:   # not a segment gone back to the queue
          if r.get("error"): summary[j.route].errors.append(f"{Path(j.src).name}: {r['error']}")
          else:
            summary[j.route].done += 1
            summary[j.route].add(r)
          reported.add(j.out)
          bar.update()
        deferred = False
        if caught: raise KeyboardInterrupt
  except KeyboardInterrupt:
    if not caught: caught.append(signal.SIGINT)   # raised by on_signal, unless Python raised one of its own
    for a in pool.actors if pool else (): ray.kill(a, no_restart=True)
    print(f"modeld-batch: interrupted ({signal.Signals(caught[0]).name}); complete segments are kept, --resume goes on from there", file=sys.stderr)
  finally:
    # a signal from here on is only noted: the job is complete, or stopping already
    deferred, t2, stopped = True, time.monotonic(), caught[0] if caught else None
    try: ray.shutdown()
    finally: sys.stdout = stdout
    remove_partial(out)   # what lost workers and an interrupted run's left (each segment failed removes its own)
    for route, why in pool.reruns if pool else ():
      summary[route].rerun += 1
      summary[route].rerun_why[why] = summary[route].rerun_why.get(why, 0) + 1
    if stopped:
      for j in todo:   # completed as the job stopped, its result not yet in: done all the same (--resume skips it)
        if j.out not in reported and (Path(j.out) / "rlog.zst").is_file() and (r := segment_counts(j)) is not None:
          summary[j.route].done += 1
          summary[j.route].add(r)
  # each phase's time, up to the next phase's start, or the end where the job stopped in it
  span = lambda t, t_next: ((t_next or t2) - t) if t else 0.
  try: report(summary, out, {"wall_s": time.monotonic() - t0, "ray_s": span(t_ray, t_workers), "start_s": span(t_workers, t1), "job_s": span(t1, None)},
              interrupted=stopped)
  finally:
    for sig, h in handlers.items(): signal.signal(sig, h)
  return 128 + stopped if stopped else 1 if any(s.errors for s in summary.values()) else 0   # 128 + the signal, as a shell reports it

def report(summary: dict[str, RouteSummary], out: Path, times: dict[str, float], interrupted: int | None = None) -> None:
  """The table on the terminal, and OUT/summary.json. times: wall_s (all of it), ray_s (Ray's start-up), start_s (the
  workers', artifacts loaded), job_s (the segments, from the workers ready to the last result). interrupted: the
  signal that stopped the job early, if one did."""
  rows = [f"{'route':40s} {'segments':>8s} {'done':>5s} {'resumed':>7s} {'failed':>6s} {'frames':>7s} {'invalid':>7s} {'bad out':>7s} "
          f"{'lost':>5s} {'model s':>8s} {'wall s':>7s}"]
  for s in summary.values():
    rows.append(f"{s.route[:40]:40s} {s.segments:8d} {s.done:5d} {s.resumed:7d} {len(s.errors):6d} {s.frames:7d} {s.invalid:7d} {s.bad_output:7d} "
                f"{s.lost:5d} {s.model_s:8.1f} {s.wall_s:7.1f}")
    rows += [f"  failed: {e}" for e in s.errors] + [f"  lost {n}: {why}" for why, n in Counter(s.lost_why).most_common()]
    rows += [f"  not run in {n} segment(s): {why}" for why, n in Counter(s.unserved).most_common()]
    rows += [f"  run again {n} time(s): {why}" for why, n in Counter(s.rerun_why).most_common()]
    if s.unrecorded: rows.append(f"  {s.unrecorded} resumed segment(s) without their counts (written by an older modeld-batch): not in frames and the rest")
  if interrupted:
    left = sum(s.segments - s.done - s.resumed - len(s.errors) for s in summary.values())
    rows.append(f"interrupted ({signal.Signals(interrupted).name}): {left} segment(s) not run; the same command with --resume goes on from there")
  if all(s.resumed == s.segments for s in summary.values()):
    rows.append(f"nothing to run: all {sum(s.segments for s in summary.values())} segments were already done (--resume)")
  else:
    rows.append(f"wall time {times['wall_s']:.1f} s: Ray {times['ray_s']:.1f} s, workers' start {times['start_s']:.1f} s, "
                f"segments {times['job_s']:.1f} s")
  out.mkdir(parents=True, exist_ok=True)   # the file first: a terminal's reader that leaves early (| head) cannot lose it
  (out / "summary.json").write_text(json.dumps({**times, "interrupted": interrupted is not None, "routes": [asdict(s) for s in summary.values()]},
                                               indent=1))
  try: print("\n".join(rows), flush=True)
  except BrokenPipeError: reader_left()

def diff(args) -> int:
  from modeld_tools.compare import compare, route_outputs, table
  a, b = Path(args.a), Path(args.b)
  if missing := [str(p) for p in (a, b) if not p.is_dir()]:
    print(f"modeld-batch diff: expected two modeld-batch output folders; no such folder: {', '.join(missing)}", file=sys.stderr)
    return 1
  ra, rb = ({d.name for d in p.iterdir() if d.is_dir()} for p in (a, b))
  for p, only in ((a, ra - rb), (b, rb - ra)):
    if only: print(f"only in {p} (not compared): {', '.join(sorted(only))}")
  if not (routes := sorted(ra & rb)):
    print(f"modeld-batch diff: {a} and {b} share no route", file=sys.stderr)
    return 1
  failed = []   # routes one side has no outputs of: not a modeld-batch output (a routes folder, say), or an empty one
  for r in routes:
    try:
      outs = [route_outputs(p / r)[0] for p in (a, b)]
      n = [sum(map(len, o.values())) for o in outs]
      why = "" if all(n) else "; ".join(f"{p / r}: {k} {' and '.join(o)} messages" for p, k, o in zip((a, b), n, outs))
    except (OSError, ValueError) as e: why = str(e)   # no segment there
    if why:
      print(f"modeld-batch diff: {r}: expected model outputs on both sides, got {why}", file=sys.stderr)
      failed.append(r)
      continue
    diffs = compare(*outs, top=args.top)
    print(f"\n{r}\n{table(diffs)}")
    for d in diffs:
      if d.worst and d.worst[0][0] > 0:
        print(f"  {d.service}.{d.field}: largest changes at " + ", ".join(f"frame {fid} ({v:.3g})" for v, fid in d.worst if v > 0))
    worst = max((d.worst[0] for d in diffs if d.worst and d.service == "modelV2"), default=None)
    if worst and worst[0] > 0: print(f"  look at it: modeld-overlay {b / r} --start {worst[1]} --frames 1 --out {r}-{worst[1]}/")
  if failed: print(f"modeld-batch diff: {len(failed)} of {len(routes)} routes not compared: {', '.join(failed)}", file=sys.stderr)
  return 1 if failed else 0

def cli(argv: list[str] | None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ["diff"]:
    ap = argparse.ArgumentParser(prog="modeld-batch diff", description="Compare two batch outputs (say, two model versions) per route and field.")
    ap.add_argument("a", metavar="OUT_A")
    ap.add_argument("b", metavar="OUT_B")
    ap.add_argument("--top", type=int, default=5, metavar="N", help="frames with the largest changes to list per field (default 5)")
    args = ap.parse_args(argv[1:])
    if args.top < 1: ap.error(f"--top: expected >= 1, got {args.top}")   # 0 would list no frame, and blank the worst frame's column too
    return diff(args)
  ap = argparse.ArgumentParser(prog="modeld-batch", description="The road and driver-monitoring models over every segment of many routes, on Ray.", epilog=HELP,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("routes", nargs="+", metavar="ROUTE", help="route folders or names, or segment folders; a route may end in a segment "
                  "range, as openpilot's identifiers do (ROUTE/2:4)")
  ap.add_argument("--artifacts", required=True, type=Path, help="artifact directory built by modeld-compile for the routes' camera layouts")
  ap.add_argument("--out", required=True, type=Path, help="output folder: OUT/<route>/<route>--<n>/rlog.zst and OUT/summary.json")
  ap.add_argument("--workers", type=int, metavar="N", help="workers (actors), --threads cores each (default: as many as the cores of this "
                  "machine, or of the cluster's nodes with --address, hold)")
  ap.add_argument("--threads", type=int, default=1, metavar="N", help="cores per worker: Ray gives it N, and its models' kernels and "
                  "video decoding run on N threads (default 1)")
  ap.add_argument("--batch-frames", type=int, default=1, metavar="N", help="segments a worker runs side by side, their frames through "
                  "one batched build of each model (modeld-compile --batch N; outputs within docs/BATCH.md's tolerance of one at a "
                  "time; default 1: one at a time, as the daemons)")
  ap.add_argument("--address", metavar="ADDR", help="join this Ray cluster (e.g. auto, or ray://head:10001) instead of starting a local Ray")
  ap.add_argument("--device", help="tinygrad device of the workers (default: the artifact's)")
  ap.add_argument("--gpus-per-worker", type=float, metavar="F", help="GPUs Ray gives each worker, a fraction to share a card "
                  "(default: 1 for artifacts built for a GPU, 0 for the CPU's)")
  ap.add_argument("--resume", action="store_true", help="skip segments whose output is complete")
  ap.add_argument("--quiet", action="store_true", help="no progress bar")
  args = ap.parse_args(argv)
  if args.workers is not None and args.workers < 1: ap.error(f"--workers: expected >= 1, got {args.workers}")
  if args.threads < 1: ap.error(f"--threads: expected >= 1, got {args.threads}")
  if args.batch_frames < 1: ap.error(f"--batch-frames: expected >= 1, got {args.batch_frames}")
  if args.gpus_per_worker is not None and not 0 <= args.gpus_per_worker <= 64:
    ap.error(f"--gpus-per-worker: expected 0 <= F <= 64, got {args.gpus_per_worker:g}")
  try: return run(args)
  except (OSError, ValueError) as e:
    print(f"modeld-batch: {e}", file=sys.stderr)
    return 1

@needs_extra("modeld-batch", "batch")   # Ray and tqdm, and for the routes PyAV and zstandard: imported as they are needed
def main(argv: list[str] | None = None) -> int:
  private_umask()   # the outputs and summary, and a local Ray's files, this account's alone
  try:
    try: return cli(argv)
    finally: sys.stdout.flush()   # a reader that left shows here, not as an error Python prints at exit
  except BrokenPipeError:   # diff's or --help's reader (the job's summary handles its own, to keep the job's status)
    reader_left()
    return 0

if __name__ == "__main__":
  sys.exit(main())
