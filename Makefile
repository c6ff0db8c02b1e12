# The two commands of the README. Both do the set-up first (idempotent, fast when done).
export PREFECT_SERVER_ANALYTICS_ENABLED = false
export DO_NOT_TRACK = 1
PYTHON ?= python3

.PHONY: setup repro test
setup:
	bash scripts/setup.sh

# the main job: every stage of dvc.yaml on the embedded default (params.yaml)
repro: setup
	bash scripts/with_prefect.sh dvc repro

test: setup
	$(PYTHON) -m pytest -q
