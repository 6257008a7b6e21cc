"""tidal's streams against the obvious alternatives, measured side by side in one run.

1. Trajectory batches (records of 512 tokens: ids, log-probs, versions, scalars) from producer processes to
   a consumer process three ways: tidal streams (credits, frames, Arrow decode), Ray (an actor call per
   batch, through its object store), and raw ZeroMQ PUSH/PULL of the same bytes (no framing: the limit).
2. Publishing a 100 MB state dict to 1, 2 and 4 subscriber processes on this host.
3. The fuzzer (`stream_fuzz.py`, which also runs alone): bad frames of every class at every kind of receiving
   endpoint of live actors, then a check that every actor still serves.

    python benchmarks/streams.py [--quick]

The last line is `vs_ray=<x> vs_raw=<x> publish4_vs_1=<x> fuzz_frames=<n> fuzz_crashes=<n>`.
The work is in `stream_bench.py` and `stream_fuzz.py`: this file's name is also the name of the `streams`
package, which other scripts here import; for them it hands over the package (below).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "streams":  # a script in benchmarks/ imported the package `streams` and found this file
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
    del sys.modules["streams"]
    sys.modules["streams"] = __import__("streams")
elif __name__ == "__main__":
    sys.path[:] = [str(HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != HERE]
    from benchmarks.stream_bench import main

    main()
