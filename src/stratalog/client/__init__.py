"""Stratalog's own client side: a wire client, Arrow batch reads and time-range replay."""
