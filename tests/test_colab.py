"""The Colab notebooks (``colab/``): each committed ``.ipynb`` is what ``colab/sync.py``
builds from its jupytext source (outputs stripped, Open-in-Colab badge, TPU runtime
metadata), and each runs top to bottom in a fresh kernel on the CPU with
``SWARMJAX_SMOKE=1`` (the shrunk job), producing its key outputs."""

import importlib.util
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from small_job import subprocess_xla_flags

jupytext = pytest.importorskip("jupytext", reason="the notebook tests need jupytext (pip install -e '.[test]')")
nbformat = pytest.importorskip("nbformat", reason="the notebook tests need nbformat")
nbclient = pytest.importorskip("nbclient", reason="the notebook tests need nbclient")
pytest.importorskip("ipykernel", reason="the notebook tests need ipykernel")

ROOT = Path(__file__).resolve().parent.parent
COLAB = ROOT / "colab"


def load_sync():
    spec = importlib.util.spec_from_file_location("colab_sync", COLAB / "sync.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sync = load_sync()


@pytest.mark.parametrize("name", sync.NOTEBOOKS)
def test_notebook_is_built_from_its_source(name):
    committed = (COLAB / f"{name}.ipynb").read_text()
    assert sync.build(name) == committed, f"colab/{name}.ipynb is stale: run python colab/sync.py"
    nb = json.loads(committed)
    meta = nb["metadata"]
    assert meta["accelerator"] == "TPU" and meta["colab"]["gpuType"].startswith("V")
    assert meta["kernelspec"]["name"] == "python3"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    first = nb["cells"][0]
    assert first["cell_type"] == "markdown"
    # no GitHub owner in the repository's own notebooks: how to open one, not a badge to nowhere
    assert sync.org_of((COLAB / f"{name}.py").read_text()) == ""
    assert sync.UPLOAD[2:] in "".join(first["source"]) and "colab.research.google.com/github" not in committed


def test_sync_check_write_and_org(tmp_path, monkeypatch, capsys):
    for name in sync.NOTEBOOKS:
        for ext in (".py", ".ipynb"):
            shutil.copy(COLAB / f"{name}{ext}", tmp_path / f"{name}{ext}")
    monkeypatch.setattr(sync, "HERE", tmp_path)
    assert sync.main(["--check"]) == 0
    src = tmp_path / "pieces.py"
    src.write_text(src.read_text() + "\n# %%\nprint('one more cell')\n")
    assert sync.main(["--check"]) == 1                       # stale, and --check writes nothing
    assert "pieces.ipynb" in capsys.readouterr().err
    assert sync.main([]) == 0 and sync.main(["--check"]) == 0
    assert "one more cell" in (tmp_path / "pieces.ipynb").read_text()
    assert sync.main(["--org", "acme-labs"]) == 0 and sync.main(["--check"]) == 0
    for name in sync.NOTEBOOKS:
        text = (tmp_path / f"{name}.ipynb").read_text()
        assert f"github/acme-labs/swarmjax/blob/main/colab/{name}.ipynb" in text
        assert "https://colab.research.google.com/assets/colab-badge.svg" in text
        assert 'ORG = \\"acme-labs\\"' in text and sync.UPLOAD[2:] not in text
    assert sync.main(["--org", "other-org"]) == 0                       # and from one owner to another
    assert "github/other-org/swarmjax" in (tmp_path / "pieces.ipynb").read_text()
    src.write_text(src.read_text().replace("Open In Colab", "Open"))     # no badge: refused
    assert sync.main([]) == 2


def test_install_cells_match_pyproject():
    """Both notebooks install alike, and their JAX_MIN is pyproject.toml's jax requirement."""
    cells = []
    for name in sync.NOTEBOOKS:
        nb = jupytext.reads((COLAB / f"{name}.py").read_text(), fmt="py:percent")
        cells.append(next(c.source for c in nb.cells if c.source.startswith("ORG = ")))
    assert cells[0] == cells[1]
    jax_min = re.search(r'^JAX_MIN = "([^"]+)"', cells[0], re.M).group(1)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"jax>={jax_min}"' in pyproject


def run_notebook(name, cwd, tmp_path, monkeypatch):
    """Execute colab/NAME.ipynb in a fresh kernel of this interpreter, working directory
    ``cwd``, with SWARMJAX_SMOKE=1 and the suite's compiler flags but its default device
    count (a plain CPU runtime: the pieces notebook asks for 8 devices itself). Returns (executed notebook, seconds, all text output)."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "swarmjax-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "swarmjax test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "MPLBACKEND")}
    env.update(SWARMJAX_SMOKE="1", PYTHONUNBUFFERED="1", XLA_FLAGS=subprocess_xla_flags())   # the suite's compiler flags
    nb = nbformat.read(COLAB / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="swarmjax-test", timeout=300,
                                     resources={"metadata": {"path": str(cwd)}})
    t0 = time.perf_counter()
    client.execute(env=env)
    seconds = time.perf_counter() - t0
    print(f"colab/{name}.ipynb ran in {seconds:.1f} s")
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                text.append(out["text"])
            elif "data" in out and "text/plain" in out["data"]:
                text.append(out["data"]["text/plain"])
            if "data" in out and "text/markdown" in out["data"]:
                text.append(out["data"]["text/markdown"])
    return nb, seconds, "\n".join(text)


def png_outputs(nb):
    return sum("image/png" in out.get("data", {}) for c in nb.cells for out in c.get("outputs", []))


def is_png(path):
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_quickstart_runs_on_cpu(tmp_path, monkeypatch):
    work = tmp_path / "content"
    work.mkdir()
    nb, seconds, text = run_notebook("quickstart", work, tmp_path, monkeypatch)
    assert "nothing to install" in text                               # the checkout's swarmjax
    assert "backend 'cpu' (CPU), 1 device(s)" in text
    assert "| policy | accuracy |" in text and "| final |" in text     # the summary table
    assert "per task size (test split)" in text and "\n| 4 | " in text
    assert "Gantt chart written to runs/quickstart/gantt.png" in text
    assert "nothing was recomputed" in text
    assert "PARL steps logged once each: 0..3" in text                 # 2 steps, then resumed to 4
    run = work / "runs" / "quickstart"
    assert json.loads((run / "summary.json").read_text())["rl_steps"] == 4
    for png in (run / "curves.png", run / "gantt.png", run / "demo_gantt.png"):
        assert is_png(png), png
    assert png_outputs(nb) >= 4                                       # curves, Gantt x 2, curves again


@pytest.mark.slow
def test_pieces_runs_on_cpu(tmp_path, monkeypatch):
    nb, seconds, text = run_notebook("pieces", tmp_path, tmp_path, monkeypatch)
    assert "backend 'cpu' (CPU), 8 device(s)" in text                 # the flag set in its first cell
    assert "logits (2, 8, 256)" in text
    assert "'clip_fraction': 0.0" in text and "'ratio_mean': 1.0" in text   # GSPO at pi = pi_old
    assert "optimizer steps 2" in text                                # 2 minibatches
    first, last = map(float, re.search(r"first 5 iterations ([\d.]+), last 5 ([\d.]+)", text).groups())
    assert last > first + 0.1, (first, last)                          # the toy RL loop learns
    assert "spec P(None, 'fsdp', 'tensor', None)" in text
    assert "same ids as on one device: True" in text
    assert png_outputs(nb) >= 1                                       # the reward curve
