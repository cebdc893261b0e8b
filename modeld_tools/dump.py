"""modeld-dump: print messages of services live, as readable text, JSON lines, or rates (--hz).

A malformed message is counted and reported, never fatal: the tool is what one points at a misbehaving stack. With
nothing of a service after a few seconds, one line on stderr says so and where it listens (the prefix's sockets, or
the TCP address), and it goes on waiting."""
import argparse, base64, json, os, sys, time
import numpy as np
from cereal.services import SERVICES
from service import reader_left

WAITING_NOTE_S = 3.   # with nothing of a service by then, say so: a missing publisher or a wrong --addr/--prefix is silent

EPILOG = f"""services: {', '.join(SERVICES)}

examples:
  modeld-dump modelV2 -n 1                  one modelV2 message as text
  modeld-dump --json driverStateV2 | jq .   JSON lines
  modeld-dump --hz modelV2 roadCameraState  rates and gaps, printed every second
  modeld-dump --addr 192.168.1.5 modelV2    a remote stack (its publishers need MSGQ_TCP set, e.g. MSGQ_TCP=0.0.0.0)
"""

def _elide_data(s) -> None:
  """Replace each Data field of an Event builder, recursively, by a note of its length: the text stays readable."""
  names = list(s.schema.non_union_fields) + ([s.which()] if s.schema.union_fields else [])
  for name in names:
    f = s.schema.fields[name].proto
    if f.which() == 'group':
      _elide_data(getattr(s, name))
      continue
    t = f.slot.type
    if not s._has(name): continue
    if t.which() == 'data': setattr(s, name, f"<{len(getattr(s, name))} bytes>".encode())
    elif t.which() == 'struct': _elide_data(getattr(s, name))
    elif t.which() == 'list' and t.list.elementType.which() == 'struct':
      for e in getattr(s, name): _elide_data(e)

def _jsonable(v, data: str):
  # every float in the schema is a Float32: print its shortest round-trip form (0.1, not 0.10000000149011612)
  if isinstance(v, float): return float(str(np.float32(v))) if np.isfinite(v) else str(v)
  if isinstance(v, bytes): return base64.b64encode(v).decode() if data == 'base64' else {'bytes': len(v)}
  if isinstance(v, dict): return {k: _jsonable(x, data) for k, x in v.items()}
  if isinstance(v, list): return [_jsonable(x, data) for x in v]
  return v

def format_text(msg) -> str:
  b = msg.as_builder()
  _elide_data(b)
  return str(b)

def format_json(msg, data: str = 'base64') -> str:
  d = msg.to_dict()
  # the union member first, so `{"modelV2": ...}` reads as what it is
  return json.dumps({msg.which(): _jsonable(d.pop(msg.which()), data), **_jsonable(d, data)}, separators=(',', ':'))

class Rates:
  """Per-service message count and receive-time gaps over the current window."""
  def __init__(self, services: list[str]):
    self.services, self.last = services, dict.fromkeys(services, None)
    self.total, self.malformed = dict.fromkeys(services, 0), dict.fromkeys(services, 0)
    self.reset(time.monotonic())

  def reset(self, now: float) -> None:
    self.start, self.dts, self.count = now, {s: [] for s in self.services}, dict.fromkeys(self.services, 0)

  def add(self, s: str, now: float) -> None:
    if self.last[s] is not None: self.dts[s].append(now - self.last[s])
    self.last[s] = now
    self.count[s] += 1
    self.total[s] += 1

  def report(self, now: float) -> str:
    w = max(12, *(len(s) for s in self.services))
    lines = [f"{'service':<{w}} {'Hz':>7} {'expect':>7} {'msgs':>6} {'dt min':>8} {'avg':>7} {'max':>7} ms  {'malformed':>9}"]
    for s in self.services:
      hz, dts = self.count[s] / max(now - self.start, 1e-9), self.dts[s]
      gaps = f"{min(dts)*1e3:8.1f} {sum(dts)/len(dts)*1e3:7.1f} {max(dts)*1e3:7.1f}" if dts else f"{'-':>8} {'-':>7} {'-':>7}"
      silent = '' if self.total[s] or self.malformed[s] else '   (nothing received yet)'
      lines.append(f"{s:<{w}} {hz:7.1f} {SERVICES[s].frequency:7.1f} {self.count[s]:6d} {gaps}    {self.malformed[s]:9d}{silent}")
    return "\n".join(lines)

