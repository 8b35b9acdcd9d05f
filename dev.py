"""Set up bertscope in ./.venv and run the main job or the tests. Needs only Python >= 3.10 and pip.

    python3 dev.py run      # set up, then `bertscope run all` (which writes the report, explorer included)
    python3 dev.py test     # set up, then ruff and the test suite
    python3 dev.py setup    # set up only

torch is installed first and pinned (BERTSCOPE_TORCH, default torch==2.13.0) so that no other package
pulls a different build. Setup is skipped when pyproject.toml has not changed since the last one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
TORCH = os.environ.get("BERTSCOPE_TORCH", "torch==2.13.0")


def main() -> int:
    command = sys.argv[1] if len(sys.argv) > 1 else "run"
    if command not in ("setup", "run", "test"):
        print(__doc__)
        return 2
    setup()
    if command == "run":
        out = os.environ.get("BERTSCOPE_OUT", "results")
        run([str(BIN / "bertscope"), "run", "all", "--out", out, *sys.argv[2:]])
        print(f"\nResults: {ROOT / out}/  —  open {ROOT / out / 'index.html'} in a browser.")
    elif command == "test":
        run([str(BIN / "ruff"), "check", "."])
        run([str(BIN / "python"), "-m", "pytest", *sys.argv[2:]])
    return 0


def setup() -> None:
    stamp = VENV / ".bertscope-setup"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + TORCH.encode()).hexdigest()
    if stamp.is_file() and stamp.read_text() == want and (BIN / "bertscope").exists():
        return
    if not (BIN / "python").exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    pip = [str(BIN / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    print(f"installing {TORCH} (first, pinned)", flush=True)
    run(pip + [TORCH])
    print("installing bertscope and its dependencies", flush=True)
    run(pip + [TORCH, "-e", f"{ROOT}[dev]"])
    stamp.write_text(want)


def run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, cwd=ROOT)
    if result.returncode:
        sys.exit(result.returncode)


if __name__ == "__main__":
    sys.exit(main())
