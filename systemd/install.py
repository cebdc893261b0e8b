"""Install the modeld stack's systemd units: fill the templates of this folder and copy them to the unit directory.

Run by `make install-services` (see systemd/README.md). The environment file is created once and never overwritten (it
holds the user's settings); nothing is installed where the services could not start (problems()).
"""
import argparse, os, re, stat, subprocess, sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
UNITS = ('camerad.service', 'modeld.service', 'dmonitoringd.service', 'modeld.target')
SCRIPTS = ('camerad', 'modeld', 'dmonitoringd')
# a venv (or the Python it runs) under a home directory must stay readable to the services: ProtectHome=read-only
HOME_ROOTS = ('/home', '/root', '/run/user')
TMP_ROOTS = ('/tmp', '/var/tmp')   # what PrivateTmp= replaces with the service's own empty folders
MOVE_CHECKOUT = "keep the checkout elsewhere (and run make setup there)"
SYSTEM_PYTHON = "recreate the venv with a system Python (in the checkout: rm -rf .venv && PATH=/usr/bin:$PATH make setup)"

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
  """The templates' fields. python: the paths the scripts' Python runs from (python_paths); like the venv, one under a
  home directory needs the homes read-only rather than hidden."""
  protect_home = 'read-only' if any(under(f, HOME_ROOTS) for p in [bindir, *python] for f in forms(p)) else 'yes'
  return {'BINDIR': str(bindir), 'ENVFILE': envfile, 'USER': user, 'PROTECT_HOME': protect_home}

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
  capabilities, CapabilityBoundingSet= is empty, so root gets no override of permissions either)."""
  import grp, pwd
  pw = pwd.getpwnam(user) if user else pwd.getpwuid(0)
  groups = {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem}
  for d in [*reversed(path.parents), path]:
    st = d.stat()
    bit = 0o100 if st.st_uid == pw.pw_uid else 0o010 if st.st_gid in groups else 0o001
    if not st.st_mode & bit: return d
  return None

def problems(bindir: Path, python: list[tuple[Path, str]], units: dict[str, str], user: str | None, check_access: bool) -> list[str]:
  """What would keep the services from starting, each naming the paths it concerns and what to do: a console script or
  a path of their Python (python_paths) that the units' sandboxing hides, or (check_access) that the service user
  cannot reach."""
  found: dict[str, list[str]] = {}   # what and what to do -> the paths it concerns
  for path, what in [*((bindir / s, 'a console script') for s in SCRIPTS), *python]:
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

def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog='install.py', description='Install the systemd units of camerad, modeld and dmonitoringd.')
  p.add_argument('--bindir', type=Path, default=Path(sys.executable).parent, help='folder of the console scripts (default: this Python\'s)')
  p.add_argument('--unitdir', default='/etc/systemd/system', help='where the units go (default: %(default)s)')
  p.add_argument('--envfile', default='/etc/default/modeld', help='environment file the units read (default: %(default)s)')
  p.add_argument('--destdir', default='', help='stage under this root instead of / (no daemon-reload)')
  p.add_argument('--user', default='', help='run the services as this existing user (and its primary group) (default: root)')
  args = p.parse_args(argv)

  bindir = args.bindir.absolute()
  missing = [b for b in SCRIPTS if not os.access(bindir / b, os.X_OK)]
  if missing: p.error(f"{', '.join(missing)} not found in {bindir}: run `make setup` first (or give --bindir)")
  for name, path in (('--unitdir', args.unitdir), ('--envfile', args.envfile)):
    if not os.path.isabs(path): p.error(f"{name}: expected an absolute path, got {path!r}")
  if args.user and not args.destdir:   # a staged install is for another root, whose users need not be this machine's
    import pwd
    try: pwd.getpwnam(args.user)
    except KeyError: p.error(f"--user: no user {args.user!r} on this machine (create it first, e.g. useradd --system {args.user})")
  try: python = python_paths(bindir)
  except (OSError, ValueError) as e:
    print(f"install.py: nothing installed: {e}", file=sys.stderr)
    return 1
  f = fields(bindir, args.envfile, args.user or None, tuple(path for path, _ in python))
  units = {u: render((HERE / u if (HERE / u).exists() else HERE / f"{u}.in").read_text(), f) for u in UNITS}
  # a staged install (a package built under /tmp, say) is only warned: its root's paths and users may differ from
  # this machine's; an install here is refused, before anything is written
  if found := problems(bindir, python, units, args.user or None, check_access=not args.destdir):
    head = "warning: staged, but from here" if args.destdir else "nothing installed,"
    print(f"install.py: {head} the services could not start:\n" + "\n".join(f"  - {x}" for x in found), file=sys.stderr)
    if not args.destdir: return 1
  root = Path(args.destdir or '/')
  unitdir, envfile = root / args.unitdir.lstrip('/'), root / args.envfile.lstrip('/')
  unitdir.mkdir(parents=True, exist_ok=True)
  for unit, text in units.items():
    (unitdir / unit).write_text(text)
    (unitdir / unit).chmod(0o644)
    print(f"installed {unitdir / unit}")
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
    print(f"next: build the artifacts into ARTIFACTS (see {args.envfile}), then: systemctl enable --now modeld.target")
  return 0

if __name__ == '__main__':
  sys.exit(main())
