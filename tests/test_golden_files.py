"""Files written by released models and codec versions keep decoding to the same pixels.

tests/golden/NAME.sfc was written once by `sfcodec compress` (tests/golden/make_sfc_golden.py) from
the PNGs beside it, with the shipped model of that time. When a newer model replaces it under the
same zoo name, the old model stays in the zoo under another name, and the file's sha256 finds it.
A failure here means users' existing files no longer decode: fix the code, never the golden file.
"""
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from scoreflow_codec import api, images, zoo

GOLDEN = Path(__file__).parent / "golden"
FILES = sorted(GOLDEN.glob("*.sfc"))


def test_golden_files_exist():
    assert {p.stem for p in FILES} >= {"photo-1", "photo-2", "cifar10-1"}


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden_file_decodes_to_its_pngs(path):
    data = path.read_bytes()
    header = api.read_header(data)
    assert header["fields"]["n_seed"] < header["fields"]["n_tiles"], "the golden file must exercise the model"
    model = zoo.model_for_header(header)
    assert model.sha256 == header["model"]["sha256"]
    decoded = api.decompress(data, model)
    pngs = sorted(GOLDEN.glob(f"{path.stem}-*.png"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    assert len(decoded) == len(pngs) > 0
    for src, png in zip(decoded, pngs):
        want = np.asarray(Image.open(png).convert("RGB"))
        assert np.array_equal(np.asarray(images.to_pil(src)), want), png.name


def test_info_names_the_zoo_entry_a_renamed_model_has_now():
    """photo-1.sfc says "photo" in its header; the zoo has since given that name to a newer model.
    `sfcodec info` must say which shipped model the file needs, not send the user to the new one."""
    from click.testing import CliRunner

    from cli.main import cli

    header = api.read_header((GOLDEN / "photo-1.sfc").read_bytes())
    assert header["model"]["name"] == "photo" and zoo.shipped_name(header["model"]["sha256"]) == "photo-1"
    assert zoo.shipped_name("0" * 64) is None
    out = CliRunner().invoke(cli, ["info", str(GOLDEN / "photo-1.sfc")]).output
    assert "shipped, now named photo-1" in out, out
