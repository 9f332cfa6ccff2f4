"""Measure issue 51's items 1-2: end tests/stage_guide.py at every stage boundary of a dumped
step, each way a training process ends (SIGKILL, SIGTERM, an exception, a peer rank's death
under torchrun), REPEATS times each, and count the runs where a step stopped or announced is
missing, a stderr line is not true, user code ran after SIGTERM, or the exit is wrong.

    PYTHONPATH=. .venv/bin/python scripts/kill_stages.py [REPEATS] [KIND,...] [STAGE,...]
Defaults: 20 runs, every kind and stage, one run at a time (the host is shared). Prints one line
per kind and stage, then the problems of the runs that had any.
"""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
import stage_support  # noqa: E402


def main() -> int:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    kinds = sys.argv[2].split(",") if len(sys.argv) > 2 else stage_support.KINDS
    stages = sys.argv[3].split(",") if len(sys.argv) > 3 else stage_support.STAGES
    workers = int(os.environ.get("WORKERS", "1"))
    problems, bad_total, runs = [], 0, 0
    for kind in kinds:
        for stage in stages:
            began = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="precdbg-stages-") as root:
                bad, found = stage_support.run_many(kind, stage, repeats, root, workers)
            runs += repeats
            bad_total += bad
            problems += found
            print(f"{kind:9} {stage:11} runs {repeats:3}  with a problem {bad:3}  "
                  f"({time.monotonic() - began:.0f} s)", flush=True)
    print(f"total: {runs} runs, {bad_total} with a problem", flush=True)
    for line in problems:
        print(line)
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main())
