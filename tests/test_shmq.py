"""The shm transport: openpilot's shared-memory queue (msgq/shmq.py) at the byte level, and the sockets over it, with real
files in /dev/shm, real signals and real processes. Against openpilot's own bytes: tests/test_golden_msgq.py."""
import logging, multiprocessing, os, signal, struct, threading, time
import pytest
import msgq
from msgq import shmq
from msgq.shmq import HEADER, NUM_READERS, Queue

CTX = multiprocessing.get_context("spawn")
HDR = struct.Struct("<3Q15Q15Q15Q")   # num_readers, write_pointer, write_uid, read_pointers, read_valids, read_uids

@pytest.fixture(autouse=True)
def shm(monkeypatch):
  monkeypatch.setenv("MSGQ_TRANSPORT", "shm")

def header(path: str) -> tuple:
  with open(path, "rb") as f: h = HDR.unpack(f.read(HEADER))
  return h[0], h[1], h[2], h[3:18], h[18:33], h[33:48]

def record(path: str, off: int, n: int) -> tuple[int, bytes]:
  with open(path, "rb") as f:
    f.seek(HEADER + off)
    tag, = struct.unpack("<q", f.read(8))
    return tag, f.read(n)

def test_queue_file_header_and_records_byte_for_byte():
  """openpilot's layout: /dev/shm/msgq_<prefix>/<endpoint> of segment + 384 bytes; header words num_readers,
  write_pointer (cycle << 32 | offset), write_uid, then 15 read pointers, valids and uids; each uid's low half the
  thread id that is signalled; records an int64 length tag and the payload, padded to 8."""
  pub = msgq.pub_sock("ep", 4096)
  path = f"/dev/shm/msgq_{os.environ['OPENPILOT_PREFIX']}/ep"
  assert os.path.getsize(path) == 4096 + 384
  n, wp, wuid, _, valids, uids = header(path)
  assert (n, wp, valids, uids) == (0, 0, (0,) * 15, (0,) * 15) and wuid & 0xFFFFFFFF == threading.get_native_id()
  sub = msgq.sub_sock("ep", segment_size=4096)
  n, wp, _, rps, valids, uids = header(path)
  assert (n, rps[0], valids[:2]) == (1, 0, (1, 0)) and uids[0] & 0xFFFFFFFF == threading.get_native_id() and uids[1] == 0
  pub.send(b"hello")
  pub.send(b"x" * 16)
  assert header(path)[1] == 16 + 24   # "hello": 8 + 5 -> 16; 16 bytes: 8 + 16 = 24
  assert record(path, 0, 5) == (5, b"hello") and record(path, 16, 16) == (16, b"x" * 16)
  assert sub.receive() == b"hello"
  assert header(path)[3][0] == 16   # the read pointer moved past the record
  assert sub.receive() == b"x" * 16 and sub.receive(non_blocking=True) is None
  assert pub.all_readers_updated()

