"""Which samples each epoch trains, on which rank and in what order, and every count that follows."""
