"""Masked LARk: browsers' secret-shared reports, the helpers, the combiner and the trainer.

Modules:

* :mod:`pipelines.masked_lark.share` -- ``python -m pipelines.masked_lark.share``: simulated browsers sharing their records;
* :mod:`pipelines.masked_lark.helper` -- ``python -m pipelines.masked_lark.helper``: one helper's masked aggregation;
* :mod:`pipelines.masked_lark.combine` -- ``python -m pipelines.masked_lark.combine``: the helpers' outputs combined;
* :mod:`pipelines.masked_lark.train` -- ``python -m pipelines.masked_lark.train``: a model trained on the combined gradients;
* :mod:`pipelines.masked_lark.config` -- the aggregation parameters file.
"""
