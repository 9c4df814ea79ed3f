"""Chi-square helpers shared by the tests that check sampled tokens against a distribution."""

import math

import numpy as np


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
