"""Progress bars: shown on a terminal for work that lasts, never in logs or pipes (#14 case 15)."""
import fcntl
import os
import pty
import struct
import termios
import subprocess
import sys

from _harness import child_env
from conftest import ROOT

RUN = [sys.executable, "-m", "triaccel.cli", "train", "--config", str(ROOT / "configs" / "quickstart.yaml"),
       "--set", "epochs=1", "--set", "tracking.enabled=false", "--set", "evaluate_test=false"]


def _on_a_terminal(env) -> str:
    """The command's output as a terminal shows it (stdout and stderr on one pseudo-terminal)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100x24 terminal
    p = subprocess.Popen(RUN, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, close_fds=True)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    p.wait(timeout=600)
    os.close(master)
    assert p.returncode == 0, out.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


def test_epochs_show_progress_on_a_terminal_only():
    env = child_env("TRIACCEL_PROGRESS")
    env["TRIACCEL_PROGRESS_DELAY"] = "0"  # a quickstart epoch is short: show the bar at once
    shown = _on_a_terminal(env)
    assert "epoch 1/1" in shown and "img/s" in shown  # tqdm's bar, with its rate
    piped = subprocess.run(RUN, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert piped.returncode == 0
    assert "img/s]" not in piped.stderr and "\r" not in piped.stderr  # no bar in a log or a pipe
