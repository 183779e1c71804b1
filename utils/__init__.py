"""The course library. One job per module; each names the lab that teaches it.

The learners' library (what the labs teach and learners call):
  config (settings from the environment), data, models, train, perf (FLOPs, peak, the one
  synchronised timer), cluster (ipyparallel engines with torch.distributed) and px (its %%px),
  collectives (collectives, the ring, the alpha-beta model and its fit), replicas (are the ranks'
  models equal; metrics over ranks), export (a notebook's job as a torchrun script), ddp (data
  parallelism from scratch), optim (LARS, LAMB, NovoGrad, warm-up), parallel_sgd (model averaging,
  local SGD), hogwild, parle.

Measurements and figures of one lab:
  single_gpu (lab 02), collectives_report (lab 03's tables and figures), ddp_costs (lab 04: a DDP
  step against its prediction), equivalence (lab 05: a wrapper against one process on the whole
  batch), scaling (lab 06: buckets, predicted communication, throughput over workers), loaders (lab 06:
  what reading batches costs), gpu_speed (lab 06: WideResNet settings on a GPU), sweep (lab 07: many runs on the engines), batch_runs
  (lab 07's short runs), batch_size (lab 07: noise scale, critical batch, LR rules), landscape
  (lab 07: sharpness, loss surfaces), plotting (every figure; it only draws), outcomes (verdicts
  printed from a cell's numbers), checks (each lab's exercise checks).

Course tooling (run by make, the tests and the grader, not by the labs' cells):
  release (learner edition, bundle, workspace), course (run notebooks headless, the course map),
  watchdog (ends a dead kernel's cluster).

The graded assessment lives in ``assessment/``.
"""
