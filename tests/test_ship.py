"""`python -m trainer ship`: an exported model takes a zoo name, the model that had it keeps another,
and the zoo reader (scoreflow_codec.zoo) finds both, the old one by the sha256 its files carry."""
import hashlib
import json
import lzma

import pytest
import torch
from click.testing import CliRunner

from coding_models import tiny_model_file, tiny_preset
from scoreflow_codec import zoo
from scoreflow_codec.modelfile import save_model
from trainer.__main__ import main

torch.set_num_threads(1)

OLD_CARD = """# Model card: `toy`

The default model. Its training curve is `toy_curve.png`.

| | |
|---|---|
| steps | 10 |

## Measured

- bound 9.9 bpd; the curve: `toy_curve.png`.
"""


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _ship(*args):
    r = CliRunner().invoke(main, ["ship", *map(str, args)])
    return r


@pytest.fixture
def zoo_dir(tmp_path, monkeypatch):
    """A zoo with `toy` (model, card, curve) and an older `toy-1`."""
    z = tmp_path / "zoo"
    z.mkdir()
    m0, m1 = tiny_model_file(z / "toy-1.safetensors", 0), tiny_model_file(z / "toy.safetensors", 1)
    (z / "toy.md").write_text(OLD_CARD)
    (z / "toy-1.md").write_text("# Model card: `toy-1`\n")
    (z / "toy_curve.png").write_bytes(b"curve-of-toy")
    (z / "index.json").write_text(json.dumps({"default": "toy", "models": {
        "toy": {"file": "toy.safetensors", "sha256": _sha(m1), "description": "the toy", "image_size": 32, "tile": 48,
                "chain_steps": 200},
        "toy-1": {"file": "toy-1.safetensors", "sha256": _sha(m0), "description": "older", "image_size": 32},
        "other": {"file": "toy-1.safetensors", "sha256": "0" * 64, "description": "x", "image_size": 32}}}))
    monkeypatch.setattr(zoo, "ZOO_DIR", z)
    return z


def test_ship_renames_the_old_model_and_both_load(zoo_dir, tmp_path):
    old_bytes = (zoo_dir / "toy.safetensors").read_bytes()
    old_sha = hashlib.sha256(old_bytes).hexdigest()
    new = tiny_model_file(tmp_path / "new.safetensors", 2)
    card = tmp_path / "card.md"
    card.write_text("# Model card: `toy`\n\nthe new one\n")
    r = _ship(new, "--as", "toy", "--keep-as", "toy-2", "--description", "the new toy", "--old-version", "0.1.0",
              "--card", card, "--zoo", zoo_dir)
    assert r.exit_code == 0, r.output
    assert f"the previous toy is now toy-2" in r.output

    index = json.loads((zoo_dir / "index.json").read_text())
    assert list(index["models"]) == ["toy", "toy-2", "toy-1", "other"] and index["default"] == "toy"
    assert index["models"]["toy"] == {"file": "toy.safetensors", "sha256": _sha(new), "description": "the new toy",
                                      "image_size": 32, "tile": 48, "chain_steps": 200}  # both from the old entry
    kept = index["models"]["toy-2"]
    assert kept["file"] == "toy-2.safetensors.xz" and kept["sha256"] == old_sha and kept["tile"] == 48
    assert kept["chain_steps"] == 200
    assert not (zoo_dir / "toy-2.safetensors").exists()
    assert lzma.decompress((zoo_dir / "toy-2.safetensors.xz").read_bytes()) == old_bytes
    assert "0.1.0" in kept["description"] and "toy-2.md" in kept["description"]

    # the files moved with the name, and the zoo reader checks both against their sha256
    assert (zoo_dir / "toy.safetensors").read_bytes() == new.read_bytes()
    assert zoo.load_model("toy").sha256 == _sha(new)
    assert zoo.load_model("toy-2").sha256 == old_sha and zoo.shipped_name(old_sha) == "toy-2"
    assert (zoo_dir / "toy-2_curve.png").read_bytes() == b"curve-of-toy" and not (zoo_dir / "toy_curve.png").exists()
    assert (zoo_dir / "toy.md").read_text() == card.read_text()

    kept_card = (zoo_dir / "toy-2.md").read_text()
    head, body = kept_card.split("\n| | |\n")
    assert head.startswith("# Model card: `toy-2`\n") and "of 0.1.0" in head and "`toy-1` (`toy-1.md`)" in head
    assert "Its training curve is `toy-2_curve.png`" in head and "The default model." not in head
    assert body == OLD_CARD.split("\n| | |\n")[1].replace("`toy_curve.png`", "`toy-2_curve.png`")


def test_ship_without_a_card_keeps_the_old_text_and_says_so(zoo_dir, tmp_path):
    new = tiny_model_file(tmp_path / "new.safetensors", 2)
    r = _ship(new, "--as", "toy", "--keep-as", "toy-2", "--description", "d", "--zoo", zoo_dir)
    assert r.exit_code == 0, r.output
    assert (zoo_dir / "toy.md").read_text() == OLD_CARD
    assert "previous card's text" in r.stderr


