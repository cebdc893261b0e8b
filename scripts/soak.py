#!/usr/bin/env python3
"""The fault battery's long runs (run it as scripts/soak.sh): the real camerad, modeld and dmonitoringd are hit by one
fault after another, round after round, then one table gives a verdict per fault; exit status 1 if any is FAIL.
HELP lists the faults and the checks; docs/RELIABILITY.md has the figures.
"""
import argparse, json, multiprocessing, os, pathlib, random, re, shutil, signal, subprocess, sys, tempfile, time, uuid
from dataclasses import dataclass, field

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

import numpy as np
from tests.artifacts import build
from tests.daemon_harness import Camera, Daemon, Notify
from tests.faults import ARTIFACT_DAMAGES, HANDSHAKE_FAULTS, MessageFaults, can_mount_tmpfs, damaged_artifact, full_disk, handshake_fault, usage
from cereal import messaging
from cereal.services import CAMERA_STATE_SERVICES, CAMERAS
from msgq.visionipc import DRIVER, ROAD, WIDE_ROAD, NV12Layout, VisionIpcClient
from msgq.visionipc.wire import socket_path
from modeld.model import RoadModel as ModelD
from dmonitoringd.model import DriverModel as DMonitoringD
from oproute.logreader import LogReader, segment_dirs

HELP = """The fault battery's long runs (run it as scripts/soak.sh). The real camerad, modeld and dmonitoringd (tiny ONNX
models, small synthetic camera frames) run on a private OPENPILOT_PREFIX and are hit by one fault after another,
round after round until the time is spent:

  baseline       nothing injected: what the stack loses on its own
  messages       garbage, truncated and wrong-type messages, 100 a second on every service the daemons read
                 (the camera is this script then, so that it owns the camera-state topics; driverMonitoringState
                 is dmonitoringd's own output and gets none)
  visionipc      garbage, truncated, silent and deaf connections to camerad's handshake socket, 100 a second, and a
                 client per stream that connects and never reads
  camerad kill   camerad SIGKILLed at a random moment after the daemons are back, again and again
  stopped reader a subscriber of every daemon output SIGSTOPped for --stop-seconds
  full disk      modeld-record on a small tmpfs until it is full
  artifact       altered weights and damaged manifests of both daemons (once, before the rounds): time until exit 78

Then one table: fault, how many injected, outputs lost, the processes' fds and RSS before and after (first and last
round), and a verdict per fault: pass, or FAIL with every check that failed. Besides each fault's own checks (the
daemons stay up, reconnect, the stopped reader gets all, the recorder stops cleanly, ...), every process measured has
its fds back to their number before the fault (no fd leaked) and its RSS grown by at most --max-rss-growth-mib, and a
damaged artifact exits 78 within --artifact-exit-seconds. Exit status 1 if any verdict is FAIL.
"""

W, H = 160, 96   # every camera: small frames keep camerad and the warps cheap; the faults do not depend on the size
LAYOUT = NV12Layout.packed(W, H)
ANSWERS = {CAMERAS[c].state: CAMERAS[c].answer for c in ('road', 'driver')}   # a frame and the output that answers it
MiB = 1024 * 1024

def scene(path: pathlib.Path) -> pathlib.Path:
  """The straight scene with every camera W x H (focal lengths scaled from the comma 3 sensors at 1928 wide)."""
  s = json.loads((REPO / 'camerad' / 'scenes' / 'straight.json').read_text())
  s['intrinsics'] = {'road': {'width': W, 'height': H, 'focal_length': 2648 * W / 1928},
                     **{c: {'width': W, 'height': H, 'focal_length': 567 * W / 1928} for c in ('wide', 'driver')}}
  path.write_text(json.dumps(s))
  return path

