"""Quality of an estimated top-k against the true top-k: F1, NCR and NDCG (seed 002; Wang, Li &
Jha, "Locally Differentially Private Heavy Hitter Identification", TDSC 2019).

Only for evaluation where the truth is known (simulation, benchmarks): the true counts are raw
data and must never shape a released file.

* True top-k: the k most frequent values, ties broken by the smaller value. The value at true
  rank i (1-based) has relevance rel = k - i + 1; values outside the true top-k have 0.
* F1 = 2|T ∩ R| / (|T| + |R|) for the true set T and the reported set R. (The seed prints the
  denominator as 2|T ∩ R| + |R - T ∩ R|, which leaves out the true heavy hitters that were
  missed; with |T| = |R| = k this is the usual F1, precision = recall = |T ∩ R| / k.)
* NCR = sum of rel over reported values / sum of rel over the true top-k (= k(k+1)/2).
* NDCG = DCG / IDCG with DCG = sum_i rel(reported value at rank i) / log2(i + 1) and IDCG the
  DCG of the true ranking.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def true_top_k(counts: np.ndarray, k: int, values: np.ndarray = None) -> np.ndarray:
    """The k most frequent values (ties: smaller value first), most frequent first."""
    counts = np.asarray(counts)
    values = np.arange(counts.size) if values is None else np.asarray(values)
    order = np.lexsort((values, -counts))
    return values[order[:k]]


def relevance(truth: np.ndarray, k: int) -> dict:
    return {int(v): k - i for i, v in enumerate(truth[:k])}


@dataclass(frozen=True, kw_only=True)
class TopKScores:
    f1: float
    ncr: float
    ndcg: float

    def as_dict(self) -> dict:
        return {"f1": self.f1, "ncr": self.ncr, "ndcg": self.ndcg}


def score_top_k(reported, truth, k: int) -> TopKScores:
    """F1, NCR and NDCG of the ranked ``reported`` values against the ranked ``truth``."""
    reported = [int(v) for v in list(reported)[:k]]
    truth = np.asarray(truth)[:k]
    if k < 1:
        raise ValueError("k must be positive")
    rel = relevance(truth, k)
    hits = len(set(reported) & set(rel))
    f1 = 2.0 * hits / (len(rel) + len(reported)) if (rel or reported) else 1.0
    ideal = np.array([k - i for i in range(len(rel))], dtype=np.float64)
    ncr = sum(rel.get(v, 0) for v in reported) / ideal.sum() if ideal.size else 1.0
    discounts = 1.0 / np.log2(np.arange(2, k + 2))
    dcg = sum(rel.get(v, 0) * discounts[i] for i, v in enumerate(reported))
    idcg = float((ideal * discounts[:ideal.size]).sum())
    return TopKScores(f1=float(f1), ncr=float(ncr), ndcg=float(dcg / idcg) if idcg else 1.0)
