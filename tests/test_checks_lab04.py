"""The checks of lab 04 (DDP): right answers pass, typical wrong ones fail with a message naming the fix.

One 3-engine cluster serves the whole module (a start costs seconds): on 2 ranks every other rank is
both the first and the last, and mistakes such as comparing only those two copies cannot show. The solutions below run on the
engines: ``@interactive`` makes ipyparallel send them by value, and their global names (torch, dist,
device, rank) are looked up in the engines' namespace, as for functions defined in a notebook.
"""
from __future__ import annotations

import re

import nbformat
import pytest
from ipyparallel import interactive

from check_helpers import fails
from notebook_runner import ROOT
from utils import cluster
from tooling import release
from utils.checks import Incorrect, NotSolved, lab04

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def workers():
    started = cluster.start(3, backend="gloo", activate=False)
    yield started
    cluster.stop()


@interactive
def stub(*args, **kwargs):
    raise NotImplementedError("Hint: x")


def test_stubs_are_not_solved(workers):
    for check, functions in ((lab04.check_shard, (stub,)), (lab04.check_replicas_equal, (stub,)),
                             (lab04.check_global_mean, (stub,)), (lab04.check_checkpoint, (stub, stub))):
        with pytest.raises(NotSolved) as info:
            check(workers, *functions)
        assert "not solved yet" in str(info.value) and "Hint: x" in str(info.value)


# --- 4.1 shard_indices -----------------------------------------------------------------------

