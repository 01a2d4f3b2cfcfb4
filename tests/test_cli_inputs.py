"""Command-line inputs nmmc once took silently: repeated --param, names in another case, shapes far
beyond any device (issue 14, items 8 and 9)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from neuronmm_compiler.cli import main
from neuronmm_compiler.targets import get_target


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_a_repeated_param_is_an_error_not_last_wins(tmp_path):
    out = tmp_path / "k.py"
    result = run("emit", "--shape", "256x512x256", "--param", "tile_m=64", "--param", "tile_m=32", "-o", str(out))
    assert result.exit_code == 2 and "--param tile_m is given twice" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("option", [("--target", "TRN2"), ("--dialect", "NeuronXCC"), ("--a-layout", "KM"),
                                    ("--schedule", "AWS-Tiled"), ("--dtype", "FP32")])
def test_names_nmmc_defines_are_case_insensitive(tmp_path, option):
    """One rule for case: every name nmmc defines (target, dialect, layout, preset, dtype, search
    method) is accepted in any case and recorded in its canonical spelling."""
    upper = run("emit", "--shape", "256x512x256", *option, "-o", "-")
    assert upper.exit_code == 0, upper.output + upper.stderr
    lower = run("emit", "--shape", "256x512x256", option[0], option[1].lower(), "-o", "-")
    assert upper.stdout == lower.stdout


def test_search_method_in_any_case(tmp_path):
    result = run("tune", "--shape", "128x256x128", "--method", "OPTUNA", "--trials", "3", "--no-cache", "--json",
                 "-o", str(tmp_path / "k.py"))
    assert result.exit_code == 0, result.stderr


def test_a_file_path_target_keeps_its_case(tmp_path):
    result = run("emit", "--shape", "256x512x256", "--target", str(tmp_path / "Missing.JSON"), "-o", "-")
    assert result.exit_code == 2 and "Missing.JSON" in result.stderr


@pytest.mark.parametrize(("args", "fragment"), [
    (("--shape", "1000000000000x128x128"), "dimensions are at most 2147483648"),
    (("--shape", "2000000x2000000x128"), "GiB of HBM; a trn2 LNC=2 logical core has 24.00 GiB"),
    (("--shape", "2000000x2000000x128", "--rank", "128"), "GiB of HBM"),
    (("--mlp", "--tokens", "100000000", "--hidden", "4096", "--intermediate", "14336", "--dense"), "GiB of HBM"),
    (("--mlp", "--tokens", "8", "--hidden", "4294967296", "--intermediate", "64", "--dense"), "at most 2147483648"),
])
@pytest.mark.parametrize("command", ["emit", "tune", "cost"])
def test_shapes_beyond_the_device_are_refused_before_any_work(tmp_path, args, fragment, command):
    out = ("-o", str(tmp_path / "k.py")) if command != "cost" else ()
    result = run(command, *args, *out)
    assert result.exit_code == 2 and fragment in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "k.py").exists()


def test_a_cache_entry_out_of_range_is_ignored_with_a_warning_naming_its_file(tmp_path, monkeypatch):
    """Like every other unusable cache file (issue 14, item 11): warned about by path, then searched again."""
    import json
    import os

    cache_dir = tmp_path / "cache"
    monkeypatch.setenv("NMMC_CACHE_DIR", str(cache_dir))
    args = ("tune", "--shape", "128x256x128", "--trials", "5", "--json", "-o", str(tmp_path / "k.py"))
    assert json.loads(run(*args).stdout)["search"]["cached"] is False
    [entry] = list((cache_dir / "tune").glob("*.json"))
    data = json.loads(entry.read_text())
    data["params"]["tile_m"] = 4096
    entry.write_text(json.dumps(data))
    result = run(*args)
    assert result.exit_code == 0, result.stderr
    assert f"ignoring cache file {entry}" in result.stderr and "tile_m=4096" in result.stderr
    assert json.loads(result.stdout)["search"]["cached"] is False
    assert os.path.exists(entry) and json.loads(entry.read_text())["params"]["tile_m"] != 4096


@pytest.mark.parametrize("value", ["0", "nan", "inf", "-1"])
def test_a_timeout_must_be_a_positive_number_of_seconds(tmp_path, value):
    result = run("tune", "--shape", "128x256x128", "--timeout", value, "-o", str(tmp_path / "k.py"))
    assert result.exit_code == 2 and "--timeout" in result.stderr and "no schedule" not in result.stderr
    assert not (tmp_path / "k.py").exists()


def test_explain_prints_the_lower_bound_terms_in_the_formulas_order():
    import re

    lines = run("explain", "--shape", "256x512x256").stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("lower_bound = ") and "Max(" in line)
    launch = get_target("trn1").launch_overhead_us
    assert "t_launch" in lines[at] and lines[at + 1].split("=")[1].strip().startswith(f"{launch:g} + max(")
    names = re.findall(r"(\w+)/(\w+)", lines[at])
    numbers = re.findall(r"([0-9.e+]+) / ([0-9.e+]+)", lines[at + 1])
    symbols = dict(re.findall(r"^  (\w+)\s+= (\S+)$", "\n".join(lines), re.M))
    assert len(names) == len(numbers) == 2
    checked = 0
    for (num, den), (num_value, den_value) in zip(names, numbers, strict=True):
        for name, value in ((num, num_value), (den, den_value)):
            if name in symbols:  # the printed symbols (the lower bound's own inputs are not all listed)
                assert float(symbols[name]) == pytest.approx(float(value), rel=1e-5), name
                checked += 1
    assert checked >= 1


def test_a_study_of_another_workload_is_named_in_words(tmp_path):
    """The mismatch error once printed the other workload as a raw dict (issue 14, small things)."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    first = run("tune", "--shape", "128x256x128", "--method", "optuna", "--trials", "3", "--no-cache",
                "--storage", storage, "--study", "s", "-o", str(tmp_path / "a.py"))
    assert first.exit_code == 0, first.stderr
    other = run("tune", "--shape", "128x512x128", "--method", "optuna", "--trials", "3", "--no-cache",
                "--storage", storage, "--study", "s", "-o", str(tmp_path / "b.py"))
    assert other.exit_code == 2 and "M=128 N=256 K=128" in other.stderr, other.stderr
    assert "{" not in other.stderr and len(other.stderr.strip().splitlines()) == 1
