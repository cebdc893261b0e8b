"""What both model daemons share: the command line, the start-up order, the camera-restart handling and the per-frame
sequence.

A daemon (ModelDaemon subclass) says which camera clients it wants for the streams the server offers, how to receive a
frame from them and which FrameModel serves their buffer layouts; this module does the rest: verify and load the
artifact's models first (a broken install fails at once, not when a camera appears), then in openpilot's order wait
for the camera server's streams, connect, load the warps for the camera's buffer layouts, one warm-up replay, READY=1;
then every frame through the model's step. When the camera server restarts, the tensors over its buffers are dropped
before the client unmaps them.

FrameModel.step is one frame's sequence, with no socket: the inputs from the newest messages, the guarded model run,
the outputs (ModelOutput) parsed and filled under OutputGuard (no model output, however wrong, crashes a daemon), the
stats. A daemon feeds it live frames; modeld-batch recorded ones.
"""
from __future__ import annotations
import argparse, logging, os, time
from dataclasses import dataclass
from typing import Any, NoReturn
from collections.abc import Callable
import numpy as np
from msgq import MultiplePublishersError
from service import Stats, add_log_level, StopFlag, Watchdog, exit_now, notify, set_process_title, setup_logging
from modeld_common.camera import StreamWatch, connect, wait_for_streams
from transformations.camera import DEFAULT_SENSOR, SENSORS
from modelrt.calibration import Calibration

EX_CONFIG = 78   # sysexits: the configuration (artifact vs camera) is wrong; restarting will not help
RECV_TIMEOUT_MS = 100   # the loop checks the stop flag and kicks the watchdog at least this often
MAX_BAD_OUTPUTS = 20    # frames in a row whose outputs cannot be parsed before the daemon gives up (1 s at 20 Hz)

def parse_args(argv: list[str] | None, prog: str, doc: str | None) -> argparse.Namespace:
  """The options both daemons share."""
  ap = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=f"""
environment: NOTIFY_SOCKET, WATCHDOG_USEC (service-manager protocol: READY=1 after load + warm-up + camera connect,
WATCHDOG=1 from the frame loop, STATUS=<stats>, and STATUS=stopped with the final totals at exit); OPENPILOT_PREFIX
(message prefix, as --prefix); DEV (tinygrad device, as --device); JOURNAL_STREAM (set by systemd: log lines carry
syslog priorities). SIGTERM/SIGINT: finish the frame, exit 0.
exit codes: 0 stopped by a signal; 1 another {prog} took over this prefix's outputs (the newest wins); 2 bad options; 78 the artifact
cannot serve this machine or camera (checked before waiting for a camera; a tinygrad device that cannot be opened
included), or its model's outputs could not be parsed for {MAX_BAD_OUTPUTS} frames in a row (the message says what to
build).""")
  ap.add_argument('--artifacts', required=True, metavar='DIR', help="artifact directory built by modeld-compile (its "
                  f"{'road' if prog == 'modeld' else 'dm'}/ subdirectory is used)")
  ap.add_argument('--device', help="tinygrad device the artifact was built for (default: $DEV, else tinygrad's default); e.g. CPU")
  ap.add_argument('--camera-server', default='camerad', metavar='NAME', help="VisionIPC server name of the camera process (default: camerad)")
  ap.add_argument('--prefix', help="message prefix (OPENPILOT_PREFIX): isolates this stack's topics and camera buffers from others")
  ap.add_argument('--sensor', choices=sorted(SENSORS),
                  help=f"camera sensor for the intrinsics, overriding the camera-state message's (default: the message's, else the "
                       f"sensor of the stream's size, else {DEFAULT_SENSOR})")
  ap.add_argument('--raw-predictions', action='store_true', default=os.environ.get('SEND_RAW_PRED') == '1',
                  help="also send the flat model outputs as rawPredictions (default: off, or on with SEND_RAW_PRED=1)")
  ap.add_argument('--stats-interval', type=float, default=10., metavar='S', help="seconds between stats log lines and STATUS= updates (default 10)")
  ap.add_argument('--threads', type=int, default=1, metavar='N', help="threads that share each model kernel's launches (default 1: one core; "
                  "N takes N cores: latency drops where they are free, docs/PERFORMANCE.md)")
  add_log_level(ap, "a line per dropped or bad frame")
  args = ap.parse_args(argv)
  if args.threads < 1: ap.error(f"--threads: expected N >= 1, got {args.threads}")
  # before anything imports tinygrad or opens a socket: both read these once
  if args.prefix is not None: os.environ['OPENPILOT_PREFIX'] = args.prefix
  if args.device: os.environ['DEV'] = args.device
  return args

