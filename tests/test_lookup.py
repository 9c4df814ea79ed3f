from specli.lookup import NgramIndex, lookup_draft


def test_longest_match_first_and_latest_occurrence():
    #        0  1  2  3  4  5  6  7  8  9 10 11
    toks = [1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3]
    # suffix (1,2,3) matched at 0..2 -> continues 4, 9, 2...; shorter (2,3) occurs later at 5..6 but
    # the longer match wins
    assert lookup_draft(toks, 3, n_min=1, n_max=3) == ([4, 9, 2], 3)
    # with n_max=2, the latest (2,3) is at 5..6 -> continues 5, 6, 1
    assert lookup_draft(toks, 3, n_min=1, n_max=2) == ([5, 6, 1], 2)


def test_no_match_and_own_suffix_never_matches():
    assert lookup_draft([1, 2, 3, 4], 4) == ([], 0)
    assert lookup_draft([7], 4) == ([], 0)
    # repeated token: the latest earlier occurrence with a continuation
    assert lookup_draft([5, 5, 5], 4, n_min=1, n_max=1) == ([5], 1)


def test_draft_is_capped_and_index_is_incremental():
    idx = NgramIndex(1, 3)
    idx.extend([1, 2, 3, 4, 5, 6])
    idx.extend([1, 2])
    assert idx.find(2) == ([3, 4], 2)
    idx.extend([3])
    assert idx.find(10) == ([4, 5, 6, 1, 2, 3], 3)
    # followed back: [1, 2, 3] matched 3 tokens (n_max), and the token before it too
    idx.extend([4])
    assert idx.find(1) == ([5], 3) and idx.find(1, extend_to=10) == ([5], 4)
    idx.truncate(3)
    assert idx.tokens == [1, 2, 3] and idx.find(4) == ([], 0)
