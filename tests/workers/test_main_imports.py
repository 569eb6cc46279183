"""The fork server imports what workers would import again when they re-import the main script.

`main_imports` reads the script (never runs it); the process tests run real scripts in fresh
interpreters (`run_script`, which fails on any process left behind), since the fork server is
per process and this one's started long ago.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import types
from pathlib import Path

import pytest
from _leaks import run_script

from aiocollect._workers._main_imports import main_imports

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

TOP = textwrap.dedent(
    """
    import numpy
    import tensordict.nn as tdnn
    from aiocollect import MultiSyncDataCollector, WorkerError
    from . import sibling
    try:
        import torchrl.envs
    except ImportError:
        from aiocollect.blocking import Collector
    if TYPE_CHECKING:
        from torchrl.objectives import ClipPPOLoss
    else:
        import aiocollect.testing

    def build():
        from torchrl.collectors import SyncDataCollector

    class Trainer:
        import tensordict.prototype

    if __name__ == "__main__":
        from torchrl.trainers import Trainer
    else:
        import tensordict.utils
    """
)


@pytest.fixture
def main_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Make ``__main__`` a module run from a script whose source is the argument."""

    def install(source: str, spec_name: str | None = None, name: str = "train.py") -> None:
        path = tmp_path / name
        path.write_bytes(source.encode())
        main = types.ModuleType("__main__")
        main.__file__ = str(path)
        main.__spec__ = None if spec_name is None else types.SimpleNamespace(name=spec_name)  # type: ignore[assignment]
        monkeypatch.setitem(sys.modules, "__main__", main)

    return install