@interactive
def shard_indices(n, rank, world_size, epoch, seed=0, drop_last=False):
    import math

    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    if drop_last:
        total = (n // world_size) * world_size
        order = order[:total]
    else:
        total = math.ceil(n / world_size) * world_size
        order = (order * math.ceil(total / n))[:total]
    return order[rank:total:world_size]


def _sampler_like(epoch_in_seed=True, honour_drop_last=True):
    # @interactive functions see the engines' globals, not this module's, and take no closure:
    # each variant is self-contained, its settings passed as defaults
    @interactive
    def shard(n, rank, world_size, epoch, seed=0, drop_last=False, epoch_in_seed=epoch_in_seed,
              honour_drop_last=honour_drop_last):
        import math

        g = torch.Generator().manual_seed(seed + (epoch if epoch_in_seed else 0))
        order = torch.randperm(n, generator=g).tolist()
        if drop_last and honour_drop_last:
            total = (n // world_size) * world_size
            order = order[:total]
        else:
            total = math.ceil(n / world_size) * world_size
            order = (order * math.ceil(total / n))[:total]
        return order[rank:total:world_size]
    return shard


shard_no_epoch = _sampler_like(epoch_in_seed=False)


@interactive
def shard_no_padding(n, rank, world_size, epoch, seed=0, drop_last=False):
    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    if drop_last:
        order = order[:(n // world_size) * world_size]
    return order[rank::world_size]


@interactive
def shard_blocks(n, rank, world_size, epoch, seed=0, drop_last=False):
    import math

    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(n, generator=g).tolist()
    per_rank = n // world_size if drop_last else math.ceil(n / world_size)
    order = (order * (per_rank * world_size // n + 1))[:per_rank * world_size]
    return order[rank * per_rank:(rank + 1) * per_rank]


@interactive
def shard_unshuffled(n, rank, world_size, epoch, seed=0, drop_last=False):
    import math

    total = (n // world_size if drop_last else math.ceil(n / world_size)) * world_size
    return (list(range(n)) * (total // n + 1))[:total][rank:total:world_size]


shard_ignores_drop_last = _sampler_like(honour_drop_last=False)


@interactive
def shard_with_the_sampler(n, rank, world_size, epoch, seed=0, drop_last=False):
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


@interactive
def shard_global_generator(n, rank, world_size, epoch, seed=0, drop_last=False):
    import math

    torch.manual_seed(seed + epoch)             # the right permutation, but it reseeds the whole program
    order = torch.randperm(n).tolist()
    total = (n // world_size if drop_last else math.ceil(n / world_size)) * world_size
    order = (order * math.ceil(total / n))[:total]
    return order[rank:total:world_size]


def test_shard_right(workers, capsys):
    lab04.check_shard(workers, shard_indices)
    assert "\u2713 Exercise 4.1 (shard_indices): passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, fix", [
    (shard_no_epoch, "seed + epoch"),
    (shard_no_padding, "pads the permutation"),
    (shard_blocks, "deals the indices out like cards"),
    (shard_unshuffled, "shuffle them first"),
    (shard_ignores_drop_last, "drop_last=True cut the permutation"),
    (shard_with_the_sampler, "used DistributedSampler itself"),
    (shard_global_generator, "changed torch's global random generator"),
])
def test_shard_wrong(workers, wrong, fix):
    message = fails(lambda f: lab04.check_shard(workers, f), wrong, Incorrect)
    assert message.startswith("Exercise 4.1 (shard_indices): on rank ")
    assert fix in message


# --- 4.2 replicas_equal ----------------------------------------------------------------------

@interactive
def replicas_equal(model):
    for tensor in list(model.parameters()) + list(model.buffers()):
        copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, tensor.detach().contiguous())
        if not all(torch.equal(copy, tensor) for copy in copies):
            return False
    return True


@interactive
def replicas_equal_one_gather(model):
    # a different right answer: compare with rank 0's broadcast copy, then agree with an all_reduce
    same = torch.ones(1)
    for tensor in model.state_dict().values():
        theirs = tensor.detach().clone()
        dist.broadcast(theirs, src=0)
        if not torch.equal(theirs, tensor):
            same.zero_()
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    return bool(same.item())


@interactive
def replicas_first_parameter_only(model):
    tensor = next(model.parameters())
    copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, tensor.detach())
    return all(torch.equal(copy, tensor) for copy in copies)


@interactive
def replicas_parameters_only(model):
    ok = True
    for tensor in model.parameters():
        copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, tensor.detach())
        ok = ok and all(torch.equal(copy, tensor) for copy in copies)
    return ok


@interactive
def replicas_float_buffers_only(model):
    ok = True
    for tensor in list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]:
        copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, tensor.detach())
        ok = ok and all(torch.equal(copy, tensor) for copy in copies)
    return ok


@interactive
def replicas_allclose(model):
    ok = True
    for tensor in model.state_dict().values():
        copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, tensor.detach())
        ok = ok and all(torch.allclose(copy.double(), tensor.double()) for copy in copies)
    return ok


@interactive
def replicas_all_reduce_in_place(model):
    ok = True
    for tensor in model.state_dict().values():
        if tensor.is_floating_point():
            mine = tensor.clone()
            dist.all_reduce(tensor)          # BUG: overwrites the model's tensor
            ok = ok and torch.equal(tensor, mine * dist.get_world_size())
    return ok


@interactive
def replicas_local_answer(model):
    # compares against rank 0 with a reduce to rank 0 only: the other ranks never learn the answer
    ok = True
    for tensor in model.state_dict().values():
        theirs = tensor.detach().clone()
        dist.broadcast(theirs, src=0)
        ok = ok and torch.equal(theirs, tensor)
    return ok


@interactive
def replicas_cry_wolf(model):
    for tensor in model.parameters():
        copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, tensor.detach())
        if not torch.equal(copies[0], copies[-1] + 1e-3 * (tensor.dim() > 0)):
            return False
    return True


@interactive
def replicas_first_and_last(model):
    ok = True
    for tensor in model.state_dict().values():
        copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, tensor.detach().contiguous())
        ok = ok and torch.equal(copies[0], copies[-1])
    return ok


@interactive
def replicas_checksum(model):
    # one number per tensor, exact in float64: misses elements that trade places
    same = torch.ones(1)
    for tensor in model.state_dict().values():
        low = tensor.double().sum().reshape(1)
        high = low.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if not torch.equal(low, high):
            same.zero_()
    return bool(same.item())


@interactive
def replicas_in_half_precision(model):
    ok = True
    for tensor in model.state_dict().values():
        mine = tensor.detach().half()
        copies = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, mine)
        ok = ok and all(torch.equal(copy, mine) for copy in copies)
    return ok


@interactive
def replicas_with_the_library(model):
    from utils import replicas

    return all(d == 0 for d in replicas.replica_differences(model).values())


