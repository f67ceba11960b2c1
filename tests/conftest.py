import os
from pathlib import Path

# Two cores on CI, and pytest-xdist runs a worker per core (pyproject's addopts): each worker gets
# its share of the cores, and so do the processes its tests start (bench/run.py, the CLI, torchrun)
# through OMP_NUM_THREADS. Torch's OpenMP threads spin-wait by default, and a contended core makes
# every op ~10-100x slower: the tests that run several threads on purpose (a file decodes at any
# thread count) wait passively instead. Both are read when torch loads, so before the import.
# SFC_TEST_THREADS=1 when the machine is busy with something else.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
TEST_THREADS = int(os.environ.get("SFC_TEST_THREADS", max(1, min(2, (os.cpu_count() or 1) // _WORKERS))))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(TEST_THREADS))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import random  # noqa: E402
import zlib  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SFC_SHARED_DATA", REPO.parent / "shared" / "data"))

torch.set_num_threads(TEST_THREADS)


@pytest.fixture(autouse=True)
def _seeded_global_generators(request):
    """Torch's, numpy's and random's global generators seeded from the test's id: a test draws the
    same numbers (a module's initial weights, say) whatever ran before it on its xdist worker, so a
    failure reproduces with that test alone and a pass is not one lucky order."""
    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or skip the test with the reason."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data set not found at {SHARED_DATA} (set SFC_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture
def one_thread():
    """One torch thread for the test: many tiny tensor ops gain nothing from a hand-off to a
    second core, and lose a lot when that core is busy."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def cifar_subset(shared_data: Path, folder: Path, n_train: int, n_test: int) -> Path:
    """folder/train.npz and folder/test.npz: the first images of the shared CIFAR-10 sets."""
    for name, n in (("train", n_train), ("test", n_test)):
        with np.load(shared_data / "cifar10" / f"{name}.npz") as z:
            np.savez(folder / f"{name}.npz", images=z["images"][:n])
    return folder
