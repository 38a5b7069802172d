"""Local and shuffle differential privacy: frequencies, heavy hitters, shuffle sums and label DP.

Modules:

* :mod:`pipelines.ldp.frequencies` -- ``python -m pipelines.ldp.frequencies``: frequency-oracle estimates from client reports;
* :mod:`pipelines.ldp.heavy_hitters` -- ``python -m pipelines.ldp.heavy_hitters``: PEM heavy hitters from client reports;
* :mod:`pipelines.ldp.shuffle_sum` -- ``python -m pipelines.ldp.shuffle_sum``: split-and-mix summation of shuffled shares;
* :mod:`pipelines.ldp.label_dp` -- ``python -m pipelines.ldp.label_dp``: a label-randomized training export (randomized response);
* :mod:`pipelines.ldp.collection` -- what these jobs share: the trust model in the ledger, report-file checks;
* :mod:`pipelines.ldp.data` -- ``python -m pipelines.ldp.data``: the sample clients' report files.
"""
