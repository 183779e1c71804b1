"""The checks of lab 05 (DDP from scratch): right wrappers pass, typical wrong ones fail with a message
naming the fix, the stub is NotSolved.

One 2-engine cluster serves the whole module. The checks send a learner's class by value with
cloudpickle; this module is registered for that, since the engines cannot import it.
"""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch import nn

from check_helpers import fails
from utils import cluster, ddp
from utils.checks import Incorrect, NotSolved, lab05

pytestmark = pytest.mark.timeout(600)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def workers():
    started = cluster.start(2, backend="gloo", activate=False)
    yield started
    cluster.stop()


class Naive(nn.Module):
    """A right answer to Exercise 5.1, as a learner would write it."""

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


class NoBroadcast(Naive):
    def __init__(self, module):
        nn.Module.__init__(self)
        self.module = module


class NoneGradient(Naive):
    def finish_gradient_synchronization(self):
        for param in self.module.parameters():
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()


class Stub(nn.Module):
    def __init__(self, module):
        raise NotImplementedError("Hint: broadcast first")


class AccumulationIgnored(ddp.BucketedDDP):
    """Reduces inside no_sync() too: the first micro-batch is reduced, then reduced again."""

    def no_sync(self):
        import contextlib
        return contextlib.nullcontext()


class ForwardOrderBuckets(ddp.BucketedDDP):
    """Buckets in the order forward uses the parameters: none is full before backward ends."""

    def __init__(self, module, bucket_cap_mb=25.0):
        super().__init__(module, bucket_cap_mb)
        self.buckets.reverse()
        self.buckets.sort(key=lambda bucket: any(p is module.gain for p in bucket.params))  # used last


class BlockingInHook(ddp.OverlapDDP):
    def _launch(self, param, grad):
        grad.div_(self.world_size)
        dist.all_reduce(grad)                      # blocking: no overlap
        self._works[param] = _Done()


class _Done:
    def wait(self):
        pass


def test_right_answers_pass(workers, capsys):
    lab05.check_naive(workers, Naive)
    lab05.check_flat(workers, ddp.FlatDDP)
    lab05.check_overlap(workers, ddp.OverlapDDP)
    lab05.check_bucketed(workers, ddp.BucketedDDP)
    printed = capsys.readouterr().out
    assert printed.count("passed") == 4 and "torch's DDP" in printed


def test_stub_is_not_solved(workers):
    message = fails(lambda cls: lab05.check_naive(workers, cls), Stub, NotSolved)
    assert "not solved yet" in message and "Hint: broadcast first" in message


@pytest.mark.parametrize("wrong, expected", [
    (SumWithoutDividing, "learning rate 0.2 instead of 0.1: the gradients were summed"),
    (DividedTwice, "learning rate 0.05 instead of 0.1: the gradients were divided by 2 twice"),
    (NoBroadcast, "broadcast every parameter and buffer from rank 0"),
    (NoneGradient, "reduce zeros in place of a None gradient"),
])
def test_naive_mistakes_are_named(workers, wrong, expected):
    assert expected in fails(lambda cls: lab05.check_naive(workers, cls), wrong, Incorrect)


@pytest.mark.parametrize("check, wrong, expected", [
    (lab05.check_flat, ddp.NaiveDDP, "single all_reduce"),
    (lab05.check_overlap, ddp.FlatDDP, "start each parameter's all_reduce from its hook"),
    (lab05.check_overlap, BlockingInHook, "async_op=True"),
    (lab05.check_bucketed, ddp.OverlapDDP, "unexpected keyword argument 'bucket_cap_mb'"),
    (lab05.check_bucketed, ForwardOrderBuckets, "from the last parameter to the first"),
    (lab05.check_bucketed, AccumulationIgnored, "no_sync"),
])
def test_communication_mistakes_are_named(workers, check, wrong, expected):
    assert expected in fails(lambda cls: check(workers, cls), wrong, Incorrect)


def test_the_cluster_survives_a_wrong_answer(workers):
    fails(lambda cls: lab05.check_naive(workers, cls), NoneGradient, Incorrect)
    lab05.check_naive(workers, Naive)
