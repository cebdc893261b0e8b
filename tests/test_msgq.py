"""msgq pub/sub: every guarantee of msgq/pubsub.py, on both transports where both keep it, and the zmq transport's own
(msgq/zmq.py), with real sockets, real shared memory and real processes (spawned, not forked). The shm transport's
queue at the byte level: tests/test_shmq.py."""
import fcntl, hashlib, math, multiprocessing, os, shutil, signal, socket, stat, threading, time
from pathlib import Path
from contextlib import contextmanager
import pytest
import zmq

import msgq
from msgq.pubsub import fnv1a64, is_local
from msgq.zmq import LIVE_ADDR, LIVE_TOPIC, MSG_OVERHEAD, QUEUE_BYTES, QUEUE_CAP, QUEUE_MESSAGES, PUMP_S, queue_len

CTX = multiprocessing.get_context("spawn")
MiB = 1024 * 1024
SMALL = 250 * 1024   # the segment of most services (openpilot's QueueSize.SMALL): messages up to 85,320 bytes
BIG = 10 * MiB       # modelV2's (QueueSize.BIG): messages up to 3,495,240 bytes

@pytest.fixture(params=["zmq", "shm"])
def transport(request, monkeypatch):
  """A test of what both transports keep, run on each (child processes inherit MSGQ_TRANSPORT)."""
  monkeypatch.setenv("MSGQ_TRANSPORT", request.param)
  return request.param

# ---- child processes ----

def _publisher(endpoint: str, conn, segment_size: int = 0) -> None:
  """A publisher driven through a pipe: ("send", [msgs]) sends them at once; ("burst", [sizes]) sends numbered(i, size)
  for each, as fast as it can; ("spam", msg) sends msg every 2 ms until the next command; ("readers", s) waits for a
  reader (True, or False after s seconds). Replies to every command."""
  try: pub = msgq.pub_sock(endpoint, segment_size)
  except msgq.IpcError as e:
    conn.send(("error", type(e).__name__)); return
  conn.send(("up", os.getpid()))
  while (cmd := conn.recv()) is not None:
    op, arg = cmd
    if op == "send":
      try:
        for m in arg: pub.send(m)
      except msgq.IpcError as e: conn.send(("error", type(e).__name__))
      else: conn.send("sent")
    elif op == "burst":
      msgs = [numbered(i, size) for i, size in enumerate(arg)]   # made first: the sends go as fast as they can
      for m in msgs: pub.send(m)
      conn.send("sent")
    elif op == "spam":
      conn.send("spamming")
      while not conn.poll(0.002): pub.send(arg)
    elif op == "readers":
      try: pub.wait_for_readers(arg)
      except TimeoutError: conn.send(False)
      else: conn.send(True)
  pub.close()

def numbered(i: int, size: int) -> bytes:
  """size bytes: i (4 bytes, little-endian) over and over."""
  return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]

def _subscriber(endpoint: str, mode: str, conn, segment_size: int = 0) -> None:
  """A subscriber that reads everything ("count": on request replies (count, newest)), never reads ("idle"),
  or reports the sizes it received ("sizes")."""
  sock = msgq.sub_sock(endpoint, timeout=20, segment_size=segment_size)
  conn.send("up")
  if mode == "idle":
    time.sleep(600)
  n, last, sizes = 0, None, []
  while True:
    if (m := sock.receive()) is not None: n, last = n + 1, m; sizes.append(len(m))
    if conn.poll():
      if conn.recv() is None: return
      conn.send((n, last) if mode == "count" else sizes)

@contextmanager
def child(target, *args, **kwargs):
  parent_end, child_end = CTX.Pipe()
  p = CTX.Process(target=target, args=(*args, child_end), kwargs=kwargs, daemon=True)
  p.start()
  try:
    assert parent_end.poll(30), "child did not start"
    yield p, parent_end, parent_end.recv()
  finally:
    if p.is_alive(): os.kill(p.pid, signal.SIGKILL)
    p.join(5)

def ask(conn, cmd, timeout: float = 10):
  conn.send(cmd)
  assert conn.poll(timeout), f"no reply to {cmd[0] if cmd else cmd}"
  return conn.recv()

def receive_until(sock, want: bytes, timeout: float = 5.0, send=None) -> list[bytes]:
  """Everything received until `want` arrives (inclusive); fails after timeout. send(), if given, runs each turn (a
  publisher that keeps sending until its subscriber has found it)."""
  out, deadline = [], time.monotonic() + timeout
  while time.monotonic() < deadline:
    if send is not None: send()
    if (m := sock.receive(non_blocking=True)) is not None:
      out.append(m)
      if m == want: return out
    else: time.sleep(0.001)
  raise AssertionError(f"{want!r} not received in {timeout} s (got {len(out)} others)")

