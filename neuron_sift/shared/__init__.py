"""What both sifting modes stand on: checkpoint envelopes, the iterator-lifetime rule,
data-parallel collectives, the user's DataLoader behind its wrappers, counts and phase
timings, logger names and seeds, config validation. Nothing here knows either mode."""
