"""The shells make OpenMP spin only briefly, set before torch loads (scoreflow_codec/threads.py)."""
import os

import numpy as np
import sfcodec_probe
from PIL import Image

from scoreflow_codec import threads

_VARS = sfcodec_probe.VARS


def _probe(tmp_path, **user):
    """sfcodec verify of a small image with --fallback seed and a model named (which loads torch; with
    --model auto it would not, since 0.9.23), the user's environment holding `user` of OpenMP's
    variables and none of the others."""
    img = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(img)
    env = {k: v for k, v in os.environ.items() if k not in _VARS}
    env.update(user)
    seen, out = sfcodec_probe.run(["verify", str(img), "--fallback", "seed", "--model", "cifar10"], env=env)
    assert seen.get("exit") in (0, None), out.stderr
    assert seen["torch"], "the command never loaded torch: the probe tests nothing"
    return seen


def test_sfcodec_spins_briefly_from_before_torch_loads(tmp_path):
    seen = _probe(tmp_path)
    want = {"GOMP_SPINCOUNT": str(threads.SPIN_COUNT), "OMP_WAIT_POLICY": None}
    assert seen["at_import"] == want and seen["after"] == want


def test_the_user_s_openmp_settings_are_kept(tmp_path):
    seen = _probe(tmp_path, GOMP_SPINCOUNT="5")
    assert seen["at_import"] == {"GOMP_SPINCOUNT": "5", "OMP_WAIT_POLICY": None}
    seen = _probe(tmp_path, OMP_WAIT_POLICY="ACTIVE")  # a spin count would override the policy
    assert seen["at_import"] == {"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": "ACTIVE"}


def test_spin_briefly_says_when_it_is_too_late(monkeypatch):
    import torch  # noqa: F401  (loaded already by conftest: too late for this process)

    for k in _VARS:
        monkeypatch.delenv(k, raising=False)
    assert threads.spin_briefly() is False
    assert os.environ["GOMP_SPINCOUNT"] == str(threads.SPIN_COUNT) and "OMP_WAIT_POLICY" not in os.environ
