"""Install the modeld stack's systemd units: fill the templates of this folder and copy them to the unit directory.

Run by `make install-services` (see systemd/README.md). The environment file is created once and never overwritten (it
holds the user's settings), and each unit's sandbox opens what its settings need (needs()); nothing is installed where
the services could not start (problems()). `--check` is the units' start check: settings that need more than the sandbox."""
import argparse, ipaddress, os, re, shlex, shutil, stat, subprocess, sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
UNITS = ('camerad.service', 'modeld.service', 'dmonitoringd.service', 'modeld.target')
SERVICES = UNITS[:3]
SCRIPTS = ('camerad', 'modeld', 'dmonitoringd')
# a venv (or the Python it runs) under a home directory must stay readable to the services: ProtectHome=read-only
HOME_ROOTS = ('/home', '/root', '/run/user')
TMP_ROOTS = ('/tmp', '/var/tmp')   # what PrivateTmp= replaces with the service's own empty folders
MOVE_CHECKOUT = "keep the checkout elsewhere (and run make setup there)"
SYSTEM_PYTHON = "recreate the venv with a system Python (in the checkout: rm -rf .venv && PATH=/usr/bin:$PATH make setup)"
DEFAULT_USER = 'modeld'   # the services' own system account, created at install when missing (sysusers.d)
SYSUSERS = f'u {DEFAULT_USER} - "modeld stack (camerad, modeld, dmonitoringd)"\n'
IP = ('none', 'localhost', 'any')   # what a unit may reach over IP, least first
EX_CONFIG = 78

def render(template: str, fields: dict[str, str | None]) -> str:
  """Replace each @KEY@; a line whose field is None is left out (e.g. User= when the services run as root)."""
  out = []
  for line in template.splitlines(keepends=True):
    keys = [k for k in fields if f"@{k}@" in line]
    if any(fields[k] is None for k in keys): continue
    for k in keys: line = line.replace(f"@{k}@", fields[k])
    out.append(line)
  text = ''.join(out)
  if left := re.findall(r'@[A-Z_]+@', text): raise ValueError(f"template fields with no value: {', '.join(sorted(set(left)))}")
  return text

def under(path: Path, roots: tuple[str, ...]) -> str | None:
  """The one of roots that path is (or is below), if any."""
  return next((r for r in roots if str(path) == r or str(path).startswith(r + '/')), None)

def forms(path: Path) -> list[Path]:
  """A path as written and as it resolves, what a service reaches it by: a link into /root is under /root."""
  return list(dict.fromkeys([path, path.resolve()]))

def fields(bindir: Path, envfile: str, user: str | None, python: tuple[Path, ...] = ()) -> dict[str, str | None]:
  """The templates' fields but the sandbox's (sandbox()). python: the paths the scripts' Python runs from
  (python_paths); like the venv, one under a home directory needs the homes read-only rather than hidden."""
  protect_home = 'read-only' if any(under(f, HOME_ROOTS) for p in [bindir, *python] for f in forms(p)) else 'yes'
  return {'BINDIR': str(bindir), 'ENVFILE': envfile, 'USER': user, 'PROTECT_HOME': protect_home}

def read_env(text: str) -> dict[str, str]:
  """An environment file as systemd reads it: KEY=VALUE lines, # and ; comments, quotes around a value removed."""
  env = {}
  for line in map(str.strip, text.splitlines()):
    if line and line[0] not in '#;' and '=' in line:
      k, v = line.split('=', 1)
      env[k.strip()] = v.strip().strip('"\'')
  return env

def needs(env: dict[str, str], daemon: str) -> tuple[bool, str]:
  """What a daemon needs of its sandbox with these settings: the real /tmp (the shm transport: VisionIPC's socket is
  where openpilot's processes look for it), and which IP (of IP): MSGQ_TCP on loopback (1, or a loopback address)
  'localhost', at another address 'any'; camerad's bridge:HOST source 'any'."""
  tcp, ip = env.get('MSGQ_TCP', ''), 'none'
  if tcp not in ('', '0'):
    try: ip = 'localhost' if tcp in ('1', 'localhost') or ipaddress.ip_address(tcp).is_loopback else 'any'
    except ValueError: ip = 'any'   # a host name: msgq binds what it resolves to
  if daemon == 'camerad' and any(w.startswith('bridge:') for w in shlex.split(f"{env.get('CAMERA_SOURCE', '')} {env.get('CAMERAD_ARGS', '')}")):
    ip = 'any'
  return env.get('MSGQ_TRANSPORT', 'zmq') == 'shm', ip

