"""The acceptance rules against their definitions, on synthetic distributions."""

import math

import numpy as np
import pytest

from specli.speculate.verify import (
    SamplingParams,
    greedy_accept,
    probs_from_logits,
    sample,
    speculative_accept,
)


def chi2_critical(dof: int, z: float = 3.719) -> float:
    """Upper critical value of chi-square (Wilson-Hilferty); z=3.719 is a 1e-4 tail."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def chi2_stat(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    n = counts.sum()
    exp = probs * n
    big = exp >= 5
    c = np.append(counts[big], counts[~big].sum())
    e = np.append(exp[big], exp[~big].sum())
    keep = e > 0
    return float(((c[keep] - e[keep]) ** 2 / e[keep]).sum()), int(keep.sum() - 1)


def test_greedy_accept():
    assert greedy_accept([5, 6, 7], [5, 6, 7, 8]) == (3, 8)
    assert greedy_accept([5, 6, 7], [5, 9, 7, 8]) == (1, 9)
    assert greedy_accept([5], [4, 1]) == (0, 4)
    assert greedy_accept([], [3]) == (0, 3)


def _random_dist(rng, v, sharp=1.0):
    p = rng.dirichlet(np.full(v, sharp))
    return p


@pytest.mark.parametrize("point_mass", [False, True])
def test_rejection_rule_first_token_follows_target(point_mass):
    rng = np.random.default_rng(1)
    v = 8
    p = np.stack([_random_dist(rng, v), _random_dist(rng, v)])
    q = np.stack([_random_dist(rng, v)])
    n = 40000
    counts = np.zeros(v)
    accepted = 0
    for _ in range(n):
        if point_mass:
            x, qq = 3, None  # a deterministic drafter always proposes token 3
        else:
            x, qq = sample(q[0], rng), q
        k, tok = speculative_accept([x], p, qq, rng)
        accepted += k
        if k == 1:
            tok = x
        counts[tok] += 1
    stat, dof = chi2_stat(counts, p[0])
    assert stat < chi2_critical(dof), (stat, dof, counts / n, p[0])
    # acceptance rate is sum(min(p, q)) for a sampled draft, p(x) for a point mass
    expected = p[0, 3] if point_mass else np.minimum(p[0], q[0]).sum()
    assert abs(accepted / n - expected) < 4 * math.sqrt(expected * (1 - expected) / n)


def test_rejection_rule_two_token_block_joint_distribution():
    """The pair (first, second) emitted from a 2-token draft is distributed as target sampling."""
    rng = np.random.default_rng(2)
    v = 5
    p1 = _random_dist(rng, v)
    p2 = np.stack([_random_dist(rng, v) for _ in range(v)])  # p(second | first)
    q1 = _random_dist(rng, v)
    q2 = np.stack([_random_dist(rng, v) for _ in range(v)])
    n = 50000
    counts = np.zeros((v, v))
    for _ in range(n):
        x1 = sample(q1, rng)
        x2 = sample(q2[x1], rng)
        p3 = _random_dist(np.random.default_rng(0), v)  # bonus distribution, irrelevant here
        k, tok = speculative_accept([x1, x2], np.stack([p1, p2[x1], p3]), np.stack([q1, q2[x1]]), rng)
        if k == 0:
            first = tok
            second = sample(p2[first], rng)  # the loop goes on sampling from the target
        elif k == 1:
            first, second = x1, tok
        else:
            first, second = x1, x2
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
    for _ in range(20000):
        counts[sample(q, rng)] += 1  # "accept everything"
    stat, dof = chi2_stat(counts, p)
    assert stat > chi2_critical(dof)


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
