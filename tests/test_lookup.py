from specli.speculate.drafters import LookupDrafter
from specli.speculate.lookup import NgramIndex, Substitutions
from specli.speculate.source import AMBIGUOUS, RESYNC, Source, lookup_key


def lookup_draft(tokens, max_draft, n_min=1, n_max=4):
    """An index over one context, asked once."""
    idx = NgramIndex(n_min, n_max)
    idx.extend(tokens)
    return idx.find(max_draft)


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


def test_a_long_match_copies_the_occurrence_that_agrees_furthest_back():
    idx = NgramIndex(1, 3)
    #          0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
    idx.extend([7, 8, 1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 8, 1, 2, 3])
    # (1, 2, 3) ends at 5 (after 7, 8, as the context's does) and at 10 (after 9): followed
    # back, the earlier one agrees for 5 tokens, the latest for 3
    assert idx.find(2, extend_to=10) == ([4, 9], 5) and idx.last_source == 5
    # not followed back, they are equals and the latest wins; so it does for a shorter match
    assert idx.find(2) == ([5, 7], 3) and idx.last_source == 10
    assert idx.find(2, extend_to=10, tail=[6, 2, 3]) == ([5, 7], 2)
    idx.extend([6, 7, 8, 1, 2, 3])  # now a third occurrence agrees as far back as the first: the latest of the two
    assert idx.find(2, extend_to=10) == ([6, 7], 5) and idx.last_source == 16
    idx.truncate(6)
    assert idx.occurrences == {(7, 8, 1): [3], (8, 1, 2): [4], (1, 2, 3): [5]}


def test_an_ngram_continued_two_ways_is_ambiguous():
    idx = NgramIndex(1, 3)
    idx.extend([1, 2, 3, 9, 1, 2, 4, 9, 1, 2])
    # (1, 2) went on with 3, then 4: a guess; (2, 3) only ever with 9
    assert (1, 2) in idx.ambiguous and (2,) in idx.ambiguous and (2, 3) not in idx.ambiguous
    assert idx.find(4) == ([4, 9, 1, 2], 3) and not idx.last_ambiguous  # (9, 1, 2): one way so far
    idx.extend([5])
    idx.extend([9, 1, 2])
    assert (9, 1, 2) in idx.ambiguous
    assert idx.find(4) == ([5, 9, 1, 2], 3) and idx.last_ambiguous
    assert idx.find(4, tail=[7, 2, 3]) == ([9, 1, 2, 4], 2) and not idx.last_ambiguous
    idx.truncate(4)
    assert idx.ambiguous == set()


def test_lookup_drafts_from_an_ambiguous_match_under_their_own_key():
    prompt = [1, 2, 3, 4, 5, 1, 2, 6, 7]
    d = LookupDrafter(n_max=4).propose(prompt + [1, 2], 3)
    assert d.tokens == [6, 7, 1] and d.source == lookup_key(2, ambiguous=True) == Source("lookup", AMBIGUOUS)
    # the longest match decides: (1, 2) is ambiguous, (1, 2, 3, 4) is not
    d = LookupDrafter(n_max=4).propose(prompt + [1, 2, 3, 4], 3)
    assert d.tokens == [5, 1, 2] and d.source == lookup_key(4) == Source("lookup", 4)
    d = LookupDrafter(n_max=4).propose(prompt + [8, 3, 4], 3)
    assert d.tokens == [5, 1, 2] and d.source == Source("lookup", 2)