# ---- naming, ports, runtime directory ----

def test_fnv1a64_known_vectors_and_tcp_port(monkeypatch):
  assert fnv1a64("") == 0xcbf29ce484222325
  assert fnv1a64("a") == 0xaf63dc4c8601ec8c
  assert fnv1a64("foobar") == 0x85944171f73967e8
  monkeypatch.delenv("OPENPILOT_PREFIX")
  assert msgq.tcp_port("modelV2") == 8023 + fnv1a64("modelV2") % (65535 - 8023)   # openpilot's port
  assert all(8023 <= msgq.tcp_port(e) < 65535 for e in ("a", "carState", "x" * 60))
  monkeypatch.setenv("OPENPILOT_PREFIX", "other")
  assert msgq.tcp_port("modelV2") != 8023 + fnv1a64("modelV2") % (65535 - 8023)

def test_only_127_0_0_1_is_local():
  assert is_local("127.0.0.1") and is_local("") and is_local(None)
  assert not any(is_local(a) for a in ("localhost", "127.0.0.2", "192.168.1.5", "::1"))

def test_runtime_dir_is_private_and_per_prefix(tmp_path, monkeypatch):
  root = tmp_path / "rt"
  root.mkdir(mode=0o755)
  monkeypatch.setenv("MSGQ_RUNTIME_DIR", str(root))
  monkeypatch.setenv("OPENPILOT_PREFIX", "a")
  a = msgq.runtime_dir()
  monkeypatch.setenv("OPENPILOT_PREFIX", "b")
  b = msgq.runtime_dir()
  assert a != b and os.path.dirname(a) == os.path.dirname(b) == str(root)
  for d in (root, a, b): assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d   # a pre-existing 0755 root is tightened
  for bad in ("x/y", "..", "."):
    monkeypatch.setenv("OPENPILOT_PREFIX", bad)
    with pytest.raises(msgq.IpcError, match="OPENPILOT_PREFIX"): msgq.runtime_dir()

def _publish_as(uid: int, root: str, conn) -> None:
  """A publisher of "ep" under another user (a service's), in its own runtime directory, until told to stop."""
  os.setgid(uid); os.setuid(uid)
  os.environ["MSGQ_RUNTIME_DIR"], os.environ["OPENPILOT_PREFIX"] = root, "svc"
  pub = msgq.pub_sock("ep")
  conn.send("up")
  while not conn.poll(0.01): pub.send(b"from the service")
  pub.close()

@pytest.mark.skipif(os.getuid() != 0, reason="root reading another user's stack")
def test_root_reads_a_service_users_stack_as_it_is(monkeypatch):
  """The services run as their own user in a runtime directory of theirs (systemd's /run/modeld, 0750): root's tools
  read it without creating or narrowing anything in it (the user would be locked out of its own stack), and a prefix
  that runs nothing there is an error, not a folder made."""
  import tempfile
  top = Path(tempfile.mkdtemp(prefix="msgq-svc-", dir="/tmp"))   # pytest's own folders are root's alone
  top.chmod(0o755)
  (root := top / "rt").mkdir(mode=0o750)
  os.chown(root, 65534, 65534)
  monkeypatch.setenv("MSGQ_RUNTIME_DIR", str(root))
  with child(_publish_as, 65534, str(root)) as (_, _, up):
    assert up == "up"
    modes = [stat.S_IMODE(os.stat(d).st_mode) for d in (root, root / "svc")]   # as the service made them
    monkeypatch.setenv("OPENPILOT_PREFIX", "svc")
    sub = msgq.sub_sock("ep", timeout=2000)
    assert sub.confirmed and sub.receive() == b"from the service"   # the service's answer counts: its uid owns the socket
    sub.close()
  assert [stat.S_IMODE(os.stat(d).st_mode) for d in (root, root / "svc")] == modes and os.stat(root / "svc").st_uid == 65534
  monkeypatch.setenv("OPENPILOT_PREFIX", "none")
  with pytest.raises(msgq.IpcError, match=f"no stack runs in {root / 'none'}"): msgq.runtime_dir()
  assert sorted(p.name for p in root.iterdir()) == ["svc"]
  shutil.rmtree(top)

