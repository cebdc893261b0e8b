"""A second, unprivileged local account for the security tests: `nobody`, where this process is root and can switch to
it. What it runs is plain Python (the standard library alone: the project's venv may be out of its reach)."""
import functools, os, pwd, shutil, subprocess, sys
import pytest

@functools.cache
def _nobody() -> tuple[int, int, str] | str:
  """(uid, gid, a Python it can run), or why there is none."""
  if os.geteuid() != 0: return "needs root, to switch to a second account (nobody)"
  try: pw = pwd.getpwnam("nobody")
  except KeyError: return "this machine has no account named nobody"
  for py in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
    try:
      if py and subprocess.run([py, "-c", "pass"], user=pw.pw_uid, group=pw.pw_gid, capture_output=True, cwd="/").returncode == 0:
        return pw.pw_uid, pw.pw_gid, py
    except OSError: pass   # out of its reach (a Python under /root)
  return "nobody can run no Python of this machine"

def _who() -> tuple[int, int, str]:
  if isinstance(who := _nobody(), str): pytest.skip(who)
  return who

def nobody_uid() -> int:
  """nobody's uid; skips the test (saying why) where no second account can be used."""
  return _who()[0]

def as_nobody(code: str, env: dict | None = None, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
  """Run `code` (standard-library Python) as nobody and wait for it; its stdout and stderr are captured (text)."""
  uid, gid, py = _who()
  r = subprocess.run([py, "-c", code], user=uid, group=gid, env=env or {"PATH": "/usr/bin:/bin"}, cwd="/", timeout=timeout,
                     capture_output=True, text=True)
  if check and r.returncode: raise AssertionError(f"as nobody: exit {r.returncode}: {r.stderr.strip()}")
  return r

def popen_as_nobody(code: str, env: dict | None = None) -> subprocess.Popen:
  """Start `code` as nobody in the background (stdout a pipe, text); the caller ends it."""
  uid, gid, py = _who()
  return subprocess.Popen([py, "-c", code], user=uid, group=gid, env=env or {"PATH": "/usr/bin:/bin"}, cwd="/",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
