"""Secure, reproducible, vectorised noise (pure numpy; no Beam).

See :mod:`transforms.noise.streams` for how randomness is derived from a per-release key and
:mod:`transforms.noise.samplers` for the exact samplers.
"""
from transforms.noise.mechanisms import add_noise, sample_units
from transforms.noise.samplers import discrete_gaussian, discrete_laplace
from transforms.noise.streams import RandomStreams, encode_key, encode_keys

__all__ = ["RandomStreams", "add_noise", "sample_units", "discrete_gaussian",
           "discrete_laplace", "encode_key", "encode_keys"]
