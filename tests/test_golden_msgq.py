"""The shm transport and VisionIPC against golden bytes captured from openpilot's own msgq and VisionIPC (commaai/msgq):
the queue files its writer made, what its readers read next from each, its VisionIPC server's replies, frame packets
and buffers, and what its client made of them. MSGQ_GOLDEN names the folder (a README and manifest.json describe every
file, its fields and its per-run bytes; CI sets it); where it is unset or absent, every test here skips saying so.
Only the bytes the manifest masks as per-run (uids, server ids, addresses, fds, padding) are left out of the comparisons."""
import gzip, hashlib, json, os, socket, struct, threading
from pathlib import Path
import numpy as np
import pytest
import msgq
from msgq.pubsub import prefix
from msgq.shmq import HEADER, Queue, queue_path
from msgq.visionipc import VisionIpcClient, VisionIpcServer
from msgq.visionipc.wire import request, socket_path

GOLDEN = Path(os.environ.get('MSGQ_GOLDEN', ''))
HDR = struct.Struct("<3Q15Q15Q15Q")   # num_readers, write_pointer, write_uid, read_pointers, read_valids, read_uids
EP = 'golden'

@pytest.fixture(scope='module')
def manifest() -> dict:
  if not os.environ.get('MSGQ_GOLDEN'): pytest.skip("no golden data from openpilot's msgq: MSGQ_GOLDEN names no folder of captured bytes")
  if not (GOLDEN / 'manifest.json').is_file(): pytest.skip(f"no golden data from openpilot's msgq: no manifest.json in MSGQ_GOLDEN={GOLDEN}")
  return json.loads((GOLDEN / 'manifest.json').read_text())

@pytest.fixture(autouse=True)
def shm(monkeypatch):
  monkeypatch.setenv('MSGQ_TRANSPORT', 'shm')

def golden(file: str) -> bytes:
  data = (GOLDEN / file).read_bytes()
  return gzip.decompress(data) if file.endswith('.gz') else data

def masked(data: bytes, masks: list[dict]) -> bytes:
  out = bytearray(data)
  for m in masks: out[m['offset']:m['offset'] + m['length']] = bytes(m['length'])
  return bytes(out)

def same(ours: bytes, theirs: bytes, masks: list[dict], what: str) -> None:
  """Equal outside the masks; else the first offsets that differ, named."""
  a, b = masked(ours, masks), masked(theirs, masks)
  if a == b: return
  diff = [i for i in range(min(len(a), len(b))) if a[i] != b[i]][:8]
  pytest.fail(f"{what}: {len(ours)} bytes against openpilot's {len(theirs)}; first differing offsets {diff}: "
              f"ours {[a[i] for i in diff]}, openpilot's {[b[i] for i in diff]}")

def pattern(i: int, n: int) -> bytes: return ((np.arange(n) + i) & 0xFF).astype(np.uint8).tobytes()

def size_of(gen: dict, i: int) -> int: return gen['sizes'][i % len(gen['sizes'])] if gen['cyclic'] else gen['sizes'][i]

def index(gen: dict, msg: bytes) -> int:
  """Which generated message `msg` is (its first byte, as every index here is below 256), checked byte for byte."""
  i = msg[0]
  assert msg == pattern(i, size_of(gen, i)), f"a message of {len(msg)} bytes is no generated one"
  return i

def pointer(w: int) -> list[int]: return [w >> 32, w & 0xFFFFFFFF]

def header(path: str) -> dict:
  with open(path, 'rb') as f: h = HDR.unpack(f.read(HEADER))
  return {'num_readers': h[0], 'write_pointer': pointer(h[1]), 'write_uid': h[2], 'read_pointers': [pointer(p) for p in h[3:18]],
          'read_valids': list(h[18:33]), 'read_uids': list(h[33:48])}

def path_of(endpoint: str) -> str: return queue_path(endpoint, prefix())

def put(endpoint: str, data: bytes) -> str:
  """A queue file holding `data`, as a snapshot is put in place before anyone opens it."""
  os.makedirs(os.path.dirname(path := path_of(endpoint)), exist_ok=True)
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
  try: os.write(fd, data)
  finally: os.close(fd)
  return path

def receive_all(sock, gen: dict, limit: int | None = None) -> list[int]:
  got = []
  while (limit is None or len(got) < limit) and (m := sock.receive(non_blocking=True)) is not None: got.append(index(gen, m))
  return got

