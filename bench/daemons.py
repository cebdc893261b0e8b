#!/usr/bin/env python3
"""Daemon benchmark: modeld and dmonitoringd as real processes on 20 Hz camera streams.

This process is the camera (VisionIPC road, wide road and driver streams, with their camera-state messages) and the
subscriber (modelV2, driverStateV2). It measures, per frame, the latency from the camera's send() to the message's
arrival here (p50/p99), frameDropPerc at 20 Hz, and each daemon's CPU and RSS (RSS sampled every second: it must
not grow). After the daemons stop it replays the same artifacts bare (RoadRunner/DMRunner.run: warps, models, copy-out,
guard checks) in this process: the daemon's p50 latency over that bare replay p50 is its overhead ratio (target <= 1.10),
printed last. Both are measured in this run on this machine. Run it alone: the two daemons share the machine's cores.

usage: bench/daemons.py [--seconds 60] [--models reference|tiny] [--camera LAYOUT]
"""
import argparse, os, pathlib, signal, subprocess, sys, tempfile, threading, time, uuid
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / 'tests')]
os.environ.setdefault('DEV', 'CPU')
os.environ['OPENPILOT_PREFIX'] = f"bench{uuid.uuid4().hex[:8]}"
import numpy as np

FRAME_NS = 50_000_000
CLK_TCK = os.sysconf('SC_CLK_TCK')

def ms(x: float) -> str: return f"{x * 1e3:.2f} ms"

def proc_stats(pid: int) -> tuple[float, float]:
  """(CPU seconds used so far, RSS in MiB) from /proc."""
  with open(f'/proc/{pid}/stat') as f: fields = f.read().rsplit(')', 1)[1].split()
  cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
  with open(f'/proc/{pid}/status') as f: rss = next(int(l.split()[1]) for l in f if l.startswith('VmRSS:')) / 1024
  return cpu, rss

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--seconds', type=float, default=60., help="measured run time at 20 Hz (default 60; after a 3 s settle)")
  ap.add_argument('--models', choices=['reference', 'tiny'], default='reference', help="built-in reference models or the tiny test models")
  ap.add_argument('--camera', default='1928x1208:aligned', help="camera buffer layout of all three streams (default 1928x1208:aligned)")
  args = ap.parse_args()

  from artifacts import build, CACHE
  from msgq.visionipc import NV12Layout, ROAD, WIDE_ROAD, DRIVER
  from daemon_harness import Camera, Notify
  from cereal import messaging
  layout = NV12Layout.parse(args.camera)
  t = time.perf_counter()
  art = build(CACHE.parent / f'bench-{args.models}', (layout,), models=args.models)
  print(f"artifacts ({args.models}, {layout}): {time.perf_counter() - t:.1f} s (content-addressed: fast when unchanged)")

  cam = Camera({ROAD: layout, WIDE_ROAD: layout, DRIVER: layout})
  rng = np.random.default_rng(1)
  cam.images = {s: rng.integers(0, 256, layout.size, dtype=np.uint8) for s in cam.layouts}
  daemons = {}
  for name in ('modeld', 'dmonitoringd'):
    notify = Notify()
    env = {**os.environ, 'NOTIFY_SOCKET': notify.addr, 'PARALLEL': '0'}
    p = subprocess.Popen([sys.executable, '-m', name, '--artifacts', str(art), '--stats-interval', '1000'], cwd=REPO, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    daemons[name] = (p, notify)
  for name, (p, notify) in daemons.items():
    notify.wait('READY=1', 180)
    notify.close()
  print("both daemons ready")

  # the subscriber: arrival time per frame id
  arrivals = {'modelV2': {}, 'driverStateV2': {}}
  drop_perc: list[float] = []
  stop = threading.Event()
  def subscribe():
    poller = messaging.Poller()
    socks = {s: messaging.sub_sock(s, poller=poller) for s in arrivals}
    while not stop.is_set():
      for sock in poller.poll(100):
        while (dat := sock.receive(non_blocking=True)) is not None:
          now = time.monotonic_ns()
          ev = messaging.log_from_bytes(dat)
          s = ev.which()
          arrivals[s][getattr(ev, s).frameId] = now
          if s == 'modelV2': drop_perc.append(ev.modelV2.frameDropPerc)
  sub = threading.Thread(target=subscribe, daemon=True)
  sub.start()
  time.sleep(0.5)

  sent: dict[int, int] = {}
  rss: dict[str, list[float]] = {n: [] for n in daemons}
  settle = int(3 * 20)
  n_frames = settle + int(args.seconds * 20)
  t0 = time.monotonic_ns()
  cpu0 = {}
  for i in range(1, n_frames + 1):
    while (now := time.monotonic_ns()) < t0 + i * FRAME_NS: time.sleep(min(0.005, (t0 + i * FRAME_NS - now) / 1e9))
    sent[i] = time.monotonic_ns()
    cam.send(i)
    if i == settle: cpu0 = {n: (proc_stats(p.pid)[0], time.monotonic()) for n, (p, _) in daemons.items()}
    if i % 20 == 0:
      for n, (p, _) in daemons.items(): rss[n].append(proc_stats(p.pid)[1])
  time.sleep(0.5)
  cpu = {n: (proc_stats(p.pid)[0] - cpu0[n][0]) / (time.monotonic() - cpu0[n][1]) for n, (p, _) in daemons.items()}
  stop.set()
  sub.join(1)
  for n, (p, _) in daemons.items():
    p.send_signal(signal.SIGTERM)
    p.wait(10)
    if p.returncode != 0: print(f"{n} exited {p.returncode}:\n{p.stderr.read()[-3000:]}")
  cam.close()

  results = {}
  for name, svc in (('modeld', 'modelV2'), ('dmonitoringd', 'driverStateV2')):
    lat = np.array([arrivals[svc][i] - sent[i] for i in range(settle + 1, n_frames + 1) if i in arrivals[svc]]) / 1e9
    got = len(lat)
    results[name] = float(np.percentile(lat, 50)) if got else float('nan')
    print(f"{name}: {svc} for {got}/{n_frames - settle} frames; latency send->arrival p50 {ms(np.percentile(lat, 50))}, "
          f"p99 {ms(np.percentile(lat, 99))}, max {ms(lat.max())}" if got else f"{name}: no {svc} received")
    r = rss[name]
    k = max(1, len(r) // 5)
    print(f"{name}: CPU {cpu[name] * 100:.0f}% of one core; RSS {np.mean(r[:k]):.1f} MiB in the first {k} s -> "
          f"{np.mean(r[-k:]):.1f} MiB in the last {k} s (max {max(r):.1f})")
  dp = drop_perc[settle:]
  print(f"modelV2 frameDropPerc at 20 Hz: max {max(dp):.2f}, last {dp[-1]:.2f}" if dp else "no frameDropPerc")

  # the bare replay of the same artifacts in this process, with the daemons gone
  from modelrt.artifact import load_artifact
  from modelrt.runner import RoadRunner, DMRunner, aligned_empty
  from modelrt.geometry import road_warp_matrix, dm_warp_matrix
  from modeld.calibration import camera_for
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
  n_bare = 60
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
