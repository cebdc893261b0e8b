"""systemd units: the installer fills the templates, every unit passes `systemd-analyze verify`, the environment
file's options reach the daemons' command lines, and the daemons accept them; the units run as an account of their
own, bounded, in a sandbox that opens only what the environment file's settings need, exposure 2.0 at most."""
import importlib.util, json, os, re, shlex, shutil, signal, subprocess, sys, tempfile
from pathlib import Path
import pytest
from tests.artifacts import CACHE, build

REPO = Path(__file__).resolve().parents[1]
BINDIR = Path(sys.executable).parent   # the venv's console scripts (installed by `make setup`)
UNITS = ('camerad.service', 'modeld.service', 'dmonitoringd.service', 'modeld.target')
SERVICES = UNITS[:3]

spec = importlib.util.spec_from_file_location('systemd_install', REPO / 'systemd' / 'install.py')
install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install)

# what this venv's units get: read-only where the venv or the Python it runs (as Python itself tells: its binary and
# its base installation) is under a home directory, which ProtectHome=yes would hide
PROTECT_HOME = 'read-only' if any(install.under(Path(p), install.HOME_ROOTS) for p in (BINDIR, os.path.realpath(sys.executable), sys.base_prefix)) else 'yes'

def run_install(destdir: Path, *args: str, bindir: Path = BINDIR, installer: Path = REPO / 'systemd' / 'install.py') -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(installer), '--bindir', str(bindir), '--destdir', str(destdir), *args],
                        capture_output=True, text=True, timeout=60)

def install_here(d: Path, *args: str, bindir: Path, installer: Path = REPO / 'systemd' / 'install.py') -> subprocess.CompletedProcess:
  """An install on this machine (not staged), its units and environment file in d: what is refused writes nothing."""
  return subprocess.run([sys.executable, str(installer), '--bindir', str(bindir), '--unitdir', str(d / 'units'),
                         '--envfile', str(d / 'modeld.env'), *args], capture_output=True, text=True, timeout=60)

def staged_with(root: Path, settings: str, *args: str) -> Path:
  """An install staged under root whose environment file (there before it, so kept) holds these settings."""
  (env := root / 'etc/default/modeld').parent.mkdir(parents=True)
  env.write_text(settings)
  r = run_install(root, *args)
  assert r.returncode == 0, r.stderr
  return root

# a checkout where the units' sandboxing hides it (PrivateTmp=yes: under /tmp) cannot have a reachable venv beside it
CHECKOUT_HIDDEN = install.under(REPO, install.TMP_ROOTS) is not None

@pytest.fixture(scope='module')
def staged(tmp_path_factory) -> Path:
  root = tmp_path_factory.mktemp('root')
  r = run_install(root)
  assert r.returncode == 0, r.stderr
  return root

def unit_text(root: Path, unit: str) -> str: return (root / 'etc/systemd/system' / unit).read_text()

def directives(text: str) -> dict[str, list[str]]:
  out: dict[str, list[str]] = {}
  for line in text.splitlines():
    if '=' in line and not line.startswith(('#', '[')):
      k, v = line.split('=', 1)
      out.setdefault(k, []).append(v)
  return out

def test_install_layout(staged):
  assert sorted(p.name for p in (staged / 'etc/systemd/system').iterdir()) == sorted(UNITS)
  assert (staged / 'etc/default/modeld').read_text() == (REPO / 'systemd/modeld.env').read_text()

@pytest.mark.skipif(shutil.which('systemd-analyze') is None, reason='systemd-analyze is not installed')
@pytest.mark.parametrize('user', ['', 'modeld'])
def test_systemd_analyze_verify(tmp_path, user):
  r = run_install(tmp_path, *(['--user', user] if user else []))
  assert r.returncode == 0, r.stderr
  unitdir = tmp_path / 'etc/systemd/system'
  for unit in UNITS:
    # verify exits 0 on mere warnings (an unknown key, an unparsable value): a clean unit prints nothing at all
    v = subprocess.run(['systemd-analyze', 'verify', '--man=no', str(unitdir / unit)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, 'SYSTEMD_UNIT_PATH': f"{unitdir}:"})
    assert v.returncode == 0 and v.stdout + v.stderr == '', f"{unit}:\n{v.stdout}{v.stderr}"

