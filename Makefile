# quantkit: every target a newcomer needs. `make demo` and `make test` set up on their own.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO   ?= demo-out
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-quick lint clean

install: $(STAMP)

# Re-installs only when the lock file or the project metadata change: a second run is a no-op.
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

demo: install
	rm -rf $(DEMO)
	$(BIN)/quantkit zoo build tiny-qwen2.5-omni --output $(DEMO)/models/tiny-qwen2.5-omni
	$(BIN)/quantkit demo-pool --output $(DEMO)/pool
	$(BIN)/quantkit calibrate $(DEMO)/pool/pool.jsonl --output $(DEMO)/calib --size 120 \
		--model $(DEMO)/models/tiny-qwen2.5-omni --max-seq-len 2048

test: install
	$(BIN)/python -m pytest

test-quick: install
	$(BIN)/python -m pytest -m "not slow"

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(DEMO) .pytest_cache
