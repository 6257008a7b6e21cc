"""What a checkpoint write cut short (a kill, a full disk) leaves is removed at the learner's next start (review
new 9), never the one complete checkpoint."""

from actors.models.checkpoint_dir import TRAINER_STATE, find_checkpoint, remove_stale


def directory(path, complete: bool):
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"x" * 1000)
    if complete:
        (path / TRAINER_STATE).write_bytes(b"")
    return path


def test_a_half_written_new_checkpoint_is_removed(tmp_path):
    final = directory(tmp_path / "policy", complete=True)
    directory(tmp_path / "policy.new", complete=False)  # the disk filled while it was written
    directory(tmp_path / "policy.old", complete=True)  # a swap cut short after its first rename's rmtree
    assert remove_stale(final) == [tmp_path / "policy.new", tmp_path / "policy.old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy"] and find_checkpoint(final) == final


def test_the_old_checkpoint_is_kept_when_it_is_the_only_complete_one(tmp_path):
    old = directory(tmp_path / "policy.old", complete=True)  # killed between the swap's two renames
    directory(tmp_path / "policy.new", complete=True)
    assert remove_stale(tmp_path / "policy") == [tmp_path / "policy.new"]
    assert find_checkpoint(tmp_path / "policy") == old
    assert remove_stale(tmp_path / "nothing") == []
