PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
NODES ?= 3
PORT ?= 27017
DIR ?= ./data

.PHONY: install run test lint bench soak fuzz spec clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,spark]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/replset up --nodes $(NODES) --port $(PORT) --dir $(DIR)

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) lint
	$(BIN)/pytest

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

soak: $(STAMP)
	$(BIN)/pytest -m soak -s

spec: $(STAMP)
	$(BIN)/python -m tests.spec

fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz --count 100000

clean:
	rm -rf $(VENV) data .pytest_cache
