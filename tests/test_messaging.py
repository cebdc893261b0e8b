"""cereal: schema, services table, log_from_bytes limits, PubMaster/SubMaster with real publisher processes."""
import gc, hashlib, os, time
import capnp
import numpy as np
import pytest

from cereal import messaging
from cereal.messaging import MalformedMessageError, log, log_from_bytes, new_message
from cereal.services import SERVICES, CAMERA_STATE_SERVICES
import msgq
from tests.test_msgq import ask, child, _publisher   # spawned children and their pipe protocol

# ---- children ----

def _pub_rates(rates: dict, conn) -> None:
  """PubMaster publishing each service at its rate (Hz) on an absolute schedule until told to stop."""
  pm = messaging.PubMaster(list(rates))
  conn.send("up")
  start, sent = time.monotonic(), dict.fromkeys(rates, 0)
  while not conn.poll(0):
    now = time.monotonic()
    for s, hz in rates.items():
      if now >= start + sent[s] / hz:
        pm.send(s, new_message(s))
        sent[s] += 1
    time.sleep(0.001)
  pm.close()

def _pub_cmd(conn) -> None:
  """PubMaster sending what it is told: ("send", service, bytes-or-kwargs), or ("readers", service, None)."""
  pm = messaging.PubMaster(["carState", "modelV2", "liveCalibration"])
  conn.send("up")
  while (cmd := conn.recv()) is not None:
    op, s, dat = cmd
    if op == "readers":
      conn.send(pm.wait_for_readers_to_update(s, 5))
      continue
    if isinstance(dat, dict):
      msg = new_message(s, valid=dat.pop("valid", True))
      for k, v in dat.items(): setattr(getattr(msg, s), k, v)
      dat = msg
    pm.send(s, dat)
    conn.send("sent")

def ask_updating(conn, cmd, sm, timeout: float = 10.0):
  """ask(), updating sm meanwhile: a subscriber re-sends its subscription to a new publisher when it is polled."""
  conn.send(cmd)
  deadline = time.monotonic() + timeout
  while not conn.poll(0):
    assert time.monotonic() < deadline, f"no reply to {cmd}"
    sm.update(10)
  return conn.recv()

def update_until(sm, cond, timeout: float = 5.0) -> None:
  deadline = time.monotonic() + timeout
  while not cond():
    assert time.monotonic() < deadline, "condition not reached"
    sm.update(50)

# ---- schema and services ----

def test_event_union_has_every_service_and_services_have_rates():
  members = set(log.Event.schema.union_fields)
  required = {"modelV2", "drivingModelData", "cameraOdometry", "driverStateV2", "driverMonitoringState", "roadCameraState",
              "wideRoadCameraState", "driverCameraState", "liveCalibration", "carState", "carControl", "deviceState", "liveDelay"}
  assert required <= members and set(SERVICES) <= members
  for name, s in SERVICES.items():
    assert s.frequency > 0 and (s.decimation is None or s.decimation >= 1), name
  # openpilot's queue sizes: both sides of an endpoint map a file of one size (QueueSize.BIG for modelV2, SMALL the rest)
  assert {n: s.queue_size for n, s in SERVICES.items() if s.queue_size != 250 * 1024} == \
    dict.fromkeys(("modelV2", "roadEncodeData", "wideRoadEncodeData", "driverEncodeData"), 10 * 1024 * 1024)
  assert set(CAMERA_STATE_SERVICES.values()) <= set(SERVICES)
  assert SERVICES["modelV2"].frequency == 20 and SERVICES["carState"].frequency == 100 and SERVICES["liveCalibration"].frequency == 4

def test_cameras_outputs_are_what_the_daemons_publish():
  """The services table says what answers each camera's frames; the daemons' frame models must publish exactly that."""
  from cereal.services import CAMERAS, DAEMON_OUTPUTS, ANSWERS
  from dmonitoringd.model import DriverModel
  from modeld.model import RoadModel
  assert CAMERAS["road"].outputs == CAMERAS["wide"].outputs == tuple(RoadModel.PUBLISHES), RoadModel.PUBLISHES
  assert CAMERAS["driver"].outputs == tuple(DriverModel.PUBLISHES), DriverModel.PUBLISHES
  assert set(DAEMON_OUTPUTS) == set(RoadModel.PUBLISHES) | set(DriverModel.PUBLISHES) and set(DAEMON_OUTPUTS) <= set(SERVICES)
  assert ANSWERS == ("modelV2", "driverStateV2")   # the outputs that carry a frame id

