"""Convolution, pooling, interpolation and the channel norms (NCHW)."""

__all__: list[str] = []
