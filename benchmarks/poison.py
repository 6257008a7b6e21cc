"""Well-typed poison through a live reward -> replay -> learner pipeline and a league: is any of it kept?

    python benchmarks/poison.py [--rounds 2] [--quick]

Every actor runs in this process over real ZeroMQ sockets. The script plays the env actors: episodes with a
poisoned turn of every class, poison-only and honest episodes, bad Arrow bodies, a batch of every class straight
to the learner and poisoned match results to the league (`tests/support/poison.py` lists the classes). Then it
counts the marked poison found in replay's spill, the learner's trained batches and the league's journal.
Last line: ``poison_rows=<n> poison_kept=<n>``.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: its packages and tests.support

from tests.support import poison  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="times every class of poison is sent")
    parser.add_argument("--quick", action="store_true", help="one round")
    args = parser.parse_args()
    outcome = poison.run(1 if args.quick else args.rounds)
    print(f"poison_rows={outcome['poison_rows']} poison_kept={outcome['poison_kept']}")


if __name__ == "__main__":
    main()
