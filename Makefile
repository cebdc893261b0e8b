# The two commands of the README: `make demo` and `make test`. Both run the set-up first (idempotent, fast when done).
PY := .venv/bin/python

.PHONY: setup test demo bench soak install-services clean
setup:
	@scripts/setup.sh

test: setup
	.venv/bin/ruff check .
	$(PY) -m pytest -q

demo: setup
	.venv/bin/modeld-demo

bench: setup
	failed=""; for b in $$(grep -l "__main__" bench/*.py); do $(PY) $$b || failed="$$failed $$b"; done; \
	  if [ -n "$$failed" ]; then echo "failed:$$failed"; exit 1; fi   # each runs even if one before it failed; bench/routes.py is shared code

# the fault battery's long runs (docs/RELIABILITY.md): 10 minutes, then a table; make soak SOAK_ARGS="--minutes 3"
soak: setup
	scripts/soak.sh $(SOAK_ARGS)

clean:
	rm -rf .venv build *.egg-info

# systemd units of camerad, modeld, dmonitoringd + modeld.target (systemd/README.md). DESTDIR=dir stages the files
# under dir (no daemon-reload); SERVICE_USER=name runs the services as that existing user instead of root.
UNITDIR ?= /etc/systemd/system
ENVFILE ?= /etc/default/modeld
install-services: setup
	$(PY) systemd/install.py --bindir "$(CURDIR)/.venv/bin" --unitdir "$(UNITDIR)" --envfile "$(ENVFILE)" --destdir "$(DESTDIR)" --user "$(SERVICE_USER)"
