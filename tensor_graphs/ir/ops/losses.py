"""Loss composites following torch.nn.functional."""

__all__: list[str] = []
