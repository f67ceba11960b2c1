"""The shells make OpenMP spin only briefly, set before torch loads (scoreflow_codec/threads.py)."""
import json
import os
import subprocess
import sys

import numpy as np
from PIL import Image

from scoreflow_codec import threads

# Runs sfcodec's entry point in a fresh process and records OpenMP's variables as torch is first
# imported (a meta-path finder sees the import before torch's OpenMP runtime loads).
_PROBE = r"""
import json, os, sys
seen = {}
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "at_import" not in seen:
            seen["at_import"] = {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
        return None
sys.meta_path.insert(0, Spy())
from cli import main as m
sys.argv = ["sfcodec"] + sys.argv[1:]
try:
    m.main()
except SystemExit as e:
    seen["exit"] = e.code
seen["after"] = {k: os.environ.get(k) for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
print(json.dumps(seen))
"""


_VARS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


def _probe(tmp_path, **user):
    """sfcodec verify of a small image with --fallback seed and a model named (which loads torch; with
    --model auto it would not, since 0.9.23), the user's environment holding `user` of OpenMP's
    variables and none of the others."""
    img = tmp_path / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(img)
    env = {k: v for k, v in os.environ.items() if k not in _VARS}
    env.update(user)
    out = subprocess.run([sys.executable, "-c", _PROBE, "verify", str(img), "--fallback", "seed", "--model", "cifar10"],
                         capture_output=True, text=True, env=env, timeout=600)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen.get("exit") in (0, None), out.stderr
    assert "at_import" in seen, "the command never loaded torch: the probe tests nothing"
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
