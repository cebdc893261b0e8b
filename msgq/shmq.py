"""openpilot's shared-memory queue (commaai/msgq's msgq.cc), byte for byte, so openpilot's processes and ours share one.
One file per endpoint in /dev/shm: a 384-byte header of 64-bit words, then a ring of records (int64 length tag, payload,
padding to 8). One writer, up to 15 readers; the writer wakes each with SIGUSR2 sent to the thread that registered it,
if of a process of its user's that handles it. Layout, rules and memory ordering: docs/MSGQ.md."""
import ctypes, ctypes.util, logging, mmap, os, platform, signal, threading, time
from service import RateLimit
from service.owned import NotOwnedError, open_private, private_dir

DEFAULT_SEGMENT = 1 << 20   # bytes of ring when the caller names no size (openpilot's DEFAULT_SEGMENT_SIZE)
HEADER = 384                # num_readers, write_pointer, write_uid, then 15 read pointers, valids and uids
NUM_READERS = 15
NUM_READERS_W, WRITE_POINTER, WRITE_UID, READ_POINTERS, READ_VALIDS, READ_UIDS = 0, 1, 2, 3, 3 + NUM_READERS, 3 + 2 * NUM_READERS
WRAP = -1                   # the tag that sends readers back to the ring's start
POLL_SLICE = 0.1            # s: a waiting reader re-checks this often, so a writer that signals nobody is still seen
LOW = 0xFFFFFFFF            # a pointer's offset (its high half counts the wraps), a uid's thread id
_USR2, _BLOCK, _UNBLOCK = frozenset({signal.SIGUSR2}), signal.SIG_BLOCK, signal.SIG_UNBLOCK   # made once: the wake-up path is cold
WAKE_CHECK_S = 1.0          # a publisher looks again this often at whom its reader slots name (a dead reader's tid reused)
log = logging.getLogger("msgq.shm")
log.addFilter(RateLimit())  # a queue file's garbage is written by whoever can write it: what it makes us say stays bounded

class QueueError(Exception):
  """A queue file or record that breaks the format; the message names the file."""

def align8(n: int) -> int: return (n + 7) & ~7
def max_message(segment: int) -> int:
  """The largest payload a segment takes: three records must fit (openpilot asserts it)."""
  return segment // 3 // 8 * 8 - 8

class _Native:
  """What Python lacks: compare-and-swap and a fence on shared memory (libatomic, GCC's runtime: Debian's libatomic1), and
  tkill. Loads and stores are memoryview accesses of aligned 8-byte words, single-copy atomic on x86-64 and arm64; x86-64
  orders them as openpilot needs without fences (fence is None there), weaker CPUs get a full fence where openpilot's
  code has one or relies on a seq_cst store."""
  def __init__(self):
    if (name := ctypes.util.find_library("atomic")) is None:
      raise QueueError("the shm transport needs libatomic.so.1 (Debian, Ubuntu: apt-get install libatomic1)")
    lib, u64 = ctypes.CDLL(name), ctypes.c_uint64
    self.cas = getattr(lib, "__atomic_compare_exchange_8")
    self.cas.argtypes, self.cas.restype = [ctypes.c_void_p, ctypes.POINTER(u64), u64, ctypes.c_int, ctypes.c_int], ctypes.c_bool
    self.fence = None if platform.machine() in ("x86_64", "AMD64") else lib.atomic_thread_fence
    # no argtypes: ctypes' conversions would double the cost of a signal, a cold call after an idle wait (tids and
    # signal numbers fit an int, which libffi widens to the register syscall() reads)
    self.syscall = ctypes.CDLL(None, use_errno=True).syscall
    self.tkill = {"x86_64": 200, "aarch64": 130, "riscv64": 130}.get(platform.machine())

_native: _Native | None = None
_native_lock = threading.Lock()

