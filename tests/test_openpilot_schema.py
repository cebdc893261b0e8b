"""The schema is openpilot's on the wire: structurally (ids, ordinals, discriminants, slot offsets, types) and by value
(each service's message read back under the other schema), against openpilot-logging's schema files."""
import itertools
import pytest
from cereal import log
from cereal.services import SERVICES
from tests import openpilot_ref as op

# Fields openpilot added after the openpilot-logging release the tests load (name: (ordinal, type)). Their layout
# follows from the fields before them, which are compared with openpilot's below.
NEWER = {
  "Event": {"liveDelay": (146, "struct"), "rawAudioData": (147, "anyPointer"), "bookmarkButton": (148, "anyPointer"),
            "audioFeedback": (149, "anyPointer"), "lateralManeuverPlan": (150, "anyPointer"), "driverMonitoringState": (151, "struct")},
  "Action": {"desiredAcceleration": (1, "float32"), "shouldStop": (2, "bool")},
  "DriverData": {"phoneProb": (13, "float32"), "sleepProb": (14, "float32")},
  "DriverMonitoringStateDEPRECATED": {"uncertainCount": (19, "uint32")},
}
# Members v0.11.1 renamed (ours: the reference's name): the same ordinal and type, so the same wire
RENAMED = {"Event": {"driverMonitoringStateDEPRECATED": "driverMonitoringState"}}
LIVE_DELAY = (0x98dfdb22c44df8d4, {"lateralDelay": (0, "float32"), "validBlocks": (1, "int32"), "status": (2, "enum"),
                                   "lateralDelayEstimate": (3, "float32"), "points": (4, "list"), "lateralDelayEstimateStd": (5, "float32"),
                                   "calPerc": (6, "int8")})   # v0.11.1's: version @7 came after it
POINTER_KINDS = {"struct", "list", "text", "data", "anyPointer"}

def short(schema) -> str: return schema.node.displayName.split(":")[-1].split(".")[-1]

def nested(field):
  """(kind, schema of the type behind a struct/enum field or a list's innermost element, or None)."""
  t, s = field.proto.slot.type, None
  while t.which() == "list": t = t.list.elementType
  if t.which() not in ("struct", "enum"): return t.which(), None
  s = field.schema
  while isinstance(s, type(log.ModelDataV2.schema.fields["laneLines"].schema)): s = s.elementType
  return t.which(), s

def type_sig(t) -> tuple:
  w = t.which()
  if w == "struct": return (w, t.struct.typeId)
  if w == "enum": return (w, t.enum.typeId)
  if w == "list": return (w, type_sig(t.list.elementType))
  return (w,)

def struct_pairs():
  """(ours, openpilot's) for every struct and enum the project's schema reaches from Event; placeholders excluded."""
  todo, seen, pairs = [(log.Event.schema, op.log.Event.schema)], set(), []
  while todo:
    ours, theirs = todo.pop()
    if ours.node.id in seen: continue
    seen.add(ours.node.id)
    pairs.append((ours, theirs))
    if ours.node.which() != "struct": continue
    for name, f in ours.fields.items():
      if name in NEWER.get(short(ours), {}): continue   # (v0.11.1's driverMonitoringState is another struct than the reference's)
      name = RENAMED.get(short(ours), {}).get(name, name)
      if name not in theirs.fields or f.proto.slot.type.which() == "anyPointer": continue
      kind, s = nested(f)
      if s is not None: todo.append((s, nested(theirs.fields[name])[1]))
  return pairs

PAIRS = struct_pairs()

