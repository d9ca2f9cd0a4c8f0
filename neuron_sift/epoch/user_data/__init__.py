"""The user's own DataLoader, sampler and Streaming dataset, read and rebuilt around the plan."""