class OutputError(RuntimeError):
  """Frame after frame, the model's outputs could not be parsed: the artifact's model does not fit this daemon."""

class OutputGuard:
  """Parses and fills one frame's outputs so that no model output, however wrong, crashes the daemon. Their sizes are
  checked against the contract first (a wrong size may also parse without an error, into garbage). A frame that fails
  is skipped (nothing published), counted as `bad_output` and logged (rate-limited per call site by the log handler);
  MAX_BAD_OUTPUTS failures in a row raise OutputError, naming the output with its expected and actual size."""
  def __init__(self, sizes: dict[str, int], stats: Stats, log: logging.Logger, limit: int = MAX_BAD_OUTPUTS):
    self.sizes, self.stats, self.log, self.limit, self.failures = sizes, stats, log, limit, 0

  def mismatches(self, outs: dict[str, np.ndarray]) -> str:
    return '; '.join(f"output {k!r}: expected {n} values, got {outs[k].size if k in outs else 'none'}"
                     for k, n in self.sizes.items() if k not in outs or outs[k].size != n)

  def __call__(self, frame_id: int, outs: dict[str, np.ndarray], fn: Callable[..., Any], *args) -> Any:
    """fn(outs, *args), or None if the outputs cannot be parsed (the frame is skipped)."""
    if not (why := self.mismatches(outs)):
      try:
        result = fn(outs, *args)
        self.failures = 0
        return result
      except Exception as e:
        why = f"{type(e).__name__}: {e}"
        self.log.debug("frame %d: parsing or filling failed", frame_id, exc_info=True)
    self.failures += 1
    self.stats.count('bad_output')
    self.log.error("frame %d skipped, its outputs cannot be parsed (%d in a row): %s", frame_id, self.failures, why)
    if self.failures >= self.limit:
      raise OutputError(f"the outputs of {self.failures} frames in a row could not be parsed, the last because {why}. The artifact's "
                        "model does not produce the outputs this daemon parses: rebuild it from a model in openpilot's output layout "
                        "(modeld-compile --help)")
    return None

@dataclass
class FrameRun:
  """A model run of one frame: the camera frames it read, its outputs, when it started and how long it took, and whether
  the camera reused a buffer meanwhile (torn)."""
  frames: tuple
  out: Any          # modelrt.runner.ModelOutput
  t0: float
  run_time: float
  torn: bool

