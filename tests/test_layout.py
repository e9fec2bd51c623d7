"""The layout rules of DESIGN.md §1."""

import subprocess
import sys

from conftest import REPO_ROOT


def test_datasets_folder_never_shadows_hf_datasets():
    assert not (REPO_ROOT / "datasets" / "__init__.py").exists()
    out = subprocess.run(
        [sys.executable, "-c", "import datasets, sys; print(datasets.__file__); "
         "print(hasattr(datasets, 'load_dataset'))"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert "site-packages" in out[0], out
    assert out[1] == "True"


def test_sandbox_knows_nothing_of_training_or_grading():
    bad = []
    for path in (REPO_ROOT / "sandbox").rglob("*.py"):
        text = path.read_text()
        for mod in ("ecredit_trl", "from eval", "import eval", "trl", "swebench"):
            for line in text.splitlines():
                s = line.strip()
                if s.startswith(("import ", "from ")) and s.split()[1].split(".")[0] == mod.split()[-1]:
                    bad.append(f"{path.name}: {s}")
    assert bad == []


def test_eval_does_not_import_trl_or_training():
    bad = []
    for path in (REPO_ROOT / "eval").rglob("*.py"):
        for line in path.read_text().splitlines():
            s = line.strip()
            if s.startswith(("import ", "from ")) and s.split()[1].split(".")[0] in ("trl", "ecredit_trl", "peft"):
                bad.append(f"{path.name}: {s}")
    assert bad == []
