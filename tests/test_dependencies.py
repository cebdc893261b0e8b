"""pyproject.toml's dependency policy, and requirements.lock inside it: every dependency is pinned exactly or a compatible
range `>=L,<M` with M a major version (a shared environment keeps its older versions; a new major is untested), and
the version the lock pins (what the suite runs with) satisfies it."""
import tomllib
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]

def test_every_dependency_is_pinned_or_a_compatible_range_holding_the_locked_version():
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  lines = [line.split("==") for line in (REPO / "requirements.lock").read_text().splitlines() if line and not line.startswith("#")]
  locked = {canonicalize_name(name): Version(version) for name, version in lines}
  for req in map(Requirement, project["dependencies"] + sum(project["optional-dependencies"].values(), [])):
    if (name := canonicalize_name(req.name)) == project["name"]: continue   # another extra of this project
    assert name in locked and req.specifier.contains(locked[name]), f"{req}: requirements.lock has {locked.get(name)}"
    spec = {s.operator: Version(s.version) for s in req.specifier}
    assert set(spec) == {"=="} or (set(spec) == {">=", "<"} and spec["<"] == Version(str(spec["<"].major)) > spec[">="]), \
      f"{req}: expected ==V or >=L,<M with M a major version above L"