def test_ship_a_new_name_into_an_empty_zoo(tmp_path):
    z = tmp_path / "empty"
    new = tiny_model_file(tmp_path / "m.safetensors", 3)
    r = _ship(new, "--as", "photo2", "--description", "photos", "--tile", "64", "--chain-steps", "96", "--zoo", z)
    assert r.exit_code == 0, r.output
    index = json.loads((z / "index.json").read_text())
    assert index == {"models": {"photo2": {"file": "photo2.safetensors", "sha256": _sha(new), "description": "photos",
                                           "image_size": 32, "tile": 64, "chain_steps": 96}}, "default": "photo2"}
    assert zoo.load_model(str(z / "photo2.safetensors")).chain_steps is None  # shipped into z, not the package's zoo: no entry has its sha256


def test_ship_takes_the_defaults_a_file_records(zoo_dir, tmp_path):
    """A file exported with --tile/--chain-steps ships with them, before the old entry's; the
    options of ship still come first."""
    model, deq = tiny_preset(4)
    new = tmp_path / "new.safetensors"
    save_model(new, model, deq, {"preset": "tiny", "codec": {"tile": 64, "chain_steps": 96}})
    r = _ship(new, "--as", "toy", "--keep-as", "toy-2", "--description", "d", "--zoo", zoo_dir)
    assert r.exit_code == 0, r.output
    entry = json.loads((zoo_dir / "index.json").read_text())["models"]["toy"]
    assert (entry["tile"], entry["chain_steps"]) == (64, 96)  # not the old entry's 48 and 200
    r = _ship(new, "--as", "toy2", "--description", "d", "--tile", "16", "--chain-steps", "8", "--zoo", tmp_path / "z2")
    assert r.exit_code == 0, r.output
    entry = json.loads((tmp_path / "z2" / "index.json").read_text())["models"]["toy2"]
    assert (entry["tile"], entry["chain_steps"]) == (16, 8)


@pytest.mark.parametrize("case, words", [
    ("no keep-as", "--keep-as"),
    ("keep-as taken", "is taken"),
    ("already shipped", "already shipped as 'toy-1'"),
    ("not a model", "not a safetensors model file"),
    ("missing file", "model file not found"),
    ("bad name", "bad model name"),
    ("keep-as of a new name", "no model to keep"),
])
def test_refused_ships_change_nothing(zoo_dir, tmp_path, case, words):
    new = tiny_model_file(tmp_path / "new.safetensors", 2)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a model at all")
    args = {"no keep-as": [new, "--as", "toy"],
            "keep-as taken": [new, "--as", "toy", "--keep-as", "toy-1"],
            "already shipped": [zoo_dir / "toy-1.safetensors", "--as", "toy", "--keep-as", "toy-2"],
            "not a model": [junk, "--as", "toy", "--keep-as", "toy-2"],
            "missing file": [tmp_path / "none.safetensors", "--as", "toy", "--keep-as", "toy-2"],
            "bad name": [new, "--as", "Toy/../x", "--keep-as", "toy-2"],
            "keep-as of a new name": [new, "--as", "fresh", "--keep-as", "fresh-1"]}[case]
    before = {p.name: p.read_bytes() for p in zoo_dir.iterdir()}
    r = _ship(*args, "--description", "d", "--zoo", zoo_dir)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("trainer: error:") and words in r.stderr, r.stderr
    assert "Traceback" not in r.output
    assert {p.name: p.read_bytes() for p in zoo_dir.iterdir()} == before


def _commit(repo):
    """The zoo folder as a git repository with everything in it committed; returns the commit."""
    import subprocess

    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    if not (repo / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "zoo"], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def _retire(*args):
    return CliRunner().invoke(main, ["retire", *map(str, args)])


