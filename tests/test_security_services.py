"""The tools' servers against other accounts and the network: modeld-batch's local Ray listens on loopback only."""
import ipaddress, time
from tests.openpilot_route import write_route
from tests.test_batch import job_processes, start_batch

def loopback(ip: str) -> bool:
  a = ipaddress.ip_address(ip)
  return a.is_loopback or (a.version == 6 and a.ipv4_mapped is not None and a.ipv4_mapped.is_loopback)

def test_local_ray_listens_on_loopback_only(scene, tiny_artifacts, tmp_path):
  """Every TCP listener of a modeld-batch job that starts its own Ray (the driver, the GCS, the raylet, the agents and
  dashboard process, the worker), polled from its start to its end, is on loopback (before: the GCS, the raylet and the
  workers on every interface)."""
  import psutil
  write_route(tmp_path / 'r', scene, segments=1, frames=8)
  p = start_batch(tmp_path / 'r', '--artifacts', tiny_artifacts, '--out', tmp_path / 'out', '--workers', '1')
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
