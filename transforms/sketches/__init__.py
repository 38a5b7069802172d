"""Cross-publisher reach and frequency with Halo-style LiquidLegions sketches.

fingerprint     salted vectorised 64-bit fingerprints of virtual person ids (salt per campaign)
liquid_legions  the sketch: exponential register choice, count + unique-key registers, merge
estimators      reach from active registers, k-frequency and k+ reach (pure math)
dp              noise on the reach and frequency statistics (global and Polya-share distributed)
impressions     arrow batches of impression rows -> partial sketches per (campaign, publisher)
beam            Beam PTransforms and the sketch-union CombineFn
"""
from transforms.sketches.fingerprint import FingerprintSalt
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig

__all__ = ["FingerprintSalt", "LiquidLegionsSketch", "SketchConfig"]
