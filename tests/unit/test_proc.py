import sys
import threading

import pytest

from kernel_lsp.services.proc import ToolMissing, run


def test_run_captures_output_and_status():
    result = run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"], timeout_s=30)
    assert result.returncode == 3
    assert result.stdout.strip() == "out"
    assert result.stderr.strip() == "err"
    assert not result.ok


def test_timeout_kills_the_whole_group():
    # The child starts a grandchild that would outlive a plain kill of the child.
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    result = run([sys.executable, "-c", code], timeout_s=0.5)
    assert result.timed_out
    assert result.returncode is None
    assert result.wall_s < 10


def test_cancel_stops_the_child():
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    result = run([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=60, cancel=cancel)
    assert result.cancelled
    assert result.wall_s < 10


def test_missing_tool_raises():
    with pytest.raises(ToolMissing):
        run(["definitely-not-a-tool-xyz"], timeout_s=5)
