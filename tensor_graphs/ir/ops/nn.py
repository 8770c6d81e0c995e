"""Neural-network composites: norms, linear, embedding, attention, rotary embedding."""

__all__: list[str] = []
