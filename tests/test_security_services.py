"""The tools' servers against other accounts and the network: modeld-view sends the stream (the cabin camera included)
only to a viewer it started or was given, never to a listener another account put on its port first, and writes its
recording for this account alone; modeld-batch's local Ray listens on loopback only."""
import ipaddress, os, signal, subprocess, sys, time
from pathlib import Path
import pytest
from tests.accounts import nobody_uid, popen_as_nobody
from tests.openpilot_route import write_route
from tests.test_batch import job_processes, start_batch

BIN = Path(sys.executable).parent

# another account's listener on a loopback port: it counts the connections it accepts and the bytes they bring, and
# prints both when terminated
SQUATTER = """
import os, signal, socket, sys, threading
s = socket.socket()
s.bind(('127.0.0.1', 0))
s.listen(16)
got = [0, 0]
def drain(c):
  while b := c.recv(65536): got[1] += len(b)
def accept():
  while True:
    c, _ = s.accept()
    got[0] += 1
    threading.Thread(target=drain, args=(c,), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
signal.signal(signal.SIGTERM, lambda *_: (print(*got, flush=True), os._exit(0)))
print(s.getsockname()[1], flush=True)
while True: signal.pause()
"""

@pytest.mark.parametrize('viewer', ['native', 'web'])
def test_view_sends_nothing_to_another_accounts_listener(viewer):
  """nobody listens on the viewer's port before `modeld-view --live` starts: the tool refuses, naming the account and
  what to do, without a traceback, and nobody's listener sees no connection at all (before, it got the stream, and
  the tool hung at exit)."""
  uid = nobody_uid()
  squatter = popen_as_nobody(SQUATTER)
  try:
    port = int(squatter.stdout.readline())
    args = ['--port', str(port)] + (['--web', '--web-port', '0'] if viewer == 'web' else [])
    r = subprocess.run([BIN / 'modeld-view', '--live', '--seconds', '1', *args], env={**os.environ, 'DISPLAY': ':0'},
                       capture_output=True, text=True, timeout=60)
  finally:
    squatter.send_signal(signal.SIGTERM)
    got = squatter.communicate(timeout=10)[0].split()
  assert r.returncode == 1 and f"127.0.0.1:{port} is taken by a listener of uid {uid} (nobody)" in r.stderr, (r.returncode, r.stderr)
  assert '--port 0' in r.stderr and 'Traceback' not in r.stderr, r.stderr
  assert got == ['0', '0'], f"nobody's listener: {got[0]} connection(s), {got[1]} bytes"

def test_view_recording_is_this_accounts_alone(tmp_path):
  """--save writes the recording 0600 whatever the umask (it holds the cabin camera), and refuses a symlink in its
  place rather than write where it points."""
  old = os.umask(0o022)
  try: r = subprocess.run([BIN / 'modeld-view', '--live', '--seconds', '0.5', '--save', tmp_path / 'live.rrd'], capture_output=True, text=True, timeout=60)
  finally: os.umask(old)
  assert r.returncode == 0, r.stderr
  assert (tmp_path / 'live.rrd').stat().st_mode & 0o777 == 0o600
  (tmp_path / 'elsewhere').write_bytes(b'theirs')
  (tmp_path / 'link.rrd').symlink_to(tmp_path / 'elsewhere')
  r = subprocess.run([BIN / 'modeld-view', '--live', '--seconds', '0.5', '--save', tmp_path / 'link.rrd'], capture_output=True, text=True, timeout=60)
  assert r.returncode == 2 and 'is a symlink: refused' in r.stderr and (tmp_path / 'elsewhere').read_bytes() == b'theirs', r.stderr

def loopback(ip: str) -> bool:
  a = ipaddress.ip_address(ip)
  return a.is_loopback or (a.version == 6 and a.ipv4_mapped is not None and a.ipv4_mapped.is_loopback)

def test_local_ray_listens_on_loopback_only_and_the_outputs_are_private(scene, tiny_artifacts, tmp_path):
  """Every TCP listener of a modeld-batch job that starts its own Ray (the driver, the GCS, the raylet, the agents and
  dashboard process, the worker), polled from its start to its end, is on loopback (before: the GCS, the raylet and the
  workers on every interface); and what the job writes is 0700/0600 under umask 0 (0777/0666 before)."""
  import psutil
  write_route(tmp_path / 'r', scene, segments=1, frames=8)
  old = os.umask(0)
  try: p = start_batch(tmp_path / 'r', '--artifacts', tiny_artifacts, '--out', tmp_path / 'out', '--workers', '1')
  finally: os.umask(old)
  seen: dict[str, set[str]] = {}   # process -> the addresses it listened on
  while p.poll() is None:
    for pid in [p.pid, *job_processes(p)]:
      try:
        proc = psutil.Process(pid)
        ips = {c.laddr.ip for c in proc.net_connections('inet') if c.status == psutil.CONN_LISTEN}
        if ips: seen.setdefault(proc.name(), set()).update(ips)
      except psutil.Error: pass   # gone meanwhile
    time.sleep(0.1)
  out, err = p.communicate()
  assert p.returncode == 0, err
  print({k: sorted(v) for k, v in seen.items()})
  assert {'gcs_server', 'raylet'} <= set(seen), seen
  assert {k: v for k, v in seen.items() if not all(map(loopback, v))} == {}
  made = [tmp_path / 'out', *(tmp_path / 'out').rglob('*')]
  assert len(made) > 3 and {str(f.relative_to(tmp_path)): oct(f.stat().st_mode & 0o777) for f in made
                            if f.stat().st_mode & 0o777 not in (0o700, 0o600)} == {}