def source(addr: str) -> str:
  """Where the messages would come from, as the waiting note names it."""
  from msgq import is_local, stack_location, transport
  if is_local(addr):
    return f"this machine's stack (OPENPILOT_PREFIX={os.environ.get('OPENPILOT_PREFIX', '')!r}, {transport()} transport, in {stack_location()})"
  return f"{addr} over TCP (its publishers need MSGQ_TCP set)"

def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog='modeld-dump', description='Print messages of services live.', epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('services', nargs='*', metavar='SERVICE', help='services to print (see the list below)')
  mode = p.add_mutually_exclusive_group()
  mode.add_argument('--json', action='store_true', help='one JSON object per message and line')
  mode.add_argument('--hz', action='store_true', help='print rates and gaps (min/avg/max dt) per service every second')
  p.add_argument('-n', type=int, metavar='N', help='stop after N messages')
  p.add_argument('--prefix', metavar='P', help='OPENPILOT_PREFIX of the stack to listen to (default: the environment\'s)')
  p.add_argument('--addr', default='127.0.0.1', metavar='HOST', help='address of a remote stack (TCP)')
  p.add_argument('--bytes', choices=('base64', 'length'), default='base64', help='Data fields in --json (text always shows the length)')
  args = p.parse_args(argv)
  if not args.services: p.error(f"name at least one service; known services: {', '.join(SERVICES)}")
  if unknown := [s for s in args.services if s not in SERVICES]:
    p.error(f"unknown service{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; known services: {', '.join(SERVICES)}")
  if args.n is not None and args.n < 1: p.error(f"-n: expected a count >= 1, got {args.n}")
  if args.prefix is not None: os.environ['OPENPILOT_PREFIX'] = args.prefix
  services = list(dict.fromkeys(args.services))

  from cereal.messaging import IpcError, MalformedMessageError, Poller, log_from_bytes, sub_sock
  poller = Poller()
  try: socks = {id(sub_sock(s, poller=poller, addr=args.addr)): s for s in services}
  except IpcError as e:
    print(f"modeld-dump: {e}", file=sys.stderr)
    return 1
  rates, printed, note_at = Rates(services), 0, time.monotonic() + WAITING_NOTE_S
  try:
    while args.n is None or printed < args.n:
      if note_at is not None and time.monotonic() >= note_at:   # once: stdout stays the messages alone
        note_at = None
        if silent := [s for s in services if not rates.total[s] and not rates.malformed[s]]:
          print(f"modeld-dump: no {' or '.join(silent)} message yet from {source(args.addr)}; waiting", file=sys.stderr, flush=True)
      for sock in poller.poll(100):
        s = socks[id(sock)]
        while (args.n is None or printed < args.n) and (dat := sock.receive(non_blocking=True)) is not None:
          now = time.monotonic()
          try: msg = log_from_bytes(dat, expect=s)
          except MalformedMessageError as e:
            rates.malformed[s] += 1
            if not args.hz: print(f"modeld-dump: {s}: {e} ({rates.malformed[s]} so far)", file=sys.stderr, flush=True)
            continue
          rates.add(s, now)
          printed += 1
          if not args.hz: print(format_json(msg, args.bytes) if args.json else format_text(msg), flush=True)
      if args.hz and (now := time.monotonic()) - rates.start >= 1.0:
        print(rates.report(now) + "\n", flush=True)
        rates.reset(now)
    if args.hz and printed: print(rates.report(time.monotonic()), flush=True)
  except KeyboardInterrupt: pass
  except BrokenPipeError: reader_left()   # `modeld-dump ... | head`: the reader left; so do we, quietly
  return 0

if __name__ == '__main__':
  sys.exit(main())
