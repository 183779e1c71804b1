"""The checks of lab 05 (DDP from scratch): right wrappers pass, each class of wrong one (the mistakes
learners make, those only visible at p >= 3 or with a layer some ranks skip, the behaviour the
exercise teaches, the shortcuts it forbids) fails with its own message, the stub is NotSolved.

One 3-engine cluster serves the whole module (at 2 ranks a wrapper dividing by 2 is right). The
checks send a learner's class by value with cloudpickle; this module is registered for that, since
the engines cannot import it.
"""
from __future__ import annotations

import contextlib
import sys

import cloudpickle
import nbformat
import pytest
import torch
import torch.distributed as dist
from torch import nn

from check_helpers import fails
from utils import cluster, ddp
from tooling import release
from utils.checks import Incorrect, NotSolved, lab05
from utils.config import COURSE_ROOT

pytestmark = pytest.mark.timeout(900)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def workers():
    started = cluster.start(3, backend="gloo", activate=False)
    yield started
    cluster.stop()


# --- right answers, written as a learner would ---------------------------------------------------

class Naive(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for tensor in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(tensor, src=0)

    def forward(self, x):
        return self.module(x)

    def finish_gradient_synchronization(self):
        for param in self.module.parameters():
            if param.requires_grad:
                grad = param.grad if param.grad is not None else torch.zeros_like(param)
                dist.all_reduce(grad)
                grad /= dist.get_world_size()
                param.grad = grad


class Flat(ddp.DataParallel):
    def finish_gradient_synchronization(self):
        flat = torch.cat([self.local_grad(p).reshape(-1) for p in self.params])
        flat /= self.world_size
        dist.all_reduce(flat)
        for param, piece in zip(self.params, flat.split([p.numel() for p in self.params])):
            param.grad = piece.view_as(param)


class Overlap(ddp.DataParallel):
    def __init__(self, module):
        super().__init__(module)
        self.handles = {}
        self.on_gradient_ready(self.gradient_ready)

    def gradient_ready(self, param):
        if not self.synchronizing:
            return
        param.grad /= self.world_size
        self.handles[param] = dist.all_reduce(param.grad, async_op=True)

    def finish_gradient_synchronization(self):
        for param in self.params:
            if param not in self.handles:
                param.grad = self.local_grad(param) / self.world_size
                self.handles[param] = dist.all_reduce(param.grad, async_op=True)
        for handle in self.handles.values():
            handle.wait()
        self.handles = {}


class Bucketed(ddp.DataParallel):
    def __init__(self, module, bucket_cap_mb=25.0):
        super().__init__(module)
        self.buckets = [{"params": params} for params in self.assign(bucket_cap_mb)]
        for bucket in self.buckets:
            bucket["slices"], offset = {}, 0
            for param in bucket["params"]:
                bucket["slices"][param] = (offset, offset + param.numel())
                offset += param.numel()
            bucket["buffer"] = self.new_buffer(offset, bucket["params"][0])
            bucket["ready"], bucket["handle"] = set(), None
        self.bucket_of = {param: bucket for bucket in self.buckets for param in bucket["params"]}
        self.next_bucket = 0
        self.on_gradient_ready(self.gradient_ready)

    def assign(self, bucket_cap_mb):
        cap, buckets, filled = bucket_cap_mb * 2 ** 20, [], 0
        for param in reversed(self.params):
            nbytes = param.numel() * param.element_size()
            if buckets and filled + nbytes <= cap:
                buckets[-1].append(param)
                filled += nbytes
            else:
                buckets.append([param])
                filled = nbytes
        return buckets

    def new_buffer(self, numel, first):
        return torch.zeros(numel, dtype=first.dtype, device=first.device)

    def put(self, bucket, param, grad):
        start, stop = bucket["slices"][param]
        bucket["buffer"][start:stop] = grad.reshape(-1)
        bucket["ready"].add(param)

    def launch(self, bucket):
        bucket["buffer"] /= self.world_size
        bucket["handle"] = dist.all_reduce(bucket["buffer"], async_op=True)

    def launch_full_buckets(self):
        while self.next_bucket < len(self.buckets):
            bucket = self.buckets[self.next_bucket]
            if len(bucket["ready"]) < len(bucket["params"]):
                return
            self.launch(bucket)
            self.next_bucket += 1

    def gradient_ready(self, param):
        if self.synchronizing:
            self.put(self.bucket_of[param], param, param.grad)
            self.launch_full_buckets()

    def finish_gradient_synchronization(self):
        if not self.synchronizing:
            return
        for bucket in self.buckets[self.next_bucket:]:
            for param in bucket["params"]:
                if param not in bucket["ready"]:
                    self.put(bucket, param, self.local_grad(param))
        self.launch_full_buckets()
        for bucket in self.buckets:
            bucket["handle"].wait()
            for param, (start, stop) in bucket["slices"].items():
                param.grad = bucket["buffer"][start:stop].view_as(param).clone()
            bucket["ready"], bucket["handle"] = set(), None
        self.next_bucket = 0


class Stub(nn.Module):
    def __init__(self, module):
        raise NotImplementedError("Hint: broadcast first")


# --- 5.1: the arithmetic, the start, None and frozen gradients ------------------------------------

class SumWithoutDividing(Naive):
    def finish_gradient_synchronization(self):
        for param in self.module.parameters():
            if param.requires_grad:
                grad = param.grad if param.grad is not None else torch.zeros_like(param)
                dist.all_reduce(grad)
                param.grad = grad


class DividedTwice(Naive):
    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        for param in self.module.parameters():
            if param.grad is not None:
                param.grad /= dist.get_world_size()


class DividedByTwo(Naive):
    """Right at 2 ranks only."""

    def finish_gradient_synchronization(self):
        for param in self.module.parameters():
            if param.requires_grad:
                grad = param.grad if param.grad is not None else torch.zeros_like(param)
                dist.all_reduce(grad)
                param.grad = grad / 2


class NoBroadcast(Naive):
    def __init__(self, module):
        nn.Module.__init__(self)
        self.module = module


class NoneGradient(Naive):
    def finish_gradient_synchronization(self):
        for param in self.module.parameters():
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()


class SkipsNone(Naive):
    """Right when a layer is unused on every rank alike; wrong when some ranks use it."""

    def finish_gradient_synchronization(self):
        for param in self.module.parameters():
            if param.grad is not None:
                dist.all_reduce(param.grad)
                param.grad /= dist.get_world_size()


class FrozenGetsZeros(Naive):
    def finish_gradient_synchronization(self):
        for param in self.module.parameters():
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            dist.all_reduce(grad)
            grad /= dist.get_world_size()
            param.grad = grad


class ReferenceSubclass(ddp.NaiveDDP):
    pass


class TorchInside(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.inner = nn.parallel.DistributedDataParallel(module, find_unused_parameters=True)

    def forward(self, x):
        return self.inner(x)

    def finish_gradient_synchronization(self):
        pass


# --- 5.2 to 5.4: how the communication is done ---------------------------------------------------

class Float32Flat(Flat):
    def finish_gradient_synchronization(self):
        flat = torch.cat([self.local_grad(p).reshape(-1) for p in self.params]).float() / self.world_size
        dist.all_reduce(flat)
        for param, piece in zip(self.params, flat.double().split([p.numel() for p in self.params])):
            param.grad = piece.view_as(param)


class BlockingInHook(Overlap):
    def gradient_ready(self, param):
        if not self.synchronizing:
            return
        param.grad /= self.world_size
        dist.all_reduce(param.grad)
        self.handles[param] = contextlib.nullcontext()   # nothing to wait for

    def finish_gradient_synchronization(self):
        for param in self.params:
            if param not in self.handles:
                param.grad = self.local_grad(param) / self.world_size
                dist.all_reduce(param.grad)
        self.handles = {}


class WaitsInHook(Overlap):
    def gradient_ready(self, param):
        if not self.synchronizing:
            return
        param.grad /= self.world_size
        self.handles[param] = dist.all_reduce(param.grad, async_op=True)
        self.handles[param].wait()


class NeverWaits(Overlap):
    def finish_gradient_synchronization(self):
        for param in self.params:
            if param not in self.handles:
                param.grad = self.local_grad(param) / self.world_size
                self.handles[param] = dist.all_reduce(param.grad, async_op=True)
        self.handles = {}                                 # forgot to wait


class HooksIgnoreNoSync(Overlap):
    def gradient_ready(self, param):
        if param in self.handles:
            self.handles[param].wait()                    # a learner's "fix" for the second backward
        param.grad /= self.world_size
        self.handles[param] = dist.all_reduce(param.grad, async_op=True)


class ForwardOrderBuckets(Bucketed):
    def assign(self, bucket_cap_mb):
        return [list(reversed(bucket)) for bucket in reversed(super().assign(bucket_cap_mb))]


class CapInElements(Bucketed):
    """Counts the cap in elements, not bytes: buckets 8 times too large for float64."""

    def assign(self, bucket_cap_mb):
        cap, buckets, filled = bucket_cap_mb * 2 ** 20, [], 0
        for param in reversed(self.params):
            if buckets and filled + param.numel() <= cap:
                buckets[-1].append(param)
                filled += param.numel()
            else:
                buckets.append([param])
                filled = param.numel()
        return buckets


class LaunchWhenFull(Bucketed):
    """Launches any bucket as soon as it is full, not in bucket order."""

    def launch_full_buckets(self):
        for bucket in self.buckets:
            if bucket["handle"] is None and len(bucket["ready"]) == len(bucket["params"]):
                self.launch(bucket)
        self.next_bucket = len(self.buckets) if all(b["handle"] for b in self.buckets) else 0


class AccumulationIgnored(Bucketed):
    def no_sync(self):
        return contextlib.nullcontext()


class Float32Buffer(Bucketed):
    def new_buffer(self, numel, first):
        return torch.zeros(numel, device=first.device)

    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        for param in self.params:
            param.grad = param.grad.to(param.dtype)


class BufferWithoutDevice(Bucketed):
    def new_buffer(self, numel, first):
        return torch.zeros(numel, dtype=first.dtype)


# --- the tests -----------------------------------------------------------------------------------

def test_right_answers_pass(workers, capsys):
    lab05.check_naive(workers, Naive)
    lab05.check_flat(workers, Flat)
    lab05.check_overlap(workers, Overlap)
    lab05.check_bucketed(workers, Bucketed)
    printed = capsys.readouterr().out
    assert printed.count("passed") == 4 and "torch's DDP" in printed and "on 3 ranks" in printed


def test_stub_is_not_solved(workers):
    message = fails(lambda cls: lab05.check_naive(workers, cls), Stub, NotSolved)
    assert "not solved yet" in message and "Hint: broadcast first" in message and 'lab05.hint(\'5.1\')' in message


@pytest.mark.parametrize("check, wrong, expected", [
    (lab05.check_naive, SumWithoutDividing, "learning rate 0.3 instead of 0.1: the gradients were summed"),
    (lab05.check_naive, DividedTwice, "instead of 0.1: the gradients were divided by 3 twice"),
    (lab05.check_naive, DividedByTwo, "divided by 2, not by the world size 3"),
    (lab05.check_naive, NoBroadcast, "broadcast every parameter and buffer from rank 0"),
    (lab05.check_naive, NoneGradient, "reduce zeros in place of a None gradient"),
    (lab05.check_naive, SkipsNone, "the ranks disagree on collective number"),
    (lab05.check_naive, FrozenGetsZeros, "(requires_grad=False) hold a gradient"),
    (lab05.check_naive, ReferenceSubclass, "subclasses utils.ddp.NaiveDDP"),
    (lab05.check_naive, TorchInside, "uses DistributedDataParallel"),
    (lab05.check_flat, Naive, "single all_reduce"),
    (lab05.check_flat, Float32Flat, "reduces a float32 tensor, but the gradients are float64"),
    (lab05.check_overlap, Flat, "start each parameter's all_reduce from its hook"),
    (lab05.check_overlap, BlockingInHook, "async_op=True"),
    (lab05.check_overlap, WaitsInHook, "waited for"),
    (lab05.check_overlap, NeverWaits, "still running when finish_gradient_synchronization() returned"),
    (lab05.check_overlap, HooksIgnoreNoSync, "inside `with model.no_sync():`"),
    (lab05.check_bucketed, Overlap, "unexpected keyword argument 'bucket_cap_mb'"),
    (lab05.check_bucketed, ForwardOrderBuckets, "from the last parameter to the first"),
    (lab05.check_bucketed, CapInElements, "(numel * element_size) stay within"),
    (lab05.check_bucketed, LaunchWhenFull, "launch buckets in bucket order"),
    (lab05.check_bucketed, AccumulationIgnored, "no_sync"),
    (lab05.check_bucketed, Float32Buffer, "allocate buffers with dtype=param.dtype"),
    (lab05.check_bucketed, BufferWithoutDevice, "allocate buffers with device=param.device"),
    (lab05.check_bucketed, ddp.BucketedDDP, "subclasses utils.ddp.BucketedDDP"),
])
def test_mistakes_are_named(workers, check, wrong, expected):
    message = fails(lambda cls: check(workers, cls), wrong, Incorrect)
    assert expected in message and "lab05.hint(" in message


def test_the_cluster_survives_a_wrong_answer(workers):
    fails(lambda cls: lab05.check_naive(workers, cls), SkipsNone, Incorrect)
    lab05.check_naive(workers, Naive)


def test_every_exercise_has_a_step_by_step_hint_that_the_learner_edition_does_not_show(capsys):
    nb = nbformat.read(COURSE_ROOT / "labs" / "05_ddp_from_scratch.ipynb", as_version=4)
    learner = "\n".join(cell.source for cell in release.learner_notebook(nb).cells)
    for number in ("5.1", "5.2", "5.3", "5.4"):
        lab05.hint(number)
        steps = capsys.readouterr().out
        assert "Step by step" in steps
        assert f'lab05.hint("{number}")' in learner, f"the lab should point to lab05.hint({number!r})"
        for line in steps.splitlines()[1:]:
            assert line.strip()[3:] not in learner, f"hint {number} leaks into the learner edition: {line}"
    with pytest.raises(ValueError, match="5.1"):
        lab05.hint("5.9")
