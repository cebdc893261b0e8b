#!/usr/bin/env python3
"""VisionIPC benchmark: 1928x1208 NV12 frames from a producer process to a consumer process at full speed, over
VisionIPC's zero-copy path, VisionIPC send() (one copy) and a msgq socket: latency publish -> usable frame, bytes per
frame, ours/baseline last (docs/VISIONIPC.md). Then the client's per-frame look at the size of a buffer its server
could shrink (openpilot's), against a sealed one (ours)."""
import fcntl, multiprocessing as mp, os, pathlib, sys, time, uuid
REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import numpy as np

N, COUNT, NAME = 300, 8, "bench"
PACED_N, PACED_PERIOD = 40, 0.05   # a camera's 20 frames/s
HEAD = 8   # the baseline's send timestamp, in the frame's first bytes

def pct(x: list[float], q: float) -> float: return float(np.percentile(x, q))

def producer(mode: str, layout_spec: str, n: int, period: float, ready, go, done, out) -> None:
  from msgq import pub_sock
  from msgq.visionipc import VisionIpcServer, NV12Layout, ROAD
  l = NV12Layout.parse(layout_spec)
  src = [np.random.default_rng(i).integers(0, 256, l.size, dtype=np.uint8) for i in range(2)]   # decoded frames to write
  if mode == "baseline": pub = pub_sock(f"frames_{NAME}", 4 * l.size)   # a segment that takes a frame
  else:
    srv = VisionIpcServer(NAME)
    srv.create_buffers_with_sizes(ROAD, COUNT, l.width, l.height, l.size, l.stride, l.uv_offset)
    srv.start_listener()
  ready.set()
  go.wait()
  t0 = time.perf_counter()
  for i in range(n):
    if period: time.sleep(max(0.0, t0 + i * period - time.perf_counter()))
    if mode == "zero-copy":
      buf = srv.get_free_buffer(ROAD)
      np.copyto(buf.array, src[i % 2])                        # the frame is produced straight into shared memory
      srv.publish(ROAD, buf, i, time.monotonic_ns())
    elif mode == "send":
      srv.send(ROAD, src[i % 2], i, time.monotonic_ns())      # produced elsewhere, copied into the ring
    else:
      frame = bytearray(src[i % 2])                           # produced into fresh memory that ZMQ may send from
      frame[:HEAD] = time.monotonic_ns().to_bytes(HEAD, "little")
      pub.send(frame)
  out.put(n / (time.perf_counter() - t0))
  done.wait(30)   # keep the server (and its buffers) up until the consumer is done
  if mode != "baseline": srv.close()

def run(mode: str, layout, n: int, period: float) -> dict:
  from msgq import sub_sock, drain_sock_raw
  from msgq.visionipc import VisionIpcClient, ROAD
  from msgq.visionipc.wire import endpoint
  ctx = mp.get_context("spawn")
  ready, go, done, out = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Queue()
  p = ctx.Process(target=producer, args=(mode, str(layout), n, period, ready, go, done, out), daemon=True)
  p.start()
  assert ready.wait(30), f"{mode} producer did not start"
  if mode == "baseline": sock = sub_sock(f"frames_{NAME}", segment_size=4 * layout.size, timeout=1000)
  else:
    c = VisionIpcClient(NAME, ROAD, False)
    assert c.connect(True)
    tap = sub_sock(endpoint(NAME, ROAD))   # queues all N packets
  lat, torn, wire = [], 0, 0
  go.set()
  while len(lat) < n:
    if mode == "baseline":
      if (msg := sock.receive()) is None: break
      wire += len(msg)
      lat.append((time.monotonic_ns() - int.from_bytes(msg[:HEAD], "little")) / 1e6)
    else:
      if (buf := c.recv(1000)) is None: break
      lat.append((time.monotonic_ns() - buf.timestamp_sof) / 1e6)
      torn += buf.overwritten()
      del buf
  if mode != "baseline": wire = sum(map(len, drain_sock_raw(tap)))
  fps = out.get(timeout=30)
  done.set()
  p.join(10)
  if mode != "baseline": c.close()
  return {"p50": pct(lat, 50), "p99": pct(lat, 99), "fps": fps, "got": len(lat), "torn": torn, "wire": wire / max(len(lat), 1)}

