"""neuron_sift's benchmarks (not installed): the entry scripts here, what they are made of in the sub-packages."""
