"""Secure, reproducible, vectorised noise (pure numpy; no Beam).

encoding    canonical bytes of output keys (Python values and Arrow columns alike)
prf         the keyed PRF: length-prefixed AES-256 CBC-MAC over encoded keys
streams     one keyed random stream per output key (AES counter mode from the PRF's seeds)
samplers    exact integer samplers (discrete Laplace, discrete Gaussian) over the streams
mechanisms  adding the noise a NoiseSpec describes to arrays of answers
"""
from transforms.noise.encoding import encode_key, encode_keys
from transforms.noise.mechanisms import add_noise, sample_units
from transforms.noise.samplers import discrete_gaussian, discrete_laplace
from transforms.noise.streams import RandomStreams

__all__ = ["RandomStreams", "add_noise", "sample_units", "discrete_gaussian",
           "discrete_laplace", "encode_key", "encode_keys"]
