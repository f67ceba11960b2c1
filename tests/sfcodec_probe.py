"""sfcodec's entry point in a fresh process, watched by a meta-path finder: whether torch is ever
imported, OpenMP's variables at that moment (the finder sees the import before torch's OpenMP
runtime loads) and at the end. Used by test_threads and test_fallback."""
from __future__ import annotations

import json
import subprocess
import sys

VARS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")

_PROBE = r"""
import json, os, sys
VARS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
seen = {"torch": False}
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen["torch"]:
            seen["torch"] = True
            seen["at_import"] = {k: os.environ.get(k) for k in VARS}
        return None
sys.meta_path.insert(0, Spy())
from cli import main as m
sys.argv = ["sfcodec"] + sys.argv[1:]
try:
    m.main()
except SystemExit as e:
    seen["exit"] = e.code
seen["after"] = {k: os.environ.get(k) for k in VARS}
print(json.dumps(seen))
"""


def run(args: list[str], env: dict | None = None, cwd=None) -> tuple[dict, subprocess.CompletedProcess]:
    """(what the probe saw: torch, at_import, after, exit; the finished process) of `sfcodec ARGS`."""
    out = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env, cwd=cwd,
                         timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1]), out
