"""Install an ``nmmc export --serving vllm-neuron`` package with pip into a throwaway virtual environment and check
what vLLM would find there: the entry point in group ``vllm.general_plugins``, the manifest and every kernel file
it names, and that loading the entry point and calling it twice installs one import hook. vLLM and vLLM Neuron are
not installed (they are not installable here): nothing runs vLLM.

    python scripts/vllm_plugin_install.py PKG_DIR [--online]

The package is copied to a temporary directory first (pip builds in place and leaves ``build/`` and an
``.egg-info`` there). Default, offline: built with this interpreter's pip and setuptools (``--no-build-isolation
--no-deps --no-index``) and installed under the new venv's prefix; ``--online``: the venv's own pip runs ``pip install
DIR`` as a user would, building in an isolated environment (downloads setuptools from PyPI). Loading the entry point
imports the package, which needs torch: this interpreter's site-packages are appended to the venv's path for that
step only. Exit status 0 when every check passes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import site
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECK = r"""
import importlib.metadata as md, json, sys
from pathlib import Path
name = sys.argv[1]
found = [e for e in md.entry_points(group="vllm.general_plugins") if e.value == f"{name}.vllm_plugin:register"]
assert len(found) == 1, f"entry point of {name} in vllm.general_plugins: {found}"
register = found[0].load()
root = Path(sys.modules[register.__module__].__file__).parent
manifest = json.loads((root / "manifest.json").read_text())
files = [k["file"] for g in manifest["groups"].values() for b in g["buckets"] for k in b["kernels"].values()]
files += [b["plan"] for g in manifest["groups"].values() for b in g["buckets"] if b["plan"]]
missing = [f for f in files if not (root / f).is_file()]
assert not missing, f"installed package lacks {missing}"
register(); register()
hooks = [f for f in sys.meta_path if type(f).__name__ == "_PatchOnImport"]
assert len(hooks) == 1, f"{len(hooks)} import hooks after two loads"
print(json.dumps({"entry_point": f"{found[0].name} = {found[0].value}", "installed_at": str(root),
                  "kernel_files": len(files), "import_hooks": len(hooks)}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("package", type=Path)
    parser.add_argument("--online", action="store_true", help="pip install as a user would (isolated build)")
    args = parser.parse_args()
    package = args.package.resolve()
    if not (package / "pyproject.toml").is_file():
        print(f"{package}: no pyproject.toml (export it with --serving vllm-neuron)", file=sys.stderr)
        return 2
    import tomllib

    # the import name the export recorded (the directory's name then; a renamed directory still installs under it)
    (name,) = tomllib.loads((package / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    with tempfile.TemporaryDirectory(prefix="nmmc-plugin-") as tmp:
        copy = Path(tmp) / package.name
        shutil.copytree(package, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        venv = Path(tmp) / "venv"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        if args.online:
            install = [str(python), "-m", "pip", "install", str(copy)]
        else:
            install = [sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                       "--prefix", str(venv), str(copy)]
        subprocess.run(install, check=True, stdout=subprocess.DEVNULL)
        installed = time.perf_counter() - start
        torch_path = ":".join(site.getsitepackages())
        result = subprocess.run([str(python), "-c", CHECK, name], capture_output=True, text=True,
                                env={"PYTHONPATH": torch_path, "PATH": "/usr/bin:/bin"})
        if result.returncode:
            print(result.stdout + result.stderr, file=sys.stderr)
            print("FAILED", file=sys.stderr)
            return 1
        report = json.loads(result.stdout.strip().splitlines()[-1])
        print(f"pip install ({'online' if args.online else 'offline'}) into a new venv: {installed:.1f} s")
        for key, value in report.items():
            print(f"  {key}: {value}")
        print("OK: vLLM would find and load the plugin (not run: vLLM itself)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