def test_a_copy_is_picked_up_again_past_an_edit():
    src = list(range(100, 140))
    prompt = [1, 2] + src + [3]
    d = LookupDrafter()
    # the answer copies 12 tokens, then inserts a word of its own (7), then goes on copying
    answer = src[:12] + [7]
    assert d.propose(prompt + src[:12], 4).tokens == src[12:16]  # the copy, before the edit
    assert d.propose(prompt + answer, 4).tokens == []  # the edit: nothing matches
    d2 = d.propose(prompt + answer + [src[12]], 4)  # back in the source: one token is enough
    assert d2.tokens == src[13:17] and d2.source == Source("lookup", RESYNC) and d2.confidence[0] == 12
    assert str(d2.source) == "lookup:resync" and str(lookup_key(5, ambiguous=True)) == "lookup:ambiguous"
    # a replaced word, then the copy: picked up past it
    d3 = d.propose(prompt + answer + src[12:20] + [8, src[21]], 4)
    assert d3.tokens == src[22:26] and d3.source.bucket == RESYNC
    # a dropped stretch of the source (up to RESYNC_WINDOW tokens) is skipped too
    d4 = d.propose(prompt + answer + src[12:20] + [8, src[21]] + src[22:26] + [src[29]], 4)
    assert d4.tokens == src[30:34] and d4.source.bucket == RESYNC
    # but a copy that had held for fewer than RESYNC_HELD tokens is not picked up again
    short = LookupDrafter()
    short.propose(prompt + src[:2], 4)
    short.propose(prompt + src[:2] + [7], 4)
    assert short.propose(prompt + src[:2] + [7, src[2]], 4).tokens == []
    # nor a token further on than RESYNC_WINDOW
    far = LookupDrafter()
    far.propose(prompt + src[:12], 4)
    far.propose(prompt + src[:12] + [7], 4)
    assert far.propose(prompt + src[:12] + [7, src[12 + LookupDrafter.RESYNC_WINDOW]], 4).tokens == []


def _copy_with(answer, prompt, drafter):
    """Feed the answer one token at a time; the drafter's proposal before each token."""
    props = []
    for i in range(len(answer)):
        props.append(drafter.propose(prompt + answer[:i], 6).tokens)
    return props


def test_a_rename_seen_twice_is_applied_to_later_copies():
    X, Y = 7, 8
    src = [10, 11, X, 12, 13, 14, 15, 16, X, 17, 18, 19, 20, 21, X, 22, 23, 24, 25, 26, X, 27, 28]
    prompt = [1, 2] + src + [3]
    answer = [Y if t == X else t for t in src]
    d = LookupDrafter()
    props = _copy_with(answer, prompt, d)
    # the third and fourth X are proposed as Y (two confirmed substitutions before them)
    i3 = [i for i, t in enumerate(src) if t == X][2]
    i4 = [i for i, t in enumerate(src) if t == X][3]
    assert Y in props[i3 - 2] and X not in props[i3 - 2]
    assert props[i4][0] == Y
    assert d.subs.map == {X: Y}
    # past a substituted token the copy goes on (looked up as the source said it)
    assert props[i3 + 1][:3] == src[i3 + 1:i3 + 4]
    # without substitutions the same copy proposes X every time
    plain = _copy_with(answer, prompt, LookupDrafter(substitute=False))
    assert X in plain[i3 - 2] and Y not in plain[i3 - 2]


def test_a_one_off_change_is_not_applied_and_a_wrong_one_is_dropped():
    X, Y = 7, 8
    src = [10, 11, X, 12, 13, 14, 15, 16, X, 17, 18, 19, 20, 21, X, 22, 23]
    answer = list(src)
    answer[2] = Y  # changed once only
    prompt = [1, 2] + src + [3]
    d = LookupDrafter()
    props = _copy_with(answer, prompt, d)
    xs = [i for i, t in enumerate(src) if t == X]
    assert d.subs.map == {} and d.subs.seen == {(X, Y): 1}
    assert [props[i][0] for i in xs[1:]] == [X, X]
    # a learned substitution that the answer stops making is forgotten at its first failure
    s = Substitutions()
    s.map[X] = Y
    ctx = [5, 6]
    assert s.apply(len(ctx), [X, 12]) == [Y, 12]
    s.learn(ctx + [X, 12])
    assert s.map == {}