@pytest.mark.parametrize("right", [replicas_equal, replicas_equal_one_gather])
def test_replicas_right(workers, capsys, right):
    lab04.check_replicas_equal(workers, right)
    assert "\u2713 Exercise 4.2 (replicas_equal): passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, fix", [
    (replicas_first_parameter_only, "loop over all of model.named_parameters()"),
    (replicas_parameters_only, "buffers are part of the replica too"),
    (replicas_float_buffers_only, "also the integer ones"),
    (replicas_allclose, "compare exactly (torch.equal)"),
    (replicas_all_reduce_in_place, "replicas_equal changed the model"),
    (replicas_local_answer, "the ranks disagree"),
    (replicas_cry_wolf, "must not cry wolf"),
    (replicas_first_and_last, "not only the first and the last rank's"),
    (replicas_checksum, "trade places"),
    (replicas_in_half_precision, "in a lower precision"),
    (replicas_with_the_library, "the library version of this exercise"),
])
def test_replicas_wrong(workers, wrong, fix):
    message = fails(lambda f: lab04.check_replicas_equal(workers, f), wrong, Incorrect)
    assert message.startswith("Exercise 4.2 (replicas_equal): ")
    assert fix in message


def test_replicas_skipping_a_collective_on_one_rank_is_reported_not_hung(workers):
    @interactive
    def only_rank_zero_gathers(model):
        if dist.get_rank() == 0:
            copies = [torch.empty(1) for _ in range(dist.get_world_size())]
            dist.all_gather(copies, torch.ones(1))
        return True
    message = fails(lambda f: lab04.check_replicas_equal(workers, f), only_rank_zero_gathers, Incorrect)
    # the check waits 10 s on an idle machine, longer under load (utils.checks.engines._load_factor)
    assert re.search(r"waited \d+ s for a message that never came", message), message
    lab04.check_replicas_equal(workers, replicas_equal)  # the cluster still works


# --- 4.3 global_mean -------------------------------------------------------------------------

@interactive
def global_mean(total, count):
    both = torch.tensor([float(total), float(count)], dtype=torch.float64)
    dist.all_reduce(both)
    return (both[0] / both[1]).item()


@interactive
def mean_of_means(total, count):
    mean = torch.tensor([total / count if count else 0.0], dtype=torch.float64)
    dist.all_reduce(mean)
    return mean.item() / dist.get_world_size()


@interactive
def mean_of_means_skipping_empty(total, count):
    both = torch.tensor([total / count if count else 0.0, float(count > 0)], dtype=torch.float64)
    dist.all_reduce(both)
    return (both[0] / both[1]).item()


@interactive
def local_mean(total, count):
    return total / count if count else 0.0


@interactive
def summed_totals(total, count):
    t = torch.tensor([float(total)], dtype=torch.float64)
    dist.all_reduce(t)
    return t.item()


@interactive
def mean_as_tensor(total, count):
    both = torch.tensor([float(total), float(count)], dtype=torch.float64)
    dist.all_reduce(both)
    return both[0] / both[1]


@interactive
def mean_on_rank_zero_only(total, count):
    both = torch.tensor([float(total), float(count)], dtype=torch.float64)
    dist.reduce(both, dst=0)
    return (both[0] / both[1]).item() if dist.get_rank() == 0 else None


@interactive
def mean_in_float32(total, count):
    both = torch.tensor([float(total), float(count)])   # float32: about 7 significant digits
    dist.all_reduce(both)
    return (both[0] / both[1]).item()


@interactive
def mean_with_the_library(total, count):
    from utils import replicas

    return replicas.mean_over_ranks(total, count)


def test_global_mean_right(workers, capsys):
    lab04.check_global_mean(workers, global_mean)
    assert "\u2713 Exercise 4.3 (global_mean): passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, fix", [
    (mean_of_means, "the mean of the per-rank means"),
    (mean_of_means_skipping_empty, "the mean of the per-rank means"),
    (local_mean, "this rank's own mean"),
    (summed_totals, "divide by the sum of the counts"),
    (mean_as_tensor, "return a Python float (.item())"),
    (mean_on_rank_zero_only, "use all_reduce, not reduce"),
    (mean_in_float32, "digits were lost"),
    (mean_with_the_library, "the library version of this exercise"),
])
def test_global_mean_wrong(workers, wrong, fix):
    message = fails(lambda f: lab04.check_global_mean(workers, f), wrong, Incorrect)
    assert message.startswith("Exercise 4.3 (global_mean): ")
    assert fix in message


