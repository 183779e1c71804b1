import time

import pytest
import torch
import torch.nn.functional as F

from check_helpers import fails, stub
from learner_hints import ROOT, learner_cells_hold_no_hint
from utils.checks import Incorrect, NotSolved, lab02

# Messages of the checks, kept whole where they do not depend on the run.
STACK_HINT = "Keep each loss on the device (losses.append(loss.detach())) and return torch.stack(losses)"
HOST_READS = "the losses are right, but train_steps reads tensors on the host: "
NO_CUDA_HERE = pytest.mark.skipif(torch.cuda.is_available(),
                                  reason="the check's CPU-only message is shown only without CUDA")


# --- correct solutions, as a learner would write them ---------------------------------------

def train_steps(model, optimizer, batches, zero_grad=True, step=True, keep=lambda loss: loss.detach()):
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        if zero_grad:
            optimizer.zero_grad()
        loss.backward()
        if step:
            optimizer.step()
        losses.append(keep(loss))
    return losses


def stacked(**options):
    return lambda *args: torch.stack(train_steps(*args, **options))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn, device, repeats=10, scale=1e3, divisor=0, warm_up=True, sync_before=True, sync_after=True,
            clock_first=False):
    if clock_first:
        start = time.perf_counter()
    if warm_up:
        fn()
    if sync_before:
        sync(device)
    if not clock_first:
        start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if sync_after:
        sync(device)
    return (time.perf_counter() - start) * scale / (repeats + divisor)


def time_ms_events(fn, device, repeats=10):
    fn()
    if device.type != "cuda":
        return time_ms(fn, device, repeats)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


# --- 2.1 train_steps -------------------------------------------------------------------------

def test_train_steps_correct(capsys):
    lab02.check_train_steps(stacked())
    assert "\u2713 Exercise 2.1 (train_steps): passed" in capsys.readouterr().out


def test_train_steps_correct_with_zero_grad_last(capsys):
    def zero_grad_after_step(model, optimizer, batches):
        losses = []
        for x, y in batches:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
        return torch.stack(losses)
    lab02.check_train_steps(zero_grad_after_step)
    assert "\u2713 Exercise 2.1 (train_steps): passed" in capsys.readouterr().out


def test_train_steps_stub():
    message = fails(lab02.check_train_steps, stub, NotSolved)
    assert message.startswith("Exercise 2.1 (train_steps) is not solved yet")
    assert "raise NotImplementedError" in message


def test_a_not_implemented_error_from_inside_torch_is_a_crash_not_a_stub():
    def reads_a_meta_tensor(model, optimizer, batches):
        return torch.empty(len(batches), device="meta").tolist()   # torch raises NotImplementedError here
    message = fails(lab02.check_train_steps, reads_a_meta_tensor, Incorrect)
    assert message.startswith("Exercise 2.1 (train_steps): your code raised NotImplementedError: Cannot copy "
                              "out of meta tensor"), message


def test_train_steps_stub_with_hint():
    def hinted(model, optimizer, batches):
        raise NotImplementedError("Hint: append loss.detach() to a list")
    message = fails(lab02.check_train_steps, hinted, NotSolved)
    assert message.endswith("\n  Hint: append loss.detach() to a list")


def test_train_steps_list_of_floats():
    message = fails(lab02.check_train_steps, lambda *a: train_steps(*a, keep=lambda loss: loss.item()), Incorrect)
    assert message.startswith("train_steps returned a list of Python numbers: you called .item() (or float())")
    assert message.endswith(STACK_HINT)


def test_train_steps_list_or_tuple_of_tensors():
    message = fails(lab02.check_train_steps, train_steps, Incorrect)
    assert message == ("train_steps returned a list of tensors; return one 1-D tensor instead: "
                       "torch.stack(losses)")
    message = fails(lab02.check_train_steps, lambda *a: tuple(train_steps(*a)), Incorrect)
    assert message.startswith("train_steps returned a tuple of tensors;")


