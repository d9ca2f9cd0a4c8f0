"""The entry scripts' first import of the checkout: ``import _bootstrap``.

Run as a file (``python benchmarks/suite.py``, from any folder), a script has ``benchmarks/``
on the path, not the checkout, so ``import benchmarks`` would fail: this module, found there
as ``_bootstrap``, imports the package ``benchmarks`` with the checkout's root on the path
only while it does. Left there, a folder of the checkout would shadow an installed package
of its name (a ``kernels/`` folder shadowed Hugging Face's ``kernels``, which transformers
imports).

Imported as a module of the package (``python -m benchmarks.suite``, the tests),
``benchmarks`` is imported already and this does nothing: ``benchmarks/__init__.py`` hands
this module on under the name the scripts import.
"""

import importlib
import sys
from pathlib import Path

if "benchmarks" not in sys.modules:
    _CHECKOUT = str(Path(__file__).resolve().parents[1])
    sys.path.insert(0, _CHECKOUT)
    try:
        importlib.import_module("benchmarks")
    finally:
        sys.path.remove(_CHECKOUT)
