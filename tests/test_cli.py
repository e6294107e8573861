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


@pytest.mark.parametrize(
    "content, problem",
    [
        ("a model\n", "is not valid JSON (Expecting value: line 1 column 1 (char 0))"),
        ('{"vocab_size": 512,\n', "is not valid JSON (Expecting"),
        (b"\x89PNG\x00", "is not valid JSON ('utf-8' codec can't decode byte 0x89"),
        ("[1, 2]", "holds a JSON list, not an object"),
    ],
    ids=["text", "broken", "binary", "list"],
)
@pytest.mark.parametrize("name", ["model.txt", "config.json"])
def test_a_model_file_that_is_not_a_config_is_named_in_one_line(tmp_path, capsys, content, problem, name):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["sol", "--model", str(path), "--chip", "h100", "--context", "1024"]) == 2
    r = capsys.readouterr()
    assert r.err.splitlines() == [r.err.strip()] and r.out == ""
    assert r.err.startswith(f"error: {path} {problem}")
    expected = "expected a model's config.json, one JSON object of its fields (data/configs/*/config.json are some)"
    assert r.err.strip().endswith(expected)


LLAMA = ["--model", "llama-3.2-1b"]  # data/configs/llama-3.2-1b: max_position_embeddings 131072


@pytest.mark.parametrize("command", [["sol", "--chip", "tpu-v5e"], ["predict", "--chip", "tpu-v5e"]])
def test_sol_and_predict_warn_of_a_context_past_the_models_maximum_and_compute_it(capsys, command):
    """A what-if past the trained length is a fair question of a step's cost: one line on stderr, the answer as
    always; at the maximum, no line."""
    assert main([*command, *LLAMA, "--context", "131072", "--json"]) == 0
    at_max = capsys.readouterr()
    assert at_max.err == ""
    assert main([*command, *LLAMA, "--context", "131073", "--json"]) == 0
    past = capsys.readouterr()
    assert past.err.splitlines() == [
        "warning: context 131073 is past llama-3.2-1b's max_position_embeddings (131072): modelled all the same, as a "
        "what-if (a --context of at most 131072 is one the model was trained for)"
    ]
    assert json.loads(past.out)["context"] == 131073  # computed at the context asked


def test_a_preset_without_a_maximum_is_not_warned_of(capsys):
    assert main(["sol", "--model", "gemma4-26b-a4b", "--chip", "tpu-v5e-8", "--context", "1000000"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "prompt, new_tokens, message",
    [
        (
            "1,2,3",
            "131071",
            "context 131073 (the longest prompt, 3 tokens, plus 131071 new tokens, less one) is past "
            "llama-3.2-1b's max_position_embeddings (131072): the model was not trained at those positions; give "
            "--new-tokens 131070 or fewer",
        ),
        (
            "1;2,3,4,5",
            "131070",
            "context 131073 (the longest prompt, 4 tokens, plus 131070 new tokens, less one) is "
            "past llama-3.2-1b's max_position_embeddings (131072): the model was not trained at those positions; give "
            "--new-tokens 131069 or fewer",
        ),
    ],
    ids=["one-user", "ragged"],
)
def test_generate_refuses_tokens_past_the_models_maximum_before_drawing_weights(capsys, prompt, new_tokens, message):
    """Refused in one line, exit 2, before any weights are drawn (llama-3.2-1b's would take this machine minutes)."""
    assert main(["generate", *LLAMA, "--prompt-ids", prompt, "--new-tokens", new_tokens]) == 2
    r = capsys.readouterr()
    assert r.err.splitlines() == [f"error: {message}"] and r.out == ""


def test_the_maximum_is_read_from_a_config_and_ignored_by_equality():
    from mk.config import PRESETS, get_config

    llama = get_config("llama-3.2-1b")
    assert llama.max_position_embeddings == 131072
    assert llama.past_max_positions(131072) is None
    assert llama.past_max_positions(131073) == "context 131073 is past llama-3.2-1b's max_position_embeddings (131072)"
    assert PRESETS["gemma4-26b-a4b"].max_position_embeddings is None  # no source gives it here: never checked
    unknown = llama.replace(max_position_embeddings=None)
    assert unknown == llama and repr(unknown) == repr(llama)  # the same model, the same plans' fingerprints