@pytest.mark.skipif(shutil.which('systemd-analyze') is None, reason='systemd-analyze is not installed')
def test_verify_catches_a_broken_unit(staged, tmp_path):
  """The check above can fail: a wrong value, a missing binary."""
  text = unit_text(staged, 'modeld.service')
  for bad in (text.replace('WatchdogSec=10', 'WatchdogSec=ten'), text.replace(f"{BINDIR}/modeld ", f"{BINDIR}/no-such-modeld ")):
    (tmp_path / 'modeld.service').write_text(bad)
    v = subprocess.run(['systemd-analyze', 'verify', '--man=no', str(tmp_path / 'modeld.service')], capture_output=True, text=True, timeout=60)
    assert v.returncode != 0 or v.stderr, bad

def exposure(unit: Path) -> float:
  """`systemd-analyze security`'s exposure level of a unit file, rated offline (no running systemd needed: systemd 252
  and later); skips, saying why, where this machine cannot rate one."""
  if shutil.which('systemd-analyze') is None: pytest.skip('systemd-analyze is not installed')
  r = subprocess.run(['systemd-analyze', 'security', '--offline=yes', '--no-pager', str(unit)], capture_output=True, text=True, timeout=60,
                     env={**os.environ, 'SYSTEMD_UNIT_PATH': f"{unit.parent}:"})
  if m := re.search(r'Overall exposure level for \S+: ([\d.]+)', r.stdout): return float(m.group(1))
  if 'offline' in r.stderr: pytest.skip(f"this systemd-analyze rates no unit file offline (systemd 252 and later do): {r.stderr.strip()[:200]}")
  raise AssertionError(r.stdout[-2000:] + r.stderr)

# the settings that open the sandbox: the default (zmq, no TCP), shm (the real /tmp), MSGQ_TCP on loopback and on an
# address, and all of it with camerad on a comma device's bridge
SETTINGS = {'default': '', 'shm': 'MSGQ_TRANSPORT=shm\n', 'tcp-loopback': 'MSGQ_TCP=1\n', 'tcp': 'MSGQ_TCP=0.0.0.0\n',
            'everything': 'MSGQ_TRANSPORT=shm\nMSGQ_TCP=0.0.0.0\nCAMERA_SOURCE=bridge:192.168.43.1\n'}

@pytest.mark.parametrize('settings', SETTINGS)
def test_security_exposure(settings, tmp_path):
  """Each service's exposure is 2.0 at most (2.9 before: root, the real /tmp and IP always), whatever the settings
  open; with both the real /tmp and IP open, 0.1 more where the homes stay readable (ProtectHome=read-only: this
  venv's Python is under a home directory)."""
  root = staged_with(tmp_path, SETTINGS[settings])
  levels = {unit: exposure(root / 'etc/systemd/system' / unit) for unit in SERVICES}
  print(settings, levels)
  assert max(levels.values()) <= (2.1 if settings == 'everything' and PROTECT_HOME == 'read-only' else 2.0), levels

