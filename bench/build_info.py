"""The build a benchmark record names: EMBSCALE_BUILD when set (a run on a copy of the tree whose git data may be
older than its files sets it), else the checkout's short commit, with "+dirty" when tracked files differ from it;
None when neither is known."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_id():
    env = os.environ.get("EMBSCALE_BUILD")
    if env:
        return env
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None