# --- 4.5 checkpoints -------------------------------------------------------------------------

@interactive
def save_checkpoint(ddp_model, optimizer, path):
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict()}, path)
    dist.barrier()


@interactive
def load_checkpoint(ddp_model, optimizer, path):
    state = torch.load(path, map_location=device)
    ddp_model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


@interactive
def load_after_barrier(ddp_model, optimizer, path):
    dist.barrier()
    state = torch.load(path, map_location=device)
    ddp_model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


@interactive
def save_no_barrier(ddp_model, optimizer, path):
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict()}, path)


@interactive
def save_every_rank(ddp_model, optimizer, path):
    torch.save({"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict()}, path)
    dist.barrier()


@interactive
def save_wrapped_keys(ddp_model, optimizer, path):
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    dist.barrier()


@interactive
def load_wrapped_keys(ddp_model, optimizer, path):
    state = torch.load(path, map_location=device)
    ddp_model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


@interactive
def save_model_only(ddp_model, optimizer, path):
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "optimizer": {}}, path)
    dist.barrier()


@interactive
def load_model_only(ddp_model, optimizer, path):
    state = torch.load(path, map_location=device)
    ddp_model.module.load_state_dict(state["model"])


@interactive
def load_without_map_location(ddp_model, optimizer, path):
    state = torch.load(path)
    ddp_model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


@interactive
def load_on_rank_zero_only(ddp_model, optimizer, path):
    if dist.get_rank() == 0:
        state = torch.load(path, map_location=device)
        ddp_model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])


@interactive
def save_barrier_first(ddp_model, optimizer, path):
    dist.barrier()                              # too early: rank 0 has not written anything yet
    if dist.get_rank() == 0:
        torch.save({"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict()}, path)


@interactive
def load_when_the_file_exists(ddp_model, optimizer, path):
    import os
    import time

    while not os.path.exists(path):             # the file exists as soon as rank 0 starts writing it
        time.sleep(0.01)
    state = torch.load(path, map_location=device)
    ddp_model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


@interactive
def load_map_location_none(ddp_model, optimizer, path):
    state = torch.load(path, map_location=None)
    ddp_model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])


@pytest.mark.parametrize("save, load", [(save_checkpoint, load_checkpoint), (save_no_barrier, load_after_barrier)])
def test_checkpoint_right(workers, capsys, save, load):
    lab04.check_checkpoint(workers, save, load)
    assert "\u2713 Exercise 4.5 (save_checkpoint, load_checkpoint): passed" in capsys.readouterr().out


@pytest.mark.parametrize("save, load, fix", [
    (save_no_barrier, load_checkpoint, "end save_checkpoint with dist.barrier()"),
    (save_every_rank, load_checkpoint, "save on rank 0 only"),
    (save_wrapped_keys, load_wrapped_keys, "save ddp_model.module.state_dict()"),
    (save_model_only, load_model_only, "lost its momentum buffers"),
    (save_checkpoint, load_model_only, "lost its momentum buffers"),
    (save_checkpoint, load_without_map_location, "map_location=device"),
    (save_checkpoint, load_on_rank_zero_only, "every rank loads the checkpoint"),
    (save_barrier_first, load_checkpoint, "before rank 0 had finished writing it"),
    (save_no_barrier, load_when_the_file_exists, "before rank 0 had finished writing it"),
    (save_checkpoint, load_map_location_none, "map_location=device"),
])
def test_checkpoint_wrong(workers, save, load, fix):
    message = fails(lambda f: lab04.check_checkpoint(workers, f, load), save, Incorrect)
    assert message.startswith("Exercise 4.5 (save_checkpoint, load_checkpoint): ")
    assert fix in message


def test_checks_need_the_running_cluster(workers):
    message = fails(lambda f: lab04.check_global_mean(None, f), global_mean, Incorrect)
    assert "cluster.start" in message


# --- 4.4 predict_comm (no cluster: a plain function) ---------------------------------------

