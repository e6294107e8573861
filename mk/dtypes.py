"""Data types: what each kind of tensor costs a policy in bytes per element (``DtypePolicy``, by name in ``DTYPES``),
and the element types a kernel's arrays are laid out in (``ARRAY_DTYPES``: numpy's names, with their bytes).

A policy is what the speed of light and the timing model count (``bf16``, ``fp8-block``, ``int4`` ...); a plan's arrays
are floats (``bfloat16``, ``float32``) beside the INT8 codes or a shipped format's codes its scheme names. One policy's
arrays are ``DtypePolicy.arrays``: every layer asks here rather than guessing a type back from an item size.

INT8 policies (mk.quant's schemes) also read each quantized matrix's scales: 4 bytes (float32) per output
channel, per distinct routed expert for the experts, counted in that matrix's component. ``fp8`` is the write-up's FP8
(every matrix one byte, the head too, no scales: the speed of light its table and its 21% for vLLM are against);
``fp8-block`` is the format DeepSeek-V3's checkpoints ship in (an F32 scale per 128 x 128 block of every matrix but
the head, which stays BF16), its scales counted in the bytes per element (exact where both dimensions are multiples
of 128). The 4-bit formats big MoE
models ship their routed experts in carry a scale per group of 32 values along a row, counted in the bytes per element
(exact where a row's length is a multiple of 32, as in every model here): ``int4`` (Kimi K2 Thinking's release) and
``mxfp4`` (gpt-oss's). They apply to a model's routed experts only, and are refused for a model without them. The
group of 32 and the 4 bits are the releases' own (Kimi K2 Thinking's quantization_config; gpt-oss's ``*_blocks`` and
``*_scales``, the OCP MX format's E8M0 scale); INT4's BF16 scale is compressed-tensors' usual one, not yet checked
against a checkpoint here.
"""

from __future__ import annotations

from dataclasses import dataclass

# The float element types a plan's weights and KV cache are laid out in, numpy's names, and their bytes.
ARRAY_DTYPES = {"float32": 4, "bfloat16": 2}


def array_itemsize(dtype: str) -> int:
    """Bytes per element of a plan's float arrays of ``dtype`` (numpy's name: ``bfloat16`` or ``float32``)."""
    try:
        return ARRAY_DTYPES[dtype]
    except KeyError:
        raise ValueError(
            f"unknown array dtype {dtype!r}: a plan lays out its weights and KV cache in {', '.join(ARRAY_DTYPES)} "
            "(numpy's names; jnp.dtype(x).name gives one)"
        ) from None


@dataclass(frozen=True)
class DtypePolicy:
    """Bytes per element for each kind of tensor, and the mk.quant scheme whose matrices also read their
    scales (``SCALE_BYTES`` per scale)."""

    name: str
    matrix: float  # attention, shared MLP and router matrices
    head: float  # the tied embedding, read as the output head
    expert: float  # expert matrices
    vector: float  # norms and the vector scales (layer_scalar, router and per-expert scales)
    kv: float  # the KV cache
    description: str
    quant: str = "none"  # the mk.quant scheme: its matrices carry per-output-channel scales
    experts_only: bool = False  # a format of routed experts: refused for a model without them
    # the float arrays a kernel plan of this policy holds (ARRAY_DTYPES): the weights not in codes, and the KV cache
    arrays: str = "bfloat16"

    @property
    def array_itemsize(self) -> int:
        return array_itemsize(self.arrays)


_INT8_SCALES = "with F32 scales per output channel"
GROUP = 32  # values a scale of the 4-bit expert formats covers, along a row
SCALE_BLOCK = 128  # fp8-block's scales cover SCALE_BLOCK x SCALE_BLOCK weights
DTYPES: dict[str, DtypePolicy] = {
    p.name: p
    for p in (
        DtypePolicy("bf16", 2, 2, 2, 2, 2, "all weights and the KV cache in BF16"),
        DtypePolicy("fp8", 1, 1, 1, 2, 2, "FP8 matrices (head included), BF16 norms and KV cache"),
        DtypePolicy(
            "fp8-block", 1 + 4 / SCALE_BLOCK**2, 2, 1 + 4 / SCALE_BLOCK**2, 2, 2,
            f"FP8 (e4m3) matrices with an F32 scale per {SCALE_BLOCK}x{SCALE_BLOCK} block, as DeepSeek-V3's "
            "checkpoints hold them; "
            "the head, norms and KV cache BF16",
        ),
        DtypePolicy(
            "int8-experts", 2, 2, 1, 2, 2, f"INT8 expert matrices {_INT8_SCALES}; the rest BF16", "int8-experts"
        ),
        DtypePolicy("f32", 4, 4, 4, 4, 4, "all weights and the KV cache in F32", arrays="float32"),
        DtypePolicy("int8", 1, 2, 1, 2, 2, f"INT8 matrices but the head {_INT8_SCALES}; the rest BF16", "int8"),
        DtypePolicy(
            "int4", 2, 2, 0.5 + 2 / GROUP, 2, 2,
            f"INT4 routed experts with a BF16 scale per {GROUP} values (Kimi K2 Thinking's release); the rest BF16",
            experts_only=True,
        ),
        DtypePolicy(
            "mxfp4", 2, 2, 0.5 + 1 / GROUP, 2, 2,
            f"MXFP4 routed experts: 4-bit E2M1 values with an 8-bit E8M0 scale per {GROUP} (gpt-oss's release); the "
            "rest BF16",
            experts_only=True,
        ),
    )
}  # fmt: skip
# Floats an INT8 scheme can be combined with ("f32+int8-experts": what mk.measure.cpu times in f32).
BASES = ("bf16", "f32")


def get_dtype(name: str) -> DtypePolicy:
    """A policy by name: one of ``DTYPES``, or ``BASE+SCHEME`` (``f32+int8-experts``): the float ``BASE``
    (bf16, f32) with the matrices of the mk.quant ``SCHEME`` in INT8 (``bf16+int8`` counts as ``int8``)."""
    if "+" in name:
        base, scheme = name.split("+", 1)
        if base in BASES and scheme in ("int8-experts", "int8"):
            b = DTYPES[base]
            return DtypePolicy(
                name,
                1 if scheme == "int8" else b.matrix,
                b.head,
                1,
                b.vector,
                b.kv,
                f"{DTYPES[scheme].description.split(';')[0]}; the rest {base.upper()}",
                scheme,
                arrays=b.arrays,
            )
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(
            f"unknown dtype {name!r}; known: {', '.join(DTYPES)} (or BASE+SCHEME, BASE one of {', '.join(BASES)}, "
            "SCHEME int8-experts or int8)"
        ) from None
