# The two commands of the README: `make demo` and `make test`. Both run the set-up first (idempotent, fast when done).
PY := .venv/bin/python

.PHONY: setup test demo bench artifacts install-services clean
setup:
	@scripts/setup.sh

test: setup
	$(PY) -m pytest -q

demo: setup
	.venv/bin/modeld-demo

bench: setup
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf .venv build *.egg-info
