"""The command line: `python -m mk sol`, the listings, and clear errors (exit 2, no traceback) on bad input."""

import json
import subprocess
import sys

import pytest

from mk.__main__ import main
from mk.config import GEMMA4_26B_A4B
from mk.sol import speed_of_light


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "mk", *args], capture_output=True, text=True, timeout=120)


def test_sol_json(capsys):
    assert main(["sol", "--model", "gemma4-26b-a4b", "--chip", "h100", "--context", "1024", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"bytes_per_token", "tokens_per_s", "step_ms", "bytes_by_component"} <= set(d)
    s = speed_of_light(GEMMA4_26B_A4B, "h100", 1024)
    assert d["tokens_per_s"] == pytest.approx(s.tokens_per_s)
    assert d["bytes_per_token"] == pytest.approx(s.bytes_per_token)
    assert d["step_ms"] == pytest.approx(1e3 / s.tokens_per_s)
    assert sum(d["bytes_by_component"].values()) == pytest.approx(d["bytes_per_token"])
    assert d["kind"].startswith("modelled")


def test_sol_text_with_batch_and_dtype(capsys):
    assert (
        main(
            [
                "sol",
                "--model",
                "gemma4-26b-a4b",
                "--chip",
                "tpu-v5e-8",
                "--context",
                "8192",
                "--batch",
                "8",
                "--dtype",
                "int8-experts",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "tpu-v5e-8" in out and "batch 8" in out and "int8-experts" in out and "experts" in out


def test_help_lists_subcommands():
    r = run_cli("--help")
    assert r.returncode == 0
    for cmd in ("sol", "models", "chips"):
        assert cmd in r.stdout


def test_models_and_chips_listings(capsys):
    assert main(["models"]) == 0
    assert "25,233,141,790" in capsys.readouterr().out
    assert main(["chips"]) == 0
    out = capsys.readouterr().out
    assert "tpu-v6e" in out and "source:" in out


BASE = ["sol", "--model", "gemma4-26b-a4b", "--chip", "h100", "--context", "1024"]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["sol", "--model", "gemma4-26b-a4b", "--chip", "a100", "--context", "1024"],
            "unknown chip 'a100'; known chips:",
        ),
        (
            ["sol", "--model", "llama", "--chip", "h100", "--context", "1024"],
            "unknown model 'llama': not a preset (gemma4-26b-a4b",
        ),
        (BASE + ["--dtype", "fp4"], "invalid choice: 'fp4'"),
        (
            ["sol", "--model", "gemma4-26b-a4b", "--chip", "h100", "--context", "0"],
            "expected a positive integer, got 0",
        ),
        (
            ["sol", "--model", "gemma4-26b-a4b", "--chip", "h100", "--context", "-5"],
            "expected a positive integer, got -5",
        ),
        (
            ["sol", "--model", "gemma4-26b-a4b", "--chip", "h100", "--context", "1k"],
            "expected a positive integer, got '1k'",
        ),
        (BASE + ["--batch", "0"], "expected a positive integer, got 0"),
        (["sol", "--model", "gemma4-26b-a4b", "--chip", "h100"], "required: --context"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
    ids=["chip", "model", "dtype", "context0", "context-neg", "context-text", "batch0", "missing", "command"],
)
def test_bad_input_exits_2_with_a_message(args, message, capsys):
    """In this process (mk.__main__.main, as ``python -m mk`` calls it; the real command: the test below)."""
    try:
        code = main(args)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    r = capsys.readouterr()
    assert code == 2, r.err
    assert message in r.err
    assert "Traceback" not in r.err and r.out == ""


def test_the_command_itself_exits_2_with_one_line_and_no_traceback():
    r = run_cli("sol", "--model", "gemma4-26b-a4b", "--chip", "a100", "--context", "1024")
    assert r.returncode == 2, r.stderr
    assert "unknown chip 'a100'; known chips:" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
