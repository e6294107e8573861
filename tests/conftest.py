"""Shared test setup: JAX on the CPU with 8 simulated devices, tiny configs, and tiny checkpoints written
by transformers itself (an implementation we did not write) for the parity and loading tests; the pin that holds a
point the timing model misses to its error (:class:`Pin`)."""

import dataclasses
import gc
import itertools
import json
import os
import sys

# Before JAX is imported anywhere: CPU only, 8 host devices for the sharded/collective tests, and XLA:CPU's
# code generation unoptimised: the tests compile hundreds of small programs and run each a few times (or
# spend their time in the interpreter's Python callbacks), so LLVM's optimisation cost more than it saved
# (tests/test_reference.py with test_parity.py: 229 s -> 149 s on 2 cores), LLVM's costlier passes off too
# (tests/test_megakernel.py with test_mla_kernel.py: 200 s -> 191 s), and XLA:CPU's older elementwise emitters in
# place of its MLIR fusion emitters, which compile slower (a tiny MoE's reference and kernel, two steps: 5.6 s of
# compiling -> 3.6 s; test_megakernel.py with test_parity.py 130 s -> 102 s). No fast-math either way; the older
# emitters' exp and friends may differ in the last bits (that tiny MoE's largest kernel-reference logit gap 1.6e-6 ->
# 2.4e-6, the tests' bound 1e-4), and libtpu's programs for the TPU are unchanged (it has its own pipeline).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    " --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false",
)
# The transformers oracles' torch one thread a process: two test workers share 2 cores, and torch's own pool of a
# thread a core each oversubscribed them (test_parity.py with test_megakernel.py, two workers: 124.7 s -> 104.4 s,
# interleaved). The processes the tests start (the CLI, the notebooks) inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# XLA:CPU runs at most NPROC device programs at once (default: the cores); the 8-chip kernels' collectives
# need all 8 in the kernel together (mk.sharding.simulate_chips)
os.environ.setdefault("NPROC", "16")
# Each test worker on cores of its own (xdist's gw0, gw1, ...: with as many workers as cores, one each), and the
# processes it starts (the CLI's, the notebooks') with it. The 8-chip interpreted kernels run a thread a chip, all
# contending for one interpreter lock; with both workers' threads free to move between the cores, their switching
# cost the run a tenth or more (two workers on 2 cores, one run each way in a row: tests/test_formats_kernel.py 118 s
# -> 97 s pinned, tests/test_sharding.py with test_gpt_oss_kernel.py 143 s -> 130 s; the CPU time spent in the operating
# system halved).
_worker, _workers = os.environ.get("PYTEST_XDIST_WORKER", ""), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _worker.startswith("gw") and hasattr(os, "sched_setaffinity"):
    _cores = sorted(os.sched_getaffinity(0))
    _n = int(_worker[2:])
    os.sched_setaffinity(0, {c for i, c in enumerate(_cores) if i % _workers == _n} or {_cores[_n % len(_cores)]})

# jsonschema (nbformat's validator) builds an RFC 3987 grammar at import where rfc3987_syntax is installed (jupyterlab's
# dependencies bring it): 1.2 s a test process; a notebook's schema checks no IRI, so that format checker is left out
# (ci/run_notebooks.py does the same in the processes it starts).
sys.modules.setdefault("rfc3987_syntax", None)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", False)

from mk.config import TINY_DENSE, TINY_LLAMA, TINY_MOE, TINY_QWEN3_MOE, to_hf_dict  # noqa: E402
from mk.tpu import semaphores_left  # noqa: E402
from mk.weights import EMBED_STD, NORM_STD  # noqa: E402

