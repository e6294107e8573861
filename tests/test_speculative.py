"""Speculative decoding's drafters."""

import pytest

from mk.speculative import ngram_draft


def test_ngram_draft_proposes_what_followed_the_latest_match_of_the_longest_suffix():
    # "7 8" recurs twice; the latest earlier occurrence (at 5) is followed by 9, 4, 7
    history = [1, 7, 8, 2, 3, 7, 8, 9, 4, 7, 8]
    assert ngram_draft(history, 3, max_ngram=2) == [9, 4, 7]
    # the trigram "4 7 8" never recurs, so the bigram decides
    assert ngram_draft(history, 3, max_ngram=3) == [9, 4, 7]
    # a longer match wins over a later shorter one: "2 3 7" is followed by 8
    assert ngram_draft([2, 3, 7, 8, 5, 3, 7, 1, 2, 3, 7], 1, max_ngram=3) == [8]


def test_ngram_draft_is_short_near_the_end_and_empty_without_a_match():
    assert ngram_draft([5, 6, 5], 4) == [6, 5]  # "5" at 0 is followed by what is left
    assert ngram_draft([1, 2, 3, 4], 2) == []
    assert ngram_draft([9], 2) == []
    assert ngram_draft([3, 3, 3], 2, min_ngram=2) == [3]


def test_ngram_draft_refuses_bad_sizes():
    with pytest.raises(ValueError, match="k"):
        ngram_draft([1, 2], 0)
    with pytest.raises(ValueError, match="max_ngram"):
        ngram_draft([1, 2], 2, max_ngram=1, min_ngram=2)
