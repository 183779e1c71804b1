"""A learner's torchrun script, run and judged: the one interface lab 06's check (``utils.checks.lab06``)
and the assessment (``assessment.job``, and through it the grader) use.

``JobCheck`` (in ``check``) runs the script under ``probe`` on a tiny problem with a time limit and
judges what each rank did; ``REPLAYED_OPTIMIZER`` names the optimizer the replay rebuilds. ``probe`` is
what torchrun runs (``-m utils.checks.job.probe SCRIPT ...``): it records each rank's calls, prints and
checkpoints. It patches torch, so importing this package imports neither module; the names below are
looked up on first use.
"""
_FROM_CHECK = ("JobCheck", "REPLAYED_OPTIMIZER", "LOG_LINE", "TIME_LIMIT_S", "WEIGHT_TOLERANCE")


def __getattr__(name):
    if name in _FROM_CHECK:
        from . import check
        return getattr(check, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