def test_bad_endpoint_names(transport):
  for bad in ("", "a/b", "..", 7):
    with pytest.raises(msgq.IpcError, match="endpoint must be a plain name"): msgq.pub_sock(bad)
  if transport == "zmq":
    with pytest.raises(msgq.IpcError, match="too long"): msgq.pub_sock("x" * 200)

def test_an_unknown_transport_is_refused_naming_the_choices(monkeypatch):
  monkeypatch.setenv("MSGQ_TRANSPORT", "udp")
  with pytest.raises(msgq.IpcError, match="MSGQ_TRANSPORT must be one of zmq, shm, got 'udp'"): msgq.pub_sock("ep")

def test_prefixes_isolate_stacks(monkeypatch, transport):
  monkeypatch.setenv("OPENPILOT_PREFIX", "stack1-" + os.environ["OPENPILOT_PREFIX"])
  pub1, sub1 = msgq.pub_sock("ep"), msgq.sub_sock("ep", timeout=200)
  monkeypatch.setenv("OPENPILOT_PREFIX", "stack2-" + os.environ["OPENPILOT_PREFIX"])
  pub2, sub2 = msgq.pub_sock("ep"), msgq.sub_sock("ep", timeout=200)   # same endpoint: no MultiplePublishersError
  pub1.send(b"one"); pub2.send(b"two")
  assert sub1.receive() == b"one" and sub2.receive() == b"two"
  assert sub1.receive() is None and sub2.receive() is None   # no cross-talk
  for s in (pub1, pub2, sub1, sub2): s.close()

# ---- the newest publisher wins ----

def test_the_newest_publisher_wins_in_one_process(transport):
  """openpilot's rule: a new publisher always takes the endpoint; the older one's next send raises and it lets go of
  the endpoint. A publisher still referenced somewhere (a traceback, a test's frame) blocks nobody."""
  old, sub = msgq.pub_sock("ep"), msgq.sub_sock("ep", timeout=100)
  new = msgq.pub_sock("ep")
  with pytest.raises(msgq.MultiplePublishersError, match="ep: a newer publisher took the endpoint"): old.send(b"old")
  with pytest.raises(msgq.MultiplePublishersError): old.send(b"old")   # every later send says so too
  receive_until(sub, b"new", send=lambda: new.send(b"new"))   # the subscriber follows the endpoint to the new one
  new.close(); old.close(); sub.close()

def test_the_newest_publisher_wins_across_processes(transport):
  with child(_publisher, "ep") as (p, conn, hello):
    assert hello[0] == "up"
    pub, sub = msgq.pub_sock("ep"), msgq.sub_sock("ep", timeout=100)   # taken from a live publisher of another process
    assert ask(conn, ("send", [b"old"])) == ("error", "MultiplePublishersError")
    receive_until(sub, b"mine", send=lambda: pub.send(b"mine"))
    with child(_publisher, "ep") as (_, conn2, hello2):   # and taken from us in turn
      assert hello2[0] == "up"
      with pytest.raises(msgq.MultiplePublishersError): pub.send(b"x")
      assert ask(conn2, ("spam", b"theirs")) == "spamming"
      receive_until(sub, b"theirs")
  pub.close(); sub.close()

def test_an_idle_older_zmq_publisher_lets_go_so_its_subscribers_reach_the_new_one():
  """On zmq a subscriber stays connected to the publisher it found: the older one, idle, notices the newer within
  PUMP_S and closes its socket, so its subscribers reconnect to the newer one without it ever sending again."""
  old = msgq.pub_sock("ep")
  sub = msgq.sub_sock("ep", timeout=100)
  new = msgq.pub_sock("ep")
  time.sleep(PUMP_S + 0.05)
  assert old._s._st.superseded   # never sent anything: it found out by itself
  receive_until(sub, b"new", send=lambda: new.send(b"new"), timeout=2 * PUMP_S + 1)
  new.close(); sub.close()

# ---- no slow-joiner loss ----

def test_subscription_is_live_when_sub_sock_returns():
  with child(_publisher, "ep") as (_, conn, _):
    standing = msgq.sub_sock("ep", timeout=1000)   # there all along: the message after a new subscription is for it too
    for i in range(20):   # each time a fresh subscriber; the publisher sends one message the moment it returns
      sub = msgq.sub_sock("ep", timeout=1000)
      assert sub.confirmed, f"the publisher did not confirm subscription {i} within sub_sock's wait"
      # one size: a larger message re-sizes the publisher's queues on live pipes, which libzmq 4.3.5 can crash on
      # while a subscriber leaves (as these do); that is not what this test is about
      msg = f"m{i:02d}".encode()
      assert ask(conn, ("send", [msg])) == "sent"
      assert sub.receive() == msg, f"message sent right after sub_sock() returned was lost (try {i})"
      assert standing.receive() == msg, f"the subscriber already there missed message {i}"
      sub.close()
    assert standing.receive(non_blocking=True) is None
    standing.close()

