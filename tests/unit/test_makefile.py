"""The Makefile's set-up for a normal user: ``make system-deps`` (what ``make test`` runs first) installs the
Debian packages as root, through ``sudo -n`` when sudo needs no password, and otherwise names the packages and
stops before anything else is installed; ``make install`` links ``kernel-lsp`` where the editors' default
command finds it.

Run against stand-ins on a PATH of their own: ``id`` (the user), ``sudo`` (with or without a password),
``apt-get`` (records what it was asked, and with which ``DEBIAN_FRONTEND``); no package is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
PACKAGES = "neovim clangd-19 nodejs npm chromium postgresql"

pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")


def _script(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _bin(tmp_path: Path, *, uid: int, sudo: str | None, present: tuple[str, ...] = ()) -> Path:
    """A PATH folder: ``sudo`` is ``None`` (not installed), ``"nopasswd"`` or ``"password"``."""
    folder = tmp_path / "bin"
    folder.mkdir()
    log = tmp_path / "log"
    for tool in ("env", "true"):
        os.symlink(shutil.which(tool), folder / tool)
    _script(folder, "id", f'[ "$1" = -u ] && echo {uid}\n')
    _script(folder, "apt-get", f'echo "apt-get $* [DEBIAN_FRONTEND=$DEBIAN_FRONTEND]" >> {log}\n')
    if sudo is not None:
        refuse = 'echo "sudo: a password is required" >&2; exit 1\n' if sudo == "password" else ""
        _script(folder, "sudo", f'echo "sudo $*" >> {log}\n[ "$1" = -n ] || exit 9\n{refuse}shift\nexec "$@"\n')
    for tool in present:
        _script(folder, tool, "exit 0\n")
    return folder


def _make(tmp_path: Path, folder: Path, *targets: str, **variables: str) -> subprocess.CompletedProcess:
    return subprocess.run([MAKE, "-s", "-C", str(ROOT), *targets, *(f"{k}={v}" for k, v in variables.items())],
                          env={"PATH": str(folder), "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60)


def _log(tmp_path: Path) -> list[str]:
    log = tmp_path / "log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_normal_user_installs_through_sudo_without_a_prompt(tmp_path):
    result = _make(tmp_path, _bin(tmp_path, uid=1000, sudo="nopasswd"), "system-deps")
    assert result.returncode == 0, result.stderr
    assert _log(tmp_path) == [
        "sudo -n true",
        "sudo -n apt-get update -qq",
        "apt-get update -qq [DEBIAN_FRONTEND=]",
        f"sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {PACKAGES}",
        f"apt-get install -y -qq {PACKAGES} [DEBIAN_FRONTEND=noninteractive]",
    ]


@pytest.mark.parametrize("sudo", ["password", None])
def test_without_usable_sudo_the_packages_are_named_and_make_stops(tmp_path, sudo):
    result = _make(tmp_path, _bin(tmp_path, uid=1000, sudo=sudo), "system-deps")
    assert result.returncode != 0
    assert f"make test needs these Debian packages: {PACKAGES}" in result.stderr
    assert f"  sudo apt-get install -y {PACKAGES}\n" in result.stderr
    assert not any(line.startswith("apt-get") for line in _log(tmp_path))
    assert "password is required" not in result.stderr  # sudo -n was asked quietly


def test_root_installs_directly(tmp_path):
    result = _make(tmp_path, _bin(tmp_path, uid=0, sudo="nopasswd"), "system-deps")
    assert result.returncode == 0, result.stderr
    assert _log(tmp_path) == ["apt-get update -qq [DEBIAN_FRONTEND=]",
                              f"apt-get install -y -qq {PACKAGES} [DEBIAN_FRONTEND=noninteractive]"]


def test_nothing_missing_runs_nothing(tmp_path):
    folder = _bin(tmp_path, uid=1000, sudo=None, present=("nvim", "clangd-19", "node", "npm", "chromium", "initdb"))
    result = _make(tmp_path, folder, "system-deps")
    assert result.returncode == 0 and result.stderr == "" and _log(tmp_path) == []


def test_make_test_checks_the_packages_before_building_anything(tmp_path):
    # python3 is not on this PATH: had make created the virtual environment first, that would fail instead.
    venv = tmp_path / "venv"
    result = _make(tmp_path, _bin(tmp_path, uid=1000, sudo=None), "install-test", VENV=str(venv))
    assert result.returncode != 0
    assert f"make test needs these Debian packages: {PACKAGES}" in result.stderr
    assert not venv.exists()


def test_make_install_links_the_command_into_bindir(tmp_path):
    # A stand-in venv with its stamp up to date: make install then only links (no pip).
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _script(venv / "bin", "kernel-lsp", 'echo "kernel-lsp $*"\n')
    (venv / "bin" / "python").symlink_to(shutil.which("true"))
    (venv / ".installed-serve").touch()
    os.utime(venv / ".installed-serve", (4e9, 4e9))  # newer than pyproject.toml
    bindir = tmp_path / "local" / "bin"
    folder = _bin(tmp_path, uid=1000, sudo=None)
    for tool in ("mkdir", "ln"):
        os.symlink(shutil.which(tool), folder / tool)
    result = _make(tmp_path, folder, "install", VENV=str(venv), BINDIR=str(bindir))
    assert result.returncode == 0, result.stderr
    link = bindir / "kernel-lsp"
    assert link.is_symlink() and os.readlink(link) == str(venv / "bin" / "kernel-lsp")
    assert f"{bindir} is not on PATH in this shell" in result.stderr
    assert subprocess.run([str(link), "serve"], capture_output=True, text=True).stdout == "kernel-lsp serve\n"
    # Again, with BINDIR on PATH: the link is replaced, no PATH advice.
    again = subprocess.run([MAKE, "-s", "-C", str(ROOT), "install", f"VENV={venv}", f"BINDIR={bindir}"],
                           env={"PATH": f"{bindir}:{folder}", "HOME": str(tmp_path)}, capture_output=True, text=True)
    assert again.returncode == 0 and "not on PATH" not in again.stderr
    # A file there that is not a link (another install) is left alone.
    link.unlink()
    link.write_text("someone else's\n")
    refused = _make(tmp_path, folder, "install", VENV=str(venv), BINDIR=str(bindir))
    assert refused.returncode != 0 and "exists and is not a link" in refused.stderr
    assert link.read_text() == "someone else's\n"


def _fake_venv(tmp_path: Path, *, gpu_extra_fails: bool) -> Path:
    """A venv whose python records each pip install it is asked for (and fails the GPU extra if told to)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fail = "case \"$*\" in *'[gpu]'*) exit 1;; esac\n" if gpu_extra_fails else ""
    _script(venv / "bin", "python", f'echo "python $*" >> {tmp_path / "log"}\n{fail}')
    return venv


@pytest.mark.parametrize(("gpu", "extra_fails", "installs"), [
    (False, False, ["-e ."]),
    (True, False, ["-e .[gpu]"]),
    (True, True, ["-e .[gpu]", "-e ."]),
])
def test_the_server_install_takes_the_gpu_extra_where_nvidia_smi_lists_a_gpu(tmp_path, gpu, extra_fails, installs):
    venv = _fake_venv(tmp_path, gpu_extra_fails=extra_fails)
    folder = _bin(tmp_path, uid=1000, sudo=None)
    os.symlink(shutil.which("touch"), folder / "touch")
    if gpu:
        _script(folder, "nvidia-smi", '[ "$1" = -L ] && echo "GPU 0: NVIDIA H200"\n')
    result = _make(tmp_path, folder, f"{venv}/.installed-serve", VENV=str(venv))
    assert result.returncode == 0, result.stderr
    asked = [line.split("install --disable-pip-version-check -q ", 1)[1] for line in _log(tmp_path) if " install " in line]
    assert asked == installs
    assert (venv / ".installed-serve").exists()
    assert ("the GPU extra did not install" in result.stderr) == extra_fails
