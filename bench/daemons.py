#!/usr/bin/env python3
"""Daemon benchmark: modeld and dmonitoringd as real processes on 20 Hz camera streams.

Three parts: each daemon's overhead over a bare replay, both daemons on all three streams, and the whole stack of `make demo`;
docs/PERFORMANCE.md says how each is measured. Run it alone (the daemons share the cores).
usage: bench/daemons.py [--seconds 60] [--ratio-seconds 20] [--stack-seconds 60] [--whole-stack] [--stack-cores 2] [--models M] [--camera LAYOUT]"""
import argparse, os, pathlib, signal, subprocess, sys, tempfile, threading, time, uuid
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]
os.environ.setdefault('DEV', 'CPU')
os.environ['OPENPILOT_PREFIX'] = f"bench{uuid.uuid4().hex[:8]}"
import numpy as np
from msgq.visionipc import NV12Layout, ROAD, WIDE_ROAD, DRIVER

FRAME_NS = 50_000_000
BLOCK = 40           # frames per block in the overhead phase (2 s at 20 Hz)
BLOCK_SKIP = 2       # frames left out at the start of each block
SETTLE_S = 3
CLK_TCK = os.sysconf('SC_CLK_TCK')
DAEMONS = {'modeld': ('modelV2', (ROAD, WIDE_ROAD)), 'dmonitoringd': ('driverStateV2', (DRIVER,))}

def ms(x: float) -> str: return f"{x * 1e3:.2f} ms"

def proc_stats(pid: int) -> tuple[float, float, float]:
  """(CPU seconds used so far, RSS, its private part RssAnon in MiB) from /proc. The rest of RSS is mostly the camera's
  shared buffers and the mapped libraries."""
  with open(f'/proc/{pid}/stat') as f: fields = f.read().rsplit(')', 1)[1].split()
  cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
  with open(f'/proc/{pid}/status') as f: mem = {k: int(v.split()[0]) / 1024 for k, v in (l.split(':', 1) for l in f) if k in ('VmRSS', 'RssAnon')}
  return cpu, mem['VmRSS'], mem['RssAnon']