class Watch:
  """Every camera-state and output message, with its arrival time: what was answered, what was lost."""
  def __init__(self):
    self.socks = {s: messaging.sub_sock(s) for s in (*ANSWERS, *ANSWERS.values())}
    self.seen: dict[str, list[tuple[float, int]]] = {s: [] for s in self.socks}

  def poll(self) -> None:
    for s, sock in self.socks.items():
      now = time.monotonic()
      for dat in messaging.drain_sock_raw(sock):
        try: ev = messaging.log_from_bytes(dat)
        except messaging.MalformedMessageError: continue   # the messages fault sends these on the camera states too
        if ev.which() == s: self.seen[s].append((now, getattr(ev, s).frameId))

  def wait(self, seconds: float, tick=None, every: float = 0.05) -> None:
    """Poll for `seconds`, calling tick() every `every` s."""
    end, nxt = time.monotonic() + seconds, time.monotonic()
    while (now := time.monotonic()) < end:
      if tick is not None and now >= nxt:
        tick()
        nxt += every
      self.poll()
      time.sleep(0.01)

  def count(self, service: str, since: float) -> int: return sum(t >= since for t, _ in self.seen[service])

  def lost(self, t0: float, t1: float) -> tuple[int, int]:
    """(frames sent in [t0, t1) never answered, frames sent then), over both cameras' frames and their outputs."""
    self.wait(1.)   # answers still on their way
    lost = total = 0
    for state, out in ANSWERS.items():
      frames = {f for t, f in self.seen[state] if t0 <= t < t1}
      lost, total = lost + len(frames - {f for t, f in self.seen[out] if t >= t0}), total + len(frames)
    for v in self.seen.values(): v.clear()
    return lost, total

def stop(d: Daemon) -> int:
  """SIGTERM, then the exit code (the harness's own stop() prints the whole log, too much for a soak)."""
  if d.proc.poll() is None: d.proc.terminate()
  try: rc = d.proc.wait(10)
  except subprocess.TimeoutExpired:
    d.proc.kill()
    rc = d.proc.wait()
  d.reader.join(2)
  return rc

class Camerad:
  def __init__(self, scene: pathlib.Path, log: pathlib.Path):
    self.cmd, self.log, self.proc = [sys.executable, '-m', 'camerad', '--source', f'synthetic:{scene}', '--loop'], log, None

  def start(self) -> float:
    with open(self.log, 'a') as f: self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=f, cwd=REPO)
    return time.monotonic()

  def kill(self, sig: int = signal.SIGKILL) -> None:
    if self.proc is not None and self.proc.poll() is None:
      self.proc.send_signal(sig)
      self.proc.wait(10)

@dataclass
class Row:
  fault: str
  injected: dict[str, int] = field(default_factory=dict)
  lost: list[int] = field(default_factory=lambda: [0, 0])          # outputs lost, of how many
  usage: dict[str, list] = field(default_factory=dict)              # process -> [before, after]
  notes: dict[str, str] = field(default_factory=dict)               # what the numbers mean, one per key
  samples: list[float] = field(default_factory=list)                # per-fault measurements, over the rounds
  failures: list[str] = field(default_factory=list)                 # every check that failed

  @property
  def ok(self) -> bool: return not self.failures

  def measure(self, procs: dict[str, int], when: int) -> None:
    for name, pid in procs.items():
      u = self.usage.setdefault(name, [None, None])
      if when == 0 and u[0] is None or when == 1: u[when] = usage(pid)

  def add(self, injected: dict[str, int], lost: tuple[int, int] = (0, 0)) -> None:
    for k, n in injected.items(): self.injected[k] = self.injected.get(k, 0) + n
    self.lost = [self.lost[0] + lost[0], self.lost[1] + lost[1]]

  def check(self, ok: bool, note: str) -> None:
    if not ok:
      self.failures.append(note)
      print(f"soak: FAIL {self.fault}: {note}", flush=True)

  def judge_usage(self, max_rss_growth: float) -> None:
    """After the last round: every process back to its fds before the fault, its RSS grown by at most max_rss_growth."""
    for name, (b, a) in self.usage.items():
      if b is None or a is None: continue   # a check that failed ended the fault before its second measurement
      self.check(a[0] <= b[0], f"{name}: {a[0] - b[0]} fds more than before ({b[0]} -> {a[0]})")
      self.check(a[1] - b[1] <= max_rss_growth * MiB, f"{name}: RSS grew {(a[1] - b[1]) / MiB:.1f} MiB, more than {max_rss_growth:g}")