def snapshot(manifest: dict, file: str) -> dict: return next(s for s in manifest['msgq']['snapshots'] if s['file'] == file)

def run_steps(manifest: dict, sc: dict, endpoint: str) -> None:
  """A scenario's steps with the project's publisher and subscribers, each result and snapshot checked as they come."""
  gen, seg, path, readers, pub = sc['generator'], sc['segment_size'], path_of(endpoint), {}, None
  wps = sc['write_pointer_after_send']
  for step in sc['steps']:
    if step['op'] == 'pub': pub = msgq.pub_sock(endpoint, seg)
    elif step['op'] == 'sub':
      readers[step['reader']] = msgq.sub_sock(endpoint, conflate=step['conflate'], segment_size=seg)
      h = header(path)
      assert h['num_readers'] == step['slot'] + 1 and h['read_uids'][step['slot']], (step, h)
    elif step['op'] == 'publish':
      got = {r: [] for r in step.get('lockstep', [])}
      for i in range(step['first'], step['first'] + step['count']):
        pub.send(pattern(i, size_of(gen, i)))
        assert header(path)['write_pointer'] == wps['values'][i - wps['first']], f"write pointer after message {i}"
        for r in got: got[r] += receive_all(readers[r], gen, 1)   # one receive each, right after the send
      assert got == step.get('lockstep_got', {}), step
    elif step['op'] == 'recv': assert receive_all(readers[step['reader']], gen, step['max']) == step['got'], step
    elif step['op'] == 'snapshot':
      snap = snapshot(manifest, step['file'])
      with open(path, 'rb') as f: ours = f.read()
      same(ours, golden(step['file']), snap['masks'], f"{sc['name']}: {step['file']}")
      assert hashlib.sha256(masked(ours, snap['masks'])).hexdigest() == snap['sha256_masked']
  for s in [pub, *readers.values()]: s.close()

# ***** msgq: the writer, the resume, the reader *****

def test_the_writer_makes_openpilots_queue_file_byte_for_byte(manifest):
  """Every scenario (one publisher; one reader, conflating or not; the 1 KiB segment's wrap edges with two readers):
  the write pointer after every send, what each reader gets, and each snapshot's whole file equal to openpilot's."""
  scenarios = [sc for sc in manifest['msgq']['scenarios'] if sc['loads_snapshot'] is None]
  assert {sc['name'] for sc in scenarios} == {'noreader', 'reader', 'conflate', 'edge'}
  for sc in scenarios: run_steps(manifest, sc, f"{EP}_{sc['name']}")

def test_a_new_publisher_on_an_existing_file_continues_it_as_openpilots(manifest):
  """A publisher opening a queue file with a reader in it (msgq_reader_4) evicts the reader (num_readers, valids and uids
  cleared, read pointers kept) and writes on from the write pointer: the file then equals msgq_resume_1."""
  (sc,) = [sc for sc in manifest['msgq']['scenarios'] if sc['loads_snapshot']]
  put(ep := f"{EP}_resume", golden(sc['loads_snapshot']))
  run_steps(manifest, sc, ep)

def test_the_reader_reads_every_snapshot_as_openpilots(manifest):
  """Each snapshot's reader slot, read as conflating and not (its pointer and valid copied into a slot of ours, as the
  capture did): the messages openpilot's reader read next, across wrap tags, a reader waiting on a tag, and lapped
  readers that read nothing; and a new subscriber of each snapshot takes openpilot's slot at the write pointer and reads
  nothing."""
  n = 0
  for snap in manifest['msgq']['snapshots']:
    sc = next(sc for sc in manifest['msgq']['scenarios'] if sc['name'] == snap['scenario'])
    data, gen, seg = golden(snap['file']), sc['generator'], snap['segment_size']
    assert len(data) == snap['file_size'] == seg + HEADER
    for case in snap['next_reads']['slots']:
      path = put(ep := f"{EP}_{n}", data); n += 1
      sub = msgq.sub_sock(ep, conflate=case['conflate'], segment_size=seg)
      h = header(path)
      ours = h['num_readers'] - 1
      with open(path, 'r+b') as f:   # slot `slot`'s place, for our slot: the pointer, then the valid
        f.seek(24 + 8 * ours); f.write(struct.pack('<Q', data_word(data, 3 + case['slot'])))
        f.seek(144 + 8 * ours); f.write(struct.pack('<Q', data_word(data, 18 + case['slot'])))
      assert receive_all(sub, gen) == case['reads'], (snap['file'], case)
      sub.close()
    path = put(ep := f"{EP}_{n}", data); n += 1
    sub, want = msgq.sub_sock(ep, segment_size=seg), snap['next_reads']['new_subscriber_slot']
    h = header(path)
    assert h['num_readers'] == want['slot'] + 1 and h['read_uids'][want['slot']], (snap['file'], h)
    assert [h['read_pointers'][want['slot']], h['read_valids'][want['slot']]] == [want['read_pointer'], want['valid']], snap['file']
    assert receive_all(sub, gen) == snap['next_reads']['new_subscriber'] == [], snap['file']
    sub.close()