def _confirm_as(uid: int, token: bytes) -> None:
  os.setuid(uid)
  with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s: s.sendto(b"\x01", LIVE_ADDR + token)

def test_only_our_own_uid_can_confirm_a_subscription():
  """The confirmation's socket is in the abstract namespace, which every user can reach: a datagram from another
  uid must not end the wait (the subscription would look live when nothing says it is)."""
  if os.getuid() != 0: pytest.skip("needs root, to send from another uid")
  path = os.path.join(msgq.runtime_dir(), "ep")
  lock = os.open(path + ".pub", os.O_RDWR | os.O_CREAT, 0o600)
  fcntl.flock(lock, fcntl.LOCK_SH)   # a publisher is up, as far as the subscriber can tell: it waits
  xpub = zmq.Context.instance().socket(zmq.XPUB)   # that publisher: it reads the token and never confirms
  xpub.setsockopt(zmq.LINGER, 0)
  xpub.setsockopt(zmq.RCVTIMEO, 5000)
  xpub.bind("ipc://" + path)
  made, wait_s = [], 3.0
  waiting = threading.Thread(target=lambda: made.append(msgq.zmq.SubSocket("ep", "127.0.0.1", False, 0, wait=wait_s)))
  waiting.start()
  while not (topic := xpub.recv()[1:]).startswith(LIVE_TOPIC): pass
  other = CTX.Process(target=_confirm_as, args=(65534, topic[len(LIVE_TOPIC):]))
  other.start(); other.join(10)
  assert other.exitcode == 0, f"the other uid's sender exited with {other.exitcode}"
  sent_while_waiting = waiting.is_alive()
  waiting.join(wait_s + 5)
  assert (sub := made[0]).confirmed is False, "a datagram from another uid confirmed the subscription"
  assert sent_while_waiting, f"the subscriber stopped waiting ({wait_s} s) before the datagram was sent: nothing was tested"
  sub.close(); xpub.close(); os.close(lock)

def test_subscriber_connects_to_a_later_publisher(transport):
  """It finds the publisher by itself once it reads (shm: re-registers in the new publisher's queue; zmq: connects)."""
  sub = msgq.sub_sock("ep", timeout=3000)   # no publisher yet: returns at once
  with child(_publisher, "ep") as (_, conn, _):
    assert ask(conn, ("spam", b"hello")) == "spamming"
    receive_until(sub, b"hello")
  sub.close()

def test_zmq_readers_follow_subscribers():
  pub = msgq.pub_sock("ep")
  assert not pub.all_readers_updated()
  with pytest.raises(TimeoutError): pub.wait_for_readers(0.05)
  a, b = msgq.sub_sock("ep"), msgq.sub_sock("ep")
  pub.wait_for_readers(1)
  assert pub._s.readers == 2
  a.close(); b.close()
  deadline = time.monotonic() + 5
  while pub.all_readers_updated(): assert time.monotonic() < deadline; time.sleep(0.01)
  assert pub._s.readers == 0
  pub.close()

def test_reader_pids_name_each_subscribing_process(transport):
  """A publisher can tell which local processes read it (a lockstep camera waits for its clients' processes): not the
  publisher's own before it subscribes, then a child's and ours, each by its pid."""
  pub = msgq.pub_sock("ep")
  assert pub.reader_pids() == set()
  ctx = multiprocessing.get_context("spawn")
  parent, conn = ctx.Pipe()
  p = ctx.Process(target=_subscribed, args=("ep", conn))
  p.start()
  try:
    assert parent.recv() == "subscribed"
    deadline = time.monotonic() + 5
    while pub.reader_pids() != {p.pid}: assert time.monotonic() < deadline, (pub.reader_pids(), p.pid); time.sleep(0.01)
    sub = msgq.sub_sock("ep")
    while pub.reader_pids() != {p.pid, os.getpid()}: assert time.monotonic() < deadline, pub.reader_pids(); time.sleep(0.01)
    sub.close()
  finally:
    p.kill(); p.join()
  pub.close()

def _subscribed(endpoint: str, conn) -> None:
  sub = msgq.sub_sock(endpoint)
  conn.send("subscribed")
  time.sleep(60)
  sub.close()

