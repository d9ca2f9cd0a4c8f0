"""One epoch as the loop sees it: opening it, iterating its batches, pairing losses, recording it."""
