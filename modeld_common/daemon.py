"""The process around a model daemon's frame loop (the loop itself is each daemon's main()): the options, the sockets,
the watchdog and stats, the artifact loaded before any camera, waiting for and connecting to the camera server in
openpilot's order, the inputs subscribed only then, reconnecting after its restart, and the exit codes."""
from __future__ import annotations
import argparse, logging, os, time
from collections.abc import Callable, Iterator
from msgq import MultiplePublishersError
from service import Stats, add_log_level, StopFlag, Watchdog, exit_now, notify, set_process_title, setup_logging
from modeld_common.camera import StreamWatch, connect, wait_for_streams
from modeld_common.frame import MAX_BAD_OUTPUTS, OutputError
from transformations.camera import DEFAULT_SENSOR, SENSORS

EX_CONFIG = 78   # sysexits: the configuration (artifact vs camera) is wrong; restarting will not help
RECV_TIMEOUT_MS = 100   # the loop checks the stop flag and kicks the watchdog at least this often

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
  ap.add_argument('--device', help="tinygrad device the artifact was built for (default: $DEV, else tinygrad's default): CPU, or a "
                  "GPU's backend (CUDA, NV, AMD, QCOM), or one of several (CUDA:1)")
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
  if prog == 'dmonitoringd':
    ap.add_argument('--model-only', action='store_true', help="driverStateV2 alone, as openpilot's dmonitoringmodeld: beside a "
                    "running openpilot, whose own dmonitoringd publishes driverMonitoringState (default: both)")
  add_log_level(ap, "a line per dropped or bad frame")
  args = ap.parse_args(argv)
  if args.threads < 1: ap.error(f"--threads: expected N >= 1, got {args.threads}")
  # before anything imports tinygrad or opens a socket: both read these once
  if args.prefix is not None: os.environ['OPENPILOT_PREFIX'] = args.prefix
  if args.device: os.environ['DEV'] = args.device.split(':')[0]   # the backend; the instance when the artifact loads (use_device)
  return args

class Camera:
  """One connection to the camera server: its clients, and whether to go on serving it."""
  def __init__(self, daemon: Daemon, clients: list, watch: StreamWatch):
    self.daemon, self.clients, self.watch = daemon, clients, watch
    self.layouts = tuple((c.stream, str(c.layout)) for c in clients)

  def active(self) -> bool:
    """Ticks the daemon; False once it is stopped, or the camera server restarted or went away (then it reconnects)."""
    self.daemon.tick()
    if self.daemon.stop: return False
    if not all(c.is_connected() for c in self.clients):
      self.daemon.log.warning("camera server %r restarted or went away: reconnecting", self.daemon.args.camera_server)
      return False
    return not self.watch.changed()

  def frame(self) -> None:
    """A frame came: the newest messages, for its step."""
    self.watch.frame()
    self.daemon.update_messages()

