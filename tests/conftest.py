"""Shared fixtures: a tiny model directory made once per session, and one Ray instance per session. Every test
under ``tests/system/`` (a whole run: a topology started, the tiny model in every actor) is marked ``system``, so
``pytest -m "not system"`` is the quick loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.models.base_model import TinyModelConfig, ensure_base_model

# A quick warm-up: enough to know the move format sometimes, not to play well. Tests check the plumbing.
TEST_MODEL = TinyModelConfig(warmup_games=200, warmup_steps=30, warmup_batch=32)


SYSTEM = Path(__file__).parent / "system"


def pytest_collection_modifyitems(items):
    for item in items:
        if SYSTEM in Path(item.fspath).parents:
            item.add_marker(pytest.mark.system)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return ensure_base_model(tmp_path_factory.mktemp("models"), TEST_MODEL)


@pytest.fixture(scope="session")
def ray_session():
    ray = pytest.importorskip("ray")
    from actors.runs.ray_cluster import init_embedded_ray

    init_embedded_ray(num_cpus=2)  # as `tidal launch` starts it: on loopback only
    yield ray
    ray.shutdown()