def test_train_steps_one_float():
    def summed(model, optimizer, batches):
        total = 0.0
        for x, y in batches:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss)
        return total
    message = fails(lab02.check_train_steps, summed, Incorrect)
    assert message.startswith("train_steps returned one Python number (")
    assert "it should give every step's loss" in message


def test_train_steps_none():
    def forgot_return(model, optimizer, batches):
        train_steps(model, optimizer, batches)
    message = fails(lab02.check_train_steps, forgot_return, Incorrect)
    assert message == "train_steps returned None: end it with return torch.stack(losses)"


def test_train_steps_other_types():
    message = fails(lab02.check_train_steps, lambda *a: [], Incorrect)
    assert message == "train_steps should return a tensor of the per-step losses, got list"
    message = fails(lab02.check_train_steps, lambda *a: [1.0, torch.stack(train_steps(*a))], Incorrect)
    assert message == "train_steps should return a tensor of the per-step losses, got list"


def test_train_steps_one_loss_instead_of_all():
    message = fails(lab02.check_train_steps, lambda *a: torch.stack(train_steps(*a)).mean(), Incorrect)
    assert message == ("with 5 batches train_steps should return shape (5,), one loss per step, "
                       "got shape ()")


def test_train_steps_losses_off_the_model_device():
    # The meta device stands in for "not the model's device" (on a GPU: the host).
    message = fails(lab02.check_train_steps, lambda *a: torch.stack(train_steps(*a)).to("meta"), Incorrect)
    model_device = "cuda:0" if torch.cuda.is_available() else "cpu"   # where the check puts the model
    assert message.startswith(f"the returned losses are on meta but the model is on {model_device}:")


def test_train_steps_not_detached():
    message = fails(lab02.check_train_steps, stacked(keep=lambda loss: loss), Incorrect)
    assert message == ("the returned losses still require grad, so each one keeps its step's autograd graph "
                       "alive: store loss.detach(), not loss")


def test_train_steps_missing_zero_grad():
    message = fails(lab02.check_train_steps, stacked(zero_grad=False), Incorrect)
    assert message.startswith("the losses match a loop that never clears the gradients")
    assert "call optimizer.zero_grad() before loss.backward()" in message


def test_train_steps_missing_step():
    expected = ("the model's weights did not change: for every batch call optimizer.zero_grad(), "
                "loss.backward(), then optimizer.step(), in that order")
    assert fails(lab02.check_train_steps, stacked(step=False), Incorrect) == expected

    def zero_grad_between_backward_and_step(model, optimizer, batches):
        losses = []
        for x, y in batches:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.zero_grad()
            optimizer.step()
            losses.append(loss.detach())
        return torch.stack(losses)
    assert fails(lab02.check_train_steps, zero_grad_between_backward_and_step, Incorrect) == expected


def test_train_steps_skips_the_last_update():
    def last_step_missing(model, optimizer, batches):
        losses = []
        for i, (x, y) in enumerate(batches):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            if i < len(batches) - 1:
                optimizer.step()
            losses.append(loss.detach())
        return torch.stack(losses)
    message = fails(lab02.check_train_steps, last_step_missing, Incorrect)
    assert message.startswith("the losses are right but the final weights differ from the reference's")


def test_train_steps_wrong_loss():
    def mse(model, optimizer, batches):
        losses = []
        for x, y in batches:
            loss = F.mse_loss(model(x), F.one_hot(y, 4).float())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        return torch.stack(losses)
    message = fails(lab02.check_train_steps, mse, Incorrect)
    assert message.startswith("the losses differ from one SGD step per batch with "
                              "loss = F.cross_entropy(model(x), y): expected [")


# On a real GPU a tensor built from host values lands on the CPU, and the device check says so first.
ON_THE_HOST = "the returned losses are on cpu but the model is on cuda:0: keep them on the device"