def test_what_was_sent_is_there_for_the_receive_that_follows(transport):
  """openpilot's msgq: a message is in the queue when send returns. The zmq transport delivers on I/O threads, so a
  confirmed local subscriber waits for what its publisher has counted as sent (docs/MSGQ.md)."""
  with child(_publisher, "ep") as (_, conn, _):
    sub, newest = msgq.sub_sock("ep"), msgq.sub_sock("ep", conflate=True)
    for i in range(20):
      sent = [b"%d.%d" % (i, k) for k in range(5)]
      assert ask(conn, ("send", sent)) == "sent"
      assert msgq.drain_sock_raw(sub) == sent, f"round {i}"   # non-blocking receives, right after the sends
      assert newest.receive(non_blocking=True) == sent[-1] and newest.receive(non_blocking=True) is None
  sub.close(); newest.close()

# ---- queueing ----

def test_conflate_keeps_only_the_newest(transport):
  with child(_publisher, "ep", segment_size=SMALL) as (_, conn, _):
    sub = msgq.sub_sock("ep", conflate=True, timeout=1000, segment_size=SMALL)
    full = msgq.sub_sock("ep", timeout=1000, segment_size=SMALL)
    sent = [str(i).encode() for i in range(100)]
    assert ask(conn, ("send", sent)) == "sent"
    assert receive_until(full, b"99") == sent   # what a subscriber without conflate gets
    # the burst reaches the conflated socket in one or a few batches, each receive() taking the newest of what came
    got = receive_until(sub, b"99")
    assert len(got) < len(sent) and all(int(a) < int(b) for a, b in zip(got, got[1:])), \
      f"expected a few ever newer messages ending with b'99', got {len(got)}: {got}"
    assert sub.receive(non_blocking=True) is None
  sub.close(); full.close()

def test_drain_sock_raw_returns_everything_in_order(transport):
  with child(_publisher, "ep", segment_size=SMALL) as (_, conn, _):
    sub = msgq.sub_sock("ep", timeout=1000, segment_size=SMALL)
    sent = [i.to_bytes(4, "little") * (i + 1) for i in range(200)]
    assert ask(conn, ("send", sent)) == "sent"
    got, deadline = [], time.monotonic() + 5
    while len(got) < len(sent) and time.monotonic() < deadline: got += msgq.drain_sock_raw(sub, wait_for_one=True)
    assert got == sent
    assert msgq.drain_sock_raw(sub) == []
  sub.close()

def test_a_socket_not_kept_stays_open_for_its_call(transport):
  """`sub_sock(...).receive()`: nothing but the call holds the socket, which must last as long as the call does."""
  pub = msgq.pub_sock("ep")
  threading.Timer(0.3, lambda: pub.send(b"x")).start()
  assert msgq.sub_sock("ep", timeout=3000).receive() == b"x"
  pub.close()

def test_receive_timeout_and_non_blocking(transport):
  pub, sub = msgq.pub_sock("ep"), msgq.sub_sock("ep")
  t = time.monotonic()
  assert sub.receive(non_blocking=True) is None
  assert time.monotonic() - t < 0.1
  sub.setTimeout(150)
  t = time.monotonic()
  assert sub.receive() is None
  assert 0.14 <= time.monotonic() - t < 1.0
  pub.send(b"x")
  assert sub.receive() == b"x"
  pub.close(); sub.close()

def test_poller_wakes_on_first_message_and_returns_only_ready_sockets(transport):
  poller = msgq.Poller()
  with child(_publisher, "a") as (_, ca, _), child(_publisher, "b") as (_, cb, _):
    sa, sb = msgq.sub_sock("a", poller=poller), msgq.sub_sock("b", poller=poller)
    sc = msgq.sub_sock("c", poller=poller)   # no publisher at all
    t = time.monotonic()
    assert poller.poll(100) == []
    assert 0.09 <= time.monotonic() - t < 1.0
    cb.send(("send", [b"B"]))
    t = time.monotonic()
    assert poller.poll(10000) == [sb]   # wakes on the message, long before the timeout
    assert time.monotonic() - t < 5.0
    assert sb.receive(non_blocking=True) == b"B" and sb.receive(non_blocking=True) is None
    assert cb.recv() == "sent"
    assert ask(ca, ("send", [b"A"])) == "sent" and ask(cb, ("send", [b"B2"])) == "sent"
    deadline, ready = time.monotonic() + 5, set()
    while len(ready) < 2 and time.monotonic() < deadline: ready |= set(poller.poll(1000))
    assert ready == {sa, sb}
    assert sa.receive() == b"A" and sb.receive() == b"B2"
    assert poller.poll(0) == []
  for s in (sa, sb, sc): s.close()

