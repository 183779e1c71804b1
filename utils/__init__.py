"""The learners' library: what the labs teach and learners call. One job per module; each names the lab
that teaches it.

  config (settings from the environment), data, models, train, perf (FLOPs, peak, the one
  synchronised timer), cluster (ipyparallel engines with torch.distributed), px (its %%px), watchdog
  (ends a dead kernel's cluster; the cluster starts it), collectives (collectives, the ring, the
  alpha-beta model and its fit), ddp_timing (DDP's buckets and a DDP step's cost, predicted and
  measured), replicas (are the ranks' models equal; metrics over ranks), export (a notebook's job as a
  torchrun script), ddp (data parallelism from scratch), optim (LARS, LAMB, NovoGrad, warm-up),
  parallel_sgd (model averaging, local SGD), hogwild, parle, sweep (many runs on the engines),
  plotting (every shared figure; it only draws), outcomes (verdicts printed from a cell's numbers),
  moved (modules of an earlier release: importing one names its new home).

Two packages sit inside it: ``labs`` (one module per lab: its measurements, figures and verdicts) and
``checks`` (one module per lab: its exercises' checks, on the harness of ``checks/__init__.py``;
``checks.job`` runs and judges a learner's torchrun script for lab 06 and the assessment).

Elsewhere: ``tooling`` (learner edition and bundle, notebooks run headless), ``assessment`` (the graded
notebook and what it needs) and ``assessment.grader`` (the grader, never in the learner bundle).
MAINTAINING.md draws the whole layout.
"""

from utils import moved as _moved

_moved.install()


def __getattr__(name):
    return _moved.package_getattr(__name__, name)
