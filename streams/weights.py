"""Weights over streams: versioned, checksummed, written once and read by every rollout actor.

The learner's `WeightsPublisher` writes each version's bytes (safetensors, never pickle) once, to a file in
shared memory (a directory of its own under `/dev/shm`, mode 0700: its files are 0600, written without following
links, and a killed learner's directory is swept by the next one, `streams/private_files.py`), and publishes a
small manifest: version, size, the CRC-32C of every chunk, the
file, and the address that serves chunks (the `crc32c` package uses the CPU's CRC instruction: about 6x
faster here than zlib's CRC-32, so checking costs each reader little). A `WeightsFollower` on the same host
maps the file (one write, many readers); on another host it fetches the chunks over ZeroMQ with credit-based
flow control. Either way it checks every chunk's CRC before the model sees a byte. The publisher re-announces the latest
manifest every few seconds, so a rollout actor that joins late gets the latest version. A follower reads the
learner's version announcements and manifests together (`LearnerFeed`): each manifest names the learner's life
that made it, so a restarted learner's versions are told from its predecessor's.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
import trio
from crc32c import crc32c
from safetensors.torch import save as save_tensors

from streams.endpoints import Inbox, Outbox
from streams.messages import VersionAnnounced, WeightsChunk, WeightsFetch, WeightsManifest
from streams.private_files import SHM_DIR, open_private, private_dir, remove_private_dir, sweep_stale, write_private
from streams.replies import open_replies
from streams.wire import DropLog, FRAME_LIMITS, FrameError, Kind, decode_frame

log = logging.getLogger(__name__)

CHUNK_BYTES = 8 * 2**20


def weights_to_bytes(model) -> bytes:
    """Every parameter once (tied embeddings are one parameter), detached, on the CPU. ``model``: a module, or
    its parameters by name (a sharded model's, gathered)."""
    named = model.items() if isinstance(model, dict) else model.named_parameters()
    return save_tensors({name: p.detach().cpu().contiguous() for name, p in named})


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def tensors_from_buffer(data) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors buffer as views into it (no copy; the buffer must be writable).

    The format: an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and
    byte range, then the bytes. A buffer that does not follow it raises ValueError.
    """
    view = memoryview(data).cast("B")
    if len(view) < 8:
        raise ValueError(f"safetensors buffer of {len(view)} bytes has no header")
    (length,) = struct.unpack_from("<Q", view)
    if 8 + length > len(view):
        raise ValueError(f"safetensors header of {length} bytes runs past the buffer ({len(view)} bytes)")
    header = json.loads(bytes(view[8:8 + length]))
    header.pop("__metadata__", None)
    start, tensors = 8 + length, {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        if not 0 <= begin <= end <= len(view) - start:
            raise ValueError(f"tensor {name} lies outside the buffer")
        dtype = _DTYPES[info["dtype"]]
        flat = torch.frombuffer(view, dtype=torch.uint8, count=end - begin, offset=start + begin) if end > begin \
            else torch.empty(0, dtype=torch.uint8)
        tensors[name] = flat.view(dtype).reshape(info["shape"])
    return tensors


def load_weights(model, data) -> None:
    """Copy published parameters (a safetensors buffer) into ``model`` in place; every one must be present."""
    tensors = tensors_from_buffer(data if isinstance(data, (bytearray, mmap.mmap)) else bytearray(data))
    expected = {name for name, _ in model.named_parameters()}
    if set(tensors) != expected:
        missing, unknown = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
        raise ValueError(f"weights do not fit the model: missing {missing[:5]}, unknown {unknown[:5]}")
    model.load_state_dict(tensors, strict=False)


def host_id() -> str:
    """This machine (and boot): readers of a shared-memory file must share both with its writer."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def chunk_crcs(data, chunk_bytes: int) -> list[int]:
    view = memoryview(data)
    return [crc32c(view[i:i + chunk_bytes]) for i in range(0, len(view), chunk_bytes)]


def free_bytes(directory: str | os.PathLike) -> int:
    """Bytes this user may still write in ``directory``'s file system."""
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


class WeightsPublisher:
    """The learner's side: one file per version (the last ``keep`` kept), manifests, and a chunk server.

    ``directory``: where its private directory is made (this user's directories there whose owner died are
    swept first); ``close`` removes it. Shared memory may be small (Docker gives a container 64 MB of
    ``/dev/shm``): a version is written only where it fits (`free_bytes`), the oldest kept one removed first if that
    makes room (a reader that has it open keeps its bytes); where even that is not enough, or there is no
    ``directory``, the versions go to a private directory under ``fallback`` (a disk) from then on, said once."""

    def __init__(self, name: str, policy_id: str, manifests: Outbox, fetch_from: str,
                 directory: str | None = SHM_DIR, chunk_bytes: int = CHUNK_BYTES, keep: int = 2, life: int = 0,
                 fallback: str | None = None):
        if directory is None and fallback is None:
            raise RuntimeError("no shared-memory directory (/dev/shm) here: pass one, or a fallback, to "
                               "WeightsPublisher")
        self.policy_id, self.manifests, self.fetch_from = policy_id, manifests, fetch_from
        self.chunk_bytes, self.keep, self.life = chunk_bytes, keep, life
        self.fallback, self._tag = fallback, f"{name}-{policy_id}"
        self.directories: list[Path] = []  # every private directory this publisher made (close removes them)
        self.directory = self._private(directory if directory is not None else fallback)
        self._prefix = f"{name}-{policy_id}"
        self._published: dict[int, WeightsManifest] = {}  # version -> manifest, oldest first
        self.stats = {"published": 0, "bytes_written": 0, "chunks_served": 0, "fetches_refused": 0,
                      "removed_early": 0}
        self.replies = None  # the chunk replies, while `serve_chunks` runs

    def _private(self, root: str) -> Path:
        sweep_stale(root)
        self.directories.append(private_dir(root, self._tag))
        return self.directories[-1]

    @property
    def latest(self) -> WeightsManifest | None:
        return next(reversed(self._published.values()), None)

    async def publish(self, version: int, data: bytes) -> WeightsManifest:
        """Write ``data`` (safetensors) once and announce it."""
        manifest = await trio.to_thread.run_sync(self._write, version, data)
        self._published[version] = manifest
        while len(self._published) > self.keep:  # a reader that has the file open keeps its bytes
            self._remove_oldest()
        await self.manifests.send(manifest.to_body())
        self.stats["published"] += 1
        self.stats["bytes_written"] += len(data)
        return manifest

    def _remove_oldest(self) -> None:
        old = self._published.pop(next(iter(self._published)))
        Path(old.path).unlink(missing_ok=True)

    def _make_room(self, size: int) -> None:
        """Room in ``directory`` for a version of ``size`` bytes (see the class's docstring)."""
        while free_bytes(self.directory) < size and len(self._published) > 1:  # the newest stays for late readers
            self._remove_oldest()
            self.stats["removed_early"] += 1
        if free_bytes(self.directory) >= size or self.fallback is None or self.directory.parent == Path(self.fallback):
            return
        log.warning("%s has %.1f MiB free, less than a version of the weights (%.1f MiB): they go to %s from now on",
                    self.directory.parent, free_bytes(self.directory) / 2**20, size / 2**20, self.fallback)
        self.directory = self._private(self.fallback)

    def _write(self, version: int, data: bytes) -> WeightsManifest:
        self._make_room(len(data))
        path = write_private(self.directory, f"{self._prefix}-v{version}.safetensors", data)  # whole or not at all
        return WeightsManifest(self.policy_id, version, len(data), self.chunk_bytes,
                               chunk_crcs(data, self.chunk_bytes), host_id(), str(path), self.fetch_from, self.life)

    async def announce_latest(self) -> None:
        """Send the latest manifest again, for subscribers that joined late or missed it."""
        if self.latest is not None:
            await self.manifests.send(self.latest.to_body())

    async def serve_chunks(self, fetches: Inbox, transport) -> None:
        """Answer ``WeightsFetch`` requests from other hosts, each to its ``reply_to`` address if the transport may
        connect there; a destination that takes nothing holds up only its own chunks (`streams.replies`)."""
        async with open_replies(transport, Kind.WEIGHTS_CHUNK, "weights", queue=64) as replies:
            self.replies = replies
            while True:
                fetch = await fetches.receive()
                data = await trio.to_thread.run_sync(self._read_chunk, fetch)
                replies.post(fetch.reply_to, WeightsChunk(self.policy_id, fetch.version, fetch.index, data).to_body())

    def statistics(self) -> dict:
        return {**self.stats, "replies": self.replies.statistics() if self.replies else {}}

    def _read_chunk(self, fetch: WeightsFetch) -> bytes:
        manifest = self._published.get(fetch.version)
        if manifest is None or fetch.policy_id != self.policy_id or not 0 <= fetch.index < manifest.chunks:
            self.stats["fetches_refused"] += 1
            return b""
        with open(manifest.path, "rb") as f:
            f.seek(fetch.index * manifest.chunk_bytes)
            self.stats["chunks_served"] += 1
            return f.read(manifest.chunk_bytes)

    def close(self) -> None:
        self._published.clear()
        for directory in self.directories:
            remove_private_dir(directory)


@dataclass
class FetchedWeights:
    """A checked version, not yet loaded: ``tensors`` is a safetensors buffer (see `load_weights`). ``life``: the
    learner's life that published it (None: no life was announced, as from a learner that does not say)."""

    version: int
    tensors: mmap.mmap | bytearray
    life: int | None = None


class LearnerFeed:
    """A follower's subscription to one learner's publisher: its version announcements (``VersionAnnounced``,
    which name the learner's life) and its weight manifests, on one subscriber, in the order it sent them.

    The learner announces its version and life before each manifest, and the manifest names its life too: a
    follower that subscribed between the two (ZeroMQ drops what a publisher sent before a subscription reached
    it) still knows whose weights they are. Bad frames are dropped and counted by reason, as by an `Inbox`."""

    DECODERS = {Kind.VERSION: VersionAnnounced.from_body, Kind.WEIGHTS: WeightsManifest.from_body}

    def __init__(self, subscriber):
        self.channel = subscriber
        self.drops = DropLog("learner feed")
        self._last_seq: dict[tuple[str, Kind], int] = {}
        self._missed = 0

    async def receive(self) -> VersionAnnounced | WeightsManifest:
        while True:
            parts = (await self.channel.receive())[1:]  # less the topic
            try:
                header, body = decode_frame(parts)
                if header.kind not in self.DECODERS:
                    raise FrameError(f"frame of kind {header.kind.value!r}, expected version or weights",
                                     "wrong_kind")
            except FrameError as error:
                self.drops.drop(error.reason, error)
                continue
            try:
                message = self.DECODERS[header.kind](body)
            except Exception as error:  # never the follower's problem, however it fails
                self.drops.drop("bad_body", error)
                continue
            last = self._last_seq.get((header.sender, header.kind))
            self._missed += max(header.seq - last - 1, 0) if last is not None else 0
            self._last_seq[(header.sender, header.kind)] = header.seq
            return message

    def statistics(self) -> dict:
        stats = self.channel.statistics()
        return {**stats, "gaps": stats["gaps"] + self._missed, "dropped_frames": self.drops.total(),
                "dropped_by_reason": dict(self.drops.counts)}


class WeightsFollower:
    """A rollout actor's side: turns manifests into checked bytes, from shared memory or in chunks.

    ``max_bytes``: the most a version of the follower's model can take (None: what the manifest's own bounds
    allow); a manifest that claims more is refused before anything is allocated (``too_large``). `fetch` never
    raises (but cancellation): whatever fails, a MemoryError included, costs that version, counted, and the
    follower waits for the next, so no manifest can end the actor that follows it."""

    def __init__(self, transport, fetch_timeout_s: float = 120.0, shared_memory: bool = True,
                 max_bytes: int | None = None):
        self.transport, self.fetch_timeout_s, self.max_bytes = transport, fetch_timeout_s, max_bytes
        self.host = host_id() if shared_memory else None  # None: never the publisher's host, always chunks
        self.stats = {"versions_received": 0, "from_shared_memory": 0, "from_chunks": 0, "corrupt": 0,
                      "fetch_failed": 0, "too_large": 0, "bad_address": 0, "bytes_received": 0}

    async def fetch(self, manifest: WeightsManifest) -> mmap.mmap | bytearray | None:
        """The version's bytes (a private mapping of the shared file, or the assembled chunks), every chunk
        checked; None (counted, logged) if they cannot be had whole, or should not be had at all."""
        if self.max_bytes is not None and manifest.size > self.max_bytes:
            self.stats["too_large"] += 1
            log.warning("weights version %d refused: its manifest claims %d bytes, more than the %d a version of "
                        "this model can take", manifest.version, manifest.size, self.max_bytes)
            return None
        try:
            return await self._fetch(manifest)
        except Exception as error:  # noqa: BLE001 - a version lost, never the follower (cancellation passes)
            self.stats["fetch_failed"] += 1
            log.warning("weights version %d (%d bytes) not fetched: %r; waiting for the next", manifest.version,
                        manifest.size, error)
            return None

    async def _fetch(self, manifest: WeightsManifest) -> mmap.mmap | bytearray | None:
        if manifest.host == self.host and os.path.exists(manifest.path):
            data, source = await trio.to_thread.run_sync(_map_file, manifest.path), "from_shared_memory"
        else:
            data, source = await self._fetch_chunks(manifest), "from_chunks"
        if data is None:
            self.stats["fetch_failed"] += 1
            return None
        if len(data) != manifest.size or await trio.to_thread.run_sync(chunk_crcs, data, manifest.chunk_bytes) != manifest.chunk_crcs:
            self.stats["corrupt"] += 1
            log.warning("weights version %d failed its checksums (%s); waiting for the next", manifest.version, source)
            return None
        self.stats[source] += 1
        self.stats["versions_received"] += 1
        self.stats["bytes_received"] += len(data)
        return data

    async def _fetch_chunks(self, manifest: WeightsManifest) -> bytearray | None:
        try:  # a manifest names where its chunks are served: connected to only where a reply may go
            self.transport.check_peer_address(manifest.fetch_from)
        except ValueError as error:
            self.stats["bad_address"] += 1
            log.warning("weights version %d refused: %s", manifest.version, error)
            return None
        data = bytearray(manifest.size)
        with trio.move_on_after(self.fetch_timeout_s):
            async with (
                self.transport.open_receiver(capacity=8,
                                             max_message_bytes=FRAME_LIMITS[Kind.WEIGHTS_CHUNK]) as chunks_in,
                self.transport.open_sender([manifest.fetch_from], capacity=8) as requests,
                trio.open_nursery() as nursery,
            ):
                outbox = Outbox(requests, Kind.WEIGHTS_FETCH, "weights-follower")
                fetches = [WeightsFetch(manifest.policy_id, manifest.version, i, chunks_in.address)
                           for i in range(manifest.chunks)]
                nursery.start_soon(_send_all, outbox, [f.to_body() for f in fetches])
                inbox = Inbox(chunks_in, Kind.WEIGHTS_CHUNK, WeightsChunk.from_body)
                for _ in range(manifest.chunks):
                    chunk = await inbox.receive()
                    start = chunk.index * manifest.chunk_bytes
                    if chunk.version != manifest.version or not chunk.data or not 0 <= start < manifest.size:
                        log.warning("weights version %d is no longer served; waiting for the next", manifest.version)
                        nursery.cancel_scope.cancel()
                        return None
                    data[start:start + len(chunk.data)] = chunk.data
                return data
        log.warning("fetching weights version %d timed out", manifest.version)
        return None


async def _send_all(outbox: Outbox, bodies: list[bytes]) -> None:
    for body in bodies:
        await outbox.send(body)


def _map_file(path: str) -> mmap.mmap | None:
    """A copy-on-write mapping of the file: no copy is made, and the publisher's bytes cannot be changed. A link
    at ``path`` is not followed (nor is anything but a regular file mapped)."""
    try:
        fd = open_private(path)
    except OSError:  # unlinked between the check and the open: a newer version is on its way
        return None
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
