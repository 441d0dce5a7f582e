"""Expected failures of the conformance suites, with their reasons.

Every entry is a known gap: a device-layer bug to fix, or a documented and
justified difference from CPU. The goal is no entries. Keys name the test's
subject and check; values read "<category>: <reason>".
"""

# (OpInfo name[.variant], check or "*") -> reason. Checks: forward,
# noncontiguous, grad, out, inplace.
OPS: dict[tuple[str, str], str] = {}

# test id in test_models.py -> reason.
MODELS: dict[str, str] = {}