def test_own_user_limits_and_exit_codes(staged, tmp_path):
  """The services run as modeld, a system account the install declares for systemd-sysusers (and creates when
  missing: here, into a root of the test's); each has a memory and a task limit; 2 and 78 stop a unit for good."""
  for unit in SERVICES:
    d = directives(unit_text(staged, unit))
    assert d['User'] == ['modeld'] and d['RestartPreventExitStatus'] == ['2 78'], d
    assert re.fullmatch(r'\d+G', d['MemoryMax'][0]) and 0 < int(d['TasksMax'][0]) <= 1024, d
    assert d['UMask'] == ['0077'] and d['RuntimeDirectoryMode'] == ['0700'] and 'StateDirectory' not in d, d   # the artifacts: root's, read-only
  sysusers = staged / 'etc/sysusers.d/modeld.conf'
  assert sysusers.read_text().split()[:2] == ['u', 'modeld']
  if shutil.which('systemd-sysusers'):
    (tmp_path / 'sys/etc').mkdir(parents=True)
    r = subprocess.run(['systemd-sysusers', f"--root={tmp_path / 'sys'}", str(sysusers)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    entry = next(l for l in (tmp_path / 'sys/etc/passwd').read_text().splitlines() if l.startswith('modeld:')).split(':')
    assert int(entry[2]) < 1000 and entry[6].endswith('nologin'), entry   # a system account, no login
  for user, expect in (('root', None), ('nobody', ['nobody'])):
    root = tmp_path / user
    assert run_install(root, '--user', user).returncode == 0
    assert directives(unit_text(root, 'modeld.service')).get('User') == expect and not (root / 'etc/sysusers.d').exists()

def test_sandbox_follows_the_settings(tmp_path):
  """Each unit gets a private /tmp, AF_UNIX alone and no IP address unless its settings need more: the shm transport
  the real /tmp, MSGQ_TCP=1 IP on loopback, MSGQ_TCP=ADDRESS any IP, and a bridge: source any IP for camerad alone."""
  want = {'default': ('yes', 'AF_UNIX', None), 'shm': ('no', 'AF_UNIX', None), 'tcp-loopback': ('yes', 'AF_UNIX AF_INET AF_INET6', 'localhost'),
          'tcp': ('yes', 'AF_UNIX AF_INET AF_INET6', 'any')}
  for settings, (private, families, allow) in want.items():
    root = staged_with(tmp_path / settings, SETTINGS[settings])
    for unit in SERVICES:
      d = directives(unit_text(root, unit))
      got = (d['PrivateTmp'][0], d['RestrictAddressFamilies'][0], d.get('IPAddressAllow', [None])[0])
      assert got == (private, families, allow) and d['IPAddressDeny'] == ['any'], (settings, unit, got)
      assert d.get('ReadWritePaths') == (['/tmp'] if private == 'no' else None), (settings, unit)
  root = staged_with(tmp_path / 'bridge', 'CAMERA_SOURCE=bridge:192.168.43.1\n')
  assert {u: directives(unit_text(root, u)).get('IPAddressAllow') for u in SERVICES} == \
         {'camerad.service': ['any'], 'modeld.service': None, 'dmonitoringd.service': None}

def start_check(unit: str, env: dict[str, str]) -> subprocess.CompletedProcess:
  """A unit's ExecStartPre= (its text given) as systemd runs it: the environment file's settings in its environment."""
  return subprocess.run(shlex.split(directives(unit)['ExecStartPre'][0]), env={'PATH': '/usr/bin:/bin', **env}, capture_output=True, text=True,
                        timeout=60)

def test_start_check_refuses_settings_the_sandbox_lacks(staged):
  """Settings changed since the install that need more than the unit's sandbox (its /tmp private, its IP closed) stop
  the unit before its daemon starts, exit 78 (the machine's configuration), naming each and saying to install again;
  settings it allows pass, and so do the environment file's as installed."""
  env = install.read_env((staged / 'etc/default/modeld').read_text())
  camerad, modeld = unit_text(staged, 'camerad.service'), unit_text(staged, 'modeld.service')
  for text in (camerad, modeld):
    assert start_check(text, env).returncode == 0
  r = start_check(modeld, {**env, 'MSGQ_TRANSPORT': 'shm', 'MSGQ_TCP': '1'})
  assert r.returncode == 78 and 'MSGQ_TRANSPORT=shm needs the real /tmp' in r.stderr and 'MSGQ_TCP=1 needs IP on loopback' in r.stderr, r.stderr
  assert 'make install-services' in r.stderr, r.stderr
  r = start_check(camerad, {**env, 'CAMERA_SOURCE': 'bridge:192.168.43.1'})
  assert r.returncode == 78 and 'a bridge:HOST source needs IP; the unit allows none' in r.stderr, r.stderr
  assert start_check(modeld, {**env, 'CAMERA_SOURCE': 'bridge:192.168.43.1'}).returncode == 0   # modeld never reaches the device

def test_template_fields(staged, tmp_path):
  for unit in SERVICES:
    text, daemon = unit_text(staged, unit), unit.split('.')[0]
    d = directives(text)
    assert not re.search(r'@[A-Z_]+@', text)
    exe = shlex.split(d['ExecStart'][0])[0]
    assert exe == str(BINDIR / daemon) and os.access(exe, os.X_OK)
    assert d['EnvironmentFile'] == ['/etc/default/modeld']   # the path on the target, without DESTDIR
    assert d['ProtectHome'] == [PROTECT_HOME] and d['User'] == ['modeld']
    assert d['Type'] == ['notify'] and d['MemoryDenyWriteExecute'] == ['no']
  r = run_install(tmp_path, '--user', 'nobody', '--envfile', '/etc/modeld.conf', '--unitdir', '/usr/lib/systemd/system')
  assert r.returncode == 0, r.stderr
  d = directives((tmp_path / 'usr/lib/systemd/system/modeld.service').read_text())
  assert d['User'] == ['nobody'] and d['EnvironmentFile'] == ['/etc/modeld.conf'] and (tmp_path / 'etc/modeld.conf').is_file()
  # a venv under a home directory, or the Python it runs, stays readable to the services
  assert install.fields(Path('/home/u/tinymodeld/.venv/bin'), '/e', None)['PROTECT_HOME'] == 'read-only'
  assert install.fields(Path('/homework/.venv/bin'), '/e', None)['PROTECT_HOME'] == 'yes'
  assert install.fields(Path('/opt/m/.venv/bin'), '/e', None, (Path('/root/.pyenv/versions/3.11.7/bin/python3.11'),))['PROTECT_HOME'] == 'read-only'
  (tmp_path / 'home-link').symlink_to('/root')   # reached through a link into a home directory: read-only too, as hidden() sees it
  assert install.fields(tmp_path / 'home-link' / 'm/.venv/bin', '/e', None)['PROTECT_HOME'] == 'read-only'
  with pytest.raises(ValueError, match='@NOPE@'): install.render('X=@NOPE@\n', {})

def test_sandbox_block_identical(staged):
  blocks = [re.search(r'# --- sandbox.*?# --- end of sandbox', unit_text(staged, u), re.S).group(0) for u in SERVICES]
  assert blocks[0] == blocks[1] == blocks[2]
  assert 'RuntimeDirectoryPreserve=yes' in blocks[0] and 'MSGQ_RUNTIME_DIR=%t/modeld' in blocks[0]

def test_env_file_kept(tmp_path):
  env = tmp_path / 'etc/default/modeld'
  env.parent.mkdir(parents=True)
  env.write_text('ARTIFACTS=/srv/mine\n')
  r = run_install(tmp_path)
  assert r.returncode == 0 and 'kept' in r.stdout
  assert env.read_text() == 'ARTIFACTS=/srv/mine\n'

def test_installer_errors(tmp_path):
  r = subprocess.run([sys.executable, str(REPO / 'systemd/install.py'), '--bindir', str(tmp_path), '--destdir', str(tmp_path)], capture_output=True, text=True)
  assert r.returncode == 2 and 'make setup' in r.stderr
  r = subprocess.run([sys.executable, str(REPO / 'systemd/install.py'), '--bindir', str(BINDIR), '--envfile', 'rel/path', '--destdir', str(tmp_path)],
                     capture_output=True, text=True)
  assert r.returncode == 2 and 'absolute' in r.stderr

# ---- where the services could not start: the installer follows the scripts to their Python and refuses (nothing
# installed) what the units' sandboxing hides or the service user cannot reach

def fake_venv(root: Path, base: Path, copies: bool = False) -> Path:
  """root/.venv laid out as `python -m venv` lays it out from a Python installed at base (base/bin/python3.11 and the
  link python3 to it, made here): console scripts whose first line names .venv/bin/python, python -> python3 -> the
  base Python (copies: a file of its own, as --copies makes it) and pyvenv.cfg naming the base's bin folder. Returns
  its bin folder. The installer only follows the paths: nothing here is run."""
  (base / 'bin').mkdir(parents=True, exist_ok=True)
  (base / 'bin/python3.11').write_bytes(b'')
  (base / 'bin/python3.11').chmod(0o755)
  if not (base / 'bin/python3').is_symlink(): (base / 'bin/python3').symlink_to('python3.11')
  (bindir := root / '.venv/bin').mkdir(parents=True)
  if copies: shutil.copy(base / 'bin/python3.11', bindir / 'python3')
  else: (bindir / 'python3').symlink_to(base / 'bin/python3')
  (bindir / 'python').symlink_to('python3')
  (root / '.venv/pyvenv.cfg').write_text(f"home = {base / 'bin'}\ninclude-system-site-packages = false\nversion = 3.11.7\n")
  for s in ('camerad', 'modeld', 'dmonitoringd'):
    (bindir / s).write_text(f"#!{bindir / 'python'}\nimport sys\n")
    (bindir / s).chmod(0o755)
  return bindir

@pytest.fixture
def in_tmp():
  """A folder under /tmp itself (wherever pytest keeps its own), which PrivateTmp=yes hides from the services."""
  d = Path(tempfile.mkdtemp(dir='/tmp', prefix='modeld-install-'))
  d.chmod(0o755)
  yield d
  shutil.rmtree(d)

@pytest.fixture
def beside_checkout():
  """A folder beside this checkout's venv (under its .cache), which the units reach as they reach the checkout."""
  (parent := REPO / '.cache').mkdir(exist_ok=True)
  d = Path(tempfile.mkdtemp(dir=parent, prefix='modeld-install-'))
  d.chmod(0o755)
  yield d
  shutil.rmtree(d)

@pytest.mark.skipif(CHECKOUT_HIDDEN, reason='this checkout is under /tmp: no venv beside it is reachable by the services')
@pytest.mark.parametrize('copies', [False, True], ids=['links', 'copies'])
def test_a_python_the_sandbox_hides_is_refused(copies, beside_checkout, in_tmp, tmp_path):
  """The venv reachable, the Python it runs under /tmp (PrivateTmp=yes): refused, nothing installed, naming where the
  venv leads (followed through its links to the binary; for a venv of copies, the base Python's folder its pyvenv.cfg
  names), the setting and its units, and what to do."""
  bindir = fake_venv(beside_checkout, base := in_tmp / 'pyenv/versions/3.11.7', copies)
  r = install_here(tmp_path / 'here', bindir=bindir)
  assert r.returncode == 1 and not (tmp_path / 'here').exists(), r.stdout + r.stderr
  led_to = f"{base / 'bin'} (the base Python's folder" if copies else f"{base / 'bin/python3.11'} (the venv's Python)"
  assert led_to in r.stderr, r.stderr
  assert "PrivateTmp=yes gives the service an empty /tmp of its own (camerad.service, modeld.service, dmonitoringd.service)" in r.stderr, r.stderr
  assert "recreate the venv with a system Python" in r.stderr and str(bindir / 'modeld') not in r.stderr, r.stderr

def test_a_checkout_under_tmp_is_refused(in_tmp, tmp_path):
  """A checkout under /tmp: its console scripts are hidden from the services (PrivateTmp=yes): refused, nothing
  installed, the scripts named, with the fix. Staged (a package built under /tmp), the same is a warning."""
  bindir = fake_venv(in_tmp / 'checkout', in_tmp / 'python')
  r = install_here(tmp_path / 'here', bindir=bindir)
  assert r.returncode == 1 and not (tmp_path / 'here').exists(), r.stdout + r.stderr
  assert f"{bindir / 'modeld'} (a console script)" in r.stderr and "keep the checkout elsewhere" in r.stderr, r.stderr
  r = run_install(tmp_path / 'staged', bindir=bindir)
  assert r.returncode == 0 and "warning: staged, but from here the services could not start" in r.stderr, r.stderr
  assert f"{bindir / 'modeld'} (a console script)" in r.stderr and (tmp_path / 'staged/etc/systemd/system/modeld.service').is_file()

def test_the_sandbox_is_read_from_the_units(in_tmp, tmp_path):
  """The settings checked are the units' own: on the shm transport the units keep the real /tmp (PrivateTmp=no), so
  the /tmp checkout that the default's private /tmp refuses installs from them."""
  (env := tmp_path / 'root/etc/default/modeld').parent.mkdir(parents=True)
  env.write_text('MSGQ_TRANSPORT=shm\n')
  r = run_install(tmp_path / 'root', bindir=fake_venv(in_tmp / 'checkout', in_tmp / 'python'))
  assert r.returncode == 0 and 'could not start' not in r.stderr, r.stderr
  assert directives(unit_text(tmp_path / 'root', 'modeld.service'))['PrivateTmp'] == ['no']

def test_hidden_reads_protect_home_and_private_tmp():
  """What each setting hides (systemd.exec(5)), the last assignment of a setting winning, as systemd reads a unit."""
  def unit(home: str, tmp: str) -> str: return f"[Service]\nProtectHome={home}\nPrivateTmp={tmp}\n"
  py = Path('/root/.pyenv/versions/3.11.7/bin/python3.11')
  assert install.hidden(py, unit('yes', 'no')) == 'ProtectHome=yes hides /root'
  assert install.hidden(Path('/home/u/m/.venv/bin/modeld'), unit('tmpfs', 'no')) == 'ProtectHome=tmpfs hides /home'
  assert install.hidden(py, unit('read-only', 'no')) is None and install.hidden(Path('/homework/x'), unit('yes', 'no')) is None
  assert install.hidden(Path('/var/tmp/m/.venv/bin/modeld'), unit('yes', 'yes')) == 'PrivateTmp=yes gives the service an empty /var/tmp of its own'
  assert install.hidden(Path('/tmp/m/x'), unit('yes', 'no')) is None and install.hidden(Path('/tmpfs/x'), unit('yes', 'yes')) is None
  assert install.hidden(Path('/tmp/m/x'), unit('yes', 'yes') + 'PrivateTmp=no\n') is None

def test_pip_long_path_shebang(tmp_path):
  """A script whose Python's path is too long for a #! line (or has a space), as pip writes it: #!/bin/sh and an
  exec line; a script naming no Python is an error."""
  (s := tmp_path / 'modeld').write_text("#!/bin/sh\n'''exec' \"/opt/a b/.venv/bin/python\" \"$0\" \"$@\"\n' '''\nimport sys\n")
  assert install.shebang(s) == Path('/opt/a b/.venv/bin/python')
  s.write_text("import sys\n")
  with pytest.raises(ValueError, match="expected a first line naming its Python"): install.shebang(s)

def test_a_removed_python_is_refused(beside_checkout, tmp_path):
  """The venv's Python gone (its pyenv version uninstalled): refused, nothing staged, saying to recreate the venv."""
  bindir = fake_venv(beside_checkout, beside_checkout / 'python')
  shutil.rmtree(beside_checkout / 'python')
  r = run_install(tmp_path, bindir=bindir)
  assert r.returncode == 1 and not list(tmp_path.iterdir()) and "which is not there" in r.stderr and "rm -rf .venv" in r.stderr, r.stderr

@pytest.mark.skipif(os.geteuid() != 0, reason='checking another user needs root')
def test_a_python_the_service_user_cannot_reach_is_refused(in_tmp, tmp_path):
  """SERVICE_USER=nobody, the venv's Python under a folder of mode 0700 (as a pyenv under /root): the install (not
  staged: access is this machine's) is refused before anything is written, naming that folder and the user; the
  same venv passes once the folder is open."""
  (private := in_tmp / 'private').mkdir(mode=0o700)
  bindir = fake_venv(in_tmp / 'checkout', private / 'python')
  r = install_here(tmp_path, '--user', 'nobody', bindir=bindir)
  assert r.returncode == 1 and not list(tmp_path.iterdir()), r.stdout + r.stderr
  assert f"nobody cannot enter {private} (mode 0700" in r.stderr, r.stderr
  python = install.python_paths(bindir)
  assert len(install.problems(bindir, python, {}, 'nobody', check_access=True)) == 1, python
  private.chmod(0o755)
  assert install.problems(bindir, python, {}, 'nobody', check_access=True) == []

@pytest.mark.skipif(os.geteuid() != 0, reason='running as another user needs root')
def test_access_check_agrees_with_the_kernel():
  """For this checkout's venv: the installer finds nobody kept from it exactly when nobody cannot run a console script
  (the kernel's answer: exec or a read refused)."""
  found = install.problems(BINDIR, install.python_paths(BINDIR), {}, 'nobody', check_access=True)
  try: runs = subprocess.run([str(BINDIR / 'modeld'), '--help'], user='nobody', capture_output=True, timeout=120, cwd='/').returncode == 0
  except PermissionError: runs = False
  assert runs == (found == []), found

@pytest.mark.skipif(os.geteuid() != 0, reason='chown to another user needs root')
def test_unreachable(tmp_path):
  """A home directory of mode 0750 owned by someone else stops the services (root without capabilities included)."""
  home = tmp_path / 'home' / 'user'
  (home / 'venv').mkdir(parents=True)
  assert install.unreachable(home / 'venv', None) is None
  os.chown(home, 12345, 12345)
  home.chmod(0o750)
  assert install.unreachable(home / 'venv', None) == home
  home.chmod(0o751)
  assert install.unreachable(home / 'venv', None) is None

def test_make_target_passes_variables():
  r = subprocess.run(['make', '-n', '-C', str(REPO), 'install-services', 'DESTDIR=/tmp/stage', 'SERVICE_USER=modeld'], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  line = next(l for l in r.stdout.splitlines() if 'systemd/install.py' in l)
  args = shlex.split(line)
  assert args[args.index('--bindir') + 1] == str(REPO / '.venv/bin')
  assert args[args.index('--destdir') + 1] == '/tmp/stage' and args[args.index('--user') + 1] == 'modeld'

# ---- the environment file reaches the command line (systemd's rules: EnvironmentFile= lines are KEY=VALUE without
# expansion; in ExecStart= "${KEY}" is one argument and "$KEY" splits at whitespace, an empty one vanishing)

def exec_start(text: str, env: dict[str, str]) -> list[str]:
  argv = []
  for word in shlex.split(directives(text)['ExecStart'][0]):
    if m := re.fullmatch(r'\$\{(\w+)\}', word): argv.append(env.get(m.group(1), ''))
    elif m := re.fullmatch(r'\$(\w+)', word): argv += env.get(m.group(1), '').split()
    else: argv.append(word)
  return argv

def test_env_file_reaches_command_line(staged, tmp_path):
  env = install.read_env((staged / 'etc/default/modeld').read_text())
  assert exec_start(unit_text(staged, 'camerad.service'), env)[1:] == ['--source', 'synthetic:straight', '--loop']
  assert exec_start(unit_text(staged, 'modeld.service'), env)[1:] == ['--artifacts', '/var/lib/modeld/artifacts']
  # a user's edits, as in /etc/default/modeld
  scene = tmp_path / 'tiny.json'
  scene.write_text(json.dumps({'frames': 3, 'intrinsics': {c: {'width': 64, 'height': 48, 'focal_length': 80.0} for c in ('road', 'wide', 'driver')}}))
  prefix = os.environ['OPENPILOT_PREFIX']
  (tmp_path / 'modeld').write_text(f"ARTIFACTS={tmp_path}/my artifacts\nCAMERA_SOURCE=synthetic:{scene}\n"
                                   f"CAMERAD_ARGS=--fps 100 --cameras road\nMODELD_ARGS=--sensor os04c10 --camera-server cam2\n"
                                   f"DEV=CPU\nOPENPILOT_PREFIX={prefix}\n")
  env = install.read_env((tmp_path / 'modeld').read_text())
  run_dir = tempfile.mkdtemp(prefix='msgq')   # stands for %t/modeld, which the unit sets; short: unix socket paths are
  proc_env = {**os.environ, **env, 'MSGQ_RUNTIME_DIR': run_dir}
  cam = exec_start(unit_text(staged, 'camerad.service'), env)
  assert cam[1:] == ['--source', f'synthetic:{scene}', '--fps', '100', '--cameras', 'road']
  r = subprocess.run(cam, env=proc_env, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr   # served the 3 frames of the scene and ended
  md = exec_start(unit_text(staged, 'modeld.service'), env)
  assert md[1:] == ['--artifacts', f'{tmp_path}/my artifacts', '--sensor', 'os04c10', '--camera-server', 'cam2']
  shutil.copytree(build(CACHE.parent / 'tiny', models='tiny'), tmp_path / 'my artifacts')   # checked before any camera
  # modeld accepts them: it loads the artifact, waits for camera server cam2 (no usage error), stops cleanly on SIGTERM
  p = subprocess.Popen(md, env=proc_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    seen = ''
    while 'cam2' not in seen and (line := p.stdout.readline()): seen += line
    assert "waiting for camera server 'cam2'" in seen, seen
  finally:
    p.send_signal(signal.SIGTERM)
    out = p.communicate(timeout=30)[0]
  assert p.returncode == 0, out
  shutil.rmtree(run_dir)

def test_the_units_run_from_the_base_install_and_the_camera_extra():
  """What the units start imports nothing beyond `pip install '.[camera]'`: the daemons the base install alone, camerad
  PyAV and zstandard besides (the tools, Ray and the test suite's packages are not needed on a car or a server)."""
  from tests.daemon_harness import beyond_base_install
  from tests.artifacts import CACHE, LAYOUT, ALT_LAYOUT, build
  build()   # then modeld-compile below runs its whole path and finds the artifacts up to date
  compile_args = ['--reference', '--quiet', '--out', str(CACHE), '--camera', str(LAYOUT), '--camera', str(ALT_LAYOUT)]
  for module, run, extra in (('modeld.main', 'pass', set()), ('dmonitoringd.main', 'pass', set()), ('camerad.main', 'pass', {'av', 'zstandard'}),
                             ('modelrt.compile', f"modelrt.compile.main({compile_args!r})", set())):
    r = subprocess.run([sys.executable, '-c', f"import sys, {module}; {run}; print(' '.join(sys.modules))"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert beyond_base_install(r.stdout.splitlines()[-1].split()) == extra, module   # main may print before
