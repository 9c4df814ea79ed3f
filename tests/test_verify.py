"""The verify rule and the sampler against their definitions, on synthetic distributions."""

import math

import numpy as np
import pytest
from stathelp import chi2_critical, chi2_stat

from specli.speculate.verify import (
    Sampler,
    SamplingParams,
    accept,
    prefix_accept,
    probs_from_logits,
)


def test_prefix_accept():
    assert prefix_accept([5, 6, 7], [5, 6, 7, 8]) == (3, 8)
    assert prefix_accept([5, 6, 7], [5, 9, 7, 8]) == (1, 9)
    assert prefix_accept([5], [4, 1]) == (0, 4)
    assert prefix_accept([], [3]) == (0, 3)


def _random_dist(rng, v, sharp=1.0):
    p = rng.dirichlet(np.full(v, sharp))
    return p


def _logits(p):
    """Logits whose distribution at temperature 1 is ``p`` (a zero stays impossible)."""
    with np.errstate(divide="ignore"):
        return np.log(p)


T1 = SamplingParams(temperature=1.0)


def test_noise_is_a_function_of_seed_and_position():
    a, b = Sampler(SamplingParams(1.0, seed=7)), Sampler(SamplingParams(1.0, seed=7))
    np.testing.assert_array_equal(a.noise(12, 10), b.noise(12, 1000)[:10])  # a shorter vocabulary: its prefix
    np.testing.assert_array_equal(a.noise(12, 1000), b.noise(12, 1000))
    b.noise(13, 1000)  # another position read first changes nothing
    np.testing.assert_array_equal(a.noise(14, 50), b.noise(14, 50))
    assert not np.array_equal(a.noise(12, 50), a.noise(13, 50))
    assert not np.array_equal(a.noise(12, 50), Sampler(SamplingParams(1.0, seed=8)).noise(12, 50))
    # no seed: each answer draws its own; a negative seed is a seed like any other
    assert not np.array_equal(Sampler(T1).noise(0, 50), Sampler(T1).noise(0, 50))
    np.testing.assert_array_equal(Sampler(SamplingParams(1.0, seed=-3)).noise(5, 50),
                                  Sampler(SamplingParams(1.0, seed=-3)).noise(5, 50))


@pytest.mark.parametrize("top_k", [0, 3])
def test_the_choice_follows_the_distribution(top_k):
    """Across seeds, the token chosen at a position is distributed as p (chi-square), and top-k
    tokens outside the set are never chosen."""
    rng = np.random.default_rng(0)
    v = 8
    z = _logits(_random_dist(rng, v))
    params = SamplingParams(1.0, top_k)
    p = probs_from_logits(z, params)
    n = 40000
    counts = np.bincount([Sampler(SamplingParams(1.0, top_k, seed=s)).pick(z, 5) for s in range(n)], minlength=v)
    assert counts[p == 0].sum() == 0
    stat, dof = chi2_stat(counts, p)
    assert stat < chi2_critical(dof), (stat, dof, counts / n, p)


@pytest.mark.parametrize("point_mass", [False, True])
def test_first_token_follows_target(point_mass):
    """A draft of one token, drawn with the same noise from q (a model drafter) or always the
    same token (lookup): the kept token is distributed as p, and a drafted token is kept with
    probability p(x) for the fixed token, within the bounds of the Gumbel coupling for a
    noise-coupled draft: at least (1 - TV) / (1 + TV), at most sum(min(p, q)) = 1 - TV."""
    rng = np.random.default_rng(1)
    v = 8
    p = np.stack([_random_dist(rng, v), _random_dist(rng, v)])
    q = p[0] * np.exp(rng.normal(size=v) * 0.5)  # a draft model close to the target
    q /= q.sum()
    n = 40000
    counts = np.zeros(v)
    accepted = 0
    for seed in range(n):
        s = Sampler(SamplingParams(1.0, seed=seed))
        x = 3 if point_mass else s.choose(q, 100)
        k, tok = accept([x], _logits(p), s, 100)
        assert tok == s.pick(_logits(p[k]), 100 + k)
        accepted += k
        counts[x if k == 1 else tok] += 1
    stat, dof = chi2_stat(counts, p[0])
    assert stat < chi2_critical(dof), (stat, dof, counts / n, p[0])
    rate, sd = accepted / n, 4 * math.sqrt(0.25 / n)
    tv = 0.5 * np.abs(p[0] - q).sum()
    if point_mass:
        assert abs(rate - p[0, 3]) < sd
    else:
        assert (1 - tv) / (1 + tv) - sd < rate < 1 - tv + sd, (rate, tv)
        assert rate > p[0].max() + 0.05  # better than drafting q's argmax could ever be here