def sandbox(python: Path, env: dict[str, str], daemon: str) -> dict[str, str | None]:
  """The fields of a unit's sandbox that its settings decide (needs()): a private /tmp unless the real one is needed,
  AF_UNIX alone and no IP address unless IP is, and the start check that holds the settings to them."""
  tmp, ip = needs(env, daemon)
  return {'PRIVATE_TMP': 'no' if tmp else 'yes', 'REAL_TMP': '/tmp' if tmp else None,
          'FAMILIES': 'AF_UNIX' + ('' if ip == 'none' else ' AF_INET AF_INET6'), 'IP_ALLOW': None if ip == 'none' else ip,
          'CHECK': f"{python} {HERE / 'install.py'} --check {daemon} {'real-tmp' if tmp else 'private-tmp'} {ip}"}

def check(env: dict[str, str], daemon: str, tmp: str, ip: str) -> list[str]:
  """What of these settings needs more than the sandbox the unit was installed with (a private or the real /tmp, the
  IP it allows), each naming the setting."""
  need_tmp, need_ip = needs(env, daemon)
  out = []
  if need_tmp and tmp != 'real-tmp':
    out.append("MSGQ_TRANSPORT=shm needs the real /tmp (VisionIPC's socket, where openpilot's processes look for it); the unit has a private one")
  if IP.index(need_ip) > IP.index(ip):
    why = f"MSGQ_TCP={env.get('MSGQ_TCP')}" if needs({**env, 'CAMERA_SOURCE': '', 'CAMERAD_ARGS': ''}, daemon)[1] == need_ip else "a bridge:HOST source"
    out.append(f"{why} needs {'IP on loopback' if need_ip == 'localhost' else 'IP'}; the unit allows {'none' if ip == 'none' else 'loopback only'}")
  return out

def shebang(script: Path) -> Path:
  """The Python a console script runs: its #! line, or under #!/bin/sh the exec line pip writes instead when the path
  is long or has a space. ValueError for a script that names no Python by an absolute path."""
  with open(script, 'rb') as f: lines = f.read(4096).decode(errors='replace').splitlines()
  first, exe = (lines or [''])[0], ''
  if first.startswith('#!/bin/sh') and len(lines) > 1 and (m := re.match(r"'''exec' (\"[^\"]+\"|\S+)", lines[1])): exe = m.group(1).strip('"')
  elif first.startswith('#!') and (words := first[2:].split()): exe = words[0]
  if not os.path.isabs(exe): raise ValueError(f"{script}: expected a first line naming its Python by an absolute path, got {first[:100]!r}")
  return Path(exe)

def python_paths(bindir: Path) -> list[tuple[Path, str]]:
  """What the console scripts of bindir need to start besides themselves, each with what it is: the Python their
  first line names, each link on the way to its binary and the binary, and the base Python's folder that the venv's
  pyvenv.cfg names (`home`: the standard library is found from it). ValueError for a Python that is not there."""
  out: list[tuple[Path, str]] = []
  for exe in dict.fromkeys(shebang(bindir / s) for s in SCRIPTS):
    p, seen = exe, set()
    while p.is_symlink():
      if p in seen: raise ValueError(f"{exe}: the links loop at {p}")
      seen.add(p)
      out.append((p, "the venv's Python, a link"))
      p = Path(os.path.normpath(p.parent / os.readlink(p)))
    if not p.is_file():
      raise ValueError(f"the scripts' Python {exe} leads to {p}, which is not there (was that Python removed?): "
                       f"recreate the venv: rm -rf .venv && make setup")
    out.append((p, "the venv's Python"))
    for cfg in (exe.parent / 'pyvenv.cfg', exe.parent.parent / 'pyvenv.cfg'):   # where Python itself looks for it
      if cfg.is_file():
        keys = {k.strip(): v.strip() for k, _, v in (line.partition('=') for line in cfg.read_text().splitlines())}
        if (home := keys.get('home')) and not Path(home).is_dir():
          raise ValueError(f"{cfg} names the base Python's folder {home}, which is not there (was that Python removed?): "
                           f"recreate the venv: rm -rf .venv && make setup")
        if home: out.append((Path(home), f"the base Python's folder, home in {cfg}"))
        break
  return list(dict.fromkeys(out))

def setting(unit: str, key: str) -> str:
  """A setting of a unit's text as systemd takes it (the last assignment wins); '' where there is none."""
  values = [v.strip() for k, eq, v in (line.partition('=') for line in unit.splitlines()) if eq and k.strip() == key]
  return values[-1] if values else ''

