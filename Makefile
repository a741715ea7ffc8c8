PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODES ?= 3
PORT ?= 27017
DIR ?= ./data

.PHONY: install run test test-loaded lint bench soak fuzz spec clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,spark]'
	touch $(STAMP)

# The MongoDB Node.js driver and mongosh, for the tests that log in with them (tests/integration/test_auth.py).
NODE_STAMP := build/node/.installed
$(NODE_STAMP):
	mkdir -p build/node
	cd build/node && npm install --no-audit --no-fund --silent mongodb@7.9.0 mongosh@2.12.0
	touch $(NODE_STAMP)

install: $(STAMP) $(NODE_STAMP)

run: $(STAMP)
	$(BIN)/replset up --nodes $(NODES) --port $(PORT) --dir $(DIR)

lint: $(STAMP)
	$(BIN)/ruff check .

# The pure tests (unit, property, simulator) on both cores; then the real-process ones, two modules at a
# time (a module's set is shared by its tests); last, alone, the ones whose timing is judged (`alone`).
REAL_TESTS := --ignore=tests/unit --ignore=tests/property --ignore=tests/sim
test: $(STAMP) $(NODE_STAMP) lint
	$(BIN)/pytest -n 2 --durations=15 tests/unit tests/property tests/sim
	$(BIN)/pytest -n 2 --dist loadfile --durations=25 -m "not soak and not alone" $(REAL_TESTS)
	$(BIN)/pytest -m "alone and not soak" $(REAL_TESTS)

# make test on a loaded machine: one core kept busy by another process the whole time. It must pass as
# make test does (the tests wait for conditions, with deadlines meant for a loaded machine).
test-loaded: $(STAMP) $(NODE_STAMP)
	$(BIN)/python -c "while True: pass" & busy=$$!; trap "kill $$busy" EXIT; $(MAKE) test

bench: $(STAMP)
	$(BIN)/python -m bench.member
	$(BIN)/python -m bench.oplog
	$(BIN)/python -m bench.replset
	$(BIN)/python -m bench.initial_sync
	$(BIN)/python -m bench.rss
	$(BIN)/python -m bench.loop_latency
	$(BIN)/python -m bench.part_log_pull
	$(BIN)/python -m bench.parts
	$(BIN)/python -m bench.spark
	$(BIN)/python -m bench.read_concern
	$(BIN)/python -m bench.change_streams
	$(BIN)/python -m bench.transactions
	$(BIN)/python -m bench.security

soak: $(STAMP)
	$(BIN)/pytest -m soak -s

spec: $(STAMP)
	$(BIN)/python -m tests.spec

fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz --count 100000

clean:
	rm -rf $(VENV) data .pytest_cache