def test_train_steps_item_then_tensor():
    message = fails(lab02.check_train_steps,
                    lambda *a: torch.tensor(train_steps(*a, keep=lambda loss: loss.item())), Incorrect)
    if torch.cuda.is_available():
        assert message.startswith(ON_THE_HOST), message
    else:
        assert message.startswith(HOST_READS + ".item() (5x). On a GPU each read waits")


def test_train_steps_tensor_of_tensors():
    message = fails(lab02.check_train_steps, lambda *a: torch.tensor(train_steps(*a)), Incorrect)
    if torch.cuda.is_available():
        assert message.startswith(ON_THE_HOST), message
    else:
        assert message.startswith(HOST_READS) and "(5x)" in message


def test_train_steps_printing(capsys):
    def printing(model, optimizer, batches):
        return torch.stack(train_steps(model, optimizer, batches, keep=lambda loss: print(loss) or loss.detach()))
    message = fails(lab02.check_train_steps, printing, Incorrect)
    assert message.startswith(HOST_READS + "print(tensor) (5x).")

    def f_string(model, optimizer, batches):
        return torch.stack(train_steps(model, optimizer, batches,
                                       keep=lambda loss: print(f"{loss:.3f}") or loss.detach()))
    message = fails(lab02.check_train_steps, f_string, Incorrect)
    # Tensor.__format__ calls .item() inside torch: only the learner's f-string counts.
    assert message.startswith(HOST_READS + "a tensor in an f-string (5x).")
    capsys.readouterr()


def test_train_steps_host_read_spies_are_removed():
    before = {name: torch.Tensor.__dict__.get(name) for name in lab02._HOST_READS}
    fails(lab02.check_train_steps, lambda *a: torch.tensor(train_steps(*a, keep=lambda loss: loss.item())),
          Incorrect)
    fails(lab02.check_train_steps, stub, NotSolved)
    assert {name: torch.Tensor.__dict__.get(name) for name in lab02._HOST_READS} == before


def learner_crashes(model, optimizer, batches):
    return [F.cross_entropy(model(x), y.float()) for x, y in batches]  # a typical dtype mistake


def test_train_steps_crash_is_incorrect_with_learner_traceback():
    with pytest.raises(Incorrect) as info:
        lab02.check_train_steps(learner_crashes)
    error = info.value
    # The CPU kernel raises RuntimeError; the CUDA one NotImplementedError, a crash all the same.
    kind = NotImplementedError if torch.cuda.is_available() else RuntimeError
    assert str(error).startswith(f"Exercise 2.1 (train_steps): your code raised {kind.__name__}:")
    assert isinstance(error.__cause__, kind)
    text = "\n".join(error._render_traceback_())
    assert "in learner_crashes" in text
    assert "utils/checks" not in text.replace("\\", "/")


# --- 2.1 on a device that cannot be read on the host ------------------------------------------

@NO_CUDA_HERE  # on a GPU the real device catches these copies, with the device message above
def test_train_steps_host_copies_are_caught_without_a_gpu():
    # .cpu(), .to("cpu") and a host buffer cost nothing on a CPU; the meta device makes each one fail.
    copy_out = "train_steps copies data from the device to the host: run on a device whose tensors cannot be read"
    message = fails(lab02.check_train_steps, stacked(keep=lambda loss: loss.detach().cpu()), Incorrect)
    assert message.startswith(copy_out)
    message = fails(lab02.check_train_steps, lambda *a: torch.stack(train_steps(*a)).to("cpu"), Incorrect)
    assert message.startswith(copy_out)

    def host_buffer(model, optimizer, batches):
        losses = torch.zeros(len(batches))
        for i, (x, y) in enumerate(batches):
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses[i] = loss.detach()
        return losses.to(x.device)
    assert fails(lab02.check_train_steps, host_buffer, Incorrect).startswith(copy_out)


def test_train_steps_host_to_device_copies():
    def running_total(model, optimizer, batches):
        losses = []
        for x, y in batches:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach() + torch.tensor(0.0).to(x.device))
        return torch.stack(losses)
    message = fails(lab02.check_train_steps, running_total, Incorrect)
    assert message.startswith("train_steps copies tensors from the host onto the device (5 copies over 5 steps")