def hidden(path: Path, unit: str) -> str | None:
  """Why the unit's own sandboxing keeps its service from path, or None: ProtectHome=yes makes the home directories
  inaccessible and tmpfs empties them (read-only leaves them readable); PrivateTmp= gives the service empty /tmp and
  /var/tmp of its own. Each of the path's forms: a link into /tmp is as hidden."""
  for p in forms(path):
    if (root := under(p, HOME_ROOTS)) and (v := setting(unit, 'ProtectHome')) in ('yes', 'true', 'on', '1', 'tmpfs'):
      return f"ProtectHome={v} hides {root}"
    if (root := under(p, TMP_ROOTS)) and (v := setting(unit, 'PrivateTmp')) not in ('', 'no', 'false', 'off', '0'):
      return f"PrivateTmp={v} gives the service an empty {root} of its own"
  return None

def unreachable(path: Path, user: str | None) -> Path | None:
  """The first folder on the way to `path` that the services cannot enter: they run as `user` (or as root without
  capabilities, CapabilityBoundingSet= is empty, so root gets no override of permissions either); a user the install
  is to create owns nothing and is in no group yet."""
  import grp, pwd
  try: pw = pwd.getpwnam(user) if user else pwd.getpwuid(0)
  except KeyError: uid, groups = None, set()
  else: uid, groups = pw.pw_uid, {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem}
  for d in [*reversed(path.parents), path]:
    st = d.stat()
    bit = 0o100 if st.st_uid == uid else 0o010 if st.st_gid in groups else 0o001
    if not st.st_mode & bit: return d
  return None

def problems(bindir: Path, python: list[tuple[Path, str]], units: dict[str, str], user: str | None, check_access: bool) -> list[str]:
  """What would keep the services from starting, each naming the paths it concerns and what to do: a console script or
  a path of their Python (python_paths) that the units' sandboxing hides, or (check_access) that the service user
  cannot reach."""
  found: dict[str, list[str]] = {}   # what and what to do -> the paths it concerns
  for path, what in [*((bindir / s, 'a console script') for s in SCRIPTS), (HERE, "the units' start check (install.py)"), *python]:
    checkout = under(path, (str(bindir.parent),)) is not None   # the venv itself: moving the checkout moves it
    why: dict[str, list[str]] = {}
    for name, text in units.items():
      if (h := hidden(path, text)) is not None: why.setdefault(h, []).append(name)
    for h, names in why.items():
      found.setdefault(f"{h} ({', '.join(names)}), where the services would not find it: "
                       f"{MOVE_CHECKOUT if checkout else 'install with a Python outside it: ' + SYSTEM_PYTHON}", []).append(f"{path} ({what})")
    if check_access and (d := unreachable(path, user)) is not None:
      st = d.stat()
      found.setdefault(f"{user or 'root without capabilities'} cannot enter {d} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}), "
                       f"so the services could not start: allow it (chmod o+x {d}), or {MOVE_CHECKOUT if checkout else SYSTEM_PYTHON}",
                       []).append(f"{path} ({what})")
  return [f"{', '.join(paths)}: {why}" for why, paths in found.items()]

def described(unit: str) -> str:
  """A unit's sandbox in words, from its text."""
  tmp = 'the real /tmp' if setting(unit, 'PrivateTmp') == 'no' else 'a private /tmp'
  ip = {'': 'no IP', 'localhost': 'IP on loopback', 'any': 'IP'}[setting(unit, 'IPAddressAllow')]
  return f"{tmp}, {ip}, as {setting(unit, 'User') or 'root'}"