def native() -> _Native:
  global _native
  with _native_lock:
    if _native is None:
      _native = _Native()
      # a reader's thread is sent SIGUSR2, whose default action ends the process. Ignored, it still wakes a thread that
      # blocks it while it waits (wait()). A handler the application set stays
      if signal.getsignal(signal.SIGUSR2) in (signal.SIG_DFL, None):
        try: signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        except ValueError: ctypes.CDLL(None).signal(signal.SIGUSR2, ctypes.c_void_p(1))   # not the main thread: SIG_IGN
  return _native

def _status(tid: int, keys: tuple[bytes, ...]) -> dict[bytes, list[bytes]]:
  """These fields of /proc/<tid>/status, split ({} for no live thread)."""
  try:
    with open(f"/proc/{tid}/status", "rb") as f: status = f.read()
  except (OSError, ValueError): return {}
  return {k: v.split() for k, _, v in (line.partition(b":") for line in status.splitlines()) if k in keys}

def wakeable(tid: int) -> int:
  """tid if it is a thread of a process of our user that catches or ignores SIGUSR2 (openpilot's readers set a handler,
  ours ignore it), else 0: a reader slot is anyone's to write who can write the file, and SIGUSR2's default action ends
  a process, so a planted or stale tid must get nothing."""
  got = _status(tid, (b"Uid", b"SigIgn", b"SigCgt"))
  try: return tid if int(got[b"Uid"][1]) == os.geteuid() and (int(got[b"SigIgn"][0], 16) | int(got[b"SigCgt"][0], 16)) >> 11 & 1 else 0
  except (KeyError, IndexError, ValueError): return 0

def process_of(tid: int) -> int | None:
  """The process a thread id belongs to (its Tgid), None for no live thread."""
  try: return int(_status(tid, (b"Tgid",))[b"Tgid"][0])
  except (KeyError, IndexError, ValueError): return None

def thread_signal(tid: int) -> None:
  """SIGUSR2 to one thread (openpilot's thread_signal), where wakeable() says it is a reader of ours."""
  n = _native or native()
  if tid and n.tkill is not None and wakeable(tid): n.syscall(n.tkill, tid, signal.SIGUSR2)

def new_uid() -> int:
  """32 random bits, then the calling thread's id (the wake-up target), as openpilot's msgq_get_uid."""
  return (int.from_bytes(os.urandom(4), "little") << 32) | threading.get_native_id()

def queue_path(endpoint: str, prefix: str) -> str:
  """openpilot's: /dev/shm/msgq_<endpoint>, or /dev/shm/msgq_<prefix>/<endpoint> under OPENPILOT_PREFIX."""
  return f"/dev/shm/msgq_{prefix}/{endpoint}" if prefix else f"/dev/shm/msgq_{endpoint}"