def test_schema_has_the_fields_openpilot_consumers_read():
  """Each field openpilot's consumers read is in the schema and comes back from the bytes with the value written."""
  fields = {   # service: {dotted field: value}
    "modelV2": {"laneLineProbs": [0.5] * 4, "confidence": "green", "action.desiredCurvature": 0.25,
                "meta.disengagePredictions.brakeDisengageProbs": [0.125] * 5, "meta.desirePrediction": [0.0] * 32,
                **{f"{f}.x": [1.0] for f in ("position", "velocity", "acceleration", "orientation", "orientationRate")}},
    "driverStateV2": {"leftDriverData.faceOrientation": [0.125, 0.25, 0.375], "rightDriverData.phoneProb": 0.5,
                      "rightDriverData.sleepProb": 0.5, "wheelOnRightProb": 0.125},
    "cameraOdometry": {"trans": [1.0] * 3, "rot": [0.0] * 3, "wideFromDeviceEuler": [0.0] * 3, "roadTransformTrans": [0.0] * 3},
    "drivingModelData": {"path.yCoefficients": [0.0] * 5, "laneLineMeta.leftY": 1.75, "meta.laneChangeState": "laneChangeStarting"},
    "liveCalibration": {"rpyCalib": [0.0, 0.5, 0.0], "calStatus": "calibrated"},
    "carState": {"vEgo": 1.0, "aEgo": 1.0, "steeringAngleDeg": 1.0},
    "driverMonitoringState": {"visionPolicyState.awarenessPercent": 100, "alertLevel": "two"},
    "liveDelay": {"lateralDelay": 0.25}, "roadCameraState": {"timestampEof": 1},
  }
  def parent(root, dotted: str):
    *path, leaf = dotted.split(".")
    for p in path: root = getattr(root, p)
    return root, leaf
  for service, values in fields.items():
    msg = new_message(service)
    for dotted, v in values.items(): setattr(*parent(getattr(msg, service), dotted), v)
    if service == "modelV2": msg.modelV2.init("laneLines", 4)[1].y = [0.5] * 33; msg.modelV2.init("leadsV3", 3)[0].x = [10.0] * 6
    back = getattr(log_from_bytes(msg.to_bytes(), expect=service), service)
    for dotted, v in values.items():
      got = getattr(*parent(back, dotted))
      got = list(got) if isinstance(v, list) else str(got) if isinstance(v, str) else got
      assert got == v, f"{service}.{dotted}: wrote {v}, read {got}"
    if service == "modelV2": assert list(back.laneLines[1].y) == [0.5] * 33 and list(back.leadsV3[0].x) == [10.0] * 6

def test_new_message_sets_logMonoTime_and_member():
  t0 = time.monotonic_ns()
  m = new_message("carState")
  assert t0 <= m.logMonoTime <= time.monotonic_ns() and m.valid and m.which() == "carState"
  assert new_message().logMonoTime > 0

# ---- log_from_bytes ----

