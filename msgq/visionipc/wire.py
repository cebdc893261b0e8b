"""What a VisionIPC server and its clients agree on, byte for byte as openpilot's (commaai/msgq's visionipc/).

The handshake on the server's unix socket (a stream type or STREAM_LIST in; the stream list, or a 112-byte BUF record
per buffer with their fds, out) and the 48-byte PACKET per published frame. docs/VISIONIPC.md
"""
import logging, os, re, socket, struct
from msgq.pubsub import IpcError, prefix, transport
from service import RateLimit
from service.owned import NotOwnedError, check_peer

STREAM_LIST = 0xFFFFFFFF      # the request for the list of streams (never a stream type)
MAX_BUFFERS = 127             # buffers per stream: openpilot's client takes fewer than 128 fds
MAX_STREAMS = 64              # openpilot's client reads up to 64 stream types
TRAILER = 8                   # the uint64 frame id after each buffer's image
WRITING = (1 << 64) - 1       # frame id in the trailer of a buffer the server is filling (ours; openpilot's never sets it)
REQUEST = struct.Struct("=I")
STREAMS = struct.Struct("=I")
# struct VisionBuf (LP64, natural alignment): len, mmap_len, addr, frame_id pointer, fd, width, height, stride, uv_offset,
# y, uv, server_id, idx, type, handle. Pointers and the fd are the sender's own; a client uses the fds that come with it
BUF = struct.Struct("=QQQQi4xQQQQQQQQIi")
# struct VisionIpcPacket: server_id, idx, then VisionIpcBufExtra: frame_id (uint32), timestamp_sof, timestamp_eof, valid
PACKET = struct.Struct("=QQI4xQQ?7x")
assert (BUF.size, PACKET.size) == (112, 48)
log = logging.getLogger("msgq.visionipc")
log.addFilter(RateLimit())   # what peers make it say stays bounded whatever the process's logging (a library's user too)

def check_name(name: str) -> str:
  if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
    raise IpcError(f"VisionIPC server name must be a plain name of [A-Za-z0-9_.-], got {name!r}")
  return name

def check_stream(stream: int) -> int:
  if not 0 <= int(stream) < STREAM_LIST: raise IpcError(f"VisionIPC stream type must be a uint32 below {STREAM_LIST:#x}, got {stream!r}")
  return int(stream)

def endpoint(name: str, stream: int) -> str: return f"visionipc_{check_name(name)}_{check_stream(stream)}"

def socket_path(name: str) -> str:
  """shm transport: openpilot's /tmp/[<OPENPILOT_PREFIX>_]visionipc_<name>; zmq: beside msgq's sockets, in its private
  runtime directory."""
  if transport() == "shm": return f"/tmp/{prefix() + '_' if prefix() else ''}visionipc_{check_name(name)}"
  from msgq.zmq import runtime_dir
  path = os.path.join(runtime_dir(), f"visionipc_{check_name(name)}.sock")
  if len(path) > 107: raise IpcError(f"VisionIPC socket path too long for a unix socket ({len(path)} > 107): {path}")
  return path

def request(name: str, stream: int, timeout: float = 2.0) -> tuple[bytes, list[int]]:
  """One handshake round trip: the reply's bytes and fds (the caller closes them). OSError when no server listens
  (missing or stale socket file); IpcError for a reply cut short; NotOwnedError (logged) for a server of another
  account, which gets no request and sends us no buffer."""
  with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as s:
    s.settimeout(timeout)
    s.connect(path := socket_path(name))
    try: check_peer(s, f"VisionIPC server {name!r} at {path}")
    except NotOwnedError as e:
      log.warning("%s", e)
      raise
    s.send(REQUEST.pack(stream))
    msg, fds, flags, _ = socket.recv_fds(s, BUF.size * (MAX_BUFFERS + 1), MAX_BUFFERS + 1, socket.MSG_CMSG_CLOEXEC)
  if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
    for fd in fds: os.close(fd)
    raise IpcError(f"VisionIPC server {name!r}: its reply to request {stream:#x} was cut short (flags {flags:#x})")
  return msg, fds

def streams(name: str) -> set[int]:
  """The stream types the server serves (OSError when none listens)."""
  msg, fds = request(name, STREAM_LIST)
  for fd in fds: os.close(fd)
  if len(msg) % STREAMS.size: raise IpcError(f"VisionIPC server {name!r}: a stream list of {len(msg)} bytes")
  return {t for (t,) in STREAMS.iter_unpack(msg)}
