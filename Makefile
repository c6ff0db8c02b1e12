# The two commands of the README. Both do the set-up first (idempotent, fast when done).
export PREFECT_SERVER_ANALYTICS_ENABLED = false
export DO_NOT_TRACK = 1
PYTHON ?= python3

.PHONY: setup repro test test-fast
setup:
	bash scripts/setup.sh

# the main job: every stage of dvc.yaml on the embedded default (params.yaml)
repro: setup
	bash scripts/with_prefect.sh dvc repro

# every tier, as CI runs it
test: setup
	$(PYTHON) -m pytest -q

# the inner loop: without the end-to-end tier (pytest -m e2e runs that tier alone)
test-fast: setup
	$(PYTHON) -m pytest -q -m "not e2e"