def _aliased(n: int = 500, m: int = 99991) -> bytes:
  """A modelV2 whose 7*n laneLines list pointers all point at one m-float list: ~0.5 MB that reads as ~1.4 GB."""
  msg = log.Event.new_message(num_first_segment_words=1 << 20)
  for line in msg.init("modelV2").init("laneLines", n):
    for f in ("x", "y", "z", "t", "xStd", "yStd", "zStd"): line.init(f, 3)
  msg.modelV2.init("laneLineProbs", m)
  words = np.frombuffer(msg.to_bytes(), dtype=np.uint64).copy()
  assert words[0] & 0xffffffff == 0   # one segment
  seg = words[1:]
  lo, hi = seg & 0xffffffff, seg >> np.uint64(32)
  is_list = (lo & 3) == 1   # list pointers: [offset:30 | kind=1], [count:29 | element size:3]; size 4 = 32-bit
  big = np.nonzero(is_list & (hi == (4 | (m << 3))))[0]
  small = np.nonzero(is_list & (hi == (4 | (3 << 3))))[0]
  assert len(big) == 1 and len(small) == 7 * n
  target = big[0] + 1 + (int(lo[big[0]]) >> 2)
  off = (target - (small + 1)).astype(np.uint64)
  seg[small] = ((off << np.uint64(2)) | np.uint64(1)) & np.uint64(0xffffffff) | np.uint64((4 | (m << 3)) << 32)
  return words.tobytes()

def test_log_from_bytes_refuses_aliased_pointers():
  dat = _aliased()
  with log.Event.from_bytes(dat, traversal_limit_in_words=2 ** 63) as msg:   # it is a valid message, just amplified
    assert len(msg.modelV2.laneLines[499].zStd) == 99991
  with pytest.raises(MalformedMessageError, match="traversal limit"): log_from_bytes(dat)