# ---- slow and dead subscribers ----

def _rss() -> int:
  with open("/proc/self/status") as f:
    return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

def test_slow_or_dead_subscriber_never_blocks_the_publisher_and_memory_stays_bounded(transport):
  """zmq keeps a queue per subscriber in the publisher, bounded in messages (fewer are sent here), holding one copy of
  each message however many queues hold it; shm has one ring for all, its file."""
  segment, size, n = 4 * MiB, MiB, 300
  pub = msgq.pub_sock("ep", segment)
  with child(_subscriber, "ep", "idle", segment_size=segment) as (_, _, _), child(_subscriber, "ep", "idle", segment_size=segment) as (stopped, _, _), \
       child(_subscriber, "ep", "count", segment_size=segment) as (_, healthy, _):
    os.kill(stopped.pid, signal.SIGSTOP)
    pub.wait_for_readers(5)
    template = bytearray(os.urandom(size))
    pub.send(bytes(template))   # first allocation outside the measurement
    before, t = _rss(), time.monotonic()
    for i in range(n):
      template[:4] = i.to_bytes(4, "little")
      pub.send(template)   # a mutable buffer: copied, so every queued message is its own MiB
    elapsed, growth = time.monotonic() - t, _rss() - before
    # the stopped reader's queue may hold all n (its mark is larger), the others' queues the same messages
    assert n < queue_len(msgq.max_message(segment))
    budget = n * (size + MSG_OVERHEAD) + 64 * MiB if transport == "zmq" else 16 * MiB
    assert growth <= budget, f"publisher RSS grew {growth / MiB:.0f} MiB sending {n} MiB to stalled readers (budget {budget / MiB:.0f})"
    assert elapsed < 20, f"publisher took {elapsed:.1f} s for {n} sends: stalled readers slowed it"
    # the publisher kept going: the healthy reader gets a message sent after all that
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
      pub.send(b"last")
      if ask(healthy, ("?", None))[1] == b"last": break
    else: raise AssertionError("healthy subscriber never got the last message")
    os.kill(stopped.pid, signal.SIGCONT)
  pub.close()

def test_a_burst_of_small_and_large_messages_from_another_process_all_arrives_in_order():
  """The reported loss, on an endpoint of the default 1 MiB segment: 10,000 messages of 1 KiB and 100 of its
  largest among them, sent by another process as fast as it can while the reader waits. Each queue's mark (12,283
  messages whatever their size) is more than the burst: nothing is lost, whichever queue holds the backlog."""
  largest = msgq.max_message(0)
  sizes = [largest if i % 101 == 100 else 1024 for i in range(10_100)]
  assert sizes.count(1024) == 10_000 and len(sizes) < queue_len(largest)
  with child(_publisher, "ep") as (_, conn, _):
    sub = msgq.sub_sock("ep", timeout=2000)
    assert ask(conn, ("burst", sizes), timeout=60) == "sent"
    got = []
    while len(got) < len(sizes) and (m := sub.receive()) is not None: got.append(m)
  sub.close()
  assert len(got) == len(sizes), f"{len(sizes) - len(got)} of {len(sizes)} messages lost"
  assert got == [numbered(i, size) for i, size in enumerate(sizes)], "messages out of order or altered"

def test_a_reader_that_reads_nothing_of_a_burst_gets_at_least_16384_messages():
  """What docs/MSGQ.md promises: a queue's mark is QUEUE_MESSAGES (16,384) messages, or as many of the endpoint's
  largest as QUEUE_CAP holds where fewer (12,283 on a 1 MiB endpoint, 1,228 on modelV2's 10 MiB), which holds at least
  QUEUE_BYTES of the largest even at half the mark (libzmq may count a queue full at half). A queue that nothing reads
  keeps the first mark's worth: twice the mark of 1 KiB messages is sent while the subscriber reads nothing."""
  size, largest = 1024, msgq.max_message(SMALL)
  for segment, mark in ((SMALL, QUEUE_MESSAGES), (0, 12283), (BIG, 1228)):
    m = msgq.max_message(segment)
    assert queue_len(m) == mark and mark * (m + MSG_OVERHEAD) <= QUEUE_CAP and mark // 2 * m >= QUEUE_BYTES
  m = msgq.max_message(4800)   # a segment under 24 KiB: its largest messages' 64 MiB take more
  assert queue_len(m) == 2 * math.ceil(QUEUE_BYTES / (m + MSG_OVERHEAD)) > QUEUE_MESSAGES
  pub, sub = msgq.pub_sock("ep", SMALL), msgq.sub_sock("ep", timeout=2000, segment_size=SMALL)
  msg = bytearray(size)
  for i in range(2 * queue_len(largest)):
    msg[:4] = i.to_bytes(4, "little")
    pub.send(msg)
  got = []
  while (m := sub.receive()) is not None: got.append(int.from_bytes(m[:4], "little"))
  assert len(got) >= QUEUE_MESSAGES, f"expected at least {QUEUE_MESSAGES} messages of {size} bytes kept, got {len(got)}"
  # the oldest first, in order: the subscriber's queue, then (after what neither held) the publisher's
  assert got[0] == 0 and all(a < b for a, b in zip(got, got[1:])), "the queues did not keep messages in order"
  pub.close(); sub.close()