class FrameModel:
  """What a daemon does with one camera frame once it has it. Subclasses supply the model's inputs (`inputs`), which
  frames are valid (`valid`) and the messages (`messages`); `step` is the sequence around them."""
  PUBLISHES: list[str]
  SUBSCRIBES: list[str]

  def __init__(self, runner, sm, stats: Stats, log: logging.Logger, raw_predictions: bool = False, sensor: str | None = None):
    self.runner, self.sm, self.stats, self.log, self.raw_predictions, self.sensor = runner, sm, stats, log, raw_predictions, sensor
    self.contract = runner.artifact.contract
    self.guard = OutputGuard({k: h.width for m in self.contract.models.values() for k, h in m.heads.items()}, stats, log)
    self.calib, self._calib_t = Calibration(), None

  def reset(self) -> None:
    """A new camera session: no history from another."""
    self.runner.reset()

  def inputs(self, *frames) -> dict:
    """The runner's arguments for these frames."""
    raise NotImplementedError
  def valid(self, run: FrameRun) -> bool: raise NotImplementedError
  def messages(self, outputs: dict, run: FrameRun, valid: bool) -> list:
    """[(service, Event builder)] from the outputs (parsed here, under the guard)."""
    raise NotImplementedError

  def step(self, *frames) -> list:
    """One frame (the camera buffers it needs, newest messages already in sm): [(service, message)] to publish."""
    from modelrt.guard import InputSpecError   # not at the top: it imports tinygrad, which reads DEV once, after parse_args set it
    if (t := self.sm.logMonoTime['liveCalibration']) != self._calib_t:   # a new calibration applies from this frame on
      self._calib_t = t
      if self.sm.seen['liveCalibration']:
        self.calib.update(self.sm['liveCalibration'].rpyCalib)
        if not self.calib.valid: self.stats.count('bad_calibration')   # a good one always makes it valid, a bad one never
    fid, t0 = frames[0].frame_id, time.perf_counter()
    kw = self.inputs(*frames)
    try: out = self.runner.run(**kw)
    except InputSpecError as e:
      self.stats.count('bad_input')
      self.log.error("frame %d skipped: %s", fid, e)
      return []
    run = FrameRun(frames, out, t0, time.perf_counter() - t0, any(f.overwritten() for f in frames))   # after the run: False means untorn
    if run.torn:
      self.stats.count('torn')
      self.log.debug("frame %d torn: the camera reused its buffer during the run", fid)
    if out is None:   # prepare-only
      self.stats.count('prepare_only')
      return []
    if not out.finite:
      self.stats.count('nonfinite')
      self.log.debug("frame %d: non-finite model outputs, published invalid", fid)
    valid = self.valid(run)
    if (msgs := self.guard(fid, out.outputs, self.messages, run, valid)) is None: return []
    self.stats.count('frames')
    self.stats.timing('exec', run.run_time)
    self.stats.timing('frame', time.perf_counter() - t0)   # frame in hand -> messages made: the run and the daemon's own work
    if not all(m.valid for _, m in msgs): self.stats.count('invalid')   # as published: messages() may find more wrong
    return msgs

