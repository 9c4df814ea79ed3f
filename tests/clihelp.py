import subprocess
import sys


def specli(*args, stdin: str | bytes | None = "", env=None, timeout=600, cwd=None):
    """Run the CLI as a user would; returns (rc, stdout, stderr). ``stdin`` may be bytes (sent
    as they are, e.g. text in another encoding); the output is decoded as UTF-8 either way."""
    binary = isinstance(stdin, bytes)
    r = subprocess.run([sys.executable, "-m", "specli", *args], input=stdin, capture_output=True,
                       text=not binary, env=env, timeout=timeout, cwd=cwd,
                       stdin=None if stdin is not None else subprocess.DEVNULL)
    if binary:
        return r.returncode, r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
    return r.returncode, r.stdout, r.stderr
