"""What tidal adds to vLLM's worker (vLLM's ``worker_extension_cls``): new weights loaded from memory.

`VllmSampler.load` sends a version's safetensors buffer to the worker over the engine's own RPC
(``collective_rpc``), in pieces (`tidal_stage_weights`; msgpack carries less than 4 GiB a value) while the engine
still generates, then, with the engine paused, has the worker load them (`tidal_load_staged_weights`) through
vLLM's ``reload_weights``: the path a reload from a file takes, fed the tensors (views into the received
bytes) instead of a directory. The worker runs in vLLM's engine process, which imports this module by name.
"""

from __future__ import annotations

from streams.weights import tensors_from_buffer


class WeightsFromMemory:
    """Mixed into vLLM's worker class; its methods are called by name through ``collective_rpc``."""

    def tidal_stage_weights(self, version: int, offset: int, total: int, piece: bytes) -> None:
        """Copy ``piece`` to ``offset`` of version ``version``'s ``total`` bytes (a new version starts afresh)."""
        staged = getattr(self, "_tidal_staged", None)
        if staged is None or staged[0] != version or len(staged[1]) != total:
            staged = self._tidal_staged = (version, bytearray(total))
        if offset + len(piece) > total:
            raise ValueError(f"weights piece at {offset} of {len(piece)} bytes runs past {total} bytes")
        staged[1][offset:offset + len(piece)] = piece

    def tidal_load_staged_weights(self, version: int) -> int:
        """Load the staged bytes of ``version`` into the model in place; the number of tensors loaded."""
        staged, self._tidal_staged = getattr(self, "_tidal_staged", None), None
        if staged is None or staged[0] != version:
            raise RuntimeError(f"no weights of version {version} were staged on this worker")
        tensors = tensors_from_buffer(staged[1])
        self.reload_weights(weights_iterator=iter(tensors.items()))  # vLLM's Worker.reload_weights
        return len(tensors)