def test_two_token_block_joint_distribution():
    """The pair (first, second) emitted from a 2-token noise-coupled draft is distributed as
    target sampling, and is the pair plain sampling with the same seed gives."""
    rng = np.random.default_rng(2)
    v = 5
    p1 = _random_dist(rng, v)
    p2 = np.stack([_random_dist(rng, v) for _ in range(v)])  # p(second | first)
    q1 = _random_dist(rng, v)
    q2 = np.stack([_random_dist(rng, v) for _ in range(v)])
    p3 = _random_dist(np.random.default_rng(0), v)  # bonus distribution, irrelevant here
    n = 50000
    counts = np.zeros((v, v))
    for seed in range(n):
        s = Sampler(SamplingParams(1.0, seed=seed))
        x1 = s.choose(q1, 0)
        x2 = s.choose(q2[x1], 1)
        k, tok = accept([x1, x2], [_logits(p1), _logits(p2[x1]), _logits(p3)], s, 0)
        if k == 0:
            first = tok
            second = s.choose(p2[first], 1)  # the loop goes on sampling from the target
        elif k == 1:
            first, second = x1, tok
        else:
            first, second = x1, x2
        plain = s.choose(p1, 0)
        assert (first, second) == (plain, s.choose(p2[plain], 1))
        counts[first, second] += 1
    joint = p1[:, None] * p2
    stat, dof = chi2_stat(counts.ravel(), joint.ravel())
    assert stat < chi2_critical(dof), (stat, dof)


def test_broken_rule_is_detected():
    """The chi-square check has teeth: keeping the draft token always is caught."""
    rng = np.random.default_rng(3)
    v = 8
    p = _random_dist(rng, v)
    q = _random_dist(rng, v)
    counts = np.zeros(v)
    for seed in range(20000):
        counts[Sampler(SamplingParams(1.0, seed=seed)).choose(q, 0)] += 1  # "accept everything"
    stat, dof = chi2_stat(counts, p)
    assert stat > chi2_critical(dof)


def test_greedy_ignores_the_noise():
    z = np.array([0.1, 2.0, 1.9, -1.0])
    assert {Sampler(SamplingParams(0.0, seed=s)).pick(z, s) for s in range(50)} == {1}


def test_probs_from_logits_temperature_topk_topp():
    rng = np.random.default_rng(0)
    z = rng.normal(size=50) * 3
    p = probs_from_logits(z, SamplingParams(temperature=0.7))
    ref = np.exp(z / 0.7 - (z / 0.7).max())
    np.testing.assert_allclose(p, ref / ref.sum(), rtol=1e-12)

    p = probs_from_logits(z, SamplingParams(temperature=1.0, top_k=5))
    top5 = np.argsort(-z)[:5]
    assert set(np.nonzero(p)[0]) == set(top5)
    np.testing.assert_allclose(p[top5], np.exp(z[top5]) / np.exp(z[top5]).sum(), rtol=1e-12)

    for top_p in (0.1, 0.5, 0.9, 0.999):
        p = probs_from_logits(z, SamplingParams(temperature=1.0, top_p=top_p))
        full = np.exp(z - z.max())
        full /= full.sum()
        order = np.argsort(-full)
        n = int(np.searchsorted(np.cumsum(full[order]), top_p)) + 1
        kept = order[:n]
        assert set(np.nonzero(p)[0]) == set(kept)
        np.testing.assert_allclose(p[kept], full[kept] / full[kept].sum(), rtol=1e-12)


def test_top_p_on_a_large_flat_vocabulary_falls_back_to_a_full_sort():
    z = np.zeros(5000)
    z[:3] = 0.5  # nucleus 0.9 needs most of the 5000 tokens, beyond the first 1024 candidates
    p = probs_from_logits(z, SamplingParams(temperature=1.0, top_p=0.9))
    assert 4000 < np.count_nonzero(p) < 5000
    assert abs(p.sum() - 1) < 1e-12


def test_top_k_then_top_p_within_the_k_set():
    z = np.array([3.0, 2.0, 1.0, 0.0, -1.0])
    p = probs_from_logits(z, SamplingParams(temperature=1.0, top_k=3, top_p=0.7))
    e = np.exp(z[:3] - 3)
    e /= e.sum()  # [0.665, 0.245, 0.090]: 0.7 needs the first two
    assert np.count_nonzero(p) == 2
    np.testing.assert_allclose(p[:2], e[:2] / e[:2].sum())