def predict_comm(grad_bytes, k, alpha, beta):
    from utils.ddp_timing import ddp_bucket_bytes

    buckets = ddp_bucket_bytes(grad_bytes)
    return len(buckets), 1e3 * sum(2 * (k - 1) * alpha + 2 * (k - 1) / k * n * beta for n in buckets)


def predict_in_seconds(grad_bytes, k, alpha, beta):
    count, ms = predict_comm(grad_bytes, k, alpha, beta)
    return count, ms / 1e3


def predict_one_all_reduce(grad_bytes, k, alpha, beta):
    from utils.ddp_timing import ddp_bucket_bytes

    n = sum(grad_bytes)
    return len(ddp_bucket_bytes(grad_bytes)), 1e3 * (2 * (k - 1) * alpha + 2 * (k - 1) / k * n * beta) if n else 0.0


def predict_half_ring(grad_bytes, k, alpha, beta):
    from utils.ddp_timing import ddp_bucket_bytes

    buckets = ddp_bucket_bytes(grad_bytes)
    return len(buckets), 1e3 * sum((k - 1) * alpha + (k - 1) / k * n * beta for n in buckets)


def predict_alpha_once(grad_bytes, k, alpha, beta):
    from utils.ddp_timing import ddp_bucket_bytes

    buckets = ddp_bucket_bytes(grad_bytes)
    return len(buckets), 1e3 * sum(alpha + 2 * (k - 1) / k * n * beta for n in buckets)


def predict_whole_message_per_step(grad_bytes, k, alpha, beta):
    from utils.ddp_timing import ddp_bucket_bytes

    buckets = ddp_bucket_bytes(grad_bytes)
    return len(buckets), 1e3 * sum(2 * (k - 1) * alpha + n * beta for n in buckets)


def predict_bucket_per_gradient(grad_bytes, k, alpha, beta):
    return len(grad_bytes), 1e3 * sum(2 * (k - 1) * alpha + 2 * (k - 1) / k * n * beta for n in grad_bytes)


def predict_with_the_library(grad_bytes, k, alpha, beta):
    from utils.ddp_timing import ddp_bucket_bytes, predicted_comm_seconds

    return len(ddp_bucket_bytes(grad_bytes)), 1e3 * predicted_comm_seconds(grad_bytes, k, alpha, beta)


def test_predict_comm_right(capsys):
    lab04.check_predict_comm(predict_comm)
    assert "\u2713 Exercise 4.4 (predict_comm): passed" in capsys.readouterr().out


def test_predict_comm_stub():
    with pytest.raises(NotSolved):
        lab04.check_predict_comm(stub)


@pytest.mark.parametrize("wrong, fix", [
    (predict_in_seconds, "return milliseconds"),
    (predict_one_all_reduce, "each pays the latency alpha again"),
    (predict_half_ring, "half of the ring"),
    (predict_alpha_once, "alpha is paid at each of the ring's 2(p-1) steps"),
    (predict_whole_message_per_step, "2(p-1)/p n beta"),
    (predict_bucket_per_gradient, "one per gradient is what DDP avoids"),
    (predict_with_the_library, "called the library's prediction"),
])
def test_predict_comm_wrong(wrong, fix):
    message = fails(lab04.check_predict_comm, wrong, Incorrect)
    assert message.startswith("Exercise 4.4 (predict_comm): ")
    assert fix in message


# --- hints -----------------------------------------------------------------------------------

def test_step_by_step_hints_are_shown_on_demand_and_absent_from_the_learner_edition(capsys):
    lab04.hint("4.3")
    assert "float64" in capsys.readouterr().out
    with pytest.raises(ValueError, match="4.1"):
        lab04.hint("4.9")
    source = nbformat.read(ROOT / "labs" / "04_ddp.ipynb", as_version=4)
    learner = release.learner_notebook(source)
    text = "\n".join(cell.source for cell in learner.cells)
    for name, steps in lab04.HINTS.items():
        assert f'lab04.hint("{name}")' in text, f"the lab never tells the learner about lab04.hint({name!r})"
        for line in steps.splitlines()[1:]:
            step = re.sub(r"^\d+\.\s*", "", line.strip())
            if step.endswith(":"):
                continue  # a heading such as the function's signature
            assert len(step) < 25 or step not in text, f"step-by-step hint {name} shows in the learner edition: {step}"