def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog='install.py', description='Install the systemd units of camerad, modeld and dmonitoringd.')
  p.add_argument('--bindir', type=Path, default=Path(sys.executable).parent, help='folder of the console scripts (default: this Python\'s)')
  p.add_argument('--unitdir', default='/etc/systemd/system', help='where the units go (default: %(default)s)')
  p.add_argument('--envfile', default='/etc/default/modeld', help='environment file the units read (default: %(default)s)')
  p.add_argument('--destdir', default='', help='stage under this root instead of / (no daemon-reload, no user created)')
  p.add_argument('--user', default='', help=f"run the services as this user and its primary group: an existing account (openpilot's, to run "
                 f"beside it), or root (default: {DEFAULT_USER}, a system account of their own, created when missing)")
  p.add_argument('--check', nargs=3, metavar=('DAEMON', 'TMP', 'IP'), help="the units' start check (ExecStartPre=): exit 78 naming each "
                 "setting of this environment that needs more than the unit's sandbox (TMP private-tmp or real-tmp, IP none, localhost or any)")
  args = p.parse_args(argv)
  if args.check:
    daemon, tmp, ip = args.check
    if found := check(dict(os.environ), daemon, tmp, ip):
      print(f"{daemon}.service was installed for other settings: {'; '.join(found)}. Install the units again, which opens what the "
            "environment file's settings need (make install-services in the checkout), then: systemctl restart modeld.target", file=sys.stderr)
      return EX_CONFIG
    return 0

  bindir, user = args.bindir.absolute(), args.user or DEFAULT_USER
  service_user = None if user == 'root' else user
  missing = [b for b in SCRIPTS if not os.access(bindir / b, os.X_OK)]
  if missing: p.error(f"{', '.join(missing)} not found in {bindir}: run `make setup` first (or give --bindir)")
  for name, path in (('--unitdir', args.unitdir), ('--envfile', args.envfile)):
    if not os.path.isabs(path): p.error(f"{name}: expected an absolute path, got {path!r}")
  create = False   # the default user, missing on this machine: made before the units are written
  if service_user and not args.destdir:   # a staged install is for another root, whose users need not be this machine's
    import pwd
    try: pwd.getpwnam(user)
    except KeyError:
      if user != DEFAULT_USER: p.error(f"--user: no user {user!r} on this machine (create it first, e.g. useradd --system {user})")
      create = True
  try: python = python_paths(bindir)
  except (OSError, ValueError) as e:
    print(f"install.py: nothing installed: {e}", file=sys.stderr)
    return 1
  root = Path(args.destdir or '/')
  unitdir, envfile, sysusers = root / args.unitdir.lstrip('/'), root / args.envfile.lstrip('/'), root / 'etc/sysusers.d' / f"{DEFAULT_USER}.conf"
  env = read_env((envfile if envfile.exists() else HERE / 'modeld.env').read_text())   # the settings the units will run with
  f, exe = fields(bindir, args.envfile, service_user, tuple(path for path, _ in python)), shebang(bindir / 'modeld')
  units = {u: render((HERE / u if (HERE / u).exists() else HERE / f"{u}.in").read_text(), {**f, **sandbox(exe, env, u.split('.')[0])})
           for u in UNITS}
  # a staged install (a package built under /tmp, say) is only warned: its root's paths and users may differ from
  # this machine's; an install here is refused, before anything is written
  if found := problems(bindir, python, units, service_user, check_access=not args.destdir):
    head = "warning: staged, but from here" if args.destdir else "nothing installed,"
    print(f"install.py: {head} the services could not start:\n" + "\n".join(f"  - {x}" for x in found), file=sys.stderr)
    if not args.destdir: return 1
  if create and not shutil.which('systemd-sysusers'):
    print(f"install.py: nothing installed: no systemd-sysusers to create the services' user {user}: create it (useradd --system {user}), "
          "or give --user", file=sys.stderr)
    return 1
  if user == DEFAULT_USER:   # declared for systemd-sysusers, which makes it (here now, or at boot from a staged package)
    sysusers.parent.mkdir(parents=True, exist_ok=True)
    sysusers.write_text(SYSUSERS)
    print(f"installed {sysusers}")
    if create:
      subprocess.run(['systemd-sysusers', str(sysusers)], check=True)
      print(f"created the system user {user}")
  unitdir.mkdir(parents=True, exist_ok=True)
  for unit, text in units.items():
    (unitdir / unit).write_text(text)
    (unitdir / unit).chmod(0o644)
    print(f"installed {unitdir / unit}" + (f" ({described(text)})" if unit in SERVICES else ''))
  if envfile.exists(): print(f"kept {envfile} (your settings; the defaults are in {HERE / 'modeld.env'})")
  else:
    envfile.parent.mkdir(parents=True, exist_ok=True)
    envfile.write_text((HERE / 'modeld.env').read_text())
    envfile.chmod(0o644)
    print(f"created {envfile}")
  if not args.destdir and os.path.isdir('/run/systemd/system'):   # sd_booted(): systemd is the running init
    subprocess.run(['systemctl', 'daemon-reload'], check=True)
    print("reloaded systemd")
  if not args.destdir:
    print(f"next: build the artifacts into ARTIFACTS (see {args.envfile}), then: systemctl enable --now modeld.target. The sandboxes follow "
          f"{args.envfile}: after changing MSGQ_TRANSPORT, MSGQ_TCP or a bridge: source there, install again")
  return 0

if __name__ == '__main__':
  sys.exit(main())