def test_all_readers_updated_is_openpilots_rule_on_its_files(manifest):
  """On every snapshot as openpilot left it: a reader registered and every valid one at the write pointer (a lapped,
  invalid reader counts as caught up), openpilot's msgq_all_readers_updated, which wait_for_readers_to_update polls."""
  for n, snap in enumerate(manifest['msgq']['snapshots']):
    h = snap['header']
    want = h['num_readers'] > 0 and all(not v or rp == h['write_pointer'] for rp, v in zip(h['read_pointers'], h['read_valids'][:h['num_readers']]))
    put(ep := f"{EP}_{n}", golden(snap['file']))
    q = Queue(ep, prefix(), snap['segment_size'])
    assert q.all_readers_updated() == want, snap['file']
    q.close()
  assert {s['file'] for s in manifest['msgq']['snapshots'] if s['header']['num_readers']} >= {'msgq_reader_3.bin.gz', 'msgq_edge_2.bin.gz'}

def data_word(data: bytes, word: int) -> int: return struct.unpack_from('<Q', data, 8 * word)[0]

def test_a_uid_names_the_thread_to_wake_as_openpilots(manifest):
  """The masked uids' known half: the low 32 bits of the write uid and of each reader's uid are the thread id of the thread
  that made the publisher or registered the reader (openpilot's writer signals that thread)."""
  assert 'gettid' in manifest['mask_kinds']['uid']
  pub = msgq.pub_sock(EP, 1024)
  got = {}
  t = threading.Thread(target=lambda: got.update(tid=threading.get_native_id(), sub=msgq.sub_sock(EP, segment_size=1024)))
  t.start(); t.join()
  h = header(path_of(EP))
  assert h['write_uid'] & 0xFFFFFFFF == threading.get_native_id() and h['read_uids'][0] & 0xFFFFFFFF == got['tid']
  pub.close(); got['sub'].close()

def test_queue_file_sizes_and_the_largest_message_as_openpilots(manifest):
  """A publisher and a subscriber each make a file of segment + 384 bytes (the default segment too), a fresh publisher's
  header is zero but for its uid; the largest message openpilot's writer takes is sent, one byte more is refused (where
  openpilot's aborts)."""
  for fact in manifest['facts']['queue_file_sizes']:
    seg = fact['segment_size_arg']
    for kind, want in (('pub', fact['file_size_pub']), ('sub', fact['file_size_sub'])):
      s = (msgq.pub_sock if kind == 'pub' else lambda ep, seg: msgq.sub_sock(ep, segment_size=seg))(ep := f"{EP}_{kind}{seg}", seg)
      assert os.path.getsize(path_of(ep)) == want, (kind, seg)
      if kind == 'pub' and fact['header_after_pub_init_all_zero_but_write_uid']:
        with open(path_of(ep), 'rb') as f: words = HDR.unpack(f.read(HEADER))
        assert words[2] and not any(words[:2] + words[3:]), seg
      s.close()
  for fact in manifest['facts']['max_payload']:
    seg, most = fact['segment_size'], fact['max_payload']
    assert msgq.max_message(seg) == most
    pub, sub = msgq.pub_sock(ep := f"{EP}_max{seg}", seg), msgq.sub_sock(ep, segment_size=seg)
    pub.send(pattern(1, most))
    with pytest.raises(ValueError): pub.send(pattern(2, most + 1))
    assert sub.receive(non_blocking=True) == pattern(1, most) and sub.receive(non_blocking=True) is None
    pub.close(); sub.close()

