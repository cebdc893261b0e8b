"""openpilot's own schema and LogReader, from the openpilot-logging package, as the reference the tests compare with
(and v0.11.1's driverMonitoringState @151, which it predates, as V2). openpilot_logging.cereal first tries `from cereal
import log`, which here finds the project's own cereal: a test built on it would compare the project with itself. So
its .capnp files are loaded by path into a parser of their own, and its LogReader runs in a child process where no
`cereal` package can be imported."""
from __future__ import annotations
import os, pickle, subprocess, sys, sysconfig
from pathlib import Path
import capnp
import openpilot_logging

SCHEMA_DIR = Path(openpilot_logging.__file__).parent / "cereal"
_parser = capnp.SchemaParser()   # its own parser: openpilot's files have the same ids as the project's
log = _parser.load(str(SCHEMA_DIR / "log.capnp"), imports=[str(SCHEMA_DIR)])
car = _parser.load(str(SCHEMA_DIR / "car.capnp"), imports=[str(SCHEMA_DIR)])

_CHILD = r"""
import importlib.util, pickle, sys
assert importlib.util.find_spec('cereal') is None, 'a cereal package is importable: openpilot_logging would use it'
from openpilot_logging.logreader import LogReader
from openpilot_logging.cereal import log
out = []
for path in sys.argv[1:]:
  out.append([(ev.which(), ev.logMonoTime, ev.as_builder().to_bytes()) for ev in LogReader(path)])
sys.stdout.buffer.write(pickle.dumps(out))
"""

def logreader_events(paths: list[str | os.PathLike], cwd: str | os.PathLike) -> list[list[tuple[str, int, bytes]]]:
  """openpilot's LogReader over each log file: per file, (which, logMonoTime, the event re-serialized) per event.
  It runs without site processing (so the project's editable install is invisible), in cwd (an empty folder)."""
  env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
  r = subprocess.run([sys.executable, "-S", "-c", _CHILD, *map(str, paths)], cwd=cwd, env=env, capture_output=True, timeout=120)
  assert r.returncode == 0, r.stderr.decode()[-3000:]
  return pickle.loads(r.stdout)

def canonical(dat: bytes) -> bytes:
  """An event's bytes as openpilot's schema re-serializes them (what logreader_events returns for the same event)."""
  with log.Event.from_bytes(dat) as ev: return ev.as_builder().to_bytes()

# v0.11.1's driverMonitoringState (Event @151), newer than the reference: every struct and enum it reaches, by name,
# with openpilot's type id and its fields (ordinal, type) or enumerants
V2 = {
  "DriverMonitoringState": (0xa0df507d7df1052d, {
    "lockout": (0, "bool"), "alertCountLockoutPercent": (1, "int8"), "alertTimeLockoutPercent": (2, "int8"), "alwaysOn": (3, "bool"),
    "alwaysOnLockout": (4, "bool"), "alertLevel": (5, "AlertLevel"), "activePolicy": (6, "MonitoringPolicy"), "isRHD": (7, "bool"),
    "rhdCalibration": (8, "CalibrationState"), "visionPolicyState": (9, "VisionPolicyState"),
    "wheeltouchPolicyState": (10, "WheeltouchPolicyState")}),
  "AlertLevel": (0x96090816b1289c99, ["none", "one", "two", "three"]),
  "MonitoringPolicy": (0xfc59c1779c0b5d25, ["wheeltouch", "vision"]),
  "VisionPolicyState": (0xe00d55cd16ef95ac, {
    "awarenessPercent": (0, "int8"), "awarenessStep": (1, "float32"), "isDistracted": (2, "bool"),
    "distractedTypes": (3, "DistractedTypes"), "faceDetected": (4, "bool"), "pose": (5, "Pose"),
    "wheeltouchFallbackPercent": (6, "int8"), "uncertainOffroadAlertPercent": (7, "int8")}),
  "DistractedTypes": (0xfea3f4cb7265dd75, {"pose": (0, "bool"), "eye": (1, "bool"), "phone": (2, "bool")}),
  "Pose": (0xd33df88c8626ec40, {"pitch": (0, "float32"), "yaw": (1, "float32"), "pitchCalib": (2, "CalibrationState"),
                                "yawCalib": (3, "CalibrationState"), "calibrated": (4, "bool"), "uncertainty": (5, "float32")}),
  "WheeltouchPolicyState": (0xf35f5f0c8b6ed5fc, {"awarenessPercent": (0, "int8"), "awarenessStep": (1, "float32"),
                                                 "driverInteracting": (2, "bool")}),
  "CalibrationState": (0xcf5d6ac20c51e9b0, {"calibratedPercent": (0, "int8"), "offset": (1, "float32")}),
}


def v0_11_1_monitoring_reader(tmp_path: Path):
  """A reader of v0.11.1's Event as far as driverMonitoringState @151 goes, written from V2 alone: every other union
  member is a pointer in openpilot's Event (so AnyPointer lays it out the same), the structs and enums have V2's ids."""
  def kind(t: str) -> str: return {"bool": "Bool", "int8": "Int8", "float32": "Float32"}.get(t, t)
  members = "; ".join(f"m{i} @{i} :AnyPointer" for i in range(1, 151) if i != 67)
  text = [f"@0xf3b1f17e25a4285b;\nstruct Event {{ logMonoTime @0 :UInt64; valid @67 :Bool = true;\n"
          f"  union {{ {members}; driverMonitoringState @151 :DriverMonitoringState; }} }}"]
  for name, (tid, body) in V2.items():
    inner = (f"{e} @{i};" for i, e in enumerate(body)) if isinstance(body, list) else (f"{f} @{o} :{kind(t)};" for f, (o, t) in body.items())
    text.append(f"{'enum' if isinstance(body, list) else 'struct'} {name} @{tid:#x} {{ {' '.join(inner)} }}")
  (path := tmp_path / "v0_11_1_monitoring.capnp").write_text("\n".join(text) + "\n")
  return capnp.SchemaParser().load(str(path))
