"""Home of the sifting configs (``smart_sifting.sift_config`` path)."""
