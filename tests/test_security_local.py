"""msgq among other local users, on both transports: folders, queue files, sockets, locks and owner files of another
account (nobody's, tests/accounts.py) or symlinks refused by name and never used, root's runtime directory squatted in
/tmp, a planted thread id that root's publisher must not signal, the modes under umask 0, and queue files of garbage
that a publisher recreates and readers read past."""
import grp, inspect, os, shutil, stat, struct, subprocess, sys, tempfile, time
from pathlib import Path
import pytest
from cereal import messaging
import msgq
from msgq import shmq
from msgq.shmq import HEADER, NUM_READERS_W, READ_UIDS, READ_VALIDS, READ_POINTERS, WRITE_POINTER, WRITE_UID
from service import RateLimit
from tests.accounts import as_nobody, nobody_uid, popen_as_nobody
from tests.artifacts import REPO
from tests.daemon_harness import Notify

GARBAGE = (0xFFFFFFF8, 2 ** 64 - 1, 5 << 32 | 12, 1 << 63)   # the write pointer, all ones, misaligned, a high bit

@pytest.fixture
def shm(monkeypatch):
  monkeypatch.setenv("MSGQ_TRANSPORT", "shm")

@pytest.fixture
def open_tmp(monkeypatch):
  """A folder of root's in /tmp (0755) that nobody can look into (pytest's own are root's alone). A runtime directory
  named in it is forgotten first: the stack's removal after the test would make it again."""
  d = tempfile.mkdtemp(prefix=f"{pfx()}-", dir="/tmp")
  os.chmod(d, 0o755)
  yield Path(d)
  for v in ("MSGQ_RUNTIME_DIR", "XDG_RUNTIME_DIR"): monkeypatch.delenv(v, raising=False)
  shutil.rmtree(d)

def pfx() -> str: return os.environ["OPENPILOT_PREFIX"]

def alive(p: subprocess.Popen) -> bool:
  time.sleep(0.2)   # a signal sent is delivered by then
  return p.poll() is None

def victim() -> subprocess.Popen:
  """A process of root's that SIGUSR2 ends (its default action): what a planted reader slot names."""
  p = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGUSR2, signal.SIG_DFL); print('up', flush=True); "
                        "time.sleep(60)"], stdout=subprocess.PIPE, text=True)   # not the ignored SIGUSR2 of a process using msgq
  assert p.stdout.readline() == "up\n"
  return p

def plant(path: str, tid: str, slot: int = 0) -> str:
  """Standard-library code (it runs as nobody too) that writes a valid reader slot into the queue file at `path`,
  naming the thread id the expression `tid` gives."""
  return f"""
import mmap, os, struct
fd = os.open({path!r}, os.O_RDWR)
m = mmap.mmap(fd, {HEADER})
wp, n = struct.unpack_from("<Q", m, {8 * WRITE_POINTER})[0], struct.unpack_from("<Q", m, {8 * NUM_READERS_W})[0]
struct.pack_into("<Q", m, {8 * NUM_READERS_W}, max({slot + 1}, n))
for word, value in (({READ_POINTERS + slot}, wp), ({READ_VALIDS + slot}, 1), ({READ_UIDS + slot}, 0xDEAD << 32 | ({tid}))):
  struct.pack_into("<Q", m, 8 * word, value)
m.close(); os.close(fd)
"""

# ---- squatted and symlinked paths ----

