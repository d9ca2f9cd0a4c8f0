"""Home of the ``Loss`` interface (``smart_sifting.loss`` path)."""
