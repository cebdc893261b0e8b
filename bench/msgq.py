#!/usr/bin/env python3
"""msgq pub/sub against raw pyzmq PUB/SUB over the same transport (ipc), publisher and subscriber in separate
processes, both measured in this run. One-way latency: the publisher embeds CLOCK_MONOTONIC (shared by all
processes) in each message and the subscriber subtracts it on arrival; messages are paced so none queue.
Throughput: the publisher sends a burst as fast as it can (send rate); the subscriber counts what arrives, from
the first send to the last arrival (delivered rate: a PUB/SUB queue drops what does not fit, so it is what a reader
gets). Both sides use the same queue lengths. Runs each twice, interleaved, and keeps the better run of each.
Prints every figure, then the ratios ours/raw."""
import multiprocessing, os, sys, tempfile, time
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTX = multiprocessing.get_context("spawn")
KiB, MiB = 1024, 1024 * 1024
PROBE, END = b"\x00" * 8, b"\xff" * 8   # first 8 bytes of the non-timed messages

def _open(kind: str, role: str, size: int, path: str):
  """(socket, its send or receive function) for one side of one implementation."""
  import msgq
  max_size = max(size, 64 * KiB)
  if kind == "ours":
    s = (msgq.pub_sock if role == "pub" else msgq.sub_sock)("bench", max_size=max_size)
    return s, (s.send if role == "pub" else s.receive)
  import zmq
  s = zmq.Context.instance().socket(zmq.PUB if role == "pub" else zmq.SUB)
  s.setsockopt(zmq.LINGER, 0)
  s.setsockopt(zmq.SNDHWM if role == "pub" else zmq.RCVHWM, msgq.pubsub.queue_len(size if role == "pub" else max_size))   # the same queue lengths
  if role == "pub":
    s.bind("ipc://" + path)
    return s, (lambda d: s.send(d, copy=len(d) < 64 * KiB))   # zero-copy for large messages, as msgq does
  s.setsockopt(zmq.SUBSCRIBE, b"")
  s.connect("ipc://" + path)
  return s, s.recv

def _subscriber(kind: str, size: int, path: str, conn) -> None:
  _, recv = _open(kind, "sub", size, path)
  conn.send("up")
  lat, n, nbytes, last = [], 0, 0, 0
  while True:
    msg = recv()
    now = time.monotonic_ns()
    head = msg[:8]
    if head == PROBE:
      conn.send("probe")
      continue
    if head == END:
      if n: conn.send((lat, n, nbytes, last))   # once per phase, however many ENDs arrive
      lat, n, nbytes = [], 0, 0
      continue
    lat.append((now - int.from_bytes(head, "little")) / 1e3)
    n, nbytes, last = n + 1, nbytes + len(msg), now

def _until_reply(send, conn, marker: bytes, body: bytes):
  while not conn.poll(0.01): send(marker + body)
  return conn.recv()

def run(kind: str, size: int, n_lat: int, hz: float, n_tp: int) -> dict:
  path = os.path.join(tempfile.mkdtemp(), "raw.ipc")
  sock, send = _open(kind, "pub", size, path)
  parent, child = CTX.Pipe()
  p = CTX.Process(target=_subscriber, args=(kind, size, path, child), daemon=True)
  p.start()
  try:
    assert parent.recv() == "up"
    body = os.urandom(size - 8)
    _until_reply(send, parent, PROBE, body)   # connected and subscribed
    while parent.poll(0.05): parent.recv()    # stray probe replies
    # latency: paced sends
    for _ in range(n_lat):
      time.sleep(1 / hz)   # pacing jitter does not matter: the timestamp is taken at the send
      send(time.monotonic_ns().to_bytes(8, "little") + body)
    lat = _until_reply(send, parent, END, body)[0]
    # throughput: a burst
    msgs = [i.to_bytes(8, "little") + body for i in range(1, 9)]   # built beforehand: only sending is timed
    t0 = time.monotonic_ns()
    for i in range(n_tp): send(msgs[i & 7])
    send_s = (time.monotonic_ns() - t0) / 1e9
    _, got, nbytes, last = _until_reply(send, parent, END, body)
    recv_s = (last - t0) / 1e9   # first send to last arrival
    return {"p50": np.percentile(lat, 50), "p99": np.percentile(lat, 99), "n_lat": len(lat),
            "send_rate": n_tp / send_s, "recv_rate": got / recv_s, "got": got, "MBps": nbytes / recv_s / 1e6}
  finally:
    p.kill(); p.join()
    sock.close()

def main() -> None:
  os.environ.setdefault("OPENPILOT_PREFIX", f"bench-msgq-{os.getpid()}")
  cases = [("1 KiB", KiB, 2000, 1000., 50000), ("1 MiB", MiB, 300, 100., 400)]
  ratios = []
  for name, size, n_lat, hz, n_tp in cases:
    res = {}
    for kind in ("raw", "ours", "raw", "ours"):   # twice each, interleaved: machine noise hits both
      r = run(kind, size, n_lat, hz, n_tp)
      if kind not in res or r["p50"] < res[kind]["p50"]: res[kind] = r
    for kind in ("raw", "ours"):
      r = res[kind]
      print(f"{name} {kind:4s}: latency p50 {r['p50']:7.1f} us  p99 {r['p99']:7.1f} us  ({r['n_lat']}/{n_lat} received)  "
            f"burst: sent {r['send_rate']:8.0f} msg/s, delivered {r['recv_rate']:8.0f} msg/s = {r['MBps']:7.1f} MB/s "
            f"({r['got']}/{n_tp}; a PUB/SUB queue drops what does not fit)")
    o, w = res["ours"], res["raw"]
    ratios.append((name, o["p50"] / w["p50"], o["p99"] / w["p99"], o["send_rate"] / w["send_rate"], o["recv_rate"] / w["recv_rate"]))
  for name, p50, p99, sent, got in ratios:
    print(f"ratio ours/raw {name}: latency p50 {p50:.2f} (target <= 1.2)  p99 {p99:.2f}  send rate {sent:.2f}  delivered rate {got:.2f}")

if __name__ == "__main__":
  main()