@pytest.mark.parametrize("ours,theirs", PAIRS, ids=[short(o) for o, _ in PAIRS])
def test_structure_is_openpilots(ours, theirs):
  assert ours.node.id == theirs.node.id, f"{short(ours)}: type id {ours.node.id:#x}, openpilot's {theirs.node.id:#x}"
  if ours.node.which() == "enum":
    ours_e, theirs_e = [e.name for e in ours.node.enum.enumerants], [e.name for e in theirs.node.enum.enumerants]
    assert ours_e == theirs_e[:len(ours_e)], f"{short(ours)} enumerants {ours_e} vs openpilot's {theirs_e}"
    return
  s, t = ours.node.struct, theirs.node.struct
  if s.discriminantCount: assert s.discriminantOffset == t.discriminantOffset
  newer, renamed = NEWER.get(short(ours), {}), RENAMED.get(short(ours), {})
  theirs_by_ordinal = {f.ordinal.explicit: f for f in t.fields}
  for f in s.fields:
    o, where = f.ordinal.explicit, f"{short(ours)}.{f.name} @{f.ordinal.explicit}"
    if f.name in newer:
      assert (o, f.slot.type.which()) == newer[f.name], f"{where}: newer than the reference, expected {newer[f.name]}"
      assert o not in theirs_by_ordinal, f"{where}: the reference has it as {theirs_by_ordinal[o].name}: drop it from NEWER"
      continue
    g = theirs_by_ordinal.get(o)
    assert g is not None, f"{where}: openpilot has no field with that ordinal"
    name = renamed.get(f.name, f.name)
    assert (name, f.discriminantValue, f.slot.offset) == (g.name, g.discriminantValue, g.slot.offset), \
      f"{where}: (name, discriminant, offset) {(name, f.discriminantValue, f.slot.offset)} vs openpilot's {(g.name, g.discriminantValue, g.slot.offset)}"
    if f.slot.type.which() == "anyPointer":   # a placeholder: keeps a pointer slot of a type the project never reads
      assert g.slot.type.which() in POINTER_KINDS, f"{where}: declared as a pointer, openpilot's is {g.slot.type.which()}"
    else:
      assert type_sig(f.slot.type) == type_sig(g.slot.type), f"{where}: type {type_sig(f.slot.type)} vs openpilot's {type_sig(g.slot.type)}"
      if f.slot.type.which() not in POINTER_KINDS: assert str(f.slot.defaultValue) == str(g.slot.defaultValue), f"{where}: default"
  assert len(s.fields) == len({f.ordinal.explicit for f in s.fields}) and sorted(f.ordinal.explicit for f in s.fields) == list(range(len(s.fields)))

def test_newer_fields():
  """The fields newer than the reference (ordinals it lacks) are exactly those NEWER lists, and liveDelay's struct is
  openpilot's."""
  live_delay = log.Event.schema.fields["liveDelay"].schema
  assert live_delay.node.id == LIVE_DELAY[0]
  assert {n: (f.proto.ordinal.explicit, f.proto.slot.type.which()) for n, f in live_delay.fields.items()} == LIVE_DELAY[1]
  for ours, theirs in PAIRS:
    if ours.node.which() == "struct":
      known = {f.proto.ordinal.explicit for f in theirs.fields.values()}   # (each one's name: test_structure_is_openpilots)
      assert {n for n, f in ours.fields.items() if f.proto.ordinal.explicit not in known} == set(NEWER.get(short(ours), {})), short(ours)

def test_driver_monitoring_state_is_v0_11_1s():
  """Event @151 is v0.11.1's driverMonitoringState: every struct and enum it reaches has openpilot's id, fields,
  ordinals and types (a struct or enum by its name); @151 is the union's discriminant 149, as in openpilot."""
  event = log.Event.schema.fields["driverMonitoringState"]
  assert (event.proto.ordinal.explicit, event.proto.discriminantValue) == (151, 149)
  todo, seen = [event.schema], set()
  while todo:
    s = todo.pop()
    if short(s) in seen: continue
    seen.add(short(s))
    want_id, want = op.V2[short(s)]
    assert s.node.id == want_id, f"{short(s)}: type id {s.node.id:#x}, openpilot's {want_id:#x}"
    if s.node.which() == "enum":
      assert [e.name for e in s.node.enum.enumerants] == want, short(s)
      continue
    got = {}
    for name, f in s.fields.items():
      kind, sub = nested(f)
      got[name] = (f.proto.ordinal.explicit, short(sub) if sub is not None else kind)
      if sub is not None: todo.append(sub)
    assert got == want, short(s)
  assert seen == set(op.V2)

def test_deprecated_driver_monitoring_state_reads_openpilots_old_message():
  """openpilot's driverMonitoringState of before v0.11.1 (Event @71) reads here as driverMonitoringStateDEPRECATED,
  every field the same, as v0.11.1 reads it; the message this project publishes is @151, which that reader does not know."""
  theirs = op.log.Event.new_message(logMonoTime=5, valid=True)
  fill(theirs.init("driverMonitoringState"), op.log.Event.schema.fields["driverMonitoringState"].schema)
  with log.Event.from_bytes(theirs.to_bytes()) as ours:
    assert ours.which() == "driverMonitoringStateDEPRECATED"
    schema = log.Event.schema.fields["driverMonitoringStateDEPRECATED"].schema
    assert compare(ours.driverMonitoringStateDEPRECATED, theirs.as_reader().driverMonitoringState, schema, "@71") > 10