def start(art, name: str) -> subprocess.Popen:
  """The daemon as a real process, returned once it sent READY=1."""
  from tests.daemon_harness import Notify
  notify = Notify()
  env = {**os.environ, 'NOTIFY_SOCKET': notify.addr, 'PARALLEL': '0'}
  log = tempfile.TemporaryFile('w+')   # a file, not a pipe: a long run's log lines never block the daemon
  p = subprocess.Popen([sys.executable, '-m', name, '--artifacts', str(art)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log)
  p.log = log
  try: notify.wait('READY=1', 180)
  finally: notify.close()
  return p

def stop(procs: dict[str, subprocess.Popen]) -> dict[str, str]:
  """SIGTERM each daemon; its last periodic stats line."""
  stats = {}
  for n, p in procs.items():
    p.send_signal(signal.SIGTERM)
    p.wait(10)
    p.log.seek(0)
    lines = p.log.read().splitlines()
    p.log.close()
    if p.returncode != 0: print(f"{n} exited {p.returncode}:\n" + '\n'.join(lines[-30:]))
    stats[n] = next((l.split(' stats ', 1)[1] for l in reversed(lines) if ' stats ' in l), 'no stats line')
  return stats

class Subscriber:
  """Arrival time of every message of the given services by frameId, its timestampEof where it has one (modelV2 and
  the camera states), and modelV2's frameDropPerc, from a thread."""
  def __init__(self, services: list[str]):
    self.arrivals: dict[str, dict[int, int]] = {s: {} for s in services}
    self.eof: dict[str, dict[int, int]] = {s: {} for s in services}
    self.drop_perc: list[tuple[int, float]] = []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()
    time.sleep(0.5)   # subscribed before the first frame

  def _run(self) -> None:
    from cereal import messaging
    poller = messaging.Poller()
    socks = [messaging.sub_sock(s, poller=poller) for s in self.arrivals]
    while not self._stop.is_set():
      for sock in poller.poll(100):
        while (dat := sock.receive(non_blocking=True)) is not None:
          now = time.monotonic_ns()
          ev = messaging.log_from_bytes(dat)
          m = getattr(ev, s := ev.which())
          self.arrivals[s][m.frameId] = now
          if hasattr(m, 'timestampEof'): self.eof[s][m.frameId] = m.timestampEof
          if s == 'modelV2': self.drop_perc.append((m.frameId, m.frameDropPerc))
    for sock in socks: sock.close()

  def close(self) -> None:
    time.sleep(0.5)   # the last frames' messages
    self._stop.set()
    self._thread.join(1)

def pace(t0: int, i: int) -> None:
  """Sleep until frame tick i after t0 (monotonic ns)."""
  while (now := time.monotonic_ns()) < t0 + i * FRAME_NS: time.sleep(min(0.005, (t0 + i * FRAME_NS - now) / 1e9))

def serve(cam, frame_ids: range, streams=None, each_second=None) -> dict[int, dict[int, int]]:
  """Send the frames at 20 Hz; {stream: {frame id: publish time}}. each_second() runs after every 20th frame."""
  sent: dict[int, dict[int, int]] = {s: {} for s in cam.layouts}
  t0 = time.monotonic_ns()
  for k, i in enumerate(frame_ids, 1):
    pace(t0, k)
    published = {}
    cam.send(i, streams, published=published)
    for s, t in published.items(): sent[s][i] = t
    if each_second and k % 20 == 0: each_second(k // 20)
  return sent

def latencies(sub: Subscriber, sent: dict, name: str, frame_ids) -> np.ndarray:
  svc, streams = DAEMONS[name]
  return np.array([sub.arrivals[svc][i] - sent[streams[-1]][i] for i in frame_ids if i in sub.arrivals[svc]]) / 1e9

def bare_runners(art, layout: NV12Layout, images: dict[int, np.ndarray]) -> dict:
  """For each daemon, a function running one bare replay of its artifact (runner.run on buffers like the camera's)."""
  from modelrt.artifact import load_artifact
  from modelrt.runner import RoadRunner, DMRunner, HostBuf
  from transformations.model import road_warp_matrix, dm_warp_matrix
  from transformations.camera import camera_for
  bufs = {s: [HostBuf(layout, images[s], s, i) for i in range(4)] for s in (ROAD, WIDE_ROAD, DRIVER)}
  road = RoadRunner(load_artifact(art, 'road'), layout, layout)
  road.set_transforms(road_warp_matrix(np.zeros(3), camera_for('ar0231', 'road', layout.width, layout.height)),
                      road_warp_matrix(np.zeros(3), camera_for('ar0231', 'wide', layout.width, layout.height), wide=True))
  dm = DMRunner(load_artifact(art, 'dm'), layout)
  dm_M = dm_warp_matrix(camera_for('ar0231', 'driver', layout.width, layout.height))
  road.warmup(), dm.warmup()
  desire, traffic = np.zeros(8, np.float32), np.array([1, 0], np.float32)
  return {'modeld': lambda i: road.run(bufs[ROAD][i % 4], bufs[WIDE_ROAD][i % 4], desire, traffic),
          'dmonitoringd': lambda i: dm.run(bufs[DRIVER][i % 4], np.zeros(3, np.float32), dm_M)}

def overhead(cam, art, name: str, bare, seconds: float) -> tuple[np.ndarray, np.ndarray]:
  """The daemon alone: (its latencies, bare replay times), from alternating blocks at 20 Hz."""
  svc, streams = DAEMONS[name]
  proc, sub = start(art, name), Subscriber([svc])
  lat, base, fid = [], [], 1
  try:
    for _ in range(max(1, round(seconds * 20 / BLOCK))):
      ids = range(fid, fid + BLOCK)
      sent = serve(cam, ids, streams)
      fid += BLOCK
      time.sleep(0.2)   # the block's last message arrives before the bare replays start
      lat.append(latencies(sub, sent, name, ids[BLOCK_SKIP:]))
      t0 = time.monotonic_ns()
      for k in range(BLOCK):
        pace(t0, k + 1)
        t = time.perf_counter()
        bare(k)
        if k >= BLOCK_SKIP: base.append(time.perf_counter() - t)
  finally:
    sub.close()
    stop({name: proc})
  return np.concatenate(lat), np.array(base)

def together(cam, art, seconds: float) -> dict:
  """Both daemons on all streams: latencies, frameDropPerc, CPU share and RSS every second."""
  procs = {n: start(art, n) for n in DAEMONS}
  sub = Subscriber([svc for svc, _ in DAEMONS.values()])
  rss: dict[str, list[tuple[float, float]]] = {n: [] for n in procs}
  settle, n_frames, cpu0 = SETTLE_S * 20, (SETTLE_S + int(seconds)) * 20, {}
  def each_second(sec: int) -> None:
    if sec == SETTLE_S: cpu0.update({n: (proc_stats(p.pid)[0], time.monotonic()) for n, p in procs.items()})
    for n, p in procs.items(): rss[n].append(proc_stats(p.pid)[1:])
  try:
    sent = serve(cam, range(1, n_frames + 1), each_second=each_second)
    cpu = {n: (proc_stats(p.pid)[0] - cpu0[n][0]) / (time.monotonic() - cpu0[n][1]) for n, p in procs.items()}
  finally:
    sub.close()
    stats = stop(procs)
  out = {'drop_perc': [v for f, v in sub.drop_perc if f > settle]}
  for n in procs:
    quarters = [(len(rss[n]) * q) // 4 for q in (1, 2, 3, 4)]
    out[n] = {'stats': stats[n], 'lat': latencies(sub, sent, n, range(settle + 1, n_frames + 1)), 'n': n_frames - settle, 'cpu': cpu[n],
              'rss': [(t, *rss[n][t - 1]) for t in quarters]}
  return out

def whole_stack(art, layout: NV12Layout, seconds: float, cores: int) -> dict:
  """camerad (the demo's scene, looping), modeld, dmonitoringd and modeld-record, held to `cores` CPUs with this
  process (the target is for a 2-core machine; the processes inherit the affinity): latencies from each frame's
  timestampEof, frameDropPerc, frames without an output, each process's CPU share over the measured seconds."""
  import json
  if cores < len(allowed := sorted(os.sched_getaffinity(0))): os.sched_setaffinity(0, allowed[:cores])
  from modeld_tools.demo import DEMO_SCENE
  from tests.daemon_harness import Notify
  tmp = tempfile.TemporaryDirectory()
  (scene := pathlib.Path(tmp.name) / 'scene.json').write_text(json.dumps(DEMO_SCENE))
  sub, procs = Subscriber(['modelV2', 'driverStateV2', 'roadCameraState', 'driverCameraState']), {}
  try:
    for name, cmd in (('record', ['modeld_tools.record', '--route', f'{tmp.name}/route']),
                      ('camerad', ['camerad', '--source', f'synthetic:{scene}', '--loop', '--layout', str(layout)])):
      notify = Notify()
      procs[name] = p = subprocess.Popen([sys.executable, '-m', *cmd], cwd=REPO, env={**os.environ, 'NOTIFY_SOCKET': notify.addr},
                                         stdout=subprocess.DEVNULL, stderr=(log := tempfile.TemporaryFile('w+')))
      p.log = log
      try: notify.wait('READY=1', 60)
      finally: notify.close()
    procs |= {n: start(art, n) for n in DAEMONS}   # each is ready once it has connected to camerad
    time.sleep(SETTLE_S)
    cpu0, t0, first = {n: proc_stats(p.pid)[0] for n, p in procs.items()}, time.monotonic(), max(sub.arrivals['roadCameraState'], default=0) + 1
    time.sleep(seconds)
    cpu = {n: (proc_stats(p.pid)[0] - cpu0[n]) / (time.monotonic() - t0) for n, p in procs.items()}
    last = max(sub.arrivals['roadCameraState'], default=0)
    time.sleep(0.5)   # the outputs of the last frames, still being computed
  finally:
    sub.close()
    stop(procs)
    tmp.cleanup()
  frames = range(first, last + 1)
  def lat(svc: str, eof: dict) -> np.ndarray:
    return np.array([sub.arrivals[svc][f] - eof[f] for f in frames if f in sub.arrivals[svc] and f in eof]) / 1e9
  return {'frames': len(frames), 'cores': len(os.sched_getaffinity(0)), 'cpu': cpu, 'drop_perc': [v for f, v in sub.drop_perc if f in frames],
          'lat': {'modelV2': lat('modelV2', sub.eof['modelV2']), 'driverStateV2': lat('driverStateV2', sub.eof['driverCameraState'])},
          'missing': {s: sum(f not in sub.arrivals[s] for f in frames) for s in ('modelV2', 'driverStateV2')}}

def lat_line(lat: np.ndarray, total: int) -> str:
  if not len(lat): return "no messages received"
  return f"{len(lat)}/{total} frames; p50 {ms(np.percentile(lat, 50))}, p99 {ms(np.percentile(lat, 99))}, max {ms(lat.max())}"

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--seconds', type=float, default=60., help="both daemons together at 20 Hz, measured seconds (default 60; after a 3 s settle)")
  ap.add_argument('--ratio-seconds', type=float, default=20., help="each daemon alone first, seconds of frames to it (as many of bare "
                  "replays, alternating in 2 s blocks; default 20)")
  ap.add_argument('--stack-seconds', type=float, default=60., help="the whole stack (camerad, both daemons, modeld-record), measured "
                  "seconds (default 60; after a 3 s settle; 0: skip)")
  ap.add_argument('--whole-stack', action='store_true', help="run only the whole stack")
  ap.add_argument('--stack-cores', type=int, default=2, help="CPUs the whole stack may use (default 2, the target's machine)")
  ap.add_argument('--models', choices=['reference', 'tiny'], default='reference', help="built-in reference models or the tiny test models")
  ap.add_argument('--camera', default='1928x1208:aligned', help="camera buffer layout of all three streams (default 1928x1208:aligned)")
  args = ap.parse_args()

  from tests.artifacts import build, CACHE
  from tests.daemon_harness import Camera
  layout = NV12Layout.parse(args.camera)
  t = time.perf_counter()
  art = build(CACHE.parent / f'bench-{args.models}', (layout,), models=args.models)
  print(f"artifacts ({args.models}, {layout}): {time.perf_counter() - t:.1f} s (content-addressed: fast when unchanged)")

  if not args.whole_stack:
    cam = Camera({ROAD: layout, WIDE_ROAD: layout, DRIVER: layout})
    rng = np.random.default_rng(1)
    cam.images = {s: rng.integers(0, 256, layout.size, dtype=np.uint8) for s in cam.layouts}
    bare = bare_runners(art, layout, cam.images)
    try:
      alone = {n: overhead(cam, art, n, bare[n], args.ratio_seconds) for n in DAEMONS}
      both = together(cam, art, args.seconds)
    finally: cam.close()
    report(alone, both)
  if args.whole_stack or args.stack_seconds > 0:
    st = whole_stack(art, layout, args.stack_seconds, args.stack_cores)
    print(f"whole stack ({args.stack_seconds:g} s of the demo's scene at 20 Hz, on {st['cores']} cores): {st['frames']} camera frames; "
          f"CPU {', '.join(f'{n} {c * 100:.0f}%' for n, c in st['cpu'].items())} of one core")
    for svc, lat in st['lat'].items():
      print(f"whole stack {svc} latency from the frame's timestampEof: {lat_line(lat, st['frames'])}; frames without it {st['missing'][svc]}")
    dp = st['drop_perc']
    print(f"whole stack modelV2 frameDropPerc: max {max(dp):.2f}, mean {np.mean(dp):.2f} over {len(dp)} outputs "
          f"({'keeps up' if max(dp) == 0 and not any(st['missing'].values()) else 'DROPS FRAMES'})" if dp else "whole stack: no modelV2")
  return 0

def report(alone: dict, both: dict) -> None:
  for n, (lat, base) in alone.items():
    print(f"{n} alone, {DAEMONS[n][0]} latency publish->arrival: {lat_line(lat, len(base))}")
    print(f"{n} bare guarded-JIT replay (runner.run) in alternating blocks: p50 {ms(np.percentile(base, 50))}, p99 {ms(np.percentile(base, 99))}")
  for n in DAEMONS:
    r = both[n]
    print(f"{n} with the other, {DAEMONS[n][0]} latency publish->arrival: {lat_line(r['lat'], r['n'])}")
    print(f"{n}: CPU {r['cpu'] * 100:.0f}% of one core; RSS (private part) at " +
          ', '.join(f"{t} s {total:.1f} ({anon:.1f}) MiB" for t, total, anon in r['rss']))
    print(f"{n}: its own last stats line: {r['stats']}")
  dp = both['drop_perc']
  print(f"modelV2 frameDropPerc at 20 Hz, both daemons running: max {max(dp):.2f}, last {dp[-1]:.2f}" if dp else "no frameDropPerc")
  for n, (lat, base) in alone.items():
    print(f"{n}: latency p50 / bare replay p50 = {np.percentile(lat, 50) / np.percentile(base, 50):.2f} (target <= 1.10)")

if __name__ == '__main__': sys.exit(main())
