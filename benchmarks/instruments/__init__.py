"""How a run is timed and recorded: the clocks and the options that pick them, the backend and versions, the record files."""