def test_log_from_bytes_refuses_garbage_truncated_and_huge_counts():
  good = new_message("modelV2")
  good.modelV2.laneLineProbs = [0.5] * 4
  dat = good.to_bytes()
  assert list(log_from_bytes(dat).modelV2.laneLineProbs) == [0.5] * 4
  huge = bytearray(dat)   # the list's element count raised to 2^29-1: far more data than the message has
  i = bytes(huge).index((4 | (4 << 3)).to_bytes(4, "little"))
  huge[i:i + 4] = (4 | ((2 ** 29 - 1) << 3)).to_bytes(4, "little")
  for bad in (b"", b"\x00" * 7, os.urandom(1000), dat[:len(dat) // 2], bytes(huge)):
    with pytest.raises(MalformedMessageError, match="malformed message"): log_from_bytes(bad)

def test_log_from_bytes_walks_the_whole_message():
  """A pointer deep inside the member (modelV2.position.x) claiming far more than the message holds: a bare reader
  gets the root and the member right and fails only when the list is read; log_from_bytes refuses it up front."""
  m = new_message("modelV2")
  m.modelV2.frameId, m.modelV2.position.x = 7, [1.0, 2.0, 3.0]
  bad = bytearray(m.to_bytes())
  i = bytes(bad).index((4 | (3 << 3)).to_bytes(4, "little"))   # the only list of three 32-bit elements
  bad[i:i + 4] = (4 | ((2 ** 29 - 1) << 3)).to_bytes(4, "little")
  with log.Event.from_bytes(bytes(bad)) as r:
    assert r.which() == "modelV2" and r.modelV2.frameId == 7
    with pytest.raises(capnp.KjException): list(r.modelV2.position.x)
  with pytest.raises(MalformedMessageError, match="malformed message"): log_from_bytes(bytes(bad))

def test_log_from_bytes_expect_refuses_another_service():
  m = new_message("carState")
  m.carState.vEgo = 3.0
  dat = m.to_bytes()
  assert log_from_bytes(dat, expect="carState").carState.vEgo == 3.0
  with pytest.raises(MalformedMessageError, match="^expected a modelV2 message, got carState$"): log_from_bytes(dat, expect="modelV2")

def test_a_parsed_message_keeps_its_bytes():
  """No copy: the reader reads the message's own bytes, so it must keep them alive when the caller drops its reference
  (a member's reader alone is enough), and a buffer that is not bytes (its owner may reuse it) is copied first."""
  m = new_message("modelV2")
  m.modelV2.frameId, m.modelV2.position.x = 7, [1.0, 2.0, 3.0]
  buf = bytearray(m.to_bytes())
  ev = log_from_bytes(buf)
  position = log_from_bytes(bytes(buf)).modelV2.position   # the bytes and the event are garbage at once
  buf[:] = bytes(len(buf))   # the owner reuses its buffer
  gc.collect()
  junk = [bytes(len(buf)) for _ in range(1000)]   # freed memory of that size, if any, now holds zeros
  assert ev.modelV2.frameId == 7 and list(ev.modelV2.position.x) == [1, 2, 3] and list(position.x) == [1, 2, 3], len(junk)

def test_a_parsed_message_can_be_read_any_number_of_times():
  m = new_message("liveCalibration")
  m.liveCalibration.rpyCalib = [0.0, 0.02, 0.01]
  r = log_from_bytes(m.to_bytes())
  for _ in range(20000): assert r.liveCalibration.rpyCalib[1] == pytest.approx(0.02)   # no traversal budget runs out

# ---- sockets, PubMaster, SubMaster ----

def test_recv_helpers_and_pubmaster_send_builder_or_bytes():
  pm = messaging.PubMaster(["carState"])
  sock = messaging.sub_sock("carState", timeout=100)
  assert pm.wait_for_readers_to_update("carState", 5) and pm.all_readers_updated("carState")
  assert messaging.recv_one(sock) is None and messaging.recv_one_or_none(sock) is None
  m = new_message("carState"); m.carState.vEgo = 1.0
  pm.send("carState", m)   # a builder
  m = new_message("carState"); m.carState.vEgo = 2.0
  pm.send("carState", m.to_bytes())   # bytes
  assert messaging.recv_one(sock).carState.vEgo == 1.0
  assert messaging.recv_one_retry(sock).carState.vEgo == 2.0
  assert messaging.recv_one_or_none(sock) is None
  for v in (3.0, 4.0, 5.0):
    m = new_message("carState"); m.carState.vEgo = v; pm.send("carState", m)
  got, deadline = [], time.monotonic() + 5
  while len(got) < 3 and time.monotonic() < deadline: got += messaging.drain_sock(sock, wait_for_one=True)
  assert [e.carState.vEgo for e in got] == [3.0, 4.0, 5.0]
  with pytest.raises(ValueError, match="larger than its segment"): pm.send("carState", b"\x00" * (msgq.max_message(SERVICES["carState"].queue_size) + 8))
  pm.close(); sock.close()

def test_submaster_drops_malformed_messages_and_never_raises():
  sm = messaging.SubMaster(["carState"])
  with child(_publisher, "carState") as (_, conn, _):   # a raw publisher on the service's endpoint
    assert ask_updating(conn, ("readers", 5.0), sm)
    wrong = new_message("liveCalibration").to_bytes()
    good = new_message("carState"); good.carState.vEgo = 7.0
    good = good.to_bytes()
    bad = [os.urandom(200), good[:20], wrong, _aliased(50, 9999)]
    for i, dat in enumerate(bad):
      assert ask(conn, ("send", [dat])) == "sent"
      update_until(sm, lambda i=i: sm.malformed["carState"] == i + 1)   # update() never raises
      assert not sm.updated["carState"] and not sm.seen["carState"]
    assert ask(conn, ("send", [good])) == "sent"
    update_until(sm, lambda: sm.updated["carState"])
    assert sm["carState"].vEgo == 7.0 and sm.malformed["carState"] == len(bad)
  sm.close()

def test_largest_service_message_goes_through_and_larger_ones_are_refused():
  size = msgq.max_message(SERVICES["modelV2"].queue_size)
  sm = messaging.SubMaster(["modelV2"])
  with child(_pub_cmd) as (_, conn, _):
    assert ask_updating(conn, ("readers", "modelV2", None), sm)
    m = new_message("modelV2")
    m.modelV2.rawPredictions = os.urandom(size - 1024)
    dat = m.to_bytes()
    assert len(dat) <= size
    assert ask(conn, ("send", "modelV2", dat)) == "sent"
    update_until(sm, lambda: sm.updated["modelV2"])
    assert hashlib.sha256(sm["modelV2"].rawPredictions).digest() == hashlib.sha256(m.modelV2.rawPredictions).digest()
  with child(_publisher, "modelV2", segment_size=40 * 1024 * 1024) as (_, conn, _):   # a publisher of another services table: larger messages
    assert ask_updating(conn, ("readers", 5.0), sm)   # the restarted publisher: the subscriber re-connects
    big = new_message("modelV2")
    big.modelV2.rawPredictions = b"\x00" * size
    assert ask(conn, ("send", [big.to_bytes()])) == "sent"
    update_until(sm, lambda: sm.sock["modelV2"]._s.refused == 1)
    assert not sm.updated["modelV2"]   # never delivered
    small = new_message("modelV2")
    small.modelV2.frameId = 5
    assert ask(conn, ("send", [small.to_bytes()])) == "sent"
    update_until(sm, lambda: sm.updated["modelV2"] and sm["modelV2"].frameId == 5)   # and the subscriber goes on
  sm.close()

def test_submaster_poll_blocks_on_the_poll_service_only():
  sm = messaging.SubMaster(["carState", "liveCalibration"], poll="liveCalibration")
  with child(_pub_rates, {"carState": 100.}) as (_, conn, _):
    update_until(sm, lambda: sm.seen["carState"])
    t = time.monotonic()
    sm.update(300)   # carState arrives all the time, but only liveCalibration ends the wait
    assert time.monotonic() - t >= 0.28
    conn.send(None)
  with child(_pub_cmd) as (_, conn, _):
    assert ask_updating(conn, ("readers", "liveCalibration", None), sm)
    assert ask(conn, ("send", "liveCalibration", {"validBlocks": 3})) == "sent"
    t = time.monotonic()
    sm.update(5000)
    assert time.monotonic() - t < 3 and sm.updated["liveCalibration"] and sm["liveCalibration"].validBlocks == 3
    assert sm.recv_frame["liveCalibration"] == sm.frame and sm.logMonoTime["liveCalibration"] > 0
    assert ask_updating(conn, ("readers", "carState", None), sm)
    assert ask(conn, ("send", "carState", {"vEgo": 3.0, "valid": False})) == "sent"
    update_until(sm, lambda: sm["carState"].vEgo == 3.0)   # a non-polled service is read on every update
    assert sm["carState"].vEgo == 3.0 and not sm.valid["carState"] and not sm.all_valid()
  sm.close()

def test_submaster_alive_and_freq_ok_follow_the_services_table():
  sm = messaging.SubMaster(["roadCameraState", "cameraOdometry", "carState", "deviceState"])
  # roadCameraState at its 20 Hz, cameraOdometry at half its 20 Hz, carState at its 100 Hz, deviceState not at all
  with child(_pub_rates, {"roadCameraState": 20., "cameraOdometry": 10., "carState": 100.}) as (_, conn, _):
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline: sm.update(100)
    assert sm.alive["roadCameraState"] and sm.freq_ok["roadCameraState"]
    assert sm.alive["cameraOdometry"] and not sm.freq_ok["cameraOdometry"]
    assert sm.alive["carState"] and sm.seen["carState"]
    assert not sm.alive["deviceState"] and not sm.freq_ok["deviceState"] and not sm.seen["deviceState"]
    assert not sm.all_checks() and sm.all_checks(["roadCameraState"])
    conn.send(None)
  t = time.monotonic()
  while time.monotonic() - t < 0.3: sm.update(20)
  assert not sm.alive["carState"] and sm.alive["roadCameraState"]   # 0.3 s > 10 / 100 Hz, but < 10 / 20 Hz
  sm.close()

def test_submaster_without_sockets_is_fed_by_update_msgs():
  """addr=None, as openpilot's replay: no socket is made; update_msgs gives the same state a socket would."""
  sm = messaging.SubMaster(["carState", "liveCalibration"], addr=None)
  assert sm.sock == {}
  with pytest.raises(RuntimeError, match="update_msgs"): sm.update(0)
  cs = new_message("carState")
  cs.carState.vEgo = 3.5
  sm.update_msgs(1.0, [log_from_bytes(cs.to_bytes())])
  assert sm.updated["carState"] and not sm.updated["liveCalibration"] and sm["carState"].vEgo == 3.5 and sm.seen["carState"]
  sm.update_msgs(1.05, [])
  assert not sm.updated["carState"] and sm["carState"].vEgo == 3.5
