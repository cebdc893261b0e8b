"""pyproject.toml's dependency policy, and requirements.lock inside it: every dependency is pinned exactly or a compatible
range `>=L,<M` with M a major version (a shared environment keeps its older versions; a new major is untested), and
the version the lock pins (what the suite runs with) satisfies it."""
import subprocess, sys, tomllib
from importlib.metadata import packages_distributions
from pathlib import Path
import pytest
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

# each console script's extra, and what a user would run it with; the others run on the base install (`pip install .`)
EXTRA_OF = {"camerad": ("camera", [["--source", "synthetic:straight", "--frames", "1"]]),
            "modeld-record": ("tools", [["--seconds", "1", "--route", "{tmp}/route"]]),
            "modeld-replay": ("tools", [["{tmp}/route", "--artifacts", "{tmp}/artifacts"]]),
            "modeld-overlay": ("tools", [["{tmp}/route", "--out", "{tmp}/o.mp4"]]),
            "modeld-plot": ("tools", [["{tmp}/route"]]),
            "modeld-batch": ("batch", [["{tmp}/route", "--artifacts", "{tmp}/artifacts", "--out", "{tmp}/out"], ["diff", "{tmp}/a", "{tmp}/b"]]),
            "modeld-demo": ("tools", [["--seconds", "1", "--artifacts", "{tmp}/artifacts", "--out", "{tmp}/out"]]),
            "modeld-fakedevice": ("camera", [["--source", "synthetic:straight", "--frames", "1"]]),
            "modeld-view": ("view", [["{tmp}/route", "--save", "{tmp}/view.rrd"], ["--live", "--web"]])}
BASE_SCRIPTS = {"modeld", "dmonitoringd", "modeld-compile", "modeld-dump"}

def base_install_run(entry: str, args: list[str]) -> subprocess.CompletedProcess:
  """The console script's entry point run as installed, in a process where every module of every extra's distributions
  is unimportable, as Python makes a module it cannot find: what `pip install .` leaves."""
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  dists = {canonicalize_name(Requirement(r).name) for extra, reqs in project["optional-dependencies"].items() if extra != "test" for r in reqs} \
    - {canonicalize_name(project["name"])}   # an extra including another
  modules = sorted({m for m, ds in packages_distributions().items() for d in ds if canonicalize_name(d) in dists})
  assert {"av", "zstandard", "PIL", "matplotlib", "tqdm", "ray"} <= set(modules), modules   # the check can fail: they are blocked
  module, func = entry.split(":")
  code = f"import sys\nfor m in {modules!r}: sys.modules[m] = None\nfrom {module} import {func}\nsys.exit({func}())"
  return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=120)

@pytest.mark.parametrize("script", sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]))
def test_each_command_on_the_base_install_runs_or_names_its_extra(script, tmp_path):
  """On the base install, a command of an extra exits 2 with the module it lacks and the pip line adding its extra, no
  traceback (as a bad option: nothing ran); the daemons and modeld-compile import and answer --help."""
  entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"][script]
  assert script in EXTRA_OF or script in BASE_SCRIPTS, f"{script}: a new console script; add it to EXTRA_OF or BASE_SCRIPTS"
  if script in BASE_SCRIPTS:
    r = base_install_run(entry, ["--help"])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return
  extra, runs = EXTRA_OF[script]
  for args in runs:
    r = base_install_run(entry, [a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2 and f"pip install 'tinymodeld[{extra}]'" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
    assert r.stderr.startswith(f"{script}: needs "), (args, r.stderr)
    assert not any(tmp_path.iterdir()), f"{args}: nothing ran, no file written"
