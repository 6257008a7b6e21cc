"""The fuzzer: bad frames at every kind of receiving endpoint of live actors, then checks that they all still serve.

    python benchmarks/stream_fuzz.py [--quick] [--frames N] [--no-poison]

Every actor runs in this process over real ZeroMQ sockets; at each receiving endpoint the fuzzer sends N frames
(10,000; 1,000 with --quick) of every class of bad frame and broken link, then checks that each endpoint accounted
for every frame and that every actor still serves (`tests/support/stream_fuzz.py` says what each class and check
is). Then, unless `--no-poison`, it sends well-typed poison through a live reward -> replay -> learner pipeline and
a league (`tests/support/poison.py`) and counts the rows of poison kept in any spill, journal or trained batch.
The last line is `fuzz_frames=<n> fuzz_crashes=<n> poison_kept=<n>` (`benchmarks/stream_bench.py` runs the frame
fuzzer too, and reports its part).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: its packages and tests.support

from tests.support import poison  # noqa: E402
from tests.support.stream_fuzz import fuzz_live_actors, summary  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description="bad frames at every kind of receiving endpoint of live actors")
    parser.add_argument("--quick", action="store_true", help="1,000 frames per endpoint instead of 10,000")
    parser.add_argument("--frames", type=int, help="frames per endpoint")
    parser.add_argument("--no-poison", action="store_true", help="frames only: no poison through the pipeline")
    args = parser.parse_args()
    result = fuzz_live_actors(args.frames or (1000 if args.quick else 10_000))
    line = summary(result)
    if not args.no_poison:
        outcome = poison.run(1 if args.quick else 2)
        line += f" poison_kept={outcome['poison_kept']}"
    print(line)


if __name__ == "__main__":
    main()