def test_train_steps_hints_on_demand_and_not_in_the_learner_edition(capsys):
    lab02.hint("2.2")
    assert "sync(device)" in capsys.readouterr().out
    learner_cells_hold_no_hint(ROOT / "labs" / "02_single_gpu.ipynb", lab02.HINTS)


# --- 2.2 time_ms -----------------------------------------------------------------------------

SIMULATED = "on a simulated GPU (this machine has none; fn queues its work and returns at once, as a CUDA launch does)"
needs_simulation = pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU is simulated only without one")


@pytest.mark.parametrize("timer", [time_ms, time_ms_events], ids=["perf_counter", "cuda events"])
def test_time_ms_correct(timer, capsys):
    lab02.check_time_ms(timer)
    assert "\u2713 Exercise 2.2 (time_ms): passed" in capsys.readouterr().out


def test_time_ms_guarded_by_is_available(capsys):
    def guarded(fn, device, repeats):
        fn()
        if torch.cuda.is_available() and device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        if torch.cuda.is_available() and device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3 / repeats
    lab02.check_time_ms(guarded)
    assert "passed" in capsys.readouterr().out
    assert torch.cuda.is_available.__module__ == "torch.cuda"  # the simulation put the real one back


def test_time_ms_stub():
    def hinted(fn, device, repeats=10):
        raise NotImplementedError("Hint: call fn() once to warm up")
    message = fails(lab02.check_time_ms, hinted, NotSolved)
    assert message.startswith("Exercise 2.2 (time_ms) is not solved yet")
    assert message.endswith("\n  Hint: call fn() once to warm up")

    def hint_names_cuda(fn, device, repeats=10):  # NotImplementedError is a RuntimeError: not blamed on CUDA
        raise NotImplementedError("Hint: see torch.cuda.Event")
    assert fails(lab02.check_time_ms, hint_names_cuda, NotSolved).endswith("\n  Hint: see torch.cuda.Event")


def test_time_ms_seconds():
    message = fails(lab02.check_time_ms, lambda fn, device, repeats: time_ms(fn, device, repeats, scale=1), Incorrect)
    assert message.startswith("on cpu, calls of about 20 ms took 0.0")
    assert message.endswith("by your measure: that looks like seconds; return milliseconds (multiply by 1000)")


def test_time_ms_total():
    message = fails(lab02.check_time_ms, lambda fn, device, repeats: time_ms(fn, device, repeats, divisor=1 - repeats),
                    Incorrect)
    assert message.startswith("on cpu, calls of about ")
    assert message.endswith("5 times too long: that is the total of the 5 repeats; divide by repeats")


def test_time_ms_divides_by_one_too_many():
    message = fails(lab02.check_time_ms, lambda fn, device, repeats: time_ms(fn, device, repeats, divisor=1),
                    Incorrect)
    assert message.startswith("on cpu, your time is 5/6 of the right one")
    assert message.endswith("divide the time of the 5 timed calls by 5, not 6")


def test_time_ms_warm_up_inside_the_timed_region():
    message = fails(lab02.check_time_ms, lambda fn, device, repeats: time_ms(fn, device, repeats, clock_first=True),
                    Incorrect)
    assert message.startswith("on cpu, your time includes the warm-up call (")
    assert message.endswith("start the clock after the warm-up")


def test_time_ms_wrong_number_of_calls():
    message = fails(lab02.check_time_ms, lambda fn, device, repeats: time_ms(fn, device, repeats, warm_up=False),
                    Incorrect)
    assert message.startswith("on cpu, fn was called 5 time(s) with repeats=5: call it once first, as a warm-up")

    message = fails(lab02.check_time_ms, lambda fn, device, repeats: time_ms(fn, device, 3 * repeats), Incorrect)
    assert message == ("on cpu, fn was called 16 times with repeats=5: call it `repeats` times "
                       "(plus a warm-up call)")