@pytest.mark.parametrize("kind", ["folder", "symlink"])
def test_a_squatted_queue_folder_is_refused_by_name(shm, kind):
  """nobody makes the prefix folder in /dev/shm first (0777), or a symlink there to a folder of its own: root's
  publisher and subscriber refuse it by name and put nothing in it."""
  folder, theirs = f"/dev/shm/msgq_{pfx()}", f"/dev/shm/{pfx()}_nobodys"
  nobody_uid()
  try:
    as_nobody(f"import os; os.mkdir({theirs!r}); os.chmod({theirs!r}, 0o777); "
              + (f"os.mkdir({folder!r}); os.chmod({folder!r}, 0o777)" if kind == "folder" else f"os.symlink({theirs!r}, {folder!r})"))
    said = f"queue folder {folder} belongs to uid 65534 \\(nobody\\)" if kind == "folder" else f"queue folder {folder} is a symlink"
    with pytest.raises(msgq.IpcError, match=said): msgq.pub_sock("carState")
    with pytest.raises(msgq.IpcError, match=said): msgq.sub_sock("carState")
    assert os.listdir(folder) == [] and os.listdir(theirs) == []
  finally:
    for p in (folder, theirs):
      if os.path.islink(p): os.unlink(p)
      else: shutil.rmtree(p, ignore_errors=True)

def test_a_squatted_queue_file_is_refused_and_its_planted_tid_never_signalled(shm, monkeypatch):
  """The issue's attack on the default stack (no prefix: the files are in /dev/shm itself): nobody pre-creates a queue
  file (0666) and keeps a reader slot in it naming a root process. Root's publisher refuses the file by name, sends
  nothing, and the process lives."""
  monkeypatch.setenv("OPENPILOT_PREFIX", "")
  endpoint = f"sq{os.getpid()}_{time.monotonic_ns()}"
  path = f"/dev/shm/msgq_{endpoint}"
  nobody_uid()
  v = victim()
  squatter = popen_as_nobody(f"""
import os, time
os.close(os.open({path!r}, os.O_RDWR | os.O_CREAT, 0o666)); os.chmod({path!r}, 0o666); os.truncate({path!r}, {shmq.DEFAULT_SEGMENT + HEADER})
print("ready", flush=True)
while True:
  {plant(path, str(v.pid)).strip().replace(chr(10), chr(10) + "  ")}
  time.sleep(0.005)
""")
  try:
    assert squatter.stdout.readline() == "ready\n", squatter.stderr.read()
    try:
      pub = msgq.pub_sock(endpoint)
      for _ in range(20): pub.send(b"x"); time.sleep(0.01)   # the old code's way: it used the file
      refused = None
    except msgq.IpcError as e: refused = str(e)
    assert alive(v), "root's publisher signalled the process nobody's slot names"
    assert refused is not None and f"queue file {path} belongs to uid 65534 (nobody)" in refused, refused
  finally:
    squatter.kill(); squatter.wait(); v.kill(); v.wait()
    os.unlink(path)

def test_a_symlinked_queue_file_is_refused_and_its_target_untouched(shm, monkeypatch):
  """nobody puts a symlink where a queue file of the default stack goes, to a file of root's: root refuses it by name
  and writes nothing through it."""
  monkeypatch.setenv("OPENPILOT_PREFIX", "")
  endpoint = f"sym{os.getpid()}_{time.monotonic_ns()}"
  path, target = f"/dev/shm/msgq_{endpoint}", f"/dev/shm/{endpoint}_roots"
  nobody_uid()
  open(target, "wb").close()   # empty: a queue file's opener would size it and write a header in it
  try:
    as_nobody(f"import os; os.symlink({target!r}, {path!r})")
    with pytest.raises(msgq.IpcError, match=f"queue file {path} is a symlink"): msgq.pub_sock(endpoint)
    with pytest.raises(msgq.IpcError, match=f"queue file {path} is a symlink"): msgq.sub_sock(endpoint)
    assert os.path.getsize(target) == 0
  finally:
    for p in (path, target): os.unlink(p)

