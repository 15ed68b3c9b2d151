"""Run a command beside N CPU-spinning processes, as on a shared machine, and return its exit status.

    python scripts/cpu_load.py [-n N] COMMAND [ARGS...]       e.g.  python scripts/cpu_load.py -n 2 pytest -q

N defaults to the number of cores. The spinners are started before the command and stopped after it (also
when it fails or is interrupted); they are plain busy loops, so the command competes for every core.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=os.cpu_count() or 2, help="spinning processes (default: cores)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run under load")
    args = parser.parse_args()
    if not args.command:
        parser.error("a COMMAND to run is required")
    if args.n < 0:
        parser.error(f"-n must be >= 0 spinning processes, got {args.n}")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.n)]
    print(f"cpu_load: {args.n} spinning processes beside: {' '.join(args.command)}", file=sys.stderr, flush=True)
    try:
        return subprocess.call(args.command)
    except KeyboardInterrupt:
        return 130
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


if __name__ == "__main__":
    sys.exit(main())
