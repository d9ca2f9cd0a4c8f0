"""Prints a pip constraints file that pins each direct dependency to its lowest admitted version.

The oldest leg installs ``pip install -e .[xla,test,bench] -c <(python scripts/lowest_bounds.py)``:
a lowest-direct resolution, so each lower bound that setup.py states is one that a leg installs
and tests (transitive dependencies stay free: pip picks the newest each pin admits).

setup.py is executed with ``setuptools.setup`` replaced by a function that keeps its keyword
arguments, so nothing is built and torch need not be installed. The requirements are parsed with
``packaging`` (pip's own copy when the standalone one is absent: a fresh virtual environment has
only pip).

Usage: python scripts/lowest_bounds.py [--setup PATH] [--extras xla,test,bench]
Exit status 2, with the requirement named, when a dependency has no lowest admitted version
(no lower bound, a ``>`` bound, a wildcard pin, or bounds that contradict each other).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import types
from collections.abc import Iterable

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # a bare virtual environment: pip vendors the same library
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[no-redef]
    from pip._vendor.packaging.version import Version  # type: ignore[no-redef]

DEFAULT_EXTRAS = ("xla", "test", "bench")
# Operators whose version is admitted and is the lowest the specifier admits.
_LOWER = {">=", "==", "~=", "==="}


class NoLowerBound(ValueError):
    """A requirement from which no lowest version can be read; the message names it."""


def setup_arguments(setup_path: str) -> dict:
    """The keyword arguments setup.py passes to setup(), from running it with setup() replaced.

    setup.py runs against a stand-in ``setuptools`` module (setup keeps its arguments; any other
    name is a no-op callable, e.g. Extension), never the real one: importing setuptools can fail
    (its distutils shim asserts under ``python -I``) and is not needed to read requirements.
    setup.py reads files relative to its own folder (the version, the README), so it runs there.
    """
    captured: list[dict] = []
    stand_in = types.ModuleType("setuptools")
    stand_in.setup = lambda **kwargs: captured.append(kwargs)  # type: ignore[attr-defined]
    stand_in.__getattr__ = lambda name: lambda *args, **kwargs: None  # type: ignore[attr-defined]
    setup_path = os.path.abspath(setup_path)
    saved_module, cwd = sys.modules.get("setuptools"), os.getcwd()
    sys.modules["setuptools"] = stand_in
    try:
        os.chdir(os.path.dirname(setup_path))
        runpy.run_path(setup_path, run_name="__main__")
    finally:
        os.chdir(cwd)
        if saved_module is None:
            del sys.modules["setuptools"]
        else:
            sys.modules["setuptools"] = saved_module
    if len(captured) != 1:
        raise RuntimeError(f"{setup_path} called setup() {len(captured)} times; expected once")
    return captured[0]


def requirements(args: dict, extras: Iterable[str]) -> list[str]:
    """install_requires and the named extras' requirements, in order; an unknown extra is an error."""
    declared = args.get("extras_require") or {}
    found = list(args.get("install_requires") or [])
    for extra in extras:
        if extra not in declared:
            raise KeyError(f"extra {extra!r} is not declared (declared: {', '.join(sorted(declared))})")
        found.extend(declared[extra])
    return found


def lowest_versions(lines: Iterable[str]) -> dict[str, tuple[str, str]]:
    """{canonical name: (name as first written, lowest admitted version)} over all requirements.

    A name required several times (numpy in the test and bench extras, torch in install_requires
    and the xla extra) gets the lowest version that every one of its requirements admits: the
    highest of their lower bounds, checked against all of them.
    """
    specs: dict[str, list[Requirement]] = {}
    for line in lines:
        req = Requirement(line)
        if req.marker is not None:
            raise NoLowerBound(f"{line!r}: a requirement with an environment marker is not supported")
        specs.setdefault(canonicalize_name(req.name), []).append(req)
    result = {}
    for key, reqs in specs.items():
        lowest: tuple[Version, str] | None = None
        for req in reqs:
            for spec in req.specifier:
                if spec.operator in _LOWER and spec.version.endswith(".*"):
                    raise NoLowerBound(f"{str(req)!r}: a wildcard pin has no single lowest version")
                if spec.operator == ">":
                    raise NoLowerBound(f"{str(req)!r}: '>' excludes its version; state the lowest with '>='")
                if spec.operator in _LOWER:
                    version = Version(spec.version)
                    if lowest is None or version > lowest[0]:
                        lowest = (version, spec.version)
        if lowest is None:
            raise NoLowerBound(
                f"{', '.join(repr(str(r)) for r in reqs)}: no lower bound, so no lowest version to install"
            )
        for req in reqs:
            if not req.specifier.contains(lowest[1], prereleases=True):
                raise NoLowerBound(f"{str(req)!r} does not admit {lowest[1]}, the lowest of {key}'s other bounds")
        result[key] = (reqs[0].name, lowest[1])
    return result


def constraints(setup_path: str, extras: Iterable[str] = DEFAULT_EXTRAS) -> str:
    """The constraints file's text: one ``name==version`` line per direct dependency."""
    extras = list(extras)
    pins = lowest_versions(requirements(setup_arguments(setup_path), extras))
    head = f"# Lowest versions admitted by {os.path.basename(setup_path)} (install_requires + {', '.join(extras)})"
    return "\n".join([head] + [f"{name}=={version}" for name, version in pins.values()]) + "\n"


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--setup", default=os.path.join(here, "setup.py"), help="setup.py to read (default: the repo's)"
    )
    parser.add_argument(
        "--extras", default=",".join(DEFAULT_EXTRAS), help="comma-separated extras (default: %(default)s)"
    )
    ns = parser.parse_args(argv)
    extras = [e for e in ns.extras.split(",") if e]
    try:
        text = constraints(ns.setup, extras)
    except (NoLowerBound, KeyError) as exc:
        print(f"lowest_bounds.py: {exc.args[0]}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
