"""What the stack makes on disk is its own user's: folders 0700, files and sockets 0600, whatever the umask. MSGQ_GROUP (a
group name or id) makes that group's accounts part of the stack (a UI of another account): 0770 / 0660 and that group.
A path that is a symlink, or that another account owns (not root, not of MSGQ_GROUP), is refused by name (NotOwnedError)."""
import errno, grp, os, pwd, socket, stat, struct
from pathlib import Path

_UCRED = struct.Struct("3i")   # struct ucred: pid, uid, gid

class NotOwnedError(PermissionError):
  """A path or peer of another account's, or a symlink where the stack keeps its own files."""

def group() -> int | None:
  """MSGQ_GROUP's gid (unset or empty: None); ValueError naming it when no such group exists."""
  if not (g := os.environ.get("MSGQ_GROUP", "")): return None
  try: return int(g) if g.isdigit() else grp.getgrnam(g).gr_gid
  except KeyError: raise ValueError(f"MSGQ_GROUP names no group of this machine: {g!r}") from None

def modes() -> tuple[int, int]:
  """(folder mode, file mode): 0o700 / 0o600, or 0o770 / 0o660 under MSGQ_GROUP (its readers write read pointers)."""
  return (0o700, 0o600) if group() is None else (0o770, 0o660)

def trusted(uid: int, gid: int | None = None) -> bool:
  """Ours, root's, or (a file's gid given) of MSGQ_GROUP's: anything else belongs to another account."""
  return uid in (os.geteuid(), 0) or (gid is not None and gid == group())

def account(uid: int) -> str:
  """'uid 65534 (nobody)': a uid as messages name it."""
  try: return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
  except KeyError: return f"uid {uid}"

def check(path: str, st: os.stat_result, what: str) -> os.stat_result:
  """st (an lstat or fstat of path) if it is no symlink and ours or root's; NotOwnedError naming what it is else."""
  if stat.S_ISLNK(st.st_mode): raise NotOwnedError(f"{what} {path} is a symlink: refused, the stack never follows one")
  if not trusted(st.st_uid, st.st_gid):
    raise NotOwnedError(f"{what} {path} belongs to {account(st.st_uid)}, not to this stack's user ({os.geteuid()}): refused; "
                        f"remove it if no process of that account uses it")
  return st

def _own(fd_or_path: int | str, st: os.stat_result, mode: int) -> None:
  """Set mode and MSGQ_GROUP's group on what we own (root's own is left as it is if we are not root)."""
  if st.st_uid != os.geteuid(): return
  if (g := group()) is not None and st.st_gid != g: os.chown(fd_or_path, -1, g)
  if stat.S_IMODE(st.st_mode) != mode: os.chmod(fd_or_path, mode)

def private_dir(path: str, what: str = "folder") -> str:
  """Make the folder path (its parent must exist) or take the one there: ours or root's, no symlink; ours gets the
  folder mode. Returns path."""
  try: os.mkdir(path, 0o700)
  except FileExistsError: pass
  st = check(path, os.lstat(path), what)
  if not stat.S_ISDIR(st.st_mode): raise NotOwnedError(f"{what} {path} is not a folder: refused")
  _own(path, st, modes()[0])
  return path

def private_dirs(path: str, what: str = "folder") -> str:
  """private_dir of path, and first of each folder above it that does not exist yet (those that exist are left as they
  are). Returns path."""
  missing = [str(p) for p in Path(path).parents if not os.path.lexists(p)]
  for p in reversed(missing): private_dir(p, what)
  return private_dir(path, what)

def open_private(path: str, flags: int, what: str = "file") -> int:
  """os.open(path, flags) that never follows a symlink and refuses a file of another account (the fd is closed
  then); a file of ours gets the file mode, whoever made it. Returns the fd."""
  try: fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
  except OSError as e:
    if e.errno == errno.ELOOP: raise NotOwnedError(f"{what} {path} is a symlink: refused, the stack never follows one") from None
    if e.errno in (errno.EACCES, errno.EPERM):   # another account's file (0600, or O_CREAT in sticky /tmp: protected_regular)
      try: check(path, os.lstat(path), what)
      except FileNotFoundError: pass
    raise
  try:
    st = check(path, os.fstat(fd), what)
    if not stat.S_ISREG(st.st_mode): raise NotOwnedError(f"{what} {path} is not a plain file: refused")
    _own(fd, st, modes()[1])
  except BaseException:
    os.close(fd)
    raise
  return fd

def private_umask() -> None:
  """From now on what this process (and a child it starts) creates is at most the stack's modes, whatever umask it got:
  for tools writing plain files (pictures of the cabin, a job's outputs and summary)."""
  os.umask(os.umask(0) | (0o077 if group() is None else 0o007))

def check_code(path: str, what: str) -> None:
  """NotOwnedError unless only we or root can change path (a file or folder whose contents this process runs, as an
  artifact's pickles): its owner one of us, no write by others, nor by a group other than its owner's own private one."""
  st = os.stat(path)
  if st.st_uid not in (os.geteuid(), 0):
    raise NotOwnedError(f"{what} {path} belongs to {account(st.st_uid)}: whoever can change it runs code as this process; refused")
  if st.st_mode & 0o002 or (st.st_mode & 0o020 and not _private_group(st.st_uid, st.st_gid)):
    raise NotOwnedError(f"{what} {path} is writable by other accounts (mode {stat.S_IMODE(st.st_mode):04o}): whoever can change "
                        f"it runs code as this process; refused (chmod go-w)")

def _private_group(uid: int, gid: int) -> bool:
  """gid is the user-private group of uid (its primary group, of no other member): group write then adds no one."""
  try: return pwd.getpwuid(uid).pw_gid == gid and not grp.getgrgid(gid).gr_mem and uid != 0
  except KeyError: return False

def own_socket_file(path: str) -> None:
  """A unix socket we just bound at path gets the file mode (bind() follows the umask)."""
  _own(path, check(path, os.lstat(path), "socket"), modes()[1])

def peer_cred(sock: socket.socket) -> tuple[int, int, int]:
  """(pid, uid, gid) of the process at the other end of a connected unix socket (SO_PEERCRED)."""
  return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))

def peer_uid(sock: socket.socket) -> int:
  """The uid of the process at the other end of a connected unix socket."""
  return peer_cred(sock)[1]

def check_peer(sock: socket.socket, what: str) -> None:
  """NotOwnedError unless the peer of a unix socket runs as our user or root (or with MSGQ_GROUP as its group: a
  stack the group's accounts share)."""
  _, uid, gid = peer_cred(sock)
  if not trusted(uid, gid):
    raise NotOwnedError(f"{what}: its peer runs as {account(uid)}, not as this stack's user ({os.geteuid()}): refused")