def test_the_scripts_top_level_imports_of_aiocollect_tensordict_and_torchrl(
    main_script, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("torchrl", "torchrl.envs", "torchrl.objectives", "tensordict.nn", "tensordict.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))  # the parent imported them
    main_script(TOP)
    assert main_imports() == [
        "tensordict.nn",
        "aiocollect",
        "aiocollect._core._errors",  # the modules behind the lazily imported public names
        "aiocollect.blocking",
        "torchrl.envs",
        "torchrl.objectives",  # both arms of a plain `if` may run
        "aiocollect.testing",
        "tensordict.utils",  # the main guard's else arm runs in a worker
    ]


def test_what_the_parent_has_not_imported_is_left_to_the_workers(main_script, monkeypatch: pytest.MonkeyPatch) -> None:
    # An import that raises anything but ImportError would kill the fork server: beside
    # aiocollect's own modules and tensordict, only what the parent imported cleanly is taken.
    for name in ("torchrl", "torchrl.envs", "tensordict.aiocollect_test_module"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    main_script("import torchrl.envs\nfrom tensordict import TensorDict\nimport tensordict.aiocollect_test_module\n")
    assert main_imports() == ["tensordict"]


def test_a_star_import_of_aiocollect_takes_every_public_module(main_script) -> None:  # type: ignore[no-untyped-def]
    main_script("from aiocollect import *\n")
    got = main_imports()
    assert got[0] == "aiocollect"
    assert {"aiocollect._collect._collector", "aiocollect._multi._collectors", "aiocollect._dist._collectors"} <= {*got}


@pytest.mark.parametrize(
    ("spec_name", "name", "source"),
    [
        ("package.__main__", "__main__.py", "import tensordict\n"),  # python -m package: not re-imported
        (None, "ipython", "import tensordict\n"),  # multiprocessing skips IPython's launcher
        (None, "train.py", "import tensordict\ndef (:\n"),  # unparsable: left to the workers
        (None, "train.py", "import numpy, gymnasium\nimport my_envs\n"),  # nothing it may preload
    ],
)
def test_nothing_when_workers_do_not_reimport_the_script_or_it_cannot_be_read(
    main_script, spec_name: str | None, name: str, source: str
) -> None:
    main_script(source, spec_name, name)
    assert main_imports() == []


def test_a_module_run_with_python_m_is_read_from_its_file(main_script) -> None:  # type: ignore[no-untyped-def]
    main_script("from tensordict import TensorDict\n", spec_name="package.train")
    assert main_imports() == ["tensordict"]


def test_nothing_without_a_main_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # python -c, a REPL
    assert main_imports() == []


# --------------------------------------------------------------------------------------------
# In fresh interpreters
# --------------------------------------------------------------------------------------------

# A worker records, when it re-imports this script, whether tensordict was already there (the
# fork server's) or is imported now by the script's own top-level imports; its env factory
# reports it with whether the worker has tensordict at all.
SCRIPT = textwrap.dedent(
    """
    import sys

    TENSORDICT_BEFORE = "tensordict" in sys.modules
    import json, os
    import gymnasium
    import torch
    {imports}


    class Policy(torch.nn.Module):
        def forward(self, observation):
            return torch.zeros(observation.shape[:-1], dtype=torch.int64)


    def make_env(out):
        # This function may reach the worker pickled by value, with the parent's globals: read
        # the flag from the script as the worker re-imported it.
        before = sys.modules["__mp_main__"].TENSORDICT_BEFORE
        with open(os.path.join(out, str(os.getpid())), "w") as f:
            json.dump({{"before": before, "after": "tensordict" in sys.modules}}, f)
        return gymnasium.make("CartPole-v1")


    if __name__ == "__main__":
        import functools
        {lookup}
        out = sys.argv[1]
        with MultiSyncDataCollector([functools.partial(make_env, out)] * 2, Policy(), frames_per_batch=8,
                                    total_frames=8) as c:
            frames = sum(b.numel() for b in c)
        workers = [json.load(open(os.path.join(out, p))) for p in os.listdir(out)]
        print(json.dumps({{"frames": frames, "workers": workers}}))
    """
)


@pytest.mark.timeout(180)
@pytest.mark.skipif(sys.platform != "linux", reason="the fork server")
@pytest.mark.parametrize(
    ("imports", "lookup", "preloaded"),
    [
        # TorchRL's script shape: the collector class imported at the top.
        ("from aiocollect import MultiSyncDataCollector", "", True),
        # Looked up under the main guard, with a plain nn.Module policy: no worker needs tensordict.
        ("import aiocollect", "MultiSyncDataCollector = aiocollect.MultiSyncDataCollector", False),
    ],
    ids=["imported-at-the-top", "looked-up-under-the-guard"],
)
def test_workers_find_what_the_scripts_top_imports_already_in_the_fork_server(
    tmp_path: Path, imports: str, lookup: str, preloaded: bool
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(imports=imports, lookup=lookup))
    out = tmp_path / "out"
    out.mkdir()
    proc, leaked = run_script([sys.executable, str(script), str(out)], timeout=150, env=SCRIPT_ENV)
    assert proc.returncode == 0, proc.stderr
    assert not leaked, leaked
    got = json.loads(proc.stdout)
    assert got["frames"] == 8
    assert len(got["workers"]) == 2
    for w in got["workers"]:
        assert w == {"before": preloaded, "after": preloaded}, w


@pytest.mark.timeout(120)
@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/task")
def test_what_the_fork_server_may_preload_starts_no_thread_and_no_cuda() -> None:
    # A process that forks must have one thread: a lock another thread held at the fork stays
    # held in the child forever. Every module main_imports can name, imported in a fresh
    # interpreter after what the fork server imports anyway.
    code = textwrap.dedent(
        """
        import importlib, json, os, sys
        import torch, numpy, gymnasium
        import aiocollect
        from aiocollect._core._names import LAZY
        before = sorted(os.listdir("/proc/self/task"))
        names = ["tensordict", "tensordict.nn", "aiocollect.blocking", "aiocollect.testing",
                 *sorted({"aiocollect" + m for m, _ in LAZY.values()})]
        try:
            import torchrl, torchrl.envs, torchrl.collectors, torchrl.objectives
        except ImportError:
            pass
        for name in names:
            importlib.import_module(name)
        print(json.dumps({"before": before, "after": sorted(os.listdir("/proc/self/task")),
                          "cuda": torch.cuda.is_initialized(), "imported": len(names)}))
        """
    )
    proc, leaked = run_script([sys.executable, "-c", code], timeout=100, env=SCRIPT_ENV)
    assert proc.returncode == 0, proc.stderr
    assert not leaked, leaked
    got = json.loads(proc.stdout)
    assert got["after"] == got["before"]
    assert got["cuda"] is False
    assert got["imported"] > 10
