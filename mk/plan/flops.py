"""The FLOPs the plan charges each compute op, named once.

A product of two numbers summed into a third is two FLOPs (a multiply and an add). Element-wise work is counted
as the arithmetic the kernel does per element; it is small beside the weight products, and the timing model charges
it only where a chip's compute, not its HBM, would set the pace (mk.timing.work)."""

from __future__ import annotations

MULTIPLY_ADD = 2


def matmul_flops(rows: int, k: int, n: int) -> int:
    """``rows`` vectors of ``k`` times a ``[k, n]`` matrix."""
    return MULTIPLY_ADD * rows * k * n


def attention_flops(rows: int, heads: int, head_dim: int, positions: int) -> int:
    """Each query head over ``positions`` cached keys (q.k) and values (p.v): two products of ``head_dim``."""
    return 2 * MULTIPLY_ADD * rows * heads * head_dim * positions


def latent_attention_flops(rows: int, heads: int, latent: int, rope: int, positions: int) -> int:
    """MLA: each head's scores over the latent and the RoPE key, and its values over the latent."""
    return MULTIPLY_ADD * rows * heads * (2 * latent + rope) * positions


def norm_flops(rows: int, width: int) -> int:
    """An RMS norm: square and sum, then scale by the root and by the weight, 4 an element."""
    return 4 * rows * width


def qk_norm_rope_flops(rows: int, heads: int, head_dim: int) -> int:
    """The q and k heads' norms (4 an element) and RoPE (a rotated pair's four products and two sums, and the
    cos/sin factors: 8 an element)."""
    return 12 * rows * heads * head_dim


def gated_act_flops(rows: int, width: int) -> int:
    """The gate's activation (a tanh-approximated GELU or SiLU, about 9 an element) times the up projection."""
    return 10 * rows * width


def attention_residual_flops(rows: int, hidden: int) -> int:
    """Attention's output normed and added to the stream, the stream normed for the FFN: 8 an element, about the two
    norms (9 counted exactly; Gemma 4's MoE layers norm the stream twice more, for the router and the experts: not
    counted)."""
    return 8 * rows * hidden


def ffn_residual_flops(rows: int, hidden: int) -> int:
    """The FFN's output added to the stream: 10 an element, between a norm, the add and the layer's scalar (6) and
    Gemma 4's MoE layer, which norms its two parts and their sum first (15)."""
    return 10 * rows * hidden


def head_tile_flops(rows: int, vocab_rows: int, hidden: int) -> int:
    """A tile of the head: the logits' product, then each logit softcapped (divide, tanh, multiply) and folded into
    the running argmax (compare, select, index): 6 a logit."""
    return matmul_flops(rows, hidden, vocab_rows) + 6 * rows * vocab_rows


def route_flops(rows: int, experts: int, top_k: int) -> int:
    """The router's softmax over ``experts`` logits (4 a logit) and its top-k (a compare and a select a logit for
    each pick)."""
    return (4 + 2 * top_k) * rows * experts


def expert_combine_flops(rows: int, hidden: int) -> int:
    """An expert's output times its routing weight, summed into the users' MoE output."""
    return MULTIPLY_ADD * rows * hidden