def frame_work(sealed: bool, layout, n: int) -> float:
  """Seconds per frame of a client's work on its packet (recv's _frame: unpack, checks, the VisionBuf) and of the
  daemon's overwritten() after the run, over COUNT buffers in memfds sealed against shrinking (our server's) or not
  (openpilot's: both look at the buffer's size first)."""
  from msgq.visionipc import VisionIpcClient, ROAD
  from msgq.visionipc.wire import BUF, PACKET, TRAILER
  fds = [os.memfd_create("bench", os.MFD_ALLOW_SEALING if sealed else 0) for _ in range(COUNT)]
  for fd in fds:
    os.ftruncate(fd, layout.size + TRAILER)
    if sealed: fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
  c = VisionIpcClient(NAME, ROAD)
  l = layout
  c._map(b"".join(BUF.pack(l.size, l.size + TRAILER, 0, 0, fd, l.width, l.height, l.stride, l.uv_offset, 0, 0, 1, i, ROAD, 0)
                  for i, fd in enumerate(fds)), fds)
  for fd in fds: os.close(fd)
  packets = [PACKET.pack(1, i % COUNT, i, 0, 0, True) for i in range(n)]
  t0 = time.perf_counter()
  for p in packets: c._frame(p).overwritten()
  dt = (time.perf_counter() - t0) / n
  c.close()
  return dt

def main() -> None:
  os.environ["OPENPILOT_PREFIX"] = f"bench-visionipc-{uuid.uuid4().hex[:8]}"
  from msgq import remove_stack
  from msgq.visionipc import NV12Layout
  from msgq.visionipc.wire import PACKET
  layout = NV12Layout.aligned(1928, 1208)
  ratios = {}
  for label, n, period in (("full speed", N, 0.0), ("paced at 20 frames/s", PACED_N, PACED_PERIOD)):
    print(f"{label}: {n} frames of {layout} ({layout.size / 2**20:.2f} MiB) per transport, producer and consumer in separate processes")
    res = {}
    for mode in ("zero-copy", "send", "baseline"):
      r = res[mode] = run(mode, layout, n, period)
      print(f"  {mode:>9}: send->recv p50 {r['p50']:.3f} ms, p99 {r['p99']:.3f} ms; producer {r['fps']:.0f} frames/s; "
            f"received {r['got']}/{n} ({r['torn']} torn); bytes through the socket per frame {r['wire']:.0f}")
    z, b = res["zero-copy"], res["baseline"]
    print(f"  frame bytes copied producer->consumer per frame: zero-copy {round(z['wire']) - PACKET.size} ({z['wire']:.0f} through the socket: "
          f"the {PACKET.size}-byte packet, no pixels), baseline {b['wire']:.0f} (a frame is {layout.size})")
    ratios[label] = f"latency p50 {z['p50'] / b['p50']:.4f}, p99 {z['p99'] / b['p99']:.4f}, bytes through the socket {z['wire'] / b['wire']:.6f}"
  print("ratio ours(zero-copy)/baseline: " + "; ".join(f"{k}: {v}" for k, v in ratios.items()))
  times = {sealed: min(frame_work(sealed, layout, 100_000) for _ in range(3)) for sealed in (True, False)}
  print(f"client work per frame, recv and overwritten() (best of 3 x 100,000): sealed buffers {times[True] * 1e6:.2f} us, "
        f"unsealed {times[False] * 1e6:.2f} us (+{(times[False] - times[True]) * 1e6:.2f} us: the looks at the buffer's size)")
  remove_stack()

if __name__ == "__main__":
  main()