@needs_simulation
def test_time_ms_without_synchronisation_is_caught_without_a_gpu():
    for options in ({"sync_after": False}, {"sync_before": False, "sync_after": False}):
        message = fails(lab02.check_time_ms, lambda fn, device, repeats: time_ms(fn, device, repeats, **options),
                        Incorrect)
        assert message.startswith(SIMULATED + ", calls whose work takes 20 ms took ")
        assert "your clock stopped before the device finished" in message


@needs_simulation
def test_time_ms_launch_only_time_that_looks_like_seconds():
    # On a loaded machine the launches alone can take about 0.02 ms: the number a 20 ms call gives in seconds.
    def launches_only(fn, device, repeats):
        if device.type != "cuda":
            return time_ms(fn, device, repeats)
        time_ms(fn, device, repeats, sync_before=False, sync_after=False)
        return 0.0201
    message = fails(lab02.check_time_ms, launches_only, Incorrect)
    assert "your clock stopped before the device finished" in message, message


@needs_simulation
def test_time_ms_without_synchronisation_before_the_clock():
    message = fails(lab02.check_time_ms, lambda fn, device, repeats: time_ms(fn, device, repeats, sync_before=False),
                    Incorrect)
    assert message.startswith(SIMULATED + ", your time (")
    assert "includes the end of the warm-up's work" in message


@needs_simulation
def test_time_ms_events_read_too_early():
    def no_event_sync(fn, device, repeats):
        if device.type != "cuda":
            return time_ms(fn, device, repeats)
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        return start.elapsed_time(end) / repeats
    message = fails(lab02.check_time_ms, no_event_sync, Incorrect)
    assert message.startswith("on a simulated GPU (this machine has none) your time_ms failed: Both events must be "
                              "recorded and completed")


def test_time_ms_wrong_value():
    def five(fn, device, repeats):
        for _ in range(repeats + 1):
            fn()
        return 5.0
    message = fails(lab02.check_time_ms, five, Incorrect)
    assert message.startswith("on cpu, calls of about 2")
    assert message.endswith("took 5 ms by your time_ms; time only the `repeats` calls after the warm-up, and "
                            "divide by repeats")


def test_time_ms_wrong_types():
    message = fails(lab02.check_time_ms, lambda *a: torch.tensor(20.0), Incorrect)
    assert message == "time_ms should return a Python float (milliseconds), got Tensor: convert it with float(...)"
    message = fails(lab02.check_time_ms, lambda *a: True, Incorrect)
    assert message == "time_ms should return a Python float (milliseconds), got bool"
    message = fails(lab02.check_time_ms, lambda *a: "20 ms", Incorrect)
    assert message == "time_ms should return a Python float (milliseconds), got str"


def test_time_ms_none():
    message = fails(lab02.check_time_ms, lambda *a: None, Incorrect)
    assert message == "time_ms returned None: return the mean time of one call, in milliseconds"


@NO_CUDA_HERE
def test_time_ms_calls_cuda_on_cpu():
    def always_synchronises(fn, device, repeats):
        torch.cuda.synchronize()
        return time_ms(fn, device, repeats)
    with pytest.raises(Incorrect) as info:
        lab02.check_time_ms(always_synchronises)
    assert str(info.value) == ("with device=cpu your time_ms called CUDA, which this machine does not have: "
                               "call torch.cuda.synchronize() or use CUDA events only when "
                               "device.type == 'cuda'")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_time_ms_other_runtime_error_is_not_blamed_on_cuda():
    def crashes(fn, device, repeats):
        raise RuntimeError("boom")
    with pytest.raises(Incorrect) as info:
        lab02.check_time_ms(crashes)
    assert str(info.value) == "Exercise 2.2 (time_ms): your code raised RuntimeError: boom"
    assert isinstance(info.value.__cause__, RuntimeError)