def test_a_reader_stopped_for_10s_neither_blocks_the_publisher_nor_grows_its_memory():
  """A reader SIGSTOPped for 10 s while the publisher sends 16 KiB messages all along, next to a healthy reader. The
  publisher keeps sending far more than the stopped reader's queue holds (its mark of 12,283 messages, whatever their
  size), its memory grows by at most the two queues, and once resumed the reader gets at least half its mark."""
  size, stop_s = 16 * 1024, 10
  pub = msgq.pub_sock("ep")
  with child(_subscriber, "ep", "count") as (stopped, sconn, _), child(_subscriber, "ep", "count") as (_, healthy, _):
    pub.wait_for_readers(5)
    msg = bytearray(os.urandom(size))   # mutable: copied at each send, so every queued message is its own 16 KiB
    pub.send(msg)
    deadline = time.monotonic() + 5
    while ask(sconn, ("?", None))[0] == 0: assert time.monotonic() < deadline   # the stopped one has been reading
    before_n = ask(sconn, ("?", None))[0]
    os.kill(stopped.pid, signal.SIGSTOP)
    before, sent, t_end = _rss(), 0, time.monotonic() + stop_s
    while time.monotonic() < t_end:
      for _ in range(50):   # in bursts, with a pause: a full core, not both
        msg[:4] = sent.to_bytes(4, "little")
        pub.send(msg)
        sent += 1
      time.sleep(0.005)
    growth = _rss() - before
    os.kill(stopped.pid, signal.SIGCONT)
    largest = msgq.max_message(0)
    queue = queue_len(largest) // 2   # messages a queue holds at least (libzmq may count it full at half its mark)
    budget = 2 * queue_len(largest) * (size + MSG_OVERHEAD) + 32 * MiB   # the stopped reader's queue and the healthy one's, at most
    # more sent than the budget: queues without a bound would exceed it
    assert queue == 6141 and sent * size > budget, f"only {sent} sends in {stop_s} s: the publisher was held up"
    assert growth <= budget, f"publisher RSS grew {growth / MiB:.0f} MiB in {sent} sends (budget {budget / MiB:.0f} MiB)"
    deadline = time.monotonic() + 10
    while (got := ask(sconn, ("?", None))[0] - before_n) < queue: assert time.monotonic() < deadline, f"resumed reader got {got} of {queue}"
    while True:   # and the healthy reader is current
      pub.send(b"last")
      if ask(healthy, ("?", None))[1] == b"last": break
      assert time.monotonic() < deadline, "healthy subscriber never got the last message"
  pub.close()

# ---- sizes ----

def test_large_messages_go_through_intact(transport):
  big = os.urandom(12 * MiB)   # larger than any service's: a segment of 40 MiB takes it
  with child(_publisher, "ep", segment_size=40 * MiB) as (_, conn, _):
    sub = msgq.sub_sock("ep", timeout=5000, segment_size=40 * MiB)
    assert ask(conn, ("send", [big, b"small"])) == "sent"
    got = sub.receive()
    assert len(got) == len(big) and hashlib.sha256(got).digest() == hashlib.sha256(big).digest()
    assert sub.receive() == b"small"
  sub.close()

def test_publisher_refuses_empty_messages_and_those_over_a_third_of_its_segment(transport):
  """openpilot's readers abort on an empty message, its writer on one over a third of the segment: refused here."""
  pub = msgq.pub_sock("ep", 4800)
  pub.send(b"x" * 1592)
  with pytest.raises(ValueError, match="1593 bytes.*1592"): pub.send(b"x" * 1593)
  with pytest.raises(ValueError, match="empty message"): pub.send(b"")
  pub.close()

