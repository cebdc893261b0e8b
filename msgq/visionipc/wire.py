"""What a VisionIPC server and its clients agree on: names, the handshake, the frame packet and the buffer trailer.

Handshake: a client connects to the server's unix socket (SOCK_SEQPACKET, in msgq's per-prefix runtime directory),
sends one REQUEST and gets one JSON reply; a buffers reply carries the stream's memfd as SCM_RIGHTS.
Frames: one FRAME packet per published buffer on the msgq topic `visionipc_<name>_<stream>`.
Trailer: TRAILER after each buffer's bytes in shared memory; seq 0 means the server is writing the buffer.
"""
import json, os, re, socket, struct
from msgq.pubsub import IpcError, runtime_dir

MAGIC = b"VIPC"
VERSION = 1
ALIGN = 64             # every buffer (and trailer) starts on a cache line; from_blob needs >= 16 (clang's CPU kernels segfault on less)
TRAILER_SPAN = 64      # bytes reserved per trailer, so a trailer never shares a cache line with frame bytes
REQUEST = struct.Struct("<4sBcB")          # magic, version, op, stream
OP_BUFFERS, OP_STREAMS = b"B", b"S"
FRAME = struct.Struct("<4sQQQQQI?")        # magic, server_id, seq, frame_id, timestamp_sof, timestamp_eof, idx, valid
TRAILER = struct.Struct("<QQ")             # seq, frame_id
MAX_PACKET = 256                           # max_size of the frame topics: room for later fields, a bound on junk
MAX_REPLY = 1 << 16

def check_name(name: str) -> str:
  if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
    raise IpcError(f"VisionIPC server name must be a plain name of [A-Za-z0-9_.-], got {name!r}")
  return name

def check_stream(stream: int) -> int:
  if not 0 <= int(stream) <= 255: raise IpcError(f"VisionIPC stream must be in 0..255, got {stream!r}")
  return int(stream)

def endpoint(name: str, stream: int) -> str: return f"visionipc_{check_name(name)}_{check_stream(stream)}"

def socket_path(name: str) -> str:
  path = os.path.join(runtime_dir(), f"visionipc_{check_name(name)}.sock")
  if len(path) > 107: raise IpcError(f"VisionIPC socket path too long for a unix socket ({len(path)} > 107): {path}")
  return path

def request(name: str, op: bytes, stream: int = 0, timeout: float = 2.0) -> tuple[dict, list[int]]:
  """One handshake round trip. Raises OSError when no server listens (missing or stale socket file)."""
  with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as s:
    s.settimeout(timeout)
    s.connect(socket_path(name))
    s.send(REQUEST.pack(MAGIC, VERSION, op, check_stream(stream)))
    msg, fds, _, _ = socket.recv_fds(s, MAX_REPLY, 1, socket.MSG_CMSG_CLOEXEC)
  try: reply = json.loads(msg)
  except ValueError: reply = None
  if not isinstance(reply, dict):
    for fd in fds: os.close(fd)
    raise IpcError(f"VisionIPC server {name!r}: expected a JSON object as handshake reply, got {msg[:64]!r}")
  return reply, fds
