"""The course library. One job per module; each names the lab that teaches it.

config (settings from the environment), data, models, train, perf (FLOPs and peak),
plotting, checks (exercise checks), release (learner edition), course (run notebooks),
cluster (ipyparallel engines with torch.distributed), watchdog, collectives, export (torchrun),
replicas (are the ranks' models equal; metrics over ranks), ddp (data parallelism from scratch),
equivalence (a data-parallel wrapper against one process on the whole batch), scaling (DDP's
buckets, predicted communication, throughput over workers), gpu_speed (WideResNet settings on a
GPU), optim (LARS, LAMB, NovoGrad, warm-up), sweep (many runs on the engines), batch_runs (lab 07's
short runs), batch_size (noise scale, critical batch, LR rules), landscape (sharpness, loss surfaces).
"""
