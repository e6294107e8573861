"""Speculative decoding's drafters: what a step proposes for the target to verify.

``ngram_draft`` is prompt lookup, which needs no model: the tokens that followed the latest earlier occurrence of
the context's last few tokens. Repetitive text (code, quotes of the prompt, lists) is where it proposes anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from .units import positive_int


def ngram_draft(history: Sequence[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to ``k`` proposed next tokens for a user whose tokens so far are ``history``: for the longest n from
    ``max_ngram`` down to ``min_ngram`` whose last n tokens occur earlier in ``history``, the tokens that followed
    their latest earlier occurrence (fewer than ``k`` where that occurrence is near the end); none when no n-gram
    recurs."""
    positive_int("k", k)
    positive_int("min_ngram", min_ngram)
    if max_ngram < min_ngram:
        raise ValueError(f"max_ngram ({max_ngram}) must be at least min_ngram ({min_ngram})")
    h = list(history)
    for n in range(min(max_ngram, len(h) - 1), min_ngram - 1, -1):
        tail = h[-n:]
        for start in range(len(h) - n - 1, -1, -1):  # latest first, never the suffix itself
            if h[start : start + n] == tail:
                return h[start + n : start + n + k]
    return []


def emitted_per_round(accept_rate: float, k: int) -> float:
    """The mean tokens a round emits per user when each of its ``k`` drafts is accepted with probability
    ``accept_rate``, given the ones before it were (drafts accepted while they match, then the target's own
    token): 1 + a + a^2 + ... + a^k."""
    if not 0 <= accept_rate <= 1:
        raise ValueError(f"accept_rate={accept_rate}: a probability, 0 to 1")
    positive_int("k", k)
    return sum(accept_rate**i for i in range(k + 1))