@pytest.mark.parametrize("kind", ["lock", "owner file", "symlinked lock"])
def test_a_lock_or_owner_file_of_another_account_is_refused_by_name(kind, open_tmp, monkeypatch):
  """The zmq transport: a runtime folder that was open to others once (root's, 0777) holds nobody's lock or owner file
  of an endpoint, or a symlink as its lock: root's publisher refuses it by name and opens nothing through it."""
  nobody_uid()
  (rt := open_tmp / "rt").mkdir()
  (folder := rt / pfx()).mkdir()
  folder.chmod(0o777)
  monkeypatch.setenv("MSGQ_RUNTIME_DIR", str(rt))
  target = open_tmp / "roots"
  name = {"lock": "ep.lock", "owner file": "ep.pub", "symlinked lock": "ep.lock"}[kind]
  as_nobody(f"import os; os.symlink({str(target)!r}, {str(folder / name)!r})" if kind == "symlinked lock" else
            f"import os; os.close(os.open({str(folder / name)!r}, os.O_RDWR | os.O_CREAT, 0o666))")
  said = f"{kind.removeprefix('symlinked ')} {folder / name} " + ("is a symlink" if kind.startswith("symlinked") else "belongs to uid 65534 \\(nobody\\)")
  with pytest.raises(msgq.IpcError, match=said): msgq.pub_sock("ep")
  assert not target.exists() and not (folder / "ep").exists()

def test_a_runtime_directory_of_another_account_is_refused_by_name(monkeypatch):
  """MSGQ_RUNTIME_DIR names a folder in /tmp that nobody made first (0777, with the prefix's folder in it): root
  neither publishes nor subscribes there."""
  nobody_uid()
  rt = f"/tmp/{pfx()}-rt"
  as_nobody(f"import os; os.mkdir({rt!r}, 0o777); os.chmod({rt!r}, 0o777); os.mkdir({rt + '/' + pfx()!r}, 0o777)")
  try:
    with monkeypatch.context() as m:   # undone before the stack's removal, which would make rt again
      m.setenv("MSGQ_RUNTIME_DIR", rt)
      for make in (lambda: msgq.pub_sock("ep"), lambda: msgq.sub_sock("ep"), msgq.runtime_dir):
        with pytest.raises(msgq.IpcError, match=f"runtime directory {rt} belongs to uid 65534 \\(nobody\\)"): make()
    assert os.listdir(f"{rt}/{pfx()}") == []
  finally: shutil.rmtree(rt)

def _roots_default_stack() -> None:
  """In a mount namespace of its own with an empty /tmp: nobody makes /tmp/msgq-0 (root's runtime directory in /tmp
  when XDG_RUNTIME_DIR is unset, as under sudo) and its prefix folder; root's stack must use neither."""
  import os, msgq
  from tests.accounts import as_nobody
  sq = f"/tmp/msgq-0/{os.environ['OPENPILOT_PREFIX']}"
  as_nobody(f"import os; os.mkdir('/tmp/msgq-0', 0o777); os.chmod('/tmp/msgq-0', 0o777); os.mkdir({sq!r}, 0o777)")
  pub, sub = msgq.pub_sock("ep"), msgq.sub_sock("ep", timeout=2000)
  pub.send(b"ours")
  print(msgq.runtime_dir(), sub.receive(), os.listdir(sq), flush=True)
  pub.close(); sub.close()
  msgq.remove_stack()

def test_roots_runtime_directory_squatted_in_tmp_is_not_adopted(monkeypatch):
  """nobody makes /tmp/msgq-0 before root's stack starts without XDG_RUNTIME_DIR: root's sockets go elsewhere (its
  own folder, none of nobody's), and its stack works. In a private mount namespace: this machine's /tmp is left alone."""
  nobody_uid()
  if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode:
    pytest.skip("needs a private mount namespace (unshare -m) to give /tmp/msgq-0 to nobody without touching this machine's")
  for v in ("XDG_RUNTIME_DIR", "MSGQ_RUNTIME_DIR", "MSGQ_TRANSPORT"): monkeypatch.delenv(v, raising=False)
  code = inspect.getsource(_roots_default_stack) + "\n_roots_default_stack()"
  r = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs tmpfs /tmp && exec "$0" -c "$1"', sys.executable, code],
                     cwd=REPO, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  where, got, theirs = r.stdout.split(" ", 2)
  assert not where.startswith("/tmp/") and got == "b'ours'" and theirs.strip() == "[]", r.stdout

