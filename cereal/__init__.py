"""cereal: openpilot's message schema (the subset this project uses, wire-compatible with openpilot's), the services
table and the messaging API. `from cereal import log, car` as in openpilot."""
import os
import capnp

_DIR = os.path.dirname(os.path.abspath(__file__))
log = capnp.load(os.path.join(_DIR, "log.capnp"))
car = capnp.load(os.path.join(_DIR, "car.capnp"))
