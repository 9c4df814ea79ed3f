import subprocess
import sys


def specli(*args, stdin: str | None = "", env=None, timeout=600):
    """Run the CLI as a user would; returns (rc, stdout, stderr)."""
    r = subprocess.run([sys.executable, "-m", "specli", *args], input=stdin, capture_output=True,
                       text=True, env=env, timeout=timeout,
                       stdin=None if stdin is not None else subprocess.DEVNULL)
    return r.returncode, r.stdout, r.stderr
