import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SFC_SHARED_DATA", REPO.parent / "shared" / "data"))

# Two cores on CI: keep torch from oversubscribing them when several tests spawn processes.
# SFC_TEST_THREADS=1 when the machine is busy with something else (torch's worker threads
# spin-wait, and a contended second core makes every op ~100x slower).
torch.set_num_threads(int(os.environ.get("SFC_TEST_THREADS", max(1, min(2, os.cpu_count() or 1)))))


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
    import numpy as np

    for name, n in (("train", n_train), ("test", n_test)):
        with np.load(shared_data / "cifar10" / f"{name}.npz") as z:
            np.savez(folder / f"{name}.npz", images=z["images"][:n])
    return folder
