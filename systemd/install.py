"""Install the modeld stack's systemd units: fill the templates of this folder and copy them to the unit directory.

Run by `make install-services` (see systemd/README.md). ExecStart points at the console scripts of the
virtual environment in `--bindir`; `--destdir` stages everything under another root (packaging, tests) and never
reloads systemd. The environment file is created once and never overwritten: it holds the user's settings.
"""
import argparse, os, re, subprocess, sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
UNITS = ('camerad.service', 'modeld.service', 'dmonitoringd.service', 'modeld.target')
# a venv under a home directory must stay readable to the services: ProtectHome=read-only instead of yes
HOME_ROOTS = ('/home', '/root', '/run/user')

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

def fields(bindir: Path, envfile: str, user: str | None) -> dict[str, str | None]:
  protect_home = 'read-only' if any(str(bindir) == r or str(bindir).startswith(r + '/') for r in HOME_ROOTS) else 'yes'
  return {'BINDIR': str(bindir), 'ENVFILE': envfile, 'USER': user, 'PROTECT_HOME': protect_home}

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

def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog='install.py', description='Install the systemd units of camerad, modeld and dmonitoringd.')
  p.add_argument('--bindir', type=Path, default=Path(sys.executable).parent, help='folder of the console scripts (default: this Python\'s)')
  p.add_argument('--unitdir', default='/etc/systemd/system', help='where the units go (default: %(default)s)')
  p.add_argument('--envfile', default='/etc/default/modeld', help='environment file the units read (default: %(default)s)')
  p.add_argument('--destdir', default='', help='stage under this root instead of / (no daemon-reload)')
  p.add_argument('--user', default='', help='run the services as this existing user (and its primary group) (default: root)')
  args = p.parse_args(argv)

  bindir = args.bindir.absolute()
  missing = [b for b in ('camerad', 'modeld', 'dmonitoringd') if not os.access(bindir / b, os.X_OK)]
  if missing: p.error(f"{', '.join(missing)} not found in {bindir}: run `make setup` first (or give --bindir)")
  for name, path in (('--unitdir', args.unitdir), ('--envfile', args.envfile)):
    if not os.path.isabs(path): p.error(f"{name}: expected an absolute path, got {path!r}")
  try:   # a staged install (--destdir) is for another root: its users and folders are not this machine's
    if not args.destdir and (d := unreachable(bindir, args.user or None)) is not None:
      print(f"warning: {d} is not searchable by {args.user or 'root without capabilities'}: the services cannot reach {bindir}; "
            f"allow it (chmod o+x {d}) or keep the checkout elsewhere", file=sys.stderr)
  except KeyError:
    p.error(f"--user: no user {args.user!r} on this machine (create it first, e.g. useradd --system {args.user})")
  root = Path(args.destdir or '/')
  unitdir, envfile = root / args.unitdir.lstrip('/'), root / args.envfile.lstrip('/')
  f = fields(bindir, args.envfile, args.user or None)
  unitdir.mkdir(parents=True, exist_ok=True)
  for unit in UNITS:
    src = HERE / unit if (HERE / unit).exists() else HERE / f"{unit}.in"
    (unitdir / unit).write_text(render(src.read_text(), f))
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
