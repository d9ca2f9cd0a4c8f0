"""Batch data model: the ``SiftingBatch`` interface and its implementations."""