# The collector's young generation every 100,000 allocations rather than 700, the older ones rarer: tracing and
# lowering allocate millions of short-lived objects, and collecting them as often cost a few percent of the run
# (test_parity.py with test_megakernel.py, two workers: 142.3 s, 135.1 s -> 135.3 s, 125.3 s, interleaved).
gc.set_threshold(100_000, 50, 100)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test whose kernels left a semaphore nonzero at their exit fails: the interpreter only prints it (a chip's
    core halts on it)."""
    outcome = yield
    report = outcome.get_result()
    left = semaphores_left(report.capstdout) if report.when == "call" and report.passed else []
    if left:
        report.outcome = "failed"
        report.longrepr = f"a kernel left {len(left)} semaphore(s) nonzero at its exit: " + "; ".join(left[:3])


# A config written the way a transformers user would (the snippet): sliding and full layers
# with different KV head counts and head dims, a short window. Built by transformers, not by mk.
HF_SNIPPET = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    hidden_size_per_layer_input=0,
    sliding_window=8,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    enable_moe_block=True,
    num_experts=8,
    top_k_experts=2,
    moe_intermediate_size=24,
    final_logit_softcapping=30.0,
)
# Odd shapes: a window of 7 (not a block multiple), head dims 48 / 64 and widths that are not multiples
# of 128, 6 experts; MoE and dense.
HF_ODD = dict(
    vocab_size=500,
    hidden_size=96,
    intermediate_size=80,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=48,
    global_head_dim=64,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    hidden_size_per_layer_input=0,
    sliding_window=7,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    enable_moe_block=True,
    num_experts=6,
    top_k_experts=2,
    moe_intermediate_size=40,
    final_logit_softcapping=30.0,
)
# One sliding and one full layer: an 8-chip interpreted step costs ~7 s a layer on 2 cores.
LAYER_PAIR = dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
# Eight query heads, so attention splits over 8 chips, with fewer KV heads than chips (2 sliding, 1 full:
# each KV head kept on 4 and 8 chips) and 8 experts (one whole expert per chip, or each split in 8), as a pair.
HF_EIGHT_HEADS = dict(
    HF_SNIPPET,
    **LAYER_PAIR,
    num_attention_heads=8,
    num_key_value_heads=2,
    num_global_key_value_heads=1,
    intermediate_size=80,
    moe_intermediate_size=40,
)
EIGHT_HEADS_PRE_NORM = dict(num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=32)
DEEPSEEK_V3 = dict(
    model_type="deepseek_v3",
    vocab_size=500,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    first_k_dense_replace=1,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=2,
    topk_group=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    q_lora_rank=24,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
    rope_interleave=True,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
)
# no query bottleneck (q_proj), rotate-half RoPE, 4 groups of 2 (the best 2 groups), weights not renormalised
DEEPSEEK_NO_Q_LORA = dict(q_lora_rank=None, rope_interleave=False, n_group=4, topk_group=2, norm_topk_prob=False)
DEEPSEEK_YARN = dict(rope_type="yarn", rope_theta=10_000.0, factor=8.0, original_max_position_embeddings=64,
                     beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)  # fmt: skip
HF_CONFIGS = {
    "tiny-dense": to_hf_dict(TINY_DENSE),
    "tiny-moe": to_hf_dict(TINY_MOE),
    "hf-snippet": HF_SNIPPET,
    "hf-odd": HF_ODD,
    "hf-odd-dense": {**HF_ODD, "enable_moe_block": False},
    "hf-eight-heads": HF_EIGHT_HEADS,
    # the snippet's 4 query heads (attention replicated over 8 chips) in one sliding and one full layer
    "hf-snippet-pair": {**HF_SNIPPET, **LAYER_PAIR},
    "hf-eight-heads-dense": {**HF_EIGHT_HEADS, "enable_moe_block": False},
    # a window of 64: 4 chips sharing a sliding KV head each hold a whole block of 16 of it (positions split)
    "hf-eight-heads-w64": {**HF_EIGHT_HEADS, "sliding_window": 64},
    "hf-eight-heads-w64-dense": {**HF_EIGHT_HEADS, "sliding_window": 64, "enable_moe_block": False},
    # The pre-norm families (transformers' LlamaForCausalLM, Qwen3MoeForCausalLM): mk's tiny presets, and odd
    # shapes (hidden 96, head dim 48, three query heads on one KV head, vocabulary 500, six experts).
    "tiny-llama": to_hf_dict(TINY_LLAMA),
    "tiny-qwen3-moe": to_hf_dict(TINY_QWEN3_MOE),
    "llama-odd": {
        **to_hf_dict(TINY_LLAMA),
        **dict(vocab_size=500, hidden_size=96, intermediate_size=80, num_attention_heads=3, head_dim=48),
    },
    # over 8 chips: 8 query heads on 2 KV heads (each kept on 4 chips), head dim 32, two layers, 8 experts
    "llama-eight-heads": {**to_hf_dict(TINY_LLAMA), **EIGHT_HEADS_PRE_NORM},
    "qwen3-moe-eight-heads": {**to_hf_dict(TINY_QWEN3_MOE), **EIGHT_HEADS_PRE_NORM},
    "qwen3-moe-odd": {
        **to_hf_dict(TINY_QWEN3_MOE),
        **dict(vocab_size=500, hidden_size=96, num_attention_heads=3, head_dim=48, num_experts=6),
        **dict(moe_intermediate_size=40, intermediate_size=40),
    },
    # DeepSeek-V3 (transformers' DeepseekV3ForCausalLM): MLA with a query bottleneck, interleaved RoPE, one dense
    # layer then 8 routed experts in 2 groups (the best group's experts picked) beside a shared one
    "deepseek-v3": DEEPSEEK_V3,
    "deepseek-v3-no-q-lora": {**DEEPSEEK_V3, **DEEPSEEK_NO_Q_LORA},
    # eight query heads: one a chip over 8 chips (the latent cache on every chip); 256 wide, so over 8 chips the
    # down-projections' rows split in two blocks of 128 (chips 2-7 holding zeros)
    "deepseek-v3-eight-heads": {**DEEPSEEK_V3, "num_attention_heads": 8, "num_key_value_heads": 8, "hidden_size": 256},
    # Kimi K2 at this size: DeepSeek-V3's architecture with one group of experts, its YaRN betas (1 / 1) and scaling
    # factor, eight query heads (one a chip over 8), 256 wide (over 8 chips its down-projections' rows split in two
    # blocks of 128, chips 2-7 holding zeros)
    "kimi-k2": {
        **DEEPSEEK_V3,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "n_group": 1,
        "topk_group": 1,
        "routed_scaling_factor": 2.827,
        "rope_parameters": dict(DEEPSEEK_YARN, beta_fast=1.0, beta_slow=1.0),
    },
    # YaRN as DeepSeek-V3 publishes it (beta 32 / 1, mscale = mscale_all_dim = 1: cos and sin unscaled, the scores
    # times mscale^2) over a short original length, so the 4 RoPE frequencies are kept, blended, slowed, slowed
    "deepseek-v3-yarn": {**DEEPSEEK_V3, "rope_parameters": DEEPSEEK_YARN},
    # Kimi K2's betas (1 / 1) and unequal mscales (cos and sin scaled too), rotate-half, no query bottleneck
    "deepseek-v3-no-q-lora-yarn": {
        **DEEPSEEK_V3,
        **DEEPSEEK_NO_Q_LORA,
        "rope_parameters": dict(DEEPSEEK_YARN, beta_fast=1.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=0.707),
    },
}


@pytest.fixture(params=[TINY_DENSE, TINY_MOE], ids=lambda c: c.name)
def tiny_cfg(request):
    """Each tiny preset in turn (dense, MoE)."""
    return request.param


def init_hf_weights(model, seed: int) -> None:
    """Random weights for a transformers model, set by parameter name only (independent of mk's name map).

    Same distributions as mk.weights.random_params, so logits are not degenerate: matrices N(0, 1/fan_in)
    (fan_in is the last axis in transformers' [out, in] / [E, out, in] layout), the embedding
    N(0, EMBED_STD^2/hidden), every norm weight and scale (incl. layer_scalar) 1 + N(0, NORM_STD^2), DeepSeek-V3's
    routing bias N(0, 0.3^2) (so it changes which experts are picked).
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("inv_freq") or name.endswith("embed_scale"):
                continue  # derived from the config, not weights
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's routing bias: as wide as the scores' spread
                t.copy_(0.3 * torch.randn(t.shape, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                t.copy_(torch.randn(t.shape, generator=gen) * (EMBED_STD * t.shape[1] ** -0.5))
            elif t.ndim >= 2:
                t.copy_(torch.randn(t.shape, generator=gen) * t.shape[-1] ** -0.5)
            else:
                t.copy_(1.0 + NORM_STD * torch.randn(t.shape, generator=gen))


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory):
    """Factory ``hf_checkpoint(name) -> (folder, model)``: a tiny transformers model with random weights (names in
    HF_CONFIGS: a Gemma4ForCausalLM, or the causal LM of the config's ``model_type``), saved with
    ``save_pretrained``; ``model`` is it reloaded from the folder with eager attention, in eval mode. Built once
    per test session."""
    made = {}

    def make(name: str):
        if name not in made:
            import torch
            from transformers import AutoConfig, AutoModelForCausalLM, Gemma4ForCausalLM, Gemma4TextConfig

            torch.manual_seed(0)
            d = dict(HF_CONFIGS[name])
            family = d.pop("model_type", "gemma4_text")
            if family == "gemma4_text":
                cls, config = Gemma4ForCausalLM, Gemma4TextConfig(**d)
            else:
                cls, config = AutoModelForCausalLM, AutoConfig.for_model(family, **d)
            model = cls.from_config(config) if cls is AutoModelForCausalLM else cls(config)
            init_hf_weights(model, seed=sum(map(ord, name)))
            folder = tmp_path_factory.mktemp(name)
            model.save_pretrained(folder)
            model = cls.from_pretrained(folder, attn_implementation="eager").eval()
            made[name] = (folder, model)
        return made[name]

    return make


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def assistant_text_config(target: dict) -> dict:
    """A tiny Gemma 4 assistant's text config for the target config ``target`` (transformers' keys): half its width,
    a sliding and a full layer reading the target's K/V (the same heads), a dense MLP."""
    return dict(target, hidden_size=target["hidden_size"] // 2, intermediate_size=48, num_hidden_layers=2,
                layer_types=["sliding_attention", "full_attention"], enable_moe_block=False,
                vocab_size_per_layer_input=0, use_double_wide_mlp=False)  # fmt: skip


@pytest.fixture(scope="session")
def hf_assistant(tmp_path_factory, hf_checkpoint):
    """Factory ``hf_assistant(target name) -> (folder, model)``: a Gemma4AssistantForCausalLM with random weights for
    the tiny target ``hf_checkpoint(name)``, saved by transformers and reloaded with eager attention."""
    made = {}

    def make(name: str):
        if name not in made:
            import torch
            from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig

            hf_checkpoint(name)
            torch.manual_seed(1)
            d = dict(HF_CONFIGS[name])
            d.pop("model_type", None)
            config = Gemma4AssistantConfig(
                text_config=Gemma4TextConfig(**assistant_text_config(d)), backbone_hidden_size=d["hidden_size"]
            )
            model = Gemma4AssistantForCausalLM(config)
            init_hf_weights(model, seed=sum(map(ord, name)) + 1)
            folder = tmp_path_factory.mktemp(name + "-assistant")
            model.save_pretrained(folder)
            made[name] = (
                folder,
                Gemma4AssistantForCausalLM.from_pretrained(folder, attn_implementation="eager").eval(),
            )
        return made[name]

    return make


@pytest.fixture
def mk_json(capsys):
    """``mk_json(*args)``: ``python -m mk ARGS`` as a user runs it (mk.__main__.main, in this process: a fresh
    one would add only JAX's start-up; tests/test_cli.py runs the command itself); its JSON output (the last
    line of stdout). A non-zero exit fails the test with what the command printed on stderr."""
    from mk.__main__ import main

    def run(*args):
        capsys.readouterr()  # what the test printed before
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        assert code == 0, out.err[-3000:]
        return json.loads(out.out.strip().splitlines()[-1])

    return run


# A whole step's pin (or its tokens/s): 3%. The chip's measured read rate, 1% lower, moves the modelled steps of the
# published and independent points by up to 1% (1.8% where a per-kernel cost is fitted through it), and its own runs
# spread 0.3%: a pin fails on a read rate 3% off, or a step that issues 3% more.
PIN_STEP = 0.03


@dataclasses.dataclass(frozen=True)
class Pin:
    """A point the timing model misses, pinned (tests/test_validation.py, tests/test_independent.py): ``error``, the
    model's error there when it was pinned (modelled / published - 1), held in both directions within ``tolerance``
    on modelled / published, relative: the bound scales with the miss (5% on +8,374% is +-4.2 points). A change that
    moves it further, a fix or a regression, fails; a deliberate change of the model pins it again."""

    error: float
    tolerance: float

    def moved(self, error: float) -> float:
        """How far ``error`` has moved modelled / published from the pinned value, relative."""
        return (1 + error) / (1 + self.error) - 1

    def holds(self, error: float) -> bool:
        return abs(self.moved(error)) <= self.tolerance

    def against(self, error: float) -> str:
        """``error`` beside the pinned one, for a failure's message."""
        return (
            f"{error:+.2%} against {self.error:+.2%} pinned ({self.moved(error):+.1%}, tolerance {self.tolerance:.0%})"
        )

    @property
    def bounds(self) -> tuple[float, float]:
        """The errors the pin allows, lowest and highest."""
        return tuple((1 + self.error) * (1 + s * self.tolerance) - 1 for s in (-1, 1))


class FakeClock:
    """A clock for mk.measure.loop.interleaved (its ``clock``) that moves only when a call moves it: ``step(s, ...)``
    is a call that advances it by its next duration, in turn, round by round (each call runs once a round). A test
    asserts the loop's statistics exactly, whatever else the machine is doing; a real stall cannot reach them."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def step(self, *seconds: float):
        durations = itertools.cycle(seconds)

        def call():
            self.now += next(durations)

        return call


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()