# ---- by value: fill every field one schema declares, read it under the other, compare what both declare ----

def fill(b, schema, n=None, depth=0) -> None:
  """Deterministic, distinct values in every settable field (the first member of a union); n counts them."""
  n = itertools.count(1) if n is None else n
  union = set(schema.union_fields)
  for name, f in schema.fields.items():
    if f.proto.which() != "slot" or (name in union and name != schema.union_fields[0]) or depth > 6: continue
    v = value(b, name, f.proto.slot.type, f, n, depth)
    if v is not None: setattr(b, name, v)

def value(b, name, t, f, n, depth):
  w, k = t.which(), next(n)
  if w == "bool": return k % 2 == 0
  if w.startswith(("int", "uint")): return k % 100
  if w.startswith("float"): return k * 0.25
  if w == "text": return f"text{k}"
  if w == "data": return bytes([k % 256]) * 3
  if w == "enum": return f.schema.enumerants and list(f.schema.enumerants)[k % len(f.schema.enumerants)]
  if w == "struct":
    fill(getattr(b, name) if b._has(name) else b.init(name), f.schema, n, depth + 1)
    return None
  if w == "list":
    e = t.list.elementType.which()
    if e in ("struct", "list", "anyPointer", "enum"):
      if e == "struct":
        lst = b.init(name, 2)
        for x in lst: fill(x, f.schema.elementType, n, depth + 1)
      return None
    return [value(None, None, t.list.elementType, None, n, depth) for _ in range(3)]
  return None

def compare(a, b, schema, where: str) -> int:
  """Fields schema declares, equal in readers a and b; returns how many leaf values were compared."""
  compared = 0
  for name, f in schema.fields.items():
    w = f.proto.slot.type.which()
    if w == "anyPointer" or (name in schema.union_fields and a.which() != name) or name in NEWER.get(short(schema), {}): continue
    va, vb = getattr(a, name), getattr(b, name)
    if w == "struct": compared += compare(va, vb, f.schema, f"{where}.{name}")
    elif w == "list" and f.proto.slot.type.list.elementType.which() == "struct":
      assert len(va) == len(vb), f"{where}.{name}"
      compared += sum(compare(x, y, f.schema.elementType, f"{where}.{name}[]") for x, y in zip(va, vb))
    else:
      norm = (lambda v: [str(x) for x in v]) if w == "list" else str
      assert norm(va) == norm(vb), f"{where}.{name}: {va} vs {vb}"
      compared += 1
  return compared

SERVICE_NAMES = list(SERVICES)

@pytest.mark.parametrize("service", SERVICE_NAMES)
def test_message_reads_the_same_in_openpilot(service):
  ours = log.Event.new_message(logMonoTime=123456789, valid=False)
  fill(ours.init(service), log.Event.schema.fields[service].schema)
  with op.log.Event.from_bytes(ours.to_bytes()) as theirs:
    if service in NEWER["Event"]:   # the reference predates it: an unknown union member there, as in any older reader
      with pytest.raises(Exception, match="null|unknown|which"): theirs.which()
      return
    assert theirs.which() == service and theirs.logMonoTime == 123456789 and not theirs.valid
    sub = getattr(theirs, service)
    assert compare(getattr(ours.as_reader(), service), sub, log.Event.schema.fields[service].schema, service) > 0

@pytest.mark.parametrize("service", [s for s in SERVICE_NAMES if s not in NEWER["Event"]])   # those the reference has
def test_openpilot_message_reads_the_same_here(service):
  theirs = op.log.Event.new_message(logMonoTime=987654321, valid=True)
  fill(theirs.init(service), op.log.Event.schema.fields[service].schema)
  with log.Event.from_bytes(theirs.to_bytes()) as ours:
    assert ours.which() == service and ours.logMonoTime == 987654321 and ours.valid
    assert compare(getattr(ours, service), getattr(theirs.as_reader(), service), log.Event.schema.fields[service].schema, service) > 0

def test_openpilot_events_this_schema_does_not_read_keep_their_name():
  """An openpilot event the project never reads (can, controlsState) is that event here too, never another type."""
  for service in ("can", "controlsState", "sendcan", "longitudinalPlan"):
    m = op.log.Event.new_message()
    m.init(service) if service not in ("can", "sendcan") else m.init(service, 1)
    with log.Event.from_bytes(m.to_bytes()) as ours: assert ours.which() == service