# ***** VisionIPC *****

def frames_of(vipc: dict, stream: int) -> list[dict]: return [f for f in sorted(vipc['frames'], key=lambda f: f['order']) if f['type'] == stream]

def image(vipc: dict, st: dict, frame: dict) -> bytes: return pattern(frame['seed'], st['width'] * st['height'] * 3 // 2)

def recv_all(conn: socket.socket) -> list[tuple[bytes, list[int], int]]:
  """Every reply on a handshake connection until the server closes it: (bytes, fds, msg_flags) each."""
  out = []
  while True:
    msg, fds, flags, _ = socket.recv_fds(conn, 1 << 16, 256)
    if not msg and not fds: return out
    out.append((msg, fds, flags))

def test_the_server_speaks_openpilots_handshake_and_frames(manifest, tmp_path):
  """A VisionIpcServer 'golden' with openpilot's streams: each request (the stream list, both streams, an unknown stream,
  requests of 2 and 8 bytes) gets openpilot's reply bytes, fd count and close; the frames published in openpilot's order
  give its packets on each stream's endpoint, its whole queue file (two readers), and its buffers (image and frame id
  trailer); closing the server removes its socket."""
  vipc = manifest['visionipc']
  srv = VisionIpcServer(vipc['name'])
  for st in vipc['streams']: srv.create_buffers(st['type'], st['count'], st['width'], st['height'])
  srv.start_listener()
  assert socket_path(vipc['name']) == vipc['socket_path_template'].replace('<OPENPILOT_PREFIX>', prefix()).replace('<name>', vipc['name'])
  for ex in vipc['exchanges']:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
      conn.settimeout(5)
      conn.connect(socket_path(vipc['name']))
      conn.send(bytes.fromhex(ex['request_hex']))
      replies = recv_all(conn)
    assert len(replies) == len(ex['replies']) and ex['closed_by_server_after'], ex['name']
    for (msg, fds, flags), want in zip(replies, ex['replies']):
      same(msg, golden(want['file']), want['masks'], f"reply to {ex['name']}")
      assert (len(msg), len(fds), flags) == (want['length'], want['num_fds'], want['msg_flags']), ex['name']
      for fd, f in zip(fds, want.get('fds', [])):
        st = os.fstat(fd)
        assert (st.st_size, st.st_nlink, st.st_mode & 0o170000 == 0o100000) == (f['st_size'], f['st_nlink'], f['regular_file'])
        os.close(fd)
  # the frames: read by a client of ours and by a plain subscriber of each endpoint, as openpilot's were
  clients = {st['type']: VisionIpcClient(vipc['name'], st['type']) for st in vipc['streams']}
  subs = {st['type']: msgq.sub_sock(st['endpoint']) for st in vipc['streams']}
  assert all(c.connect(False) for c in clients.values())
  assert VisionIpcClient.available_streams(vipc['name'], False) == set(vipc['available_streams_upstream_client'])
  sts = {st['type']: st for st in vipc['streams']}
  for f in sorted(vipc['frames'], key=lambda f: f['order']):
    srv.send(f['type'], image(vipc, sts[f['type']], f), f['frame_id'], f['timestamp_sof'], f['timestamp_eof'], valid=False)
  for t, st in sts.items():
    packets = b''.join(msgq.drain_sock_raw(subs[t]))
    same(packets, golden(st['packets']['file']), st['packets']['masks'], f"stream {t}'s packets")
    assert [b.frame_id for b in iter(lambda c=clients[t]: c.recv(0), None)] == [f['frame_id'] for f in st['client_frames']]
    with open(path_of(st['endpoint']), 'rb') as f: same(f.read(), golden(st['queue_file']['file']), st['queue_file']['masks'], f"{st['endpoint']} queue file")
    _, fds = request(vipc['name'], t)   # the buffers through the handshake's fds, as the capture read them: image, then trailer
    files = [os.pread(fd, st['buffer_len'] + 8, 0) for fd in fds]
    for fd in fds: os.close(fd)
    assert [struct.unpack_from('<Q', b, st['buffer_len'])[0] for b in files] == st['buffer_trailer_frame_ids']
    assert [hashlib.sha256(b[:st['buffer_len']]).hexdigest() for b in files] == st['buffer_data_sha256']
    if 'buffers_file' in st: assert b''.join(files) == golden(st['buffers_file']['file'])
  for c in [*clients.values(), *subs.values()]: c.close()
  srv.close()
  assert not os.path.exists(socket_path(vipc['name'])) and vipc['server_delete_removes_socket']

class GoldenServer:
  """openpilot's server as the golden data holds it: its raw replies on the handshake socket, with memfds of ours
  holding what its buffers held after all frames, and its packets published on the stream endpoints."""
  def __init__(self, vipc: dict):
    self.vipc, self.fds = vipc, {}
    for st in vipc['streams']:
      (reply,) = next(e for e in vipc['exchanges'] if e['request_hex'] == struct.pack('<I', st['type']).hex())['replies']
      self.fds[st['type']] = fds = [os.memfd_create(f"golden{i}") for i in range(st['count'])]
      last = {}
      for n, f in enumerate(frames_of(vipc, st['type'])): last[n % st['count']] = f   # round robin, as the server fills them
      for i, fd in enumerate(fds):
        os.ftruncate(fd, reply['records'][i]['mmap_len'])
        os.pwrite(fd, image(vipc, st, last[i]) + struct.pack('<Q', last[i]['frame_id']), 0)
    self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self.sock.bind(socket_path(vipc['name']))
    self.sock.listen(8)
    self.thread = threading.Thread(target=self.serve, daemon=True)
    self.thread.start()
    self.pubs = {st['type']: msgq.pub_sock(st['endpoint']) for st in vipc['streams']}

  def serve(self) -> None:
    replies = {bytes.fromhex(e['request_hex']): e['replies'] for e in self.vipc['exchanges']}
    while True:
      try: conn = self.sock.accept()[0]
      except OSError: return
      with conn:
        for r in replies.get(conn.recv(64), []):
          fds = self.fds.get(r['records'][0]['type'], []) if 'records' in r else []
          socket.send_fds(conn, [golden(r['file'])], fds)

  def publish(self, stream: int) -> None:
    for (p,) in struct.iter_unpack('48s', golden(next(st for st in self.vipc['streams'] if st['type'] == stream)['packets']['file'])):
      self.pubs[stream].send(p)

  def close(self) -> None:
    self.sock.shutdown(socket.SHUT_RDWR); self.sock.close(); self.thread.join(5)
    os.unlink(socket_path(self.vipc['name']))
    for p in self.pubs.values(): p.close()
    for fds in self.fds.values():
      for fd in fds: os.close(fd)

def test_the_client_makes_of_openpilots_server_what_openpilots_client_made(manifest):
  """A VisionIpcClient of ours on openpilot's raw handshake replies and packets: the stream list, each stream's
  geometry and buffer count, and every frame as openpilot's client received it: frame id, times, valid, buffer index,
  geometry and pixels, and whether the buffer still holds that frame (frame 1's was refilled by a later frame); then
  nothing more."""
  vipc = manifest['visionipc']
  srv = GoldenServer(vipc)
  try:
    assert VisionIpcClient.available_streams(vipc['name'], False) == set(vipc['available_streams_upstream_client'])
    for st in vipc['streams']:
      c = VisionIpcClient(vipc['name'], st['type'])
      assert c.connect(False)
      rep = st['client_reports']
      assert [st['endpoint'], c.width, c.height, c.stride, c.uv_offset, c.buffer_len, c.num_buffers, c.is_connected()] == \
             [rep['endpoint'], rep['width'], rep['height'], rep['stride'], rep['uv_offset'], rep['buffer_len'], rep['num_buffers'], rep['is_connected']]
      srv.publish(st['type'])
      for want in st['client_frames']:
        assert (buf := c.recv(1000)) is not None, want
        assert [buf.frame_id, buf.timestamp_sof, buf.timestamp_eof, buf.valid, buf.idx, buf.size, buf.width, buf.height, buf.stride,
                buf.uv_offset, hashlib.sha256(buf.data).hexdigest(), buf.overwritten()] == \
               [want['frame_id'], want['timestamp_sof'], want['timestamp_eof'], want['valid'], want['idx'], want['len'], want['width'],
                want['height'], want['stride'], want['uv_offset'], want['data_sha256'], want['trailer_frame_id'] != want['frame_id']]
        del buf
      assert c.recv(0) is None and st['client_extra_recv_is_none']
      c.close()
  finally: srv.close()
