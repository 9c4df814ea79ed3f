"""Shared by the Hub tests: where a downloaded file lies in the Hub cache, and the one-line error
of a failed command."""

import os


def cache_file(env, repo, name):
    snaps = os.path.join(env["HF_HOME"], "hub", "models--" + repo.replace("/", "--"), "snapshots")
    for d in os.listdir(snaps) if os.path.isdir(snaps) else []:
        p = os.path.join(snaps, d, name)
        if os.path.exists(p):
            return p
    return None


def one_line_error(rc, err):
    lines = err.strip().splitlines()
    assert rc != 0 and len(lines) >= 1 and "Traceback" not in err, err
    return lines[-1]
