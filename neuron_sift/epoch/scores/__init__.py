"""This rank's score and weight tensors (``tables.py``) and what it shares of them with the other ranks."""
