#!/usr/bin/env python3
"""Daemon benchmark: modeld and dmonitoringd as real processes on 20 Hz camera streams.

This process is the camera (VisionIPC road, wide road and driver streams, with their camera-state messages) and the
subscriber (modelV2, driverStateV2). Each daemon first runs alone (--ratio-seconds): per-frame latency from the publish
of the last camera frame it needs (the buffer filled, its index sent) to its message's arrival here, p50/p99. Then both run together (--seconds): the
same latencies, frameDropPerc at 20 Hz, each daemon's CPU and its RSS sampled every second (it must not grow). Last,
with the daemons gone, this process replays the same artifacts bare at 20 Hz (RoadRunner/DMRunner.run: guard checks,
warps, models, copy-out): a daemon's latency p50 alone over its bare replay p50 is its overhead ratio (target <= 1.10),
printed last. Everything is measured in this run on this machine; run it alone (the daemons share the cores).

usage: bench/daemons.py [--seconds 60] [--ratio-seconds 20] [--models reference|tiny] [--camera LAYOUT]
"""
import argparse, os, pathlib, signal, subprocess, sys, threading, time, uuid
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / 'tests')]
os.environ.setdefault('DEV', 'CPU')
os.environ['OPENPILOT_PREFIX'] = f"bench{uuid.uuid4().hex[:8]}"
import numpy as np
from msgq.visionipc import NV12Layout, ROAD, WIDE_ROAD, DRIVER

FRAME_NS = 50_000_000
CLK_TCK = os.sysconf('SC_CLK_TCK')

def ms(x: float) -> str: return f"{x * 1e3:.2f} ms"

def proc_stats(pid: int) -> tuple[float, float]:
  """(CPU seconds used so far, RSS in MiB) from /proc."""
  with open(f'/proc/{pid}/stat') as f: fields = f.read().rsplit(')', 1)[1].split()
  cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
  with open(f'/proc/{pid}/status') as f: rss = next(int(l.split()[1]) for l in f if l.startswith('VmRSS:')) / 1024
  return cpu, rss

DAEMONS = {'modeld': ('modelV2', (ROAD, WIDE_ROAD)), 'dmonitoringd': ('driverStateV2', (DRIVER,))}
SETTLE_S = 3