class Soak:
  def __init__(self, args, tmp: pathlib.Path):
    self.args, self.tmp, self.rng = args, tmp, random.Random(args.seed)
    self.artifacts = build(REPO / '.cache' / 'soak', layouts=(LAYOUT,), models='tiny')
    self.camerad = Camerad(scene(tmp / 'soak.json'), tmp / 'camerad.log')
    self.rows: dict[str, Row] = {}
    self.watch = Watch()
    self.camerad.start()
    self.notify = {n: Notify() for n in ('modeld', 'dmonitoringd')}
    self.daemons = {n: Daemon(n, self.artifacts, '--log-level', 'INFO', notify=self.notify[n]) for n in self.notify}
    for nt in self.notify.values(): nt.wait('READY=1', 120)
    self.back(time.monotonic())

  def row(self, fault: str) -> Row: return self.rows.setdefault(fault, Row(fault))

  def procs(self, camerad: bool = False) -> dict[str, int]:
    return {**{n: d.proc.pid for n, d in self.daemons.items()}, **({'camerad': self.camerad.proc.pid} if camerad else {})}

  def alive(self, row: Row) -> None:
    for n, d in self.daemons.items(): row.check(d.proc.poll() is None, f"{n} exited with {d.proc.returncode}")

  def back(self, since: float, timeout: float = 30.) -> float | None:
    """Seconds until both daemons answered 3 frames sent after `since` (they reconnected), None after timeout."""
    deadline = time.monotonic() + timeout
    while not all(self.watch.count(o, since) >= 3 for o in ANSWERS.values()):
      if time.monotonic() > deadline: return None
      self.watch.wait(0.05)
    return time.monotonic() - since

  # ***** faults *****

  def baseline(self) -> None:
    row = self.row('none (baseline)')
    row.measure(self.procs(True), 0)
    t0 = time.monotonic()
    self.watch.wait(self.args.baseline_seconds)
    row.add({'seconds': round(self.args.baseline_seconds)}, self.watch.lost(t0, time.monotonic()))
    row.measure(self.procs(True), 1)
    self.alive(row)

  def messages(self) -> None:
    """This script is the camera (its own camera-state publishers), camerad is stopped meanwhile."""
    row = self.row('messages: garbage, truncated, wrong type at 100 Hz')
    row.measure(self.procs(), 0)   # with camerad, as after: the same publishers connected
    self.camerad.kill(signal.SIGTERM)
    cam = Camera({ROAD: LAYOUT, WIDE_ROAD: LAYOUT, DRIVER: LAYOUT})
    inputs = sorted((set(ModelD.SUBSCRIBES) | set(DMonitoringD.SUBSCRIBES)) - set(CAMERA_STATE_SERVICES.values())
                    - set(ModelD.PUBLISHES + DMonitoringD.PUBLISHES))
    pm = messaging.PubMaster(inputs)
    faults, frame = MessageFaults({**pm.sock, **cam.pm.sock}, hz=100, seed=self.rng.randrange(1 << 30)), [0]
    def send() -> None:
      frame[0] += 1
      cam.send(frame[0])
    try:
      t = time.monotonic()
      while self.back(t, timeout=0.05) is None:
        row.check(time.monotonic() - t < 30, "daemons did not come to this camera")
        if not row.ok: return
        send()
      t0 = time.monotonic()
      faults.start()
      self.watch.wait(self.args.garbage_seconds, send)
      row.add(faults.stop(), self.watch.lost(t0, time.monotonic()))
      self.alive(row)
    finally:
      if faults.is_alive(): faults.stop()
      cam.close(); pm.close()
      self.camerad.start()
      row.check(self.back(time.monotonic()) is not None, "daemons did not come back to camerad")
    self.watch.wait(1.)
    row.measure(self.procs(), 1)

  def visionipc(self) -> None:
    row = self.row('visionipc: handshake junk at 100 Hz, clients that never read')
    path = socket_path('camerad')
    row.measure(self.procs(True), 0)
    lazy = [VisionIpcClient('camerad', s, False) for s in (ROAD, WIDE_ROAD, DRIVER)]   # subscribe, map, never recv()
    row.check(all(c.connect(True) for c in lazy), "a client could not connect")
    held, counts, served, asked = [], dict.fromkeys(HANDSHAKE_FAULTS, 0), 0, 0
    def junk() -> None:
      nonlocal served, asked
      kind = HANDSHAKE_FAULTS[sum(counts.values()) % len(HANDSHAKE_FAULTS)]
      if (s := handshake_fault(path, kind, np.random.default_rng(self.rng.randrange(1 << 30)))) is not None:
        counts[kind] += 1
        held.append(s)
      if len(held) > 64: held.pop(0).close()
      if sum(counts.values()) % 100 == 0:   # once a second, a client that connects meanwhile must be served
        asked += 1
        with VisionIpcClient('camerad', ROAD, False) as c: served += c.connect(False)
    t0 = time.monotonic()
    self.watch.wait(self.args.visionipc_seconds, junk, every=0.01)
    lost = self.watch.lost(t0, time.monotonic())
    for s in held: s.close()
    for c in lazy: c.close()
    self.watch.wait(1.)   # camerad drops the closed connections
    row.add(counts, lost)
    row.add({'never-reading clients': len(lazy)})
    row.check(served == asked, f"{asked - served} of {asked} clients connecting meanwhile were not served")
    row.measure(self.procs(True), 1)
    self.alive(row)

  def kills(self) -> None:
    row = self.row(f'camerad SIGKILLed at a random moment, {self.args.kills} times in a row')
    row.measure(self.procs(), 0)
    back, n0, n = row.samples, len(row.samples), 0
    for _ in range(self.args.kills):
      self.watch.wait(self.rng.uniform(0, 2))   # a random moment of camerad's frame loop
      self.camerad.kill()
      n += 1
      if (dt := self.back(self.camerad.start())) is None:
        row.check(False, "daemons did not reconnect within 30 s")
        break
      back.append(dt)
    self.watch.wait(2.)
    self.watch.lost(0, 0)
    row.add({'SIGKILL': n}, (n - (len(back) - n0), n))
    if back: row.notes['back'] = f"restarts without outputs again; from camerad's start to outputs: mean {np.mean(back):.1f} s, max {max(back):.1f} s"
    row.measure(self.procs(), 1)
    self.alive(row)

  def stopped_reader(self) -> None:
    row = self.row(f'a subscriber of every output SIGSTOPped for {self.args.stop_seconds:g} s')
    ctx = multiprocessing.get_context('spawn')
    parent, child = ctx.Pipe()
    p = ctx.Process(target=reader, args=(child,), daemon=True)
    p.start()
    try:
      row.check(parent.poll(30) and parent.recv() == 'up', "the subscriber did not start")
      self.watch.wait(1.)
      row.measure(self.procs(), 0)
      os.kill(p.pid, signal.SIGSTOP)
      t0 = time.monotonic()
      self.watch.wait(self.args.stop_seconds)
      t1 = time.monotonic()
      published = {s: {f for t, f in self.watch.seen[s] if t0 <= t < t1} for s in ANSWERS.values()}
      os.kill(p.pid, signal.SIGCONT)
      lost = self.watch.lost(t0, t1)   # another reader's losses meanwhile: the publishers did not stall
      row.measure(self.procs(), 1)
      deadline = time.monotonic() + 10
      while True:   # the resumed reader drains its queue: ask until it has all, or for 10 s
        parent.send('?')
        row.check(parent.poll(10), "the resumed subscriber did not answer")
        got = parent.recv()
        if (missed := sum(len(published[s] - got[s]) for s in published)) == 0 or time.monotonic() > deadline: break
        time.sleep(0.2)
      row.add({'SIGSTOP': 1}, lost)
      row.samples += [sum(map(len, published.values())), missed]
      row.notes['reader'] = (f"outputs another reader missed meanwhile; the stopped one, resumed, got {sum(row.samples[::2]) - sum(row.samples[1::2]):.0f} "
                             f"of the {sum(row.samples[::2]):.0f} published while it was stopped")
      row.check(missed == 0, f"the stopped reader missed {missed} outputs published while it was stopped")
    finally:
      p.kill()
    self.alive(row)

  def full_disk(self) -> None:
    row = self.row(f'modeld-record on a full disk ({self.args.disk_kib} KiB tmpfs)')
    mount, keep = self.tmp / 'disk', self.tmp / 'kept'
    shutil.rmtree(keep, ignore_errors=True)
    for d in (mount, keep): d.mkdir(exist_ok=True)
    if not can_mount_tmpfs(str(self.tmp / 'probe')):
      row.notes['skip'] = "skipped: no user namespace to mount a tmpfs in"
      return
    row.measure(self.procs(), 0)
    cmd = [sys.executable, '-m', 'modeld_tools.record', '--route', str(mount / 'r'), '--segment-seconds', '2']
    p = subprocess.Popen(full_disk(cmd, self.args.disk_kib * 1024, str(mount), str(keep)), cwd=REPO, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while p.poll() is None and time.monotonic() < deadline: self.watch.wait(0.2)
    if p.poll() is None: p.kill()
    err = p.communicate()[1]
    self.watch.lost(0, 0)
    segs = segment_dirs(keep / 'r') if (keep / 'r').exists() else []
    left = set(m.group(1).split(', ')) if (m := re.search(r"recording stopped; (.*) unfinished", err)) else set()   # as it says
    finished = [seg for seg in segs if seg.name not in left]
    unreadable = 0
    for seg in finished:
      lr = LogReader(seg)
      unreadable += not list(lr) or bool(lr.warnings)
    row.add({'disk full': 1}, (unreadable, len(finished)))
    row.check(p.returncode == 1 and 'No space left on device' in err and 'recording stopped' in err and 'Traceback' not in err,
              f"modeld-record exited {p.returncode}: {err.strip().splitlines()[-1:] if err.strip() else ''}")
    row.check(len(finished) >= 1 and unreadable == 0, f"{unreadable} of {len(finished)} finished segments unreadable")
    row.notes['disk'] = "finished segments that do not read back whole"
    row.measure(self.procs(), 1)
    self.alive(row)

  def artifact(self) -> None:
    row = self.row(f'damaged artifact ({", ".join(ARTIFACT_DAMAGES)}), no camera')
    limit, times = self.args.artifact_exit_seconds, []
    for name, family in (('modeld', 'road'), ('dmonitoringd', 'dm')):
      for kind in ARTIFACT_DAMAGES:
        bad = self.tmp / 'bad' / f"{name}-{kind.replace(' ', '-')}"
        msg = damaged_artifact(self.artifacts, bad, family, kind)
        t = time.monotonic()
        d = Daemon(name, bad, env={'OPENPILOT_PREFIX': f'soak-bad-{uuid.uuid4().hex[:8]}'})
        try: rc = d.proc.wait(60)
        except subprocess.TimeoutExpired: rc = None
        times.append(dt := time.monotonic() - t)
        stop(d)
        err = d.stderr()
        row.add({name: 1})
        row.check(rc == 78 and msg in err and 'waiting for camera' not in err and 'Traceback' not in err, f"{name}, {kind}: exit {rc}, not 78 saying '{msg}'")
        row.check(dt <= limit, f"{name}, {kind}: exit after {dt:.2f} s, more than {limit:g} s")
    row.notes['exit'] = f"exits after {min(times):.2f} to {max(times):.2f} s"

  def close(self) -> None:
    for n, d in self.daemons.items():
      if (rc := stop(d)) != 0: print(f"soak: {n} exited {rc}; its log:\n{d.stderr()}", flush=True)
    for n in self.notify.values(): n.close()
    self.camerad.kill(signal.SIGTERM)
    for s in self.watch.socks.values(): s.close()

def reader(conn) -> None:
  """A subscriber of every daemon output that reads all it can; on request, the frame ids it got per output."""
  socks = {s: messaging.sub_sock(s) for s in ANSWERS.values()}
  got = {s: set() for s in socks}
  conn.send('up')
  while True:
    for s, sock in socks.items():
      for dat in messaging.drain_sock_raw(sock): got[s].add(getattr(messaging.log_from_bytes(dat), s).frameId)
    if conn.poll(0.01):
      conn.recv()
      conn.send(got)

def table(rows: list[Row]) -> str:
  mib = lambda b: f"{b / MiB:.0f}"
  out = ["| fault | injected | outputs lost | process | fds before -> after | RSS MiB before -> after | verdict |", "|---|---|---|---|---|---|---|"]
  for r in rows:
    inj = ', '.join(f"{k} {v}" for k, v in r.injected.items()) or '-'
    lost = ' '.join([f"{r.lost[0]} of {r.lost[1]}" if r.lost[1] else '-', *(f"({'; '.join(r.notes.values())})",) * bool(r.notes)])
    verdict = 'pass' if r.ok else f"**FAIL**: {'; '.join(r.failures)}"
    procs = list(r.usage.items()) or [('-', [None, None])]
    for i, (name, (b, a)) in enumerate(procs):
      fds = f"{b[0]} -> {a[0]}" if b and a else '-'
      rss = f"{mib(b[1])} -> {mib(a[1])}" if b and a else '-'
      first = i == 0
      out.append(f"| {r.fault if first else ''} | {inj if first else ''} | {lost if first else ''} | {name} | {fds} | {rss} | {verdict if first else ''} |")
  return '\n'.join(out)

def main() -> int:
  ap = argparse.ArgumentParser(prog='scripts/soak.sh', description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument('--minutes', type=float, default=10., help="total time: rounds of every fault until it is spent (at least one round; default 10)")
  ap.add_argument('--baseline-seconds', type=float, default=20., metavar='S', help="no fault, per round (default 20)")
  ap.add_argument('--garbage-seconds', type=float, default=60., metavar='S', help="malformed messages at 100 Hz, per round (default 60)")
  ap.add_argument('--visionipc-seconds', type=float, default=30., metavar='S', help="handshake junk at 100 Hz, per round (default 30)")
  ap.add_argument('--kills', type=int, default=20, help="camerad SIGKILLs in a row, per round (default 20)")
  ap.add_argument('--stop-seconds', type=float, default=10., metavar='S', help="how long the subscriber stays stopped (default 10)")
  ap.add_argument('--disk-kib', type=int, default=2048, metavar='KiB', help="size of the recorder's tmpfs (default 2048)")
  ap.add_argument('--seed', type=int, default=0, help="random seed for the fault moments and bytes (default 0)")
  ap.add_argument('--max-rss-growth-mib', type=float, default=16., metavar='MiB',
                  help="most a process's RSS may grow over a fault's rounds before the verdict fails (default 16)")
  ap.add_argument('--artifact-exit-seconds', type=float, default=2., metavar='S',
                  help="most a daemon may take to exit 78 on a damaged artifact, from its start (default 2)")
  args = ap.parse_args()
  os.environ['OPENPILOT_PREFIX'] = f"soak{uuid.uuid4().hex[:8]}"
  os.environ.setdefault('DEV', 'CPU')
  t_end = time.monotonic() + args.minutes * 60
  with tempfile.TemporaryDirectory(prefix='soak-') as tmp:
    print(f"soak: {args.minutes:g} min on prefix {os.environ['OPENPILOT_PREFIX']}; logs of camerad in {tmp} while it runs", flush=True)
    soak = Soak(args, pathlib.Path(tmp))
    try:
      soak.artifact()
      rounds, last = 0, 0.
      while rounds == 0 or time.monotonic() + last < t_end:
        t = time.monotonic()
        for fault in (soak.baseline, soak.messages, soak.visionipc, soak.kills, soak.stopped_reader, soak.full_disk):
          print(f"soak: round {rounds + 1}: {fault.__name__}", flush=True)
          fault()
        rounds, last = rounds + 1, time.monotonic() - t
    finally:
      soak.close()
  for r in soak.rows.values(): r.judge_usage(args.max_rss_growth_mib)
  print(f"\nsoak: {rounds} rounds in {(time.monotonic() - t_end) / 60 + args.minutes:.1f} min; counts summed over the rounds, "
        "fds and RSS before the first round's fault and after the last one's\n")
  print(table(list(soak.rows.values())))
  failed = [r.fault for r in soak.rows.values() if not r.ok]
  print(f"\nsoak: {'FAIL: ' + '; '.join(failed) if failed else f'every fault passed ({len(soak.rows)})'}")
  return 1 if failed else 0

if __name__ == '__main__':
  sys.exit(main())
