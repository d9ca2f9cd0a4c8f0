"""neuron_sift's benchmarks (not installed): the entry scripts here, what they are made of in the sub-packages."""

import sys

from benchmarks import _bootstrap

# The entry scripts' ``import _bootstrap`` (see there), when they are imported as modules of this package.
sys.modules.setdefault("_bootstrap", _bootstrap)
