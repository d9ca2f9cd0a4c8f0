"""Home of ``SiftingDataloader`` (``smart_sifting.dataloader`` path)."""
