"""``nmmc export --sdk``: the package's kernels are emitted for the release asked for. On a logical core of two
programs the exchange between them is spelled per release (``nki.lnc.sendrecv`` from Neuron 2.34,
``nisa.sendrecv`` before), and the manifest's SDK range says which releases the kernels are checked for."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main

pytestmark = pytest.mark.usefixtures("one_polish_start")  # what surrounds a search, not the search (conftest.py)

#: One layer of Llama-3.2-1B's MLP shape: at one token its LNC=2 kernel divides the hidden contraction between the
#: two programs, which exchange their partial sums.
CONFIG = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 1,
          "torch_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sdk") / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(CONFIG))
    return directory


@pytest.mark.parametrize(("sdk", "spelling", "newest"), [(None, "nki.lnc.sendrecv(", "2.34"),
                                                          ("2.33", "nisa.sendrecv(", "2.33")])
def test_export_emits_the_exchange_of_the_release_asked_for(model, tmp_path, sdk, spelling, newest):
    out = tmp_path / "pkg"
    args = ["export", str(model), "--tokens", "1", "-o", str(out)] + (["--sdk", sdk] if sdk else [])
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    kernel = next(out.glob("kernels/*/t1/mlp.py")).read_text()
    assert spelling in kernel
    assert ("pipe_id" in kernel) == (sdk == "2.33")
    assert json.loads((out / "manifest.json").read_text())["sdk"]["max"] == newest
    verified = CliRunner().invoke(main, ["verify", str(out)])
    assert verified.exit_code == 0, verified.output
