"""Shared by the fault tests: a `specli` process that can be killed with its children, waiting
on an observable condition, and a small tmpfs that is a full disk."""

import subprocess
import sys
import time
from contextlib import contextmanager

import pytest


def start(*args, env):
    """`specli ARGS` in its own process group, so a kill takes its children (pip) with it."""
    return subprocess.Popen([sys.executable, "-m", "specli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(what, check, deadline_s=300):
    """Poll an observable condition (a file on disk, a request seen) until it holds."""
    end = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.05)


@contextmanager
def tmpfs(path, size):
    """A tmpfs of ``size`` mounted at ``path``: a real full disk (ENOSPC on write, little free
    space in statvfs) for specli and the pip it starts. Mounting needs root (CAP_SYS_ADMIN), as
    `.ci/run` has; elsewhere the test fails and says so: it never passes unrun."""
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.fail(f"the disk-full tests mount a {size} tmpfs and could not ({r.stderr.strip()}): "
                    "run them as root (CAP_SYS_ADMIN), as CI does", pytrace=False)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
