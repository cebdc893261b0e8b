"""Faults to inject and what to measure around them, shared by tests/test_faults.py and scripts/soak.sh: malformed
messages on the daemons' inputs, damaged artifacts, junk on a VisionIPC server's handshake socket, a full disk under
a process; the file descriptors and RSS of a process."""
import hashlib, json, os, pathlib, shlex, shutil, socket, subprocess, threading, time
import numpy as np
from cereal import messaging
from msgq import runtime_dir
from msgq.visionipc.wire import REQUEST

MESSAGE_FAULTS = ('garbage', 'truncated', 'wrong type')

def bad_message(kind: str, service: str, rng: np.random.Generator) -> bytes:
  """Random bytes, a valid message of `service` cut short, or a valid message of another service."""
  if kind == 'garbage': return rng.bytes(int(rng.integers(1, 256)))
  if kind == 'truncated': return (m := messaging.new_message(service).to_bytes())[:int(rng.integers(1, len(m)))]
  return messaging.new_message('deviceState' if service == 'carState' else 'carState').to_bytes()

class MessageFaults(threading.Thread):
  """Sends a bad message on every socket `hz` times a second, the kinds of MESSAGE_FAULTS in turn, until stop().
  The sockets may be shared with a thread that sends good messages (PubSocket.send is thread-safe)."""
  def __init__(self, socks: dict, hz: float = 100., seed: int = 0):
    super().__init__(daemon=True)
    self.socks, self.period, self.rng = socks, 1 / hz, np.random.default_rng(seed)
    self.counts, self._done = dict.fromkeys(MESSAGE_FAULTS, 0), threading.Event()

  def run(self) -> None:
    i, t = 0, time.monotonic()
    while not self._done.wait(max(0., t - time.monotonic())):
      kind = MESSAGE_FAULTS[i % len(MESSAGE_FAULTS)]
      for service, sock in self.socks.items(): sock.send(bad_message(kind, service, self.rng))
      self.counts[kind] += len(self.socks)
      i, t = i + 1, t + self.period

  def stop(self) -> dict[str, int]:
    self._done.set()
    self.join()
    return self.counts

def _altered_weights(d: pathlib.Path, model: str) -> str:
  """8 bytes in the middle of the model's weights overwritten."""
  with open(weights := d / f'{model}.bin', 'r+b') as f:
    f.seek(os.path.getsize(weights) // 2)
    f.write(b'\xff' * 8)
  want, got = json.loads((d / 'manifest.json').read_text())['files'][weights.name], hashlib.sha256(weights.read_bytes()).hexdigest()
  return f"{weights.name} does not match its sha256 in the manifest (expected {want[:12]}..., got {got[:12]}...)"

def _manifest_edit(edit):
  """A damage to the manifest (which the file hashes do not cover): edit(manifest, model) changes it and returns what
  the loader says of the field."""
  def damage(d: pathlib.Path, model: str) -> str:
    m = json.loads((p := d / 'manifest.json').read_text())
    msg = edit(m, model)
    p.write_text(json.dumps(m))
    return f"manifest.json field {msg}"
  return damage

@_manifest_edit
def _missing_key(m: dict, model: str) -> str:
  del m['jits'][model]['buffers']
  return f"jits.{model}.buffers: expected a list of [offset, size] pairs, got nothing"

@_manifest_edit
def _wrong_type(m: dict, model: str) -> str:
  m['target']['cpu_features'] = 'avx2'
  return "target.cpu_features: expected a list of feature names, got 'avx2'"

@_manifest_edit
def _bad_output_slice(m: dict, model: str) -> str:
  slices = m['output_slices'][model]
  slices[k := next(iter(slices))] = [3]
  return f"output_slices.{model}.{k}: expected [start, stop] within the output's {m['jits'][model]['output']['shape'][-1]} values, got [3]"

ARTIFACT_DAMAGES = {'altered weights': _altered_weights, 'missing key': _missing_key, 'wrong type': _wrong_type, 'bad output slice': _bad_output_slice}

def damaged_artifact(artifacts: pathlib.Path, out: pathlib.Path, family: str, kind: str) -> str:
  """A copy of artifacts/FAMILY as out/FAMILY with the damage `kind` of ARTIFACT_DAMAGES; returns what the loader
  says of it (after 'DIR: ')."""
  shutil.copytree(artifacts / family, out / family)
  return ARTIFACT_DAMAGES[kind](out / family, 'vision' if family == 'road' else 'dm')

HANDSHAKE_FAULTS = ('garbage', 'truncated', 'silent', 'deaf')

def handshake_fault(path: str, kind: str, rng: np.random.Generator) -> socket.socket | None:
  """One connection to a VisionIPC server's handshake socket: random bytes, a request cut short, nothing at all, or a
  good request whose reply (with the buffers' fds) is never read. The connection is returned open, its reply unread
  (close it later); None if the server refused it."""
  s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
  req = REQUEST.pack(0)   # stream 0's buffers
  try:
    s.connect(path)
    if kind == 'garbage': s.send(rng.bytes(int(rng.integers(1, 512))))
    elif kind == 'truncated': s.send(req[:int(rng.integers(1, len(req)))])
    elif kind == 'deaf': s.send(req)
  except OSError:
    s.close()
    return None
  return s

def usage(pid: int) -> tuple[int, int]:
  """(open file descriptors, resident bytes) of a process."""
  with open(f'/proc/{pid}/status') as f: rss = next(int(l.split()[1]) * 1024 for l in f if l.startswith('VmRSS:'))
  return len(os.listdir(f'/proc/{pid}/fd')), rss

def full_disk(argv: list[str], size: int, mount: str, keep: str) -> list[str]:
  """A command line running argv with a `size`-byte tmpfs mounted at `mount`, in a user and mount namespace of its own
  (no root needed where unprivileged user namespaces are allowed); what it left there is copied to `keep` when it
  exits, and its exit code is kept. Inside, the user is root: msgq's runtime directory is passed on explicitly."""
  if shutil.which('unshare') is None: raise RuntimeError("full_disk needs unshare (util-linux)")
  script = (f"export MSGQ_RUNTIME_DIR={shlex.quote(os.path.dirname(runtime_dir()))}; "
            f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(mount)} || exit 125; {shlex.join(argv)}; rc=$?; "
            f"cp -a {shlex.quote(mount)}/. {shlex.quote(keep)}; exit $rc")
  return ['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c', script]

def can_mount_tmpfs(tmp: str) -> bool:
  """Whether full_disk works here (a user namespace may be refused, e.g. in some containers)."""
  os.makedirs(tmp, exist_ok=True)
  return subprocess.run(full_disk(['true'], 1 << 20, tmp, tmp), capture_output=True).returncode == 0