class Queue:
  """One endpoint's queue file, mapped. A publisher calls init_publisher() once, then send(); a subscriber
  init_subscriber(), then recv() / ready(). One thread at a time per Queue, as openpilot's sockets. The file and its
  prefix folder are ours (service/owned.py): another account's, or a symlink, is refused by name. Any word of the file
  may be garbage: the publisher recreates a header it cannot write on, a reader skips what it cannot read."""
  def __init__(self, endpoint: str, prefix: str, segment: int = 0):
    self.endpoint, self.path, self.size = endpoint, queue_path(endpoint, prefix), segment or DEFAULT_SEGMENT
    if not 48 <= self.size < 1 << 32 or self.size % 8:
      raise QueueError(f"{self.path}: the segment size must be a multiple of 8 in 48..2^32, got {self.size}")
    self.n = native()
    try:
      if prefix: private_dir(os.path.dirname(self.path), "queue folder")   # openpilot's msgq expects it made
      fd = open_private(self.path, os.O_RDWR | os.O_CREAT, "queue file")
    except NotOwnedError as e: raise QueueError(str(e)) from None
    except OSError as e: raise QueueError(f"cannot open {self.path}: {e.strerror}") from None
    try:
      have = os.fstat(fd).st_size
      if have not in (0, self.size + HEADER):   # openpilot's would re-size it under the other side's mapping
        raise QueueError(f"{self.path} has {have} bytes, expected {self.size + HEADER} (a {self.size}-byte segment): made by "
                         f"another services table; remove it if no process uses it")
      if have == 0: os.ftruncate(fd, self.size + HEADER)
      self.mm = mmap.mmap(fd, self.size + HEADER, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally: os.close(fd)
    self.w, self.tags = memoryview(self.mm)[:HEADER].cast("Q"), memoryview(self.mm)[HEADER:].cast("q")
    self.addr = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))   # the temporary export is gone at once
    self.reader_id, self.read_uid, self.write_uid, self.conflate, self.max_msg = -1, 0, 0, False, max_message(self.size)
    self.wake, self.wake_until = {}, 0.   # a publisher's reader uids -> the tid to signal (0: none), looked at until then

  def cas(self, word: int, expected: int, new: int) -> bool:
    return self.n.cas(self.addr + 8 * word, ctypes.c_uint64(expected), new, 5, 5)   # 5: __ATOMIC_SEQ_CST

  def close(self) -> None:
    """Unmap; the file stays, as openpilot's (its header holds the queue's state for the next opener)."""
    if self.mm.closed: return
    self.w.release(); self.tags.release()
    self.mm.close()

  # ---- publisher ----
  def init_publisher(self) -> None:
    """Take the endpoint: another publisher's next send fails, every reader re-registers (openpilot's rule)."""
    self.write_uid = new_uid()
    self._reset(self.w[WRITE_POINTER])

  def _reset(self, wp: int) -> int:
    """Write our uid and clear every reader slot; a write pointer that points outside the ring (a header of garbage)
    starts the ring again, saying so. Returns the write pointer."""
    w, size = self.w, self.size
    if wp & LOW > size - 8 or wp & 7:
      log.warning("%s: corrupt header (write pointer %#x, num_readers %d): recreated the queue; its readers register again",
                  self.path, wp, w[NUM_READERS_W])
      w[WRITE_POINTER] = wp = 0
    w[WRITE_UID], w[NUM_READERS_W] = self.write_uid, 0
    for i in range(NUM_READERS): w[READ_VALIDS + i] = w[READ_UIDS + i] = 0
    if self.n.fence: self.n.fence(5)
    return wp

  def is_publisher(self) -> bool: return self.w[WRITE_UID] == self.write_uid

  def send(self, data: bytes | bytearray | memoryview) -> bool:
    """Append one message (bytes-like, len() its bytes) and wake the readers (openpilot's msgq_msg_send); False, and
    nothing written, once another publisher took the endpoint. ValueError for an empty message (openpilot's readers
    abort on one) or one over a third of the segment (its writer aborts). Inlined: this runs after an idle wait, on
    cold caches, where every call costs microseconds."""
    w, n, size, fence = self.w, len(data), self.size, self.n.fence
    if w[WRITE_UID] != self.write_uid: return False
    if not 0 < n <= self.max_msg:
      raise ValueError(f"{self.endpoint}: an empty message (openpilot's readers abort on one)" if n == 0 else
                       f"{self.endpoint}: a message of {n} bytes is larger than its {size}-byte segment takes ({self.max_msg})")
    readers, wp = w[NUM_READERS_W], w[WRITE_POINTER]
    if readers > NUM_READERS: readers = NUM_READERS
    cycle, off = wp >> 32, wp & LOW
    if off > size - 8 or off & 7: readers, cycle, off = 0, 0, self._reset(wp)   # garbage: a tag written there would miss the ring
    if size - off - ((n + 15) & ~7) - 8 <= 0:   # no room before the end (8 bytes always stay free for this tag): wrap
      self.tags[off // 8] = WRAP
      for i in range(readers):   # readers still ahead of us in the previous cycle lose what gets overwritten
        rp = w[READ_POINTERS + i]
        if (rp & LOW) > off and rp >> 32 != cycle: w[READ_VALIDS + i] = 0
      cycle, off = (cycle + 1) & LOW, 0   # a 32-bit count, as openpilot's
      w[WRITE_POINTER] = cycle << 32
    end = (off + n + 15) & ~7
    for i in range(readers):   # readers whose next record this one overwrites
      rp = w[READ_POINTERS + i]
      if off <= (rp & LOW) < end and rp >> 32 != cycle: w[READ_VALIDS + i] = 0
    self.tags[off // 8] = n
    self.mm[HEADER + off + 8:HEADER + off + 8 + n] = data
    if fence: fence(5)   # the record before the pointer that shows it
    w[WRITE_POINTER] = cycle << 32 | end
    if fence: fence(5)
    if readers and (tkill := self.n.tkill):
      syscall, wake = self.n.syscall, self.wake
      if (now := time.monotonic()) > self.wake_until: wake.clear(); self.wake_until = now + WAKE_CHECK_S
      for i in range(readers):   # SIGUSR2, as thread_signal(), to the tids wakeable() passed
        if (tid := wake.get(uid := w[READ_UIDS + i])) is None: tid = self._wakeable(uid)
        if tid: syscall(tkill, tid, 12)
    return True

  def _wakeable(self, uid: int) -> int:
    """The tid to signal for reader uid `uid` (0: none), remembered until the next look (WAKE_CHECK_S)."""
    if len(self.wake) >= 4 * NUM_READERS: self.wake.clear()   # uids churned by some writer: the table stays small
    self.wake[uid] = tid = wakeable(uid & LOW)
    return tid

  def all_readers_updated(self) -> bool:
    """A reader is registered and every valid one has read everything (openpilot's msgq_all_readers_updated), and no
    slot is still being taken (no uid yet)."""
    w = self.w
    readers, wp = min(w[NUM_READERS_W], NUM_READERS), w[WRITE_POINTER]
    return readers > 0 and all(w[READ_UIDS + i] and (not w[READ_VALIDS + i] or w[READ_POINTERS + i] == wp) for i in range(readers))

  def reader_pids(self) -> set[int]:
    """The processes of the registered readers (each slot names the thread that reads it)."""
    w = self.w
    return {p for i in range(min(w[NUM_READERS_W], NUM_READERS)) if (uid := w[READ_UIDS + i]) and (p := process_of(uid & LOW))}

  # ---- subscriber ----
  def init_subscriber(self) -> None:
    """Take a reader slot with a compare-and-swap; with all 15 taken, evict every reader first (openpilot's rule: slots
    are never given back, so the 16th reader of a queue's lifetime starts the count again)."""
    w, uid = self.w, new_uid()
    while True:
      cur = w[NUM_READERS_W]
      if cur + 1 > NUM_READERS:
        w[NUM_READERS_W] = 0
        for i in range(NUM_READERS):
          old, w[READ_VALIDS + i], w[READ_UIDS + i] = w[READ_UIDS + i], 0, 0
          thread_signal(old & LOW)   # a poller of the evicted reader wakes and re-registers
        continue
      if self.cas(NUM_READERS_W, cur, cur + 1): break
    # the slot's place first, its uid last: a publisher's all_readers_updated must not count the slot as caught up
    # before the reader is at the write pointer (openpilot's order leaves a window in which a message sent is missed)
    self.reader_id, self.read_uid = cur, uid
    w[READ_POINTERS + cur] = w[WRITE_POINTER]
    w[READ_VALIDS + cur] = 1
    if self.n.fence: self.n.fence(5)
    w[READ_UIDS + cur] = uid

  def reset_reader(self) -> None:
    """Skip to the newest position: a lapped or new reader drops what it has not read."""
    self.w[READ_VALIDS + self.reader_id] = 1
    self.w[READ_POINTERS + self.reader_id] = self.w[WRITE_POINTER]

  def _check_slot(self) -> None:
    """Re-register if evicted; skip to the newest position if the writer invalidated our place."""
    w, rid = self.w, self.reader_id
    for _ in range(100):
      if w[READ_UIDS + rid] != self.read_uid: self.init_subscriber(); rid = self.reader_id
      elif not w[READ_VALIDS + rid]: self.reset_reader()
      else: return
    raise QueueError(f"{self.path}: reader {rid} cannot keep a slot: another process keeps resetting the header")

  def ready(self) -> bool:
    w, rid = self.w, self.reader_id
    if w[READ_UIDS + rid] != self.read_uid or not w[READ_VALIDS + rid]:
      try: self._check_slot()
      except QueueError as e:   # not ready: the poll sleeps its slice instead of spinning on it
        log.warning("%s", e)
        return False
      rid = self.reader_id
    return (w[READ_POINTERS + rid] ^ w[WRITE_POINTER]) & LOW != 0

  def recv(self) -> bytes | None:
    """The next message (with conflate, the newest), or None when there is none (openpilot's msgq_msg_recv). A record
    that breaks the format raises QueueError and puts the reader at the newest position, so the next call reads on."""
    w, size, fence = self.w, self.size, self.n.fence
    rid = self.reader_id
    for _ in range(size // 16 + 2):   # a ring holds at most size/16 records: a longer walk is corruption
      if w[READ_UIDS + rid] != self.read_uid or not w[READ_VALIDS + rid]: self._check_slot(); rid = self.reader_id
      rp = w[READ_POINTERS + rid]
      cycle, off = rp >> 32, rp & LOW
      if off == w[WRITE_POINTER] & LOW: return None
      if fence: fence(5)
      tag = self.tags[off // 8] if off < size and not off % 8 else 0
      if not w[READ_VALIDS + rid]: continue   # overwritten while we looked: start again from the newest
      if tag == WRAP and off:
        w[READ_POINTERS + rid] = ((cycle + 1) & LOW) << 32
        continue
      if not 0 < tag < size or off + 8 + tag > size:
        self.reset_reader()
        raise QueueError(f"{self.path}: corrupt record at offset {off} (length tag {tag}, segment {size}): skipped to the newest message")
      nxt = align8(off + 8 + tag)
      if self.conflate and nxt != w[WRITE_POINTER] & LOW:   # not the newest: skip it
        w[READ_POINTERS + rid] = cycle << 32 | nxt
        continue
      msg = self.mm[HEADER + off + 8:HEADER + off + 8 + tag]
      if fence: fence(5)
      w[READ_POINTERS + rid] = cycle << 32 | nxt
      if fence: fence(5)
      if w[READ_VALIDS + rid]: return msg   # else the writer overwrote it during the copy: start again
    raise QueueError(f"{self.path}: no message boundary found walking the whole segment: the queue is corrupt")

  def wake_here(self, tid: int) -> None:
    """Make thread `tid` the one the writer signals (openpilot signals the thread that registered the reader only, so
    a poll in another thread would sleep to its timeout)."""
    new = self.read_uid & ~LOW | tid
    if self.cas(READ_UIDS + self.reader_id, self.read_uid, new): self.read_uid = new

def wait(queues: list[Queue], timeout: float | None) -> list[int]:
  """The indexes of the queues with a message ready, sleeping until one is, a writer's SIGUSR2, or `timeout` s (None:
  forever).
  SIGUSR2 is blocked while this thread checks and sleeps, so a signal sent after the check is not lost; the mask is
  restored before returning (a child started later inherits none of it). The sleep lasts POLL_SLICE at most."""
  tid = threading.get_native_id()
  for q in queues:
    if q.read_uid & LOW != tid: q.wake_here(tid)
  if ready := [i for i, q in enumerate(queues) if q.ready()]: return ready
  deadline = None if timeout is None else time.monotonic() + timeout
  old = signal.pthread_sigmask(_BLOCK, _USR2)
  try:
    while not (ready := [i for i, q in enumerate(queues) if q.ready()]):
      left = POLL_SLICE if deadline is None else deadline - time.monotonic()
      if left <= 0: break
      signal.sigtimedwait(_USR2, min(left, POLL_SLICE))
  finally:
    if signal.SIGUSR2 not in old: signal.pthread_sigmask(_UNBLOCK, _USR2)
  return ready