class ModelDaemon:
  name: str                 # process and logger name
  family: str               # artifact family: 'road' | 'dm'
  MODEL: type[FrameModel]

  def __init__(self, args: argparse.Namespace, stop: StopFlag):
    from cereal import messaging
    self.args, self.stop, self.watchdog = args, stop, Watchdog()
    self.log = logging.getLogger(self.name)
    self.stats = Stats(self.log, args.stats_interval)
    self.pm, self.sm = messaging.PubMaster(self.MODEL.PUBLISHES), messaging.SubMaster(self.MODEL.SUBSCRIBES)
    self.artifact, self.models, self.ready = None, {}, False

  def tick(self) -> None:
    """Between frames and while waiting: the watchdog, the stats, and the messages (so they stay current, and a new
    publisher's subscription goes live, even while no frame comes)."""
    self.watchdog.kick()
    self.stats.tick()
    self.update_messages()
    if taken := [s for s, sock in self.pm.sock.items() if sock.taken_over()]:   # as openpilot's: the newest publisher wins
      raise MultiplePublishersError(f"{taken[0]}: a newer publisher took the endpoint")

  def pause(self, seconds: float) -> None:
    """Wait `seconds` as the frame loop waits: ticking at least every RECV_TIMEOUT_MS, returning once stopped."""
    deadline = time.monotonic() + seconds
    while not self.stop and (left := deadline - time.monotonic()) > 0:
      self.tick()
      time.sleep(min(left, RECV_TIMEOUT_MS / 1000))

  def update_messages(self) -> None:
    """The newest of each subscribed message; those dropped as malformed are counted in the stats."""
    self.sm.update(0)
    if (new := sum(self.sm.malformed.values()) - self.stats.totals.get('malformed', 0)) > 0: self.stats.count('malformed', new)

  def clients(self, streams: set[int]) -> list | None:
    """The VisionIpcClients to connect for these streams, or None (logged) if the server lacks what is needed."""
    raise NotImplementedError

  def make_model(self, clients: list) -> FrameModel:
    """The FrameModel (with its runner) for the connected clients' streams and buffer layouts."""
    raise NotImplementedError

  def receiver(self, clients: list) -> Callable[[], tuple | None]:
    """A function returning the next frame's buffers (the model's step arguments), or None after a receive timeout."""
    raise NotImplementedError

  def serve(self, model: FrameModel, watch: StreamWatch, clients: list) -> None:
    """Frames until the stop flag or a camera server restart (a client disconnects)."""
    model.reset()
    receive = self.receiver(clients)
    while not self.stop:
      self.tick()
      if not all(c.is_connected() for c in clients):
        self.log.warning("camera server %r restarted or went away: reconnecting", self.args.camera_server)
        break
      if (frames := receive()) is None:
        if watch.changed(): break
        continue
      watch.frame()
      self.update_messages()
      for name, msg in model.step(*frames): self.pm.send(name, msg)
    if not self.stop: self.stats.count('disconnects')

  def run(self) -> int:
    from modelrt.artifact import load_artifact
    server = self.args.camera_server
    try:
      # manifest, hashes and model JITs before any camera: a bad artifact exits 78 at once (the warps wait for the layouts)
      t = time.perf_counter()
      self.artifact = load_artifact(self.args.artifacts, self.family)
      self.log.info("loaded %s in %.2f s (layouts: %s)", self.artifact.dir, time.perf_counter() - t, ', '.join(self.artifact.layouts))
      while not self.stop:
        self.stats.set_state(f"waiting for camera server {server!r}")
        if (streams := wait_for_streams(server, self.stop, self.tick)) is None: break
        if (clients := self.clients(streams)) is None:
          self.pause(1.)   # the server may serve the missing stream later: look again
          continue
        try:
          if not connect(clients, self.stop, self.tick): continue
          self.log.info("connected to %r: %s", server, streams_desc := ', '.join(f"stream {c.stream} ({c.layout})" for c in clients))
          self.stats.count('connects')
          if (model := self.models.get(key := tuple((c.stream, str(c.layout)) for c in clients))) is None:
            model = self.models[key] = self.make_model(clients)
            model.runner.set_threads(self.args.threads)
            model.runner.warmup()
          self.stats.set_state(f"serving {server!r}: {streams_desc}")
          if not self.ready:
            notify('READY=1')
            self.ready = True
            self.log.info("ready")
          self.serve(model, StreamWatch(server, streams, clients[0].server_id), clients)
        finally:
          for m in self.models.values(): m.runner.release_camera_tensors()   # tensors over the buffers go before the mappings
          for c in clients: c.close()
    finally:
      self.pm.close()
      self.sm.close()
      self.log.info("stopped; totals: %s", self.stats.totals_line())
      # the service manager gets the final totals too: the counts since the last stats tick, such as the frame whose
      # bad outputs ended the daemon, would otherwise never reach it
      self.stats.set_state('stopped')
    return 0

def main(cls: type[ModelDaemon], argv: list[str] | None, doc: str | None) -> NoReturn:
  args = parse_args(argv, cls.name, doc)
  setup_logging(args.log_level)
  set_process_title(cls.name)
  stop = StopFlag()
  from modelrt.artifact import ArtifactError
  try: rc = cls(args, stop).run()
  except (ArtifactError, OutputError) as e:
    logging.getLogger(cls.name).error("%s: %s", type(e).__name__, e)
    rc = EX_CONFIG
  except MultiplePublishersError as e:   # not a configuration error: once the other one stops, a restart works
    logging.getLogger(cls.name).error("%s (another %s on OPENPILOT_PREFIX %r?)", e, cls.name, os.environ.get('OPENPILOT_PREFIX', ''))
    rc = 1
  exit_now(rc)   # sockets closed and mappings released by now