def test_wraparound_tags_the_end_counts_the_cycle_and_loses_nothing():
  q, r = Queue("ep", os.environ["OPENPILOT_PREFIX"], 512), Queue("ep", os.environ["OPENPILOT_PREFIX"], 512)
  q.init_publisher(); r.init_subscriber()
  got = []
  for i in range(100):   # 100 records of 40 bytes through a 512-byte ring: wraps every 12
    q.send(bytes([i]) * 32)
    got.append(r.recv())
    if i == 11: wrap_at = q.w[shmq.WRITE_POINTER]
  assert got == [bytes([i]) * 32 for i in range(100)] and r.recv() is None
  assert wrap_at == 12 * 40 and q.tags[wrap_at // 8] == -1   # 12 records, then no room for 40 + the 8 kept free: a -1 tag
  assert q.w[shmq.WRITE_POINTER] >> 32 == 100 // 12 and r.w[shmq.READ_POINTERS] == q.w[shmq.WRITE_POINTER]

def test_a_lapped_reader_skips_to_the_newest_message():
  """A reader the writer laps loses its whole backlog (its slot is invalidated, it restarts at the writer's position,
  as openpilot's), never reads a torn or stale record; one that kept up reads everything."""
  pub, lapped, reading = msgq.pub_sock("ep", 1024), msgq.sub_sock("ep", segment_size=1024), msgq.sub_sock("ep", segment_size=1024)
  got = []
  for i in range(200):   # 72-byte records: the 1 KiB ring wraps many times
    pub.send(i.to_bytes(4, "little") * 16)
    got.append(reading.receive(non_blocking=True))
  assert got == [i.to_bytes(4, "little") * 16 for i in range(200)]
  q = lapped._s.q
  assert q.w[shmq.READ_VALIDS + q.reader_id] == 0   # the writer told it
  assert lapped.receive(non_blocking=True) is None
  pub.send(b"after")
  assert lapped.receive(non_blocking=True) == b"after"

def test_the_16th_reader_evicts_all_and_each_re_registers_on_its_next_read():
  pub = msgq.pub_sock("ep")
  subs = [msgq.sub_sock("ep") for _ in range(NUM_READERS)]
  path = subs[0]._s.q.path
  assert header(path)[0] == NUM_READERS
  last = msgq.sub_sock("ep")   # no slot left: everyone out, then it takes slot 0
  n, _, _, _, valids, uids = header(path)
  assert n == 1 and valids[1:] == (0,) * 14 and uids[1:] == (0,) * 14
  pub.send(b"before")   # the evicted readers register again only when they next read: this one is lost to them
  assert last.receive() == b"before"
  assert all(s.receive(non_blocking=True) is None for s in subs)   # each re-registered, at the newest message...
  n, _, _, _, _, uids = header(path)   # ...and the 15th of them found no slot again: sixteen readers cannot share a queue
  assert n == 1 and uids[0] == subs[-1]._s.q.read_uid
  pub.send(b"after")
  assert subs[-1].receive(non_blocking=True) == b"after" and last.receive(non_blocking=True) is None

def test_conflate_returns_the_newest_and_a_send_is_visible_when_it_returns():
  pub = msgq.pub_sock("ep")
  sub, newest = msgq.sub_sock("ep"), msgq.sub_sock("ep", conflate=True)
  for i in range(50): pub.send(b"%d" % i)
  assert newest.receive(non_blocking=True) == b"49" and newest.receive(non_blocking=True) is None
  assert msgq.drain_sock_raw(sub) == [b"%d" % i for i in range(50)]

def test_the_newest_publisher_wins_and_the_older_lets_go():
  old = msgq.pub_sock("ep")
  sub = msgq.sub_sock("ep")
  new = msgq.pub_sock("ep")   # takes the endpoint at once, whoever still holds the old one
  with pytest.raises(msgq.MultiplePublishersError, match="newer publisher"): old.send(b"old")
  with pytest.raises(msgq.MultiplePublishersError): old.send(b"old")   # and ever after: it let go of its mapping
  assert old._s.q is None
  new.send(b"new")   # the subscriber was evicted by the new publisher and re-registers at its next read
  assert sub.receive(non_blocking=True) is None
  new.send(b"new 2")
  assert sub.receive(non_blocking=True) == b"new 2"

def test_empty_and_oversize_messages_are_refused_before_anything_is_written():
  pub, sub = msgq.pub_sock("ep", 4800), msgq.sub_sock("ep", segment_size=4800)
  largest = msgq.max_message(4800)
  assert largest == 1592 and 3 * ((largest + 8 + 7) // 8 * 8) <= 4800 < 3 * ((largest + 1 + 8 + 7) // 8 * 8)   # openpilot's assert
  with pytest.raises(ValueError, match="empty message"): pub.send(b"")
  with pytest.raises(ValueError, match=f"1593 bytes.*{largest}"): pub.send(b"x" * (largest + 1))
  assert header(sub._s.q.path)[1] == 0
  pub.send(b"y" * largest)
  assert sub.receive() == b"y" * largest

def test_a_queue_file_of_another_size_is_refused_naming_it(tmp_path):
  msgq.pub_sock("ep", 4096)
  with pytest.raises(msgq.IpcError, match=r"msgq_t\w+/ep has 4480 bytes, expected 8576"): msgq.sub_sock("ep", segment_size=8192)

def test_a_corrupt_length_tag_is_reported_skipped_and_reading_goes_on(caplog):
  pub, sub = msgq.pub_sock("ep"), msgq.sub_sock("ep")
  pub.send(b"good")
  with open(path := pub._s.q.path, "r+b") as f: f.seek(HEADER); f.write(struct.pack("<q", 1 << 40))   # its length tag
  with caplog.at_level(logging.WARNING, "msgq"): assert sub.receive(non_blocking=True) is None
  assert f"{path}: corrupt record at offset 0 (length tag {1 << 40}" in caplog.text and sub._s.errors == 1
  pub.send(b"next")
  assert sub.receive(non_blocking=True) == b"next"
  with open(path, "r+b") as f: f.seek(HEADER + 24); f.write(struct.pack("<q", -1))   # a wrap tag where "next" ended: fine
  pub.send(b"x")   # a reader that finds the wrap tag at offset 0 (only corruption puts one there) must not loop
  q = sub._s.q
  q.w[shmq.READ_POINTERS + q.reader_id] = 0
  q.tags[0] = -1
  assert sub.receive(non_blocking=True) is None and sub._s.errors == 2

def _waiter(conn, prefix: str, mode: str) -> None:
  os.environ["OPENPILOT_PREFIX"], os.environ["MSGQ_TRANSPORT"] = prefix, "shm"
  import msgq
  sub = msgq.sub_sock("ep", timeout=-1 if mode == "block" else None)
  poller = msgq.Poller()
  poller.registerSocket(sub)
  conn.send("up")
  if mode == "idle":   # blocked in poll for the whole time: what does it cost?
    t0 = time.process_time()
    poller.poll(1500)
    conn.send(time.process_time() - t0)
    return
  while (got := [s.receive() for s in poller.poll(10_000)] if mode == "poll" else [sub.receive()])[0] != b"end":
    conn.send(time.monotonic_ns() - int.from_bytes(got[0], "little"))

@pytest.mark.parametrize("mode", ["poll", "block"])
def test_a_waiting_reader_sleeps_until_the_writers_signal(mode):
  """Poller.poll and a blocking receive sleep in sigtimedwait: woken by the writer's SIGUSR2 within milliseconds."""
  pub = msgq.pub_sock("ep")
  a, b = CTX.Pipe()
  p = CTX.Process(target=_waiter, args=(b, os.environ["OPENPILOT_PREFIX"], mode), daemon=True)
  p.start()
  try:
    assert a.poll(30) and a.recv() == "up"
    pub.wait_for_readers(5)
    lat = []
    for _ in range(40):
      time.sleep(0.02)
      pub.send(time.monotonic_ns().to_bytes(8, "little"))
      assert a.poll(5), "the reader was not woken"
      lat.append(a.recv() / 1e6)
    pub.send(b"end")
  finally: p.kill(); p.join()
  assert sorted(lat)[len(lat) // 2] < 5, f"wake-up latency p50 {sorted(lat)[len(lat) // 2]:.2f} ms"   # a 100 ms slice would show

def test_an_idle_reader_uses_no_cpu():
  a, b = CTX.Pipe()
  p = CTX.Process(target=_waiter, args=(b, os.environ["OPENPILOT_PREFIX"], "idle"), daemon=True)
  p.start()
  try:
    assert a.poll(30) and a.recv() == "up"
    assert a.poll(10)
    cpu = a.recv()
  finally: p.kill(); p.join()
  assert cpu < 0.05, f"a reader idle in poll for 1.5 s used {cpu:.3f} s of CPU"

def test_a_poll_in_another_thread_than_the_subscribers_is_woken_too():
  """openpilot signals the thread that registered the reader; ours hands the wake-ups to the thread that waits."""
  pub, sub = msgq.pub_sock("ep"), msgq.sub_sock("ep")   # registered by this thread
  out = []
  t = threading.Thread(target=lambda: out.append((time.monotonic(), sub.receive())))
  sub.setTimeout(5000)
  t.start()
  time.sleep(0.2)   # the thread is asleep in receive
  sent = time.monotonic()
  pub.send(b"wake")
  t.join(6)
  assert out[0][1] == b"wake" and out[0][0] - sent < 0.05   # not at the 100 ms slice, not at the 5 s timeout
  assert sub._s.q.read_uid & 0xFFFFFFFF == t.native_id

def test_waiting_leaves_the_signal_mask_as_it_was_and_a_stray_sigusr2_is_harmless():
  pub, sub = msgq.pub_sock("ep"), msgq.sub_sock("ep", timeout=50)
  assert sub.receive() is None
  assert signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, set())   # children started now inherit nothing
  os.kill(os.getpid(), signal.SIGUSR2)   # the default action would end the process
  pub.send(b"still here")
  assert sub.receive() == b"still here"

def test_wait_for_readers_raises_timeout_as_openpilots():
  pub = msgq.pub_sock("ep")
  with pytest.raises(TimeoutError, match="ep"): pub.wait_for_readers(0.05)
  sub = msgq.sub_sock("ep")
  pub.wait_for_readers(1)
  pub.send(b"a")
  assert not pub.all_readers_updated()   # sent, not read yet
  assert sub.receive() == b"a" and pub.all_readers_updated()

def test_wait_for_readers_never_returns_before_a_registering_reader_is_at_the_write_pointer():
  """A reader registering in another thread while the publisher waits for it and then sends at once (openpilot's
  test_poll_once): the message is always the reader's. A slot counted before its reader stood at the write pointer
  made it miss the message and sleep to its timeout (1 run in 15)."""
  for i in range(100):
    pub = msgq.pub_sock("ep")   # a new one each time (the older lets go): no reader yet, as in openpilot's test
    got = []
    t = threading.Thread(target=lambda got=got: got.append(msgq.sub_sock("ep", timeout=2000).receive()))
    t.start()
    pub.wait_for_readers(5)
    pub.send(b"%d" % i)
    t.join(5)
    assert got == [b"%d" % i], f"try {i}: the registering reader missed the message"
