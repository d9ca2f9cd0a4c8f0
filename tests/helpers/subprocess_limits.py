"""How long a test waits for a subprocess it runs (a tiny benchmark run, a torchrun job, a
script in a fresh interpreter) before it fails the test as hung.

Why one generous limit: the slowest of these runs takes well under a minute on this
project's idle 2-core machine, but CI runs two legs side by side, on other and slower CPUs,
under load, where a limit of 180 s was once exceeded by a run that takes 16 s here (the tiny
XLA suite, issue 39). A limit only keeps CI from waiting forever on a hang, which fails the
test either way; it is no performance check, so it is sized at more than 20 times the
slowest run measured here (41 s: the compiled language model's tiny run, in a full
reference-leg run of the tests), not near it. Tests that wait for a hang on purpose keep
limits of their own.
"""

LIMIT_S = 900
