"""The score tables: where each sample's score lives, how the ranks share them, and the sharded layout."""