def run_daemons(cam, art, names: list[str], seconds: float) -> dict:
  """Start the daemons, wait for READY, serve 20 Hz frames for SETTLE_S + seconds, stop them. Per daemon: latency from
  the publish of the last camera frame it needs to its message's arrival here, CPU share and RSS every second."""
  from daemon_harness import Notify
  from cereal import messaging
  procs = {}
  for name in names:
    notify = Notify()
    env = {**os.environ, 'NOTIFY_SOCKET': notify.addr, 'PARALLEL': '0'}
    procs[name] = subprocess.Popen([sys.executable, '-m', name, '--artifacts', str(art), '--stats-interval', '1000'], cwd=REPO, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    notify.wait('READY=1', 180)
    notify.close()
  arrivals = {DAEMONS[n][0]: {} for n in names}
  drop_perc: list[tuple[int, float]] = []
  stop = threading.Event()
  def subscribe():
    poller = messaging.Poller()
    socks = [messaging.sub_sock(s, poller=poller) for s in arrivals]
    while not stop.is_set():
      for sock in poller.poll(100):
        while (dat := sock.receive(non_blocking=True)) is not None:
          now = time.monotonic_ns()
          ev = messaging.log_from_bytes(dat)
          arrivals[s := ev.which()][getattr(ev, s).frameId] = now
          if s == 'modelV2': drop_perc.append((ev.modelV2.frameId, ev.modelV2.frameDropPerc))
    for sock in socks: sock.close()
  sub = threading.Thread(target=subscribe, daemon=True)
  sub.start()
  time.sleep(0.5)

  sent: dict[int, dict[int, int]] = {s: {} for s in cam.layouts}
  rss: dict[str, list[float]] = {n: [] for n in names}
  settle, n_frames = SETTLE_S * 20, (SETTLE_S + int(seconds)) * 20
  t0, cpu0 = time.monotonic_ns(), {}
  for i in range(1, n_frames + 1):
    while (now := time.monotonic_ns()) < t0 + i * FRAME_NS: time.sleep(min(0.005, (t0 + i * FRAME_NS - now) / 1e9))
    published = {}
    cam.send(i, published=published)
    for s, t in published.items(): sent[s][i] = t
    if i == settle: cpu0 = {n: (proc_stats(p.pid)[0], time.monotonic()) for n, p in procs.items()}
    if i % 20 == 0:
      for n, p in procs.items(): rss[n].append(proc_stats(p.pid)[1])
  time.sleep(0.5)
  cpu = {n: (proc_stats(p.pid)[0] - cpu0[n][0]) / (time.monotonic() - cpu0[n][1]) for n, p in procs.items()}
  stop.set()
  sub.join(1)
  out = {'drop_perc': [v for f, v in drop_perc if f > settle]}
  for n, p in procs.items():
    p.send_signal(signal.SIGTERM)
    p.wait(10)
    if p.returncode != 0: print(f"{n} exited {p.returncode}:\n{p.stderr.read()[-3000:]}")
    svc, streams = DAEMONS[n]
    lat = np.array([arrivals[svc][i] - sent[streams[-1]][i] for i in range(settle + 1, n_frames + 1) if i in arrivals[svc]]) / 1e9
    r, k = rss[n], max(1, len(rss[n]) // 5)
    out[n] = {'p50': float(np.percentile(lat, 50)) if len(lat) else float('nan'), 'cpu': cpu[n], 'k': k,
              'rss_first': float(np.mean(r[:k])), 'rss_last': float(np.mean(r[-k:])), 'rss_max': max(r),
              'line': (f"{svc} for {len(lat)}/{n_frames - settle} frames; latency publish->arrival p50 {ms(np.percentile(lat, 50))}, "
                       f"p99 {ms(np.percentile(lat, 99))}, max {ms(lat.max())}") if len(lat) else f"no {svc} received"}
  return out

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--seconds', type=float, default=60., help="both daemons together at 20 Hz, measured seconds (default 60; after a 3 s settle)")
  ap.add_argument('--ratio-seconds', type=float, default=20., help="each daemon alone first, for its latency ratio (default 20)")
  ap.add_argument('--models', choices=['reference', 'tiny'], default='reference', help="built-in reference models or the tiny test models")
  ap.add_argument('--camera', default='1928x1208:aligned', help="camera buffer layout of all three streams (default 1928x1208:aligned)")
  args = ap.parse_args()

  from artifacts import build, CACHE
  from daemon_harness import Camera
  layout = NV12Layout.parse(args.camera)
  t = time.perf_counter()
  art = build(CACHE.parent / f'bench-{args.models}', (layout,), models=args.models)
  print(f"artifacts ({args.models}, {layout}): {time.perf_counter() - t:.1f} s (content-addressed: fast when unchanged)")

  cam = Camera({ROAD: layout, WIDE_ROAD: layout, DRIVER: layout})
  rng = np.random.default_rng(1)
  cam.images = {s: rng.integers(0, 256, layout.size, dtype=np.uint8) for s in cam.layouts}
  # each daemon alone (its latency against its bare replay), then both together (drops, CPU, RSS at 20 Hz)
  alone = {name: run_daemons(cam, art, [name], args.ratio_seconds) for name in DAEMONS}
  both = run_daemons(cam, art, list(DAEMONS), args.seconds)
  cam.close()
  results = {}
  for name, r in alone.items():
    results[name] = r[name]['p50']
    print(f"{name} alone: {r[name]['line']}")
  for name in DAEMONS:
    r = both[name]
    print(f"{name} with the other: {r['line']}")
    print(f"{name}: CPU {r['cpu'] * 100:.0f}% of one core; RSS {r['rss_first']:.1f} MiB in the first {r['k']} s -> "
          f"{r['rss_last']:.1f} MiB in the last {r['k']} s (max {r['rss_max']:.1f})")
  dp = both['drop_perc']
  print(f"modelV2 frameDropPerc at 20 Hz, both daemons running: max {max(dp):.2f}, last {dp[-1]:.2f}" if dp else "no frameDropPerc")

  # the bare replay of the same artifacts in this process, with the daemons gone
  from modelrt.artifact import load_artifact
  from modelrt.runner import RoadRunner, DMRunner, aligned_empty
  from modelrt.geometry import road_warp_matrix, dm_warp_matrix
  from modelrt.calibration import camera_for
  class Buf:
    def __init__(self, idx, stream):
      self.data = aligned_empty(layout.size)
      self.data[:] = cam.images[stream]
      self.addr, self.idx, self.stream = self.data.ctypes.data, idx, stream
      self.width, self.height, self.stride, self.uv_offset, self.size = layout.width, layout.height, layout.stride, layout.uv_offset, layout.size
  road = RoadRunner(load_artifact(art, 'road'), layout, layout)
  road.set_transforms(road_warp_matrix(np.zeros(3), camera_for('ar0231', 'road', layout.width, layout.height)),
                      road_warp_matrix(np.zeros(3), camera_for('ar0231', 'wide', layout.width, layout.height), wide=True))
  dm = DMRunner(load_artifact(art, 'dm'), layout)
  dm_M = dm_warp_matrix(camera_for('ar0231', 'driver', layout.width, layout.height))
  bufs = {s: [Buf(i, s) for i in range(4)] for s in (ROAD, WIDE_ROAD, DRIVER)}
  desire, traffic = np.zeros(8, np.float32), np.array([1, 0], np.float32)
  bare = {'modeld': [], 'dmonitoringd': []}
  n_bare = int(args.ratio_seconds * 10)
  for i in range(n_bare + 5):
    t = time.perf_counter()
    road.run(bufs[ROAD][i % 4], bufs[WIDE_ROAD][i % 4], desire, traffic)
    t1 = time.perf_counter()
    dm.run(bufs[DRIVER][i % 4], np.zeros(3, np.float32), dm_M)
    t2 = time.perf_counter()
    if i >= 5: bare['modeld'].append(t1 - t), bare['dmonitoringd'].append(t2 - t1)
    time.sleep(max(0, 0.05 - (time.perf_counter() - t)))   # at 20 Hz, like the daemons
  for name in bare:
    b = np.array(bare[name])
    print(f"{name}: bare guarded-JIT replay (runner.run) p50 {ms(np.percentile(b, 50))}, p99 {ms(np.percentile(b, 99))}")
  for name in bare:
    print(f"{name}: latency p50 / bare replay p50 = {results[name] / np.percentile(bare[name], 50):.2f} (target <= 1.10)")
  return 0

if __name__ == '__main__': sys.exit(main())