def test_retire_takes_a_kept_model_out_and_its_files_get_the_way_back(zoo_dir, tmp_path):
    """The files go, the entry moves to "retired" with the release and commit; loading it by name or
    by a file's sha256 is one error naming both, and the commit has the very file."""
    import subprocess

    (zoo_dir / "toy-1_curve.png").write_bytes(b"curve")
    (zoo_dir / "toy.md").write_text(OLD_CARD + "\nBefore it: `toy-1` (`toy-1.md`), its curve `toy-1_curve.png`.\n")
    commit = _commit(zoo_dir)
    sha = json.loads((zoo_dir / "index.json").read_text())["models"]["toy-1"]["sha256"]
    old = (zoo_dir / "toy-1.safetensors").read_bytes()
    r = _retire("toy-1", "--release", "1.2.3", "--zoo", zoo_dir)
    assert r.exit_code == 0, r.output
    assert "retired toy-1" in r.output and commit[:12] in r.output and "1.2.3" in r.output
    assert not any((zoo_dir / f).exists() for f in ("toy-1.safetensors", "toy-1.md", "toy-1_curve.png"))
    index = json.loads((zoo_dir / "index.json").read_text())
    assert "toy-1" not in index["models"] and index["default"] == "toy" and "toy" in index["models"]
    assert index["retired"] == {"toy-1": {"sha256": sha, "file": "toy-1.safetensors", "path": "toy-1.safetensors",
                                          "description": "older", "release": "1.2.3", "commit": commit[:12]}}
    assert zoo.retired_name(sha) == "toy-1" and zoo.shipped_name(sha) is None
    where = f"[retired after 1.2.3, in commit {commit[:12]}]"  # the other cards say where its files went
    card = (zoo_dir / "toy.md").read_text()  # (its paragraph filled again: the notes made it too long)
    assert card.endswith(".\n") and " ".join(card.split()).endswith(
        f"(`toy-1.md` {where}), its curve `toy-1_curve.png` {where}.")
    with pytest.raises(zoo.ModelError, match="'toy-1' no longer ships with the package: it was retired after release 1.2.3"):
        zoo.load_model("toy-1")
    with pytest.raises(zoo.ModelError) as e:
        zoo.model_for_header({"model": {"name": "toy", "sha256": sha}})
    assert f"git show {commit[:12]}:toy-1.safetensors > toy-1.safetensors" in str(e.value), e.value
    assert "--model toy-1.safetensors" in str(e.value) and "scoreflow-codec 1.2.3" in str(e.value)
    blob = subprocess.run(["git", "-C", str(zoo_dir), "show", f"{commit[:12]}:toy-1.safetensors"], capture_output=True)
    assert blob.stdout == old and hashlib.sha256(old).hexdigest() == sha
    # the name stays taken: a later ship cannot give it to another model
    new = tiny_model_file(tmp_path / "new.safetensors", 2)
    r = _ship(new, "--as", "toy", "--keep-as", "toy-1", "--description", "d", "--zoo", zoo_dir)
    assert r.exit_code == 2 and "is taken" in r.stderr, r.output


def test_retire_wraps_again_the_prose_its_notes_make_too_long(zoo_dir):
    """The note after a retired card's name can push a line of prose past the cards' width: that
    paragraph (or list item) is filled again; tables, and paragraphs it did not touch, stay as they
    were, long lines and all."""
    from trainer.ship import CARD_WIDTH

    prose = ("The models it replaced keep decoding their files under the names `toy-1` (`toy-1.md`), `toy-2`\n"
             "(`toy-2.md`) and `toy-3` (`toy-3.md`), each with its card.")
    item = "- Its curve is `toy-1_curve.png`, steps 0 - 10, " + "and more words to fill the line " * 2 + "\n  up."
    untouched = "A long line of prose that names no retired card " + "x" * 80
    table = "| start | from `toy-1` (`toy-1.md`) |"
    (zoo_dir / "toy.md").write_text("\n\n".join(["# Model card: `toy`", prose, item, untouched, table]) + "\n")
    commit = _commit(zoo_dir)
    r = _retire("toy-1", "--release", "1.2.3", "--zoo", zoo_dir)
    assert r.exit_code == 0, r.output
    where = f"[retired after 1.2.3, in commit {commit[:12]}]"
    paras = (zoo_dir / "toy.md").read_text().split("\n\n")
    assert paras[0] == "# Model card: `toy`" and paras[3] == untouched
    assert paras[4] == f"| start | from `toy-1` (`toy-1.md` {where}) |\n"
    assert max(map(len, paras[1].split("\n") + paras[2].split("\n"))) <= CARD_WIDTH
    assert " ".join(paras[1].split()) == " ".join(prose.replace("`toy-1.md`", f"`toy-1.md` {where}").split())
    assert paras[2].startswith("- Its curve is `toy-1_curve.png` [retired") and paras[2].endswith(" up.")
    assert all(ln.startswith("  ") for ln in paras[2].split("\n")[1:])
    assert " ".join(paras[2].split()) == " ".join(item.replace("_curve.png`", f"_curve.png` {where}").split())


@pytest.mark.parametrize("case, words", [
    ("not a checkout", "not in a git checkout"),
    ("the default", "a name the codec picks by itself"),
    ("an auto name", "a name the codec picks by itself"),
    ("not in the zoo", "is not in the zoo"),
    ("changed since the commit", "is not in commit"),
])
def test_refused_retires_change_nothing(zoo_dir, case, words):
    if case != "not a checkout":
        _commit(zoo_dir)
    if case == "changed since the commit":
        (zoo_dir / "toy-1.safetensors").write_bytes((zoo_dir / "toy-1.safetensors").read_bytes() + b" ")
    if case == "an auto name":
        index = json.loads((zoo_dir / "index.json").read_text())
        index["models"]["photo"] = index["models"]["toy-1"]
        (zoo_dir / "index.json").write_text(json.dumps(index))
    name = {"the default": "toy", "an auto name": "photo", "not in the zoo": "nope"}.get(case, "toy-1")
    before = {p.name: p.read_bytes() for p in zoo_dir.iterdir() if p.is_file()}
    r = _retire(name, "--zoo", zoo_dir)
    assert r.exit_code == 2 and r.stderr.startswith("trainer: error:") and words in r.stderr, r.output
    assert "Traceback" not in r.output
    assert {p.name: p.read_bytes() for p in zoo_dir.iterdir() if p.is_file()} == before