def test_zmq_subscriber_refuses_messages_over_its_segments_largest():
  """A zmq publisher with another services table (a larger segment) cannot make a subscriber take more."""
  m = msgq.max_message(SMALL)
  with child(_publisher, "ep") as (_, conn, _):   # the publisher takes up to 349,512 bytes
    sub = msgq.sub_sock("ep", timeout=1000, segment_size=SMALL)
    assert ask(conn, ("send", [b"a" * (m + 1), b"b" * m])) == "sent"
    assert sub.receive() == b"b" * m   # the larger one was refused, the next one is delivered
    assert sub._s.refused == 1
    assert ask(conn, ("send", [b"c" * (4 * m), b"ok"])) == "sent"
    assert sub.receive() == b"ok" and sub._s.refused == 2
  sub.close()

# ---- publisher restart ----

def test_subscriber_survives_publisher_restart_across_processes(transport):
  sub = msgq.sub_sock("ep", timeout=100)
  for gen in (b"first", b"second"):   # the second publisher starts after the first was SIGKILLed
    with child(_publisher, "ep") as (p, conn, _):
      assert ask(conn, ("spam", gen)) == "spamming"
      receive_until(sub, gen)
      os.kill(p.pid, signal.SIGKILL)
  sub.close()

def test_subscriber_survives_publisher_restart_in_same_process(transport):
  sub = msgq.sub_sock("ep", timeout=10)
  for gen in (b"first", b"second", b"third"):
    pub = msgq.pub_sock("ep")
    deadline = time.monotonic() + 5
    while sub.receive() != gen:
      assert time.monotonic() < deadline, f"no message from publisher {gen!r}"
      pub.send(gen)
    pub.close()
  sub.close()

# ---- openpilot's bytes on the wire ----

@pytest.mark.parametrize("kind,tcp", [("zmq", False), ("zmq", True), ("shm", True)], ids=["zmq-ipc", "zmq-tcp", "shm-tcp"])
def test_a_plain_zmq_subscriber_receives_only_the_events_sent(monkeypatch, kind, tcp):
  """What an openpilot process or a script with a plain ZMQ SUB sees, over ipc or (MSGQ_TCP=1) TCP: the Events the
  publisher sent, each parsable by cereal, and nothing else (no frame of msgq's own)."""
  from cereal import messaging
  monkeypatch.setenv("MSGQ_TRANSPORT", kind)
  if tcp: monkeypatch.setenv("MSGQ_TCP", "1")   # before the child starts: it inherits the environment
  events = []
  for i in range(5):
    (m := messaging.new_message("carState")).carState.vEgo = i
    events.append(m.to_bytes())
  raw = zmq.Context.instance().socket(zmq.SUB)
  raw.setsockopt(zmq.LINGER, 0)
  raw.setsockopt(zmq.RCVTIMEO, 5000)
  raw.setsockopt(zmq.SUBSCRIBE, b"")
  with child(_publisher, "carState") as (_, conn, _):
    raw.connect(f"tcp://127.0.0.1:{msgq.tcp_port('carState')}" if tcp else "ipc://" + os.path.join(msgq.runtime_dir(), "carState"))
    if kind == "zmq": assert ask(conn, ("readers", 5.0)) is True   # the plain SUB's subscription is applied
    else: time.sleep(0.5)   # a PUB applies it on its own thread
    assert ask(conn, ("send", events)) == "sent"
    got = [raw.recv() for _ in events]
  raw.close()
  assert got == events, f"expected the {len(events)} events sent, got frames starting {[m[:16] for m in got]}"
  assert [messaging.log_from_bytes(m).carState.vEgo for m in got] == list(range(5))

# ---- TCP ----

def test_tcp_only_when_enabled(monkeypatch, transport):
  monkeypatch.delenv("MSGQ_TCP", raising=False)
  pub = msgq.pub_sock("ep")
  with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", msgq.tcp_port("ep")), timeout=1): pass
  pub.close()

@pytest.mark.parametrize("listen,addr", [("1", "localhost"), ("127.0.0.2", "127.0.0.2")])
def test_remote_subscriber_over_tcp(monkeypatch, transport, listen, addr):
  monkeypatch.setenv("MSGQ_TCP", listen)
  with child(_publisher, "ep") as (_, conn, _):
    sub = msgq.sub_sock("ep", addr=addr, timeout=100)
    assert ask(conn, ("spam", b"over tcp")) == "spamming"
    receive_until(sub, b"over tcp")
    conn.send(None)
    sub.close()
