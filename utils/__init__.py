"""The course library. One job per module; each names the lab that teaches it.

config (settings from the environment), data, models, train, perf (FLOPs and peak),
plotting, outcomes (verdicts printed from a cell's numbers), checks (exercise checks), release
(learner edition), course (run notebooks), single_gpu (lab 02's GPU measurements), cluster
(ipyparallel engines with torch.distributed), watchdog, collectives, collectives_report (lab 03's
figures and tables), export (torchrun), ddp_costs (a DDP step measured against its prediction),
replicas (are the ranks' models equal; metrics over ranks), ddp (data parallelism from scratch),
equivalence (a data-parallel wrapper against one process on the whole batch), scaling (DDP's
buckets, predicted communication, throughput over workers), gpu_speed (WideResNet settings on a
GPU), optim (LARS, LAMB, NovoGrad, warm-up), sweep (many runs on the engines), batch_runs (lab 07's
short runs), batch_size (noise scale, critical batch, LR rules), landscape (sharpness, loss surfaces),
parallel_sgd (model averaging, local SGD), hogwild, parle. The graded assessment lives in
``assessment/``.
"""
