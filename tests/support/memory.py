"""What torch holds on the CPU while a function runs, from the profiler's record of every allocation and free:
the logits-memory test (``tests/algos/test_chunked_logprobs.py``) and benchmark (``benchmarks/logits_memory.py``)."""

from __future__ import annotations

from torch.profiler import ProfilerActivity, profile


def allocations(fn) -> tuple[int, int]:
    """The most bytes torch held on the CPU at once while ``fn`` ran, and those still held when it returned, both
    counted from its start: the profiler records every allocation and free of the CPU allocator, in order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return peak, live


def forward_backward_memory(compute, logits) -> tuple[int, int]:
    """The bytes a forward pass of ``compute`` (on the positions that predict a token, ``logits[:, :-1]``) leaves
    held for its backward pass, and the peak over both passes."""
    value = []
    forward_peak, held = allocations(lambda: value.append(compute(logits[:, :-1])))
    backward_peak, _ = allocations(lambda: value[0].sum().backward())
    return held, max(forward_peak, held + backward_peak)