def test_root_adopts_only_a_named_runtime_directory_that_root_made(open_tmp, monkeypatch):
  """The rule that keeps root's tools reading a service account's stack: MSGQ_RUNTIME_DIR names a folder of that
  account in a folder only root can write (systemd's /run/modeld); one the account could have made itself (its parent
  writable by others, as /tmp) is refused, as is the same folder reached through XDG_RUNTIME_DIR."""
  uid = nobody_uid()
  for parent_mode, adopted in ((0o755, True), (0o777, False), (0o1777, False)):   # only root / anyone / anyone, sticky
    (top := open_tmp / f"p{parent_mode:o}").mkdir()
    top.chmod(parent_mode)
    (rt := top / "rt").mkdir()
    (rt / pfx()).mkdir()
    for d in (rt, rt / pfx()): os.chown(d, uid, uid)
    monkeypatch.setenv("MSGQ_RUNTIME_DIR", str(rt))
    if adopted: assert msgq.runtime_dir() == str(rt / pfx())
    else:
      said = f"{top} is every account's to write" if parent_mode == 0o777 else f"runtime directory {rt} belongs to uid 65534"
      with pytest.raises(msgq.IpcError, match=said): msgq.runtime_dir()
  monkeypatch.delenv("MSGQ_RUNTIME_DIR")
  monkeypatch.setenv("XDG_RUNTIME_DIR", str(open_tmp / "p755"))
  (open_tmp / "p755" / "rt").rename(open_tmp / "p755" / "msgq")
  with pytest.raises(msgq.IpcError, match="belongs to uid 65534"): msgq.runtime_dir()

def test_a_runtime_directory_in_another_accounts_folder_is_refused_by_name(open_tmp, monkeypatch):
  """XDG_RUNTIME_DIR names another account's folder (kept by sudo -E): root makes nothing in it, which that account
  could swap for a folder of its own, and says why."""
  uid = nobody_uid()
  (theirs := open_tmp / "run-user").mkdir()
  os.chown(theirs, uid, uid)
  monkeypatch.setenv("XDG_RUNTIME_DIR", str(theirs))
  with pytest.raises(msgq.IpcError, match=f"the runtime directory's folder {theirs} belongs to uid 65534"): msgq.pub_sock("ep")
  assert os.listdir(theirs) == []

# ---- signals ----

def openpilot_reader(path: str, slot: int) -> str:
  """Standard-library code: a reader registered as openpilot's (a SIGUSR2 handler, its thread id in reader slot `slot`);
  prints 'up', and at SIGTERM how many SIGUSR2 it got."""
  return f"""
import signal, sys, threading, time
got = []
signal.signal(signal.SIGUSR2, lambda *a: got.append(1))
signal.signal(signal.SIGTERM, lambda *a: (print(len(got), flush=True), sys.exit(0)))
{plant(path, "threading.get_native_id()", slot)}
print("up", flush=True)
while True: time.sleep(1)
"""

def signals_got(p: subprocess.Popen) -> int:
  p.terminate()
  out, err = p.communicate(timeout=10)
  assert p.returncode == 0, err
  return int(out)

