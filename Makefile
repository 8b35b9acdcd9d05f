# Thin wrappers around dev.py, which needs only Python and pip.
.PHONY: setup run test lint bench
setup:
	python3 dev.py setup
run:
	python3 dev.py run
test:
	python3 dev.py test
lint:
	.venv/bin/ruff check .
bench:
	.venv/bin/python benchmarks/forward.py
	.venv/bin/python benchmarks/capture.py
	.venv/bin/python benchmarks/probes.py