class Daemon:
  """A model daemon's process, as `with Daemon(...) as d:` around its loop. Leaving it closes the sockets, reports the
  totals and exits: 0 when stopped by a signal, 1 when another daemon took the outputs, EX_CONFIG for an artifact that
  cannot serve this machine or camera, or a model whose outputs cannot be parsed."""
  def __init__(self, name: str, args: argparse.Namespace, publishes: list[str], subscribes: list[str]):
    self.name, self.args = name, args
    setup_logging(self.args.log_level)
    set_process_title(name)
    from cereal import messaging
    self.stop, self.watchdog, self.log = StopFlag(), Watchdog(), logging.getLogger(name)
    self.stats = Stats(self.log, self.args.stats_interval)
    self.pm, self.sm, self.subscribes, self.is_ready = messaging.PubMaster(publishes), None, subscribes, False

  def __enter__(self) -> Daemon: return self

  def __exit__(self, typ, e, tb) -> None:
    from modelrt.artifact import ArtifactError
    self.pm.close()
    if self.sm is not None: self.sm.close()
    if isinstance(e, (ArtifactError, OutputError)): self.log.error("%s: %s", type(e).__name__, e)
    elif isinstance(e, MultiplePublishersError):   # not a configuration error: once the other one stops, a restart works
      self.log.error("%s (another %s on OPENPILOT_PREFIX %r?)", e, self.name, os.environ.get('OPENPILOT_PREFIX', ''))
    self.log.info("stopped; totals: %s", self.stats.totals_line())
    # the service manager gets the final totals too: the counts since the last stats tick, such as the frame whose
    # bad outputs ended the daemon, would otherwise never reach it
    self.stats.set_state('stopped')
    if e is None or isinstance(e, (ArtifactError, OutputError, MultiplePublishersError)):
      exit_now(0 if e is None else 1 if isinstance(e, MultiplePublishersError) else EX_CONFIG)   # sockets closed, mappings released

  def load_artifact(self, family: str):
    """The artifact's manifest, hashes and model JITs, before any camera: a bad one exits EX_CONFIG at once (the warps
    wait for the camera's layouts)."""
    from modelrt.artifact import ArtifactError, load_artifact, use_device
    t = time.perf_counter()
    try: device = use_device(self.args.device) if self.args.device else None
    except Exception as e: raise ArtifactError(f"--device {self.args.device}: {type(e).__name__}: {e}") from None
    artifact = load_artifact(self.args.artifacts, family, device)
    self.log.info("loaded %s in %.2f s (layouts: %s)", artifact.dir, time.perf_counter() - t, ', '.join(artifact.layouts))
    return artifact

  def cameras(self, wanted: Callable[[set[int]], list[tuple[int, bool]] | str]) -> Iterator[Camera]:
    """Each connection to the camera server until stopped: its streams awaited, wanted(streams) ([(stream, conflate)],
    or why none of them will do: looked at again in a second) connected, and left once the caller is done with it (its
    tensors over the buffers dropped). A stream's client is kept from one connection to the next: subscribed all along,
    it misses no frame of a restarted server (a lockstep camera sends its first frame once and waits for the answer)."""
    from msgq.visionipc import VisionIpcClient
    server, kept = self.args.camera_server, {}
    try:
      while not self.stop:
        self.stats.set_state(f"waiting for camera server {server!r}")
        if (streams := wait_for_streams(server, self.stop, self.tick)) is None: return
        if isinstance(want := wanted(streams), str):
          self.log.error("camera server %r serves streams %s, %s; waiting", server, sorted(streams), want)
          self.pause(1.)
          continue
        for key in set(kept) - set(want): kept.pop(key).close()
        for key in want:
          if key not in kept: kept[key] = VisionIpcClient(server, *key)
        clients = [kept[key] for key in want]
        if not connect(clients, self.stop, self.tick): continue
        desc = ', '.join(f"stream {c.stream} ({c.layout})" for c in clients)
        if self.stats.totals.get('connects'):   # as often as its server restarts or misbehaves: a warning, rate-limited
          self.log.warning("reconnected to %r: %s", server, desc)
        else: self.log.info("connected to %r: %s", server, desc)
        self.stats.count('connects')
        self.stats.set_state(f"serving {server!r}: {desc}")
        yield Camera(self, clients, StreamWatch(server, streams, clients[0].server_id, wanted))
        if not self.stop: self.stats.count('disconnects')
        for c in clients:
          if c.is_connected(): c.disconnect()
          c.release_old_mappings()
    finally:
      for c in kept.values(): c.close()

  def subscribe(self):
    """The inputs' SubMaster, made at the first call: once the daemon can take a frame (its models loaded and warmed up,
    its camera clients connected), as openpilot's modeld subscribes after connecting. A reader on an input then means
    ready: a harness that waits for one (PubMaster.wait_for_readers_to_update) and sends frame 1 gets its answer. Kept
    from then on: a restarted camera's frames wait in the kept clients meanwhile."""
    if self.sm is None:
      from cereal import messaging
      from cereal.services import CAMERA_STATE_SERVICES
      # the camera states last: a lockstep camera takes this process reading them as every input live
      states = set(CAMERA_STATE_SERVICES.values())
      self.sm = messaging.SubMaster(sorted(self.subscribes, key=lambda s: s in states))
    return self.sm

  def ready(self) -> None:
    """READY=1, once: the models loaded and warmed up, the camera connected."""
    if not self.is_ready:
      notify('READY=1')
      self.is_ready = True
      self.log.info("ready")

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
    """The newest of each subscribed message (none before subscribe()); those dropped as malformed are counted in the stats."""
    if self.sm is None: return
    self.sm.update(0)
    if (new := sum(self.sm.malformed.values()) - self.stats.totals.get('malformed', 0)) > 0: self.stats.count('malformed', new)
