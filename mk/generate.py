"""Greedy generation with a pluggable decode engine.

Users may bring prompts of different lengths; each decodes from its own position.

An engine is a name and a ``make_step(cfg)`` returning a step with ``mk.reference.decode_step``'s
signature: ``step(params, cfg, cache, tokens[B], pos[B], knockout) -> (logits[B, V], cache)``, where
generate always passes ``pos`` as a ``[B]`` int32 device array, user b's position. A step may offer
``step.prepare(params, cfg)``, the parameter layout it runs on, made once per tree (mk.measure times the
step on it), and ``step.adopt_cache(cache)``, its own layout of the reference's cache, which generate
calls once after prefill (the step then receives and returns caches in that layout). An engine
registers with a ``cache_multiple``: generate makes every layer's cache a multiple of it in slots
(``mk.reference.init_cache(multiple=...)``; the extra slots are masked). The prompt is always
prefilled by the reference (engines are decode engines), right-padded to the longest prompt; the
engine then decodes every new token after the first. The registry is mk.engines: engines living in other
modules register themselves there on import.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from .assistant import draft
from .assistant_config import check_pair
from .config import ModelConfig
from .engines import cache_multiple, get_step, register_engine
from .params import check_knockout
from .progress import tqdm
from .reference import check_tokens, decode_step, float_params, init_cache, prefill
from .speculative import ngram_draft
from .units import positive_int

register_engine("reference", lambda cfg: decode_step)


def prompt_batch(cfg: ModelConfig, prompt) -> tuple[np.ndarray, np.ndarray]:
    """A prompt as (tokens [B, T] int32 right-padded with 0, lengths [B]): ``prompt`` is a ``[B, T]``
    array (every user T tokens) or a list of per-user lists of token ids, of any lengths >= 1."""
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(p, (list, tuple, np.ndarray)) for p in prompt):
        rows = [check_tokens(cfg, p) for p in prompt]
        for b, r in enumerate(rows):
            if r.ndim != 1 or r.size == 0:
                raise ValueError(f"the prompt of user {b} must be a list of >= 1 token ids, got shape {r.shape}")
        lengths = np.array([len(r) for r in rows], np.int32)
        tokens = np.zeros((len(rows), int(lengths.max())), np.int32)
        for b, r in enumerate(rows):
            tokens[b, : len(r)] = r
        return tokens, lengths
    tokens = check_tokens(cfg, prompt)
    if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise ValueError(f"prompt must be [batch >= 1, length >= 1] token ids, got shape {tokens.shape}")
    return tokens, np.full(tokens.shape[0], tokens.shape[1], np.int32)


def generate(
    params: dict,
    cfg: ModelConfig,
    prompt,
    new_tokens: int,
    engine: str = "reference",
    knockout=frozenset(),
    max_len: int | None = None,
    cache_dtype=jnp.float32,
    return_logits: bool = False,
    progress: bool = False,
    engine_options: dict | None = None,
):
    """Greedy-decode ``new_tokens`` tokens for each user after its prompt.

    ``prompt``: a ``[B, T]`` array (every user its own prompt of T tokens) or a list of B per-user
    lists of token ids of different lengths. User b with a prompt of L_b tokens decodes its n-th new
    token (n >= 1) at position ``L_b + n - 1``: its tokens are those it would get decoded alone.
    Returns the new token ids ``np.ndarray [B, new_tokens]`` int32, and with ``return_logits`` also the
    logits that chose them, ``[B, new_tokens, V]`` float32. The cache holds ``max_len`` positions
    (default: the longest prompt plus new tokens, less one), every layer's slots rounded up to the
    engine's ``cache_multiple``. ``knockout`` applies to the decode steps only. ``engine_options`` go to
    the engine's ``make_step`` (the megakernel's: ``kv_tile``, ``detect_races``). An engine whose step has
    ``greedy`` picks the tokens itself (the megakernel: inside the kernel, no logits written) unless
    ``return_logits``.
    """
    knockout = check_knockout(knockout)
    tokens, lengths = prompt_batch(cfg, prompt)
    positive_int("new_tokens", new_tokens)
    B = tokens.shape[0]
    # positions written: the prompt, then every new token but the last
    need = int(lengths.max()) + new_tokens - 1
    max_len = need if max_len is None else max_len
    if cfg.full_layers and max_len < need:
        b = int(np.argmax(lengths))
        if lengths[b] > max_len:
            raise ValueError(
                f"prompt of {int(lengths[b])} tokens for user {b} is longer than the cache "
                f"({max_len} positions); make the cache with a larger max_len"
            )
        who = f" (user {b})" if len(set(lengths.tolist())) > 1 else ""
        raise ValueError(
            f"a prompt of {int(lengths[b])} tokens{who} plus {new_tokens} new tokens needs {need} "
            f"cache positions, the cache holds {max_len}"
        )
    step = get_step(engine, cfg, **(engine_options or {}))
    cache = init_cache(cfg, B, max_len, cache_dtype, multiple=cache_multiple(engine))
    logits, cache = prefill(params, cfg, tokens, cache, lengths)
    adopt = getattr(step, "adopt_cache", None)
    if adopt is not None:  # the engine's own cache layout, made once
        cache = adopt(cache)
    pos = jnp.asarray(lengths, jnp.int32)  # step n decodes at lengths + n - 1
    out, all_logits = [], []
    greedy = None if return_logits else getattr(step, "greedy", None)  # the engine picks the tokens itself
    for n in tqdm(range(new_tokens), desc=f"generate ({engine})", disable=not progress):
        if n and greedy is not None:
            tok, cache = greedy(params, cfg, cache, out[-1], pos, knockout)
            out.append(tok)
            pos = pos + 1
            continue
        if n:
            logits, cache = step(params, cfg, cache, out[-1], pos, knockout)
            pos = pos + 1
        out.append(jnp.argmax(logits, axis=-1).astype(jnp.int32))
        if return_logits:
            all_logits.append(logits)
    out = np.stack([np.asarray(t) for t in out], axis=1)
    if return_logits:
        return out, np.stack([np.asarray(x) for x in all_logits], axis=1)
    return out


# Speculative decoding ---------------------------------------------------------------------------------
DRAFTERS = ("ngram", "mtp")  # prompt lookup (mk.speculative.ngram_draft); Gemma 4's assistant (mk.assistant)


@dataclass(frozen=True)
class SpeculativeRun:
    """What :func:`generate_speculative` did: the tokens ``[B, new_tokens]``, and per user the verification rounds it
    took part in, the tokens drafted for it and the drafts accepted (each round emits its accepted drafts and the
    target's own next token)."""

    tokens: np.ndarray
    rounds: list[int]
    drafted: list[int]
    accepted: list[int]

    def to_dict(self) -> dict:
        return {"tokens": self.tokens.tolist(), "rounds": self.rounds, "drafted": self.drafted,
                "accepted": self.accepted}  # fmt: skip


def check_drafter(drafter, assistant):
    if callable(drafter):
        return drafter
    if drafter not in DRAFTERS:
        raise ValueError(f"unknown drafter {drafter!r}; drafters: {', '.join(DRAFTERS)}")
    if drafter == "mtp" and assistant is None:
        raise ValueError("drafter 'mtp' drafts with Gemma 4's assistant: pass its checkpoint (--assistant DIR)")
    if drafter == "ngram" and assistant is not None:
        raise ValueError("drafter 'ngram' (prompt lookup) needs no assistant; drop --assistant or use --speculate mtp")
    return drafter


def _speculation_cache_length(cfg: ModelConfig, lengths, new_tokens: int, k: int, max_len: int | None) -> int:
    """Cache positions a speculative run needs: the longest prompt, the new tokens, and the ``k`` drafts the last
    round may write past the last token (``max_len``, when given, must hold them where a full layer keeps them)."""
    need = int(lengths.max()) + new_tokens - 1 + k
    if max_len is None:
        return need
    if cfg.full_layers and max_len < need:
        raise ValueError(
            f"speculation with {k} drafts needs {need} cache positions (the longest prompt, {new_tokens} new tokens "
            f"and {k} drafts written ahead), the cache holds {max_len}"
        )
    return max_len


@dataclass
class _SpeculatingUsers:
    """Each user's tokens so far and where it stands: ``last`` its last token (its K/V not yet written, at ``pos``),
    ``hidden`` the target's last hidden state for it (what Gemma 4's assistant drafts from)."""

    out: list[list[int]]
    history: list[list[int]]
    pos: np.ndarray
    last: np.ndarray
    hidden: np.ndarray
    rounds: list[int]
    accepted: list[int]

    @classmethod
    def start(cls, tokens, lengths, first: np.ndarray, hidden) -> _SpeculatingUsers:
        B = len(first)
        out = [[int(t)] for t in first]
        history = [list(map(int, tokens[b, : lengths[b]])) + out[b] for b in range(B)]
        return cls(out, history, lengths.astype(np.int32), first, np.asarray(hidden), [0] * B, [0] * B)

    def accept(self, b: int, drafts, picks, hidden_rows, new_tokens: int) -> int:
        """User ``b`` takes the longest prefix of its drafts equal to the target's picks, then the pick after it (no
        more than its ``new_tokens``); how many tokens it emitted."""
        k = len(drafts)
        n = int(np.cumprod(drafts == picks[:k]).sum())
        emitted = ([int(t) for t in drafts[:n]] + [int(picks[n])])[: new_tokens - len(self.out[b])]
        self.out[b] += emitted
        self.history[b] += emitted
        self.rounds[b] += 1
        self.accepted[b] += min(n, len(emitted))
        self.pos[b] += n + 1
        self.last[b] = picks[n]
        self.hidden[b] = hidden_rows[n]
        return len(emitted)


def generate_speculative(
    params: dict,
    cfg: ModelConfig,
    prompt,
    new_tokens: int,
    drafter,
    draft_tokens: int,
    engine: str = "reference",
    assistant: tuple | None = None,
    max_len: int | None = None,
    cache_dtype=jnp.float32,
    progress: bool = False,
    engine_options: dict | None = None,
) -> SpeculativeRun:
    """Greedy decoding with speculation: the tokens of :func:`generate` exactly, in fewer target passes.

    Each round, every user's last token and ``draft_tokens`` drafts go through the engine's verification step (one
    weight pass for all 1 + k rows of every user); a user accepts the longest prefix of drafts equal to the target's
    greedy picks, then the target's pick after it, and moves on by that many positions (users in a batch move by
    their own counts). The K/V of rejected drafts stay in the cache, hidden by position until overwritten.
    ``drafter``: ``ngram`` (prompt lookup over the user's tokens so far; where it finds nothing the draft repeats the
    last token, which the verification simply rejects) or ``mtp`` (``assistant`` = (mk.assistant_config.AssistantConfig,
    its params): Gemma 4's assistant, reading the target's cache and last hidden state), or a function
    ``(tokens so far, k) -> up to k drafts`` of one user (as ``ngram_draft`` is).
    """
    check_drafter(drafter, assistant)
    positive_int("new_tokens", new_tokens)
    positive_int("draft_tokens", draft_tokens)
    if assistant is not None:
        check_pair(assistant[0], cfg)
    tokens, lengths = prompt_batch(cfg, prompt)
    B, K = tokens.shape[0], draft_tokens
    max_len = _speculation_cache_length(cfg, lengths, new_tokens, K, max_len)
    step = get_step(engine, cfg, **(engine_options or {}))
    verify = getattr(step, "verify", None)
    if verify is None:
        raise ValueError(f"engine {engine!r} has no speculative verification step; use the reference engine")
    cache = init_cache(cfg, B, max_len, cache_dtype, multiple=cache_multiple(engine), draft_tokens=K)
    logits, hidden, cache = prefill(params, cfg, tokens, cache, lengths, return_hidden=True)
    cache = getattr(step, "adopt_cache", lambda c: c)(cache)
    # the assistant reads the reference's cache layout and the target's float embedding
    reference_cache = getattr(step, "reference_cache", lambda c: c)
    embedding = float_params(params, cfg)["embed"]
    users = _SpeculatingUsers.start(tokens, lengths, np.array(jnp.argmax(logits, axis=-1), np.int32), hidden)
    bar = tqdm(total=B * new_tokens, initial=B, desc=f"speculate ({engine}, {drafter})", disable=not progress)
    while any(len(o) < new_tokens for o in users.out):
        if drafter != "mtp":
            propose = ngram_draft if drafter == "ngram" else drafter
            drafts = np.array([_padded(propose(h, K), K, h[-1]) for h in users.history], np.int32)
        else:
            a, ap = assistant
            drafts = np.asarray(draft(ap, a, cfg, embedding, reference_cache(cache), jnp.asarray(users.last),
                                      jnp.asarray(users.hidden), jnp.asarray(users.pos), K))  # fmt: skip
        rows = np.concatenate([users.last[:, None], drafts], axis=1)
        picks, hidden_rows, cache = verify(params, cfg, cache, jnp.asarray(rows), jnp.asarray(users.pos))
        picks, hidden_rows = np.asarray(picks), np.asarray(hidden_rows)
        users.hidden = np.array(hidden_rows[:, 0])
        for b in range(B):
            if len(users.out[b]) < new_tokens:  # a user done ran with the batch; its position stays
                bar.update(users.accept(b, drafts[b], picks[b], hidden_rows[b], new_tokens))
    bar.close()
    return SpeculativeRun(np.array(users.out, np.int32), users.rounds, [K * r for r in users.rounds], users.accepted)


def _padded(draft: list[int], k: int, filler: int) -> list[int]:
    return draft + [draft[-1] if draft else filler] * (k - len(draft))