@pytest.mark.parametrize("planter", ["nobody", "root"])
def test_a_planted_thread_id_gets_no_signal_and_openpilots_readers_still_do(shm, monkeypatch, tmp_path, planter):
  """Root's stack shares its queues with nobody's group (MSGQ_GROUP: a UI of another account writes its read pointers
  into them). A reader slot names a root process that SIGUSR2 would end, planted by nobody (as a group member) or by
  any writer of the file (a dead reader's slot, its tid reused): root's publisher leaves it alone. A reader of root's
  with openpilot's SIGUSR2 handler is still woken by every send; nobody's own such reader, of another account, never."""
  gid = nobody_uid()
  monkeypatch.setenv("MSGQ_GROUP", grp.getgrgid(gid).gr_name)
  monkeypatch.setenv("MSGQ_RUNTIME_DIR", str(tmp_path))   # the stack's removal makes no folder of root's shared
  pub = msgq.pub_sock("modelV2")
  path = pub._s.q.path
  v = victim()
  ours = subprocess.Popen([sys.executable, "-c", openpilot_reader(path, 1)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  theirs = None
  try:
    assert ours.stdout.readline() == "up\n", ours.stderr.read()
    if planter == "nobody": as_nobody(plant(path, str(v.pid)))
    else: exec(plant(path, str(v.pid)))
    for _ in range(5): pub.send(b"x" * 100)
    assert alive(v), "root's publisher signalled the planted thread id"
    theirs = popen_as_nobody(openpilot_reader(path, 2))
    assert theirs.stdout.readline() == "up\n", theirs.stderr.read()
    for _ in range(5): pub.send(b"x" * 100)
    assert signals_got(ours) >= 1 and signals_got(theirs) == 0   # signals pending at once count as one
  finally:
    for p in (v, ours, theirs):
      if p is not None and p.poll() is None: p.kill(); p.wait()

# ---- modes ----

@pytest.mark.parametrize("transport", ["shm", "zmq"])
@pytest.mark.parametrize("shared", [False, True], ids=["private", "MSGQ_GROUP"])
def test_what_the_stack_makes_is_its_users_alone_under_umask_0(transport, shared, tmp_path, monkeypatch):
  """Folders 0700 and files 0600 (MSGQ_GROUP: 0770 / 0660 and that group) under umask 0: the queue folder and file on
  shm; the runtime directory, the prefix's folder, the socket, its lock and owner file on zmq. nobody reads none."""
  gid = nobody_uid()
  monkeypatch.setenv("MSGQ_TRANSPORT", transport)
  monkeypatch.setenv("MSGQ_RUNTIME_DIR", str(rt := tmp_path / "rt"))
  if shared: monkeypatch.setenv("MSGQ_GROUP", grp.getgrgid(gid).gr_name)
  old = os.umask(0)
  try:
    pub, sub = msgq.pub_sock("ep"), msgq.sub_sock("ep", timeout=2000)
    pub.send(b"x")
    assert sub.receive() == b"x"
  finally: os.umask(old)
  folders = [f"/dev/shm/msgq_{pfx()}"] if transport == "shm" else [str(rt), str(rt / pfx())]
  files = [f"/dev/shm/msgq_{pfx()}/ep"] if transport == "shm" else [str(rt / pfx() / f) for f in ("ep", "ep.lock", "ep.pub")]
  want = (0o770, 0o660) if shared else (0o700, 0o600)
  got = {p: (oct(stat.S_IMODE((st := os.lstat(p)).st_mode)), st.st_gid == gid) for p in folders + files}
  assert got == {p: (oct(want[p in files]), shared) for p in got}
  if not shared:
    tmp_path.chmod(0o755)
    tmp_path.parent.chmod(0o755)   # pytest's folders are root's alone: nobody may walk up to rt, not into it
    try: r = as_nobody(f"import os\nfor p in {files!r}:\n  try: open(p, 'rb'); print('read', p)\n  except OSError: pass")
    finally: tmp_path.parent.chmod(0o700)
    assert r.stdout == ""
  pub.close(); sub.close()

# ---- garbage in a queue file ----

@pytest.fixture
def own_rate_limit():
  """msgq.shm's log through a RateLimit of this test's own: the hundreds of lines it causes hold back none of a later
  test's, and none of an earlier test's hold back its own."""
  shared = [f for f in shmq.log.filters if isinstance(f, RateLimit)]
  for f in shared: shmq.log.removeFilter(f)
  shmq.log.addFilter(own := RateLimit())
  yield
  shmq.log.removeFilter(own)
  for f in shared: shmq.log.addFilter(f)

def corrupt(path: str, word: int, value: int) -> None:
  with open(path, "r+b") as f: f.seek(8 * word); f.write(struct.pack("<Q", value))

@pytest.mark.parametrize("conflate", [False, True])
def test_any_header_word_of_garbage_is_read_past_and_a_bad_write_pointer_recreated(shm, conflate, caplog, own_rate_limit):
  """Every word of the header set to garbage under a publisher and a subscriber of ours: no exception out of a send
  (but the one that says another publisher took the endpoint, which a garbage write_uid is), a receive or a poll; the
  reader gets what is sent next; a write pointer outside the ring is recreated by the publisher, with one line. So is a
  garbage length tag where the reader reads next."""
  for word in range(HEADER // 8):
    for value in GARBAGE:
      ep = f"w{word}_{value:x}"
      pub, sub = msgq.pub_sock(ep, 4096), msgq.sub_sock(ep, conflate=conflate, segment_size=4096)
      poller = msgq.Poller()
      poller.registerSocket(sub)
      pub.send(b"before")
      with caplog.at_level("WARNING", "msgq"):
        corrupt(path := pub._s.q.path, word, value)
        got = []
        for _ in range(3):
          poller.poll(0)
          try: pub.send(b"after")
          except msgq.MultiplePublishersError:
            assert word == WRITE_UID, (word, value)
            pub = msgq.pub_sock(ep, 4096)
            pub.send(b"after")
          got += msgq.drain_sock_raw(sub)
      assert b"after" in got, (word, value, got)
      recreated = [r for r in caplog.records if f"{path}: corrupt header" in r.getMessage()]
      if (word, value) == (WRITE_POINTER, 0xFFFFFFF8): assert len(recreated) == 1 and "recreated" in recreated[0].getMessage()
      caplog.clear()
      pub.close(); sub.close(); poller.close()
  for tag in (0, -2, -(2 ** 63), 2 ** 62, 4096, 4095, 7):
    pub, sub = msgq.pub_sock("tags", 4096), msgq.sub_sock("tags", conflate=conflate, segment_size=4096)
    pub.send(b"before")
    off = sub._s.q.w[READ_POINTERS + sub._s.q.reader_id] & 0xFFFFFFFF
    with open(pub._s.q.path, "r+b") as f: f.seek(HEADER + off); f.write(struct.pack("<q", tag))
    assert sub.receive(non_blocking=True) in (None, b"before\0")   # a tag of 7 is a record, of garbage: 7 bytes
    pub.send(b"after")
    assert sub.receive(non_blocking=True) == b"after", tag
    pub.close(); sub.close()

def test_camerad_recreates_a_corrupt_queue_file_and_keeps_running(scene):
  """The issue's write pointer of 0xFFFFFFF8 in the header of camerad's roadCameraState queue, written under the
  running camerad, then again before it starts: it goes on publishing both times (it died of an IndexError, then
  refused the file at every restart), saying so in one log line each time; a reader of ours reads on."""
  env = {**os.environ, "MSGQ_TRANSPORT": "shm"}
  os.environ["MSGQ_TRANSPORT"] = "shm"
  path = f"/dev/shm/msgq_{pfx()}/roadCameraState"
  try:
    sub = messaging.sub_sock("roadCameraState", timeout=5000)
    for before_start in (False, True):
      if before_start: corrupt(path, WRITE_POINTER, 0xFFFFFFF8)
      notify = Notify(abstract=True)
      p = subprocess.Popen([sys.executable, "-m", "camerad", "--source", f"synthetic:{scene}", "--loop"], cwd=REPO,
                           stderr=subprocess.PIPE, text=True, env={**env, "NOTIFY_SOCKET": notify.addr})
      try:
        notify.wait("READY=1", 60)
        assert sub.receive() is not None
        if not before_start: corrupt(path, WRITE_POINTER, 0xFFFFFFF8)
        got = [sub.receive() for _ in range(3)]
        assert p.poll() is None and None not in got, got
      finally:
        p.terminate()
        _, err = p.communicate(timeout=30)
        notify.close()
        print(f"--- camerad ({'corrupt before its start' if before_start else 'corrupted under it'}):\n{err}")   # shown when it fails
      said = [line for line in err.splitlines() if "corrupt header" in line]
      assert p.returncode == 0 and len(said) == 1 and "write pointer 0xfffffff8" in said[0] and "recreated" in said[0], err
    sub.close()
  finally: os.environ.pop("MSGQ_TRANSPORT")
