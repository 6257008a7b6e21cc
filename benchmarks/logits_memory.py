"""What a micro-batch's log-probs cost in memory at a real vocabulary: `algos.losses.token_logprobs` (in blocks of
``CHUNK_ELEMENTS`` logits) against the whole-tensor formula (an fp32 log-softmax of every logit), side by side, through
a forward and a backward pass on the CPU (the profiler's count of every allocation).

    python benchmarks/logits_memory.py [--rows 2] [--tokens 1024] [--vocab 151936]

Prints, for bf16 logits (a GPU's, under autocast) and fp32 ones, the bytes held between the passes and the peak, and
ends with ``bf16_peak_ratio=<blocks/whole> fp32_peak_ratio=<blocks/whole> bf16_held_mib=<blocks> ...``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from algos.losses import token_logprobs  # noqa: E402
from tests.support.memory import forward_backward_memory  # noqa: E402

MIB = 2**20


def whole_logprobs(logits, targets):
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=151936, help="Qwen2's by default")
    args = parser.parse_args(argv)
    targets = torch.randint(args.vocab, (args.rows, args.tokens), generator=torch.Generator().manual_seed(0))
    figures = {}
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randn(args.rows, args.tokens + 1, args.vocab, dtype=dtype).requires_grad_()
        for name, compute in (("blocks", lambda x: token_logprobs(x, targets)),
                              ("whole", lambda x: whole_logprobs(x, targets))):
            logits.grad = None
            held, peak = forward_backward_memory(compute, logits)
            figures[str(dtype).removeprefix("torch."), name] = (held, peak)
            print(f"{str(dtype).removeprefix('torch.'):>8} {name:>6}: held between the passes {held / MIB:8.1f} MiB, "
                  f"peak {peak / MIB:8.1f} MiB", flush=True)
        del logits
    ratios = {d: figures[d, "blocks"][1] / figures[d, "whole"][1] for d in ("bfloat16", "float32")}
    print(f"bf16_peak_ratio={ratios['bfloat16']:.3f} fp32_peak_ratio={ratios['float32']:.3f} "
          f"bf16_held_mib={figures['bfloat16', 'blocks'][0] / MIB:.1f} "
          f"bf16_whole_held_mib={figures['bfloat16', 'whole'][0] / MIB:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
