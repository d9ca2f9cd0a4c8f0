"""Which samples each epoch trains, on which rank and in what order (both planners), and every count that follows."""
