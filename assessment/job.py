"""The assessment's job: the learner's torchrun script, checked in the notebook and judged by the grader.

The script is run the way lab 06's check runs its job (``utils.checks.job.check``): under
``utils.checks.job.probe`` on a tiny problem, with a time limit, in four scenarios:

- ``two``: 2 processes on one node;
- ``three``: 3 processes on two simulated GPU nodes (2 + 1, so ``LOCAL_RANK`` differs from ``RANK``);
- ``failure``: 2 processes on two nodes, rank 1 raising in its 3rd training step;
- ``refusal``: 3 processes on two nodes given a global batch they cannot share equally.

The learner picks the optimizer and its schedule, so the one-process reference takes the optimizer
steps the ranks recorded (``REPLAYED_OPTIMIZER``). ``run(script, folder, seed)`` runs the scenarios and
writes what came back (exit codes, output, each rank's record, the checkpoint) into ``folder``;
``judge(folder, seed, load_state)`` turns those files into a verdict per criterion. The grader runs the
first inside its sandbox and the second in its own process, treating every file as hostile (a
malformed one fails the criterion); ``check_job`` does both here, for the notebook's check cell.
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from assessment import supervised
from utils.checks import Incorrect, NotSolved

if TYPE_CHECKING:
    from utils.checks.job import JobCheck

# torch (through utils.checks.job.check) is imported only where a check runs or judges: the grader's own process,
# which imports this module for the scenarios' names and files, never loads it (about 500 MB and 5 s less).

# No module-level import of assessment.settings: it reads COURSE_QUICK when first imported, and the grader
# imports this module before it sets that from its --quick option.
JOB_EPOCHS = 2
SAVED = f"epoch_{JOB_EPOCHS:02d}.pt"   # the tiny job's last checkpoint (settings.checkpoint_name), compared with one process
REFUSED_BATCH = 20                                 # divides by 2 and 4, not by 3
SCENARIOS = {   # name: (processes per node, settings changed, rank that fails, step at which it fails)
    "two": ([2], {}, None, 0),
    "three": ([2, 1], {}, None, 0),
    "failure": ([1, 1], {}, 1, 3),
    "refusal": ([2, 1], {"global_batch": REFUSED_BATCH}, None, 0),
}
CRITERION = {"two": "job", "three": "job", "failure": "failure", "refusal": "refusal"}
MAX_FILE = 4 << 20     # bytes read from any file the sandbox returns: a record, the output, the exit code
MAX_TEXT = 4000        # characters kept of any text in a record (an error message) before anything parses it
MAX_OUTPUT = 200_000   # characters kept of a run's output (its end), before anything searches it


def job_check(seed: int) -> JobCheck:
    """The check of exercise A.1 on the tiny problem, its sampler and model seeded with ``seed``."""
    from utils.checks.job import JobCheck, REPLAYED_OPTIMIZER
    job = {"epochs": JOB_EPOCHS, "global_batch": 12, "train_size": 100, "test_size": 60, "dropout": 0.5,
           "seed": seed, "difficulty": "standard"}
    return JobCheck("A.1", job, saved=SAVED, nodes=SCENARIOS["three"][0], refused_batch=REFUSED_BATCH,
                    optimizer=REPLAYED_OPTIMIZER, checkpoint_every_epoch=True)


def files(scenario: str) -> list[str]:
    """The files ``run`` writes for one scenario, relative to its folder (the grader keeps exactly these)."""
    nproc = sum(SCENARIOS[scenario][0])
    return ([f"{scenario}_code.txt", f"{scenario}_output.txt"] + [f"{scenario}_rank{r}.json" for r in range(nproc)]
            + ([f"{scenario}_{SAVED}"] if scenario in ("two", "three") else []))


def run(script: Path, folder: Path, seed: int) -> None:
    """Run every scenario of ``script`` and write what came back into ``folder`` (see ``files``)."""
    check, folder = job_check(seed), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    supervised.protect()
    for scenario, (nodes, changes, fail_rank, fail_at) in SCENARIOS.items():
        with tempfile.TemporaryDirectory(prefix="assessment-job-") as work:
            code, output, records = check.run_job(Path(script).resolve(), nodes, Path(work), fail_at=fail_at,
                                                  fail_rank=fail_rank, **changes)
            supervised.end_other_processes()   # in the grader's sandbox: nothing left by this run rewrites its files
            (folder / f"{scenario}_code.txt").write_text("timeout" if code is None else str(code))
            (folder / f"{scenario}_output.txt").write_text(output[-200_000:])
            for rank, record in records.items():
                (folder / f"{scenario}_rank{rank}.json").write_text(json.dumps(record))
            saved = Path(work) / "out" / SAVED
            if saved.is_file() and scenario in ("two", "three"):
                (folder / f"{scenario}_{SAVED}").write_bytes(saved.read_bytes())


def _read(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(MAX_FILE).decode("utf-8", "replace")


def _returned(folder: Path, scenario: str) -> tuple:
    """One scenario's exit code (None: timed out), output and records, as ``JobCheck.run_job`` gives them."""
    nproc = sum(SCENARIOS[scenario][0])
    code_file = folder / f"{scenario}_code.txt"
    if not code_file.is_file():
        raise Incorrect(f"A.1: the check of your script ({scenario}) did not finish within the grader's time limit")
    code_text = _read(code_file).strip()
    code = None if code_text == "timeout" else int(code_text)
    output = _read(folder / f"{scenario}_output.txt")[-MAX_OUTPUT:] if (folder / f"{scenario}_output.txt").is_file() else ""
    return code, output, _records(folder, f"{scenario}_", nproc)


def _records(folder: Path, prefix: str, nproc: int) -> dict:
    """The records ``<prefix>rank<r>.json`` that exist, by rank; a malformed one raises."""
    records = {}
    for rank in range(nproc):
        path = folder / f"{prefix}rank{rank}.json"
        if path.is_file():
            record = _cut_texts(json.loads(_read(path)))
            if not isinstance(record, dict) or str(record.get("rank")) != str(rank):
                raise ValueError(f"rank {rank}'s record is not a record of rank {rank}")
            records[rank] = record
    return records


def _cut_texts(value):
    """``value`` with every string in it cut to MAX_TEXT characters (walked without recursion: hostile input)."""
    cut = lambda v: v[:MAX_TEXT] if isinstance(v, str) else v   # noqa: E731
    value = cut(value)
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in list(item):
                item[key] = cut(item[key])
                stack.append(item[key])
        elif isinstance(item, list):
            item[:] = [cut(v) for v in item]
            stack.extend(item)
    return value


def judge(folder: Path, seed: int, load_state) -> dict[str, str | None]:
    """Criterion -> None when it holds, else why not, from the files ``run`` wrote into ``folder``.
    ``load_state(path)`` returns a checkpoint's state_dict or raises ``Incorrect`` saying why not."""
    check, folder = job_check(seed), Path(folder)
    verdicts: dict[str, str | None] = {}
    for scenario, (nodes, _, _, _) in SCENARIOS.items():
        name = CRITERION[scenario]
        if verdicts.get(name):
            continue
        try:
            code, output, records = _returned(folder, scenario)
            if scenario in ("failure", "refusal") and not _trains(folder):
                # A script that never trains "fails" when a rank fails and "refuses" every batch: no point for that.
                verdicts[name] = ("A.1: judged once your script trains on 2 processes (see the job criterion): "
                                  "a job that never trains cannot show that it fails or refuses for the right reason")
                continue
            if scenario in ("two", "three"):
                where = f" on {len(nodes)} node(s) ({' + '.join(map(str, nodes))} processes)"
                check.judge_training(code, output, records, sum(nodes), where,
                                     lambda: load_state(folder / f"{scenario}_{SAVED}"))
            elif scenario == "failure":
                check.judge_one_rank_failing(code, output, records)
            else:
                check.judge_refusal(code, output, records)
            verdicts.setdefault(name, None)
        except (Incorrect, NotSolved) as failed:
            verdicts[name] = str(failed)
        except Exception as error:  # noqa: BLE001 - files written in the sandbox: a malformed one fails, nothing more
            verdicts[name] = (f"A.1: what your script's run left ({scenario}) could not be read "
                              f"({type(error).__name__}: {error})"[:500])
    return verdicts


SET_EPOCH_LIMIT = 1000   # the run that counts: set_epoch values from 0 to this - 1 (see judge_counted_run)


def judge_counted_run(folder: Path, seed: int, checkpoints: Path, load_state=None) -> str | None:
    """None when the run that counts trained as the assessment sets it, else why not, from the records its
    processes left (``rank<r>.json`` in ``folder``, written by the probe with ``COURSE_PROBE_CALLS_ONLY``) at the
    ``seed`` it was given (its samplers must shuffle with it): the
    same judgement of what each rank called and did as the job criterion's, at the assessment's size, and
    (``judge_provenance``) whether the checkpoints in the folder ``checkpoints`` (``load_state(path)`` reads one,
    or returns None; default: ``torch.load``, for the notebook's own run) come from that training. Its checkpoints count only then: a script that trains
    one way under the check and another in this run gets nothing for the second."""
    from utils.checks.job import JobCheck, REPLAYED_OPTIMIZER

    from . import settings
    try:
        records = _records(Path(folder), "", settings.WORKERS)
        try:
            global_batch = counted_global_batch(records)
        except ValueError as why:
            return f"the run that counts: {why}"
        check = JobCheck("the run that counts", settings.counted_run(seed, global_batch),
                         saved=settings.checkpoint_name(settings.EPOCHS), optimizer=REPLAYED_OPTIMIZER,
                         checkpoint_every_epoch=True)
        check.judge_calls(records, settings.WORKERS)
        # set_epoch values far from the epochs (an offset that cancels the given seed: the sampler shuffles with seed
        # + value) would make every graded run the same pre-tuned run, whatever seed the grader gives
        values = sorted({value for rec in records.values() for sampler in _training_samplers(rec, check)
                         for value in sampler["iterated"]})
        if any(not 0 <= int(value) < SET_EPOCH_LIMIT for value in values):
            return (f"the run that counts: its samplers were read with set_epoch values {values[:5]}"
                    f"{' ...' if len(values) > 5 else ''}: the run's order must come from the seed it is given and the "
                    f"epoch (sampler.set_epoch(epoch)); values from 0 to {SET_EPOCH_LIMIT - 1} are accepted")
        why = judge_provenance(check, records, Path(checkpoints), load_state or _load_trusted_state)
        if why:
            return f"the run that counts: {why}"
    except (Incorrect, NotSolved) as failed:
        return str(failed)
    except Exception as error:  # noqa: BLE001 - files written in the sandbox: a malformed one fails, nothing more
        return f"the run that counts left records that could not be read ({type(error).__name__}: {error})"[:500]
    return None


def counted_global_batch(records: dict) -> int:
    """The global batch the run that counts was given: its ``--global-batch=N`` option, from the command line every
    rank's probe recorded (the same on every rank), checked against the assessment's range; else a ValueError."""
    from . import settings
    lines = {tuple(a for a in rec.get("argv") or () if isinstance(a, str)) for rec in records.values()}
    given = [a.split("=", 1)[1] for line in lines for a in line if a.startswith("--global-batch=")]
    if len(records) != settings.WORKERS or len(lines) != 1 or len(given) != 1 \
            or not (given[0].isascii() and given[0].isdigit()):
        raise ValueError("its records do not show one --global-batch=N given alike to every process, as the "
                         "notebook's cell for the run that counts gives it: run that cell as the course wrote it")
    return settings.check_global_batch(int(given[0]) if len(given[0]) <= 9 else 10 ** 9)


def counted_run_shape(folder: Path, seed: int) -> tuple[int, bool] | None:
    """(global batch, whether each epoch's last smaller batch was left out) of the run that counts whose records are
    in ``folder`` (a run ``judge_counted_run`` accepted), or None where the records do not show them."""
    from utils.checks.job import JobCheck, REPLAYED_OPTIMIZER

    from . import settings
    try:
        records = _records(Path(folder), "", settings.WORKERS)
        global_batch = counted_global_batch(records)
        check = JobCheck("the run that counts", settings.counted_run(seed, global_batch), optimizer=REPLAYED_OPTIMIZER)
        return global_batch, check._drops_last(records, settings.WORKERS)
    except Exception:  # noqa: BLE001 - records written in the sandbox: judge_counted_run says what is wrong
        return None


INPUT_TOLERANCE = 1e-4   # of a batch's summed magnitudes: its sum on another device or in another order differs by ~1e-6


def judge_provenance(check: JobCheck, records: dict, checkpoints: Path, load_state) -> str | None:
    """None when the run's checkpoints come from the training its records show, else why not (a run whose
    records passed ``judge_calls``). The probe noted digests of the model's weights when DDP wrapped them and of
    what each ``torch.save`` wrote, and the sum of every training forward's images: the weights must start from
    the seed's initialisation (as the check's one-process reference does), each checkpoint be the DDP model's
    weights saved after its epoch's optimizer steps, unchanged since, and every batch the course's images in the
    sampler's order. A script that loads weights trained elsewhere, saves another model, or trains on other
    images is refused here."""
    import torch

    from utils import models
    from utils.checks.job.check import _rank_batches
    from utils.checks.job.probe import state_digest
    from . import settings

    job, nproc = check.job, len(records)
    dataset = _training_set(check)
    torch.manual_seed(job["seed"])
    initial = state_digest(models.CNN(dataset.input_shape, dropout=job["dropout"]).state_dict())
    if records[0].get("initial") != initial:
        return ("the model's weights when DDP wrapped them on rank 0 were not the initialisation its seed gives "
                "(torch.manual_seed(seed), then the course's CNN built on the CPU and moved to the device, as the check's "
                "one-process reference starts): a run starts from those weights, not from weights loaded or trained "
                "before")
    per_rank, drop_last = job["global_batch"] // nproc, check._drops_last(records, nproc)
    epoch_values = {r: [v for sampler in _training_samplers(rec, check) for v in sampler["iterated"]]
                    for r, rec in records.items()}
    steps_per_epoch = len(check._expected_batches(nproc, drop_last)) // job["epochs"]
    saves = [entry for entry in records[0].get("saved", []) if isinstance(entry, dict)]
    for epoch in range(1, job["epochs"] + 1):
        name = settings.checkpoint_name(epoch)
        if not (checkpoints / name).is_file():
            continue                               # judge_checkpoints says what a missing one costs
        # Matched by content, not by the name saved to: a save to a temporary name renamed after is the same save.
        state = load_state(checkpoints / name)
        digest = None if state is None else state_digest(state)
        same = [entry for entry in saves if digest is not None and entry.get("digest") == digest]
        if not same:
            return (f"{name} is not what any torch.save of rank 0 wrote during the run: it was written another way, "
                    f"or changed after the save")
        if not any(entry.get("model") == digest for entry in same):
            return (f"what rank 0 saved as {name} was not the DDP model's weights at that moment: save "
                    f"ddp_model.module.state_dict() after each epoch")
        if not any(entry.get("model") == digest and entry.get("steps") == epoch * steps_per_epoch for entry in same):
            return (f"{name} was saved after {same[-1].get('steps')} optimizer steps; after epoch {epoch} the run has "
                    f"taken {epoch * steps_per_epoch} ({steps_per_epoch} per epoch): save each epoch's model under "
                    f"that epoch's name")
    for rank, rec in records.items():
        sums = rec.get("input_sums")
        images = [dataset.x_train[torch.tensor(batch)].double()
                  for value in epoch_values[rank]
                  for batch in _rank_batches(len(dataset.x_train), nproc, per_rank, value, job["seed"])[rank]
                  if not drop_last or len(batch) == per_rank]
        expected = [(float(x.sum()), float(x.abs().sum())) for x in images]
        if not isinstance(sums, list) or len(sums) != len(expected):
            return (f"rank {rank} recorded {len(sums) if isinstance(sums, list) else 'no'} training inputs for the "
                    f"{len(expected)} batches its sampler gave")
        for at, (got, (want, size)) in enumerate(zip(sums, expected)):
            if not isinstance(got, (int, float)) or not abs(got - want) <= INPUT_TOLERANCE * max(1.0, size):
                return (f"rank {rank}'s training forward {at + 1} (epoch {at // steps_per_epoch + 1}) was not given the "
                        f"course's images in its sampler's order (their pixels sum to {want:.6g}, its input's to "
                        f"{got if not isinstance(got, float) else f'{got:.6g}'}): train on the training set the "
                        f"assessment loads, in the order its DistributedSampler gives")
    return None


REPLAY_TOLERANCE = 0.05       # of how far an epoch moved the weights: how far a replayed epoch may end from the run's
REPLAY_FLOOR = 1e-5           # ... and at least this much (an epoch that hardly moved the weights)


def replay_counted_run(folder: Path, seed: int, checkpoints: Path, load_state) -> dict:
    """The run that counts taken again in one process, epoch by epoch, and compared with its checkpoints: a run
    ``judge_counted_run`` accepted (its records in ``folder``, its checkpoints in ``checkpoints``, read with
    ``load_state``). Each epoch starts from the seed's initialisation or the run's checkpoint before it and
    takes the optimizer steps the run recorded on the course's images in its samplers' order with the probe's
    dropout masks; what it ends with must match the run's checkpoint of that epoch within REPLAY_TOLERANCE of
    the epoch's own change. A run trained otherwise than its records show (gradients changed or replaced before
    a step, inputs changed after the probe read them, other labels, another dropout) ends elsewhere.

    Returns ``{"flag": None or what differed, with the evidence, "epochs": [{"epoch", "differs", "moved"}, ...],
    "replayed": whether it ran}``; the grader flags a differing run for the instructor and changes no points."""
    import torch

    from utils import models
    from utils.checks.job import JobCheck, REPLAYED_OPTIMIZER
    from . import settings

    records = _records(Path(folder), "", settings.WORKERS)
    global_batch = counted_global_batch(records)
    check = JobCheck("the run that counts", settings.counted_run(seed, global_batch), optimizer=REPLAYED_OPTIMIZER)
    steps, taken = records[0].get("steps") or [], records[0].get("optimizer_steps")
    if not steps or taken != len(steps):
        return {"flag": f"the run that counts could not be replayed: its records hold {len(steps)} of its {taken} "
                        f"optimizer steps", "epochs": [], "replayed": False}
    epochs = [value for sampler in _training_samplers(records[0], check) for value in sampler["iterated"]]
    if len(epochs) != settings.EPOCHS:
        return {"flag": f"the run that counts could not be replayed: its records hold {len(epochs)} of its "
                        f"{settings.EPOCHS} epochs", "epochs": [], "replayed": False}
    saved = [load_state(Path(checkpoints) / settings.checkpoint_name(e)) for e in range(1, len(epochs) + 1)]
    torch.manual_seed(check.job["seed"])
    initial = models.CNN(_training_set(check).input_shape, dropout=check.job["dropout"]).state_dict()
    # Each epoch from the run's checkpoint before it; after a missing or refused one, from where the replay got.
    starts = [initial, *saved[:-1]]
    compared, flag = [], None
    replay = check.replay_epochs(len(records), epochs, steps, check._drops_last(records, len(records)),
                                 starts.__getitem__, dataset=_training_set(check))
    replayed_before = initial
    for epoch, (start, ended, replayed) in enumerate(zip(starts, saved, replay), 1):
        start, replayed_before = (replayed_before if start is None else start), replayed
        if ended is None:
            continue                               # judge_checkpoints says what a missing one costs
        # Over all weights at once (Euclidean): rounding that flips a ReLU or a max-pooling choice moves a few
        # weights visibly, a run trained otherwise moves them all.
        moved = sum(float((ended[k].double() - start[k].double()).pow(2).sum()) for k in ended) ** 0.5
        differs = sum(float((ended[k].double() - replayed[k].double()).pow(2).sum()) for k in ended) ** 0.5
        compared.append({"epoch": epoch, "differs": differs, "moved": moved})
        if not math.isfinite(differs) or not math.isfinite(moved):   # NaN compares False: never read as a match
            flag = flag or (f"checkpoint {settings.checkpoint_name(epoch)} could not be compared with its replay: the "
                            f"distance is {differs} (the epoch moved the weights {moved}); the records hold settings "
                            f"or the checkpoint weights that are not finite numbers")
            continue
        if differs > max(REPLAY_FLOOR, REPLAY_TOLERANCE * moved) and flag is None:
            start_name = ("the seed's initialisation" if epoch == 1 else "the checkpoint before it"
                          if starts[epoch - 1] is not None else "where its replay of the epoch before ended")
            flag = (f"checkpoint {settings.checkpoint_name(epoch)} is not what its epoch's recorded steps give: taken "
                    f"again in one process from {start_name}, the epoch ends {differs:.3g} away from it (the epoch moved the "
                    f"weights {moved:.3g}, both distances over all weights; "
                    f"a run trained as its records show differs by rounding only, under {REPLAY_TOLERANCE:.0%} of that): "
                    f"it trained otherwise than its records show (gradients or inputs changed inside its steps)"
                    f"{_rounding_evidence(records[0])}")
    if not compared:
        flag = "the run that counts could not be replayed: none of its checkpoints could be read"
    return {"flag": flag, "epochs": compared, "replayed": bool(compared)}


def _rounding_evidence(record: dict) -> str:
    """What else rounded the run's steps unlike the replay (one thread, float32, the CPU), from the probe's record:
    the instructor weighs a flag on a GPU run, with TF32, or on several threads with that in mind."""
    numerics = record.get("numerics")
    if not isinstance(numerics, dict):
        return ""
    found = [text for key, text in (("cuda", "on a GPU"), ("tf32", "with TF32 on")) if numerics.get(key) is True]
    threads = numerics.get("threads")
    if isinstance(threads, int) and not isinstance(threads, bool) and threads > 1:
        found.append(f"on {threads} torch threads per process")
    return f"; the run trained {', '.join(found)}, which rounds otherwise than the replay" if found else ""


def _training_samplers(record: dict, check: JobCheck) -> list:
    """The rank's samplers over the training set (one over the test set, for an evaluation, reads other images)."""
    return [sampler for sampler in record["samplers"] if sampler.get("size") == check.job["train_size"]]


_TRAINING_SETS: dict = {}


def _training_set(check: JobCheck):
    """The run's images, made once per process for its settings (generating them takes seconds)."""
    key = tuple(sorted((k, v) for k, v in check.job.items() if k in ("train_size", "test_size", "difficulty", "dataset")))
    if key not in _TRAINING_SETS:
        _TRAINING_SETS.clear()
        _TRAINING_SETS[key] = check.dataset()
    return _TRAINING_SETS[key]


def _load_trusted_state(path: Path) -> dict | None:
    """A checkpoint of the notebook's own run (nothing hostile to guard against here; the grader passes its own)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - unreadable: not the file the run saved
        return None


def _trains(folder: Path) -> bool:
    """Whether the 2-process run ended well with every rank having trained (its records, however hostile)."""
    try:
        code, _, records = _returned(folder, "two")
        return code == 0 and len(records) == 2 and all(rec.get("batches") for rec in records.values())
    except Exception:  # noqa: BLE001 - unreadable files: it did not show that it trains
        return False


def _load_trusted(path: Path) -> dict:
    """A checkpoint this process's own check wrote (the notebook's check: nothing hostile to guard against)."""
    import torch

    if not path.is_file():
        raise Incorrect(f"A.1: no model was saved as {SAVED} in the folder given by --out: rank 0 must save "
                        f"ddp_model.module.state_dict() there after every epoch")
    return torch.load(path, map_location="cpu", weights_only=True)


def check_job(script, seed: int = 0) -> None:
    """The notebook's check of exercise A.1: the grader's scenarios and verdicts, run here."""
    script = Path(script)
    if not script.is_file():
        raise Incorrect(f"A.1: {script} does not exist yet: run the %%writefile cell above, which writes it")
    try:
        compile(script.read_text(), str(script), "exec")
    except SyntaxError as error:
        raise Incorrect(f"A.1: your script does not compile: line {error.lineno}: {error.msg}") from None
    with tempfile.TemporaryDirectory(prefix="assessment-check-") as folder:
        run(script, Path(folder), seed)
        verdicts = judge(Path(folder), seed, _load_trusted)
    from . import criteria
    failed = {name: why for name, why in verdicts.items() if why}
    for name, why in verdicts.items():
        print(f"{name:<8} {criteria.CRITERIA[name][0]} point(s): " + ("passed" if not why else "not yet"))
    if failed:
        unsolved = [why for why in failed.values() if "not solved yet" in why]
        raise (NotSolved if unsolved else Incorrect)("\n\n".join(f"[{name}] {why}" for name, why in failed.items()))
    print("\u2713 A.1: passed")   # as every other check says it, once every criterion above passed


def check_global_batch_choice(choose) -> int:
    """The notebook's check of exercise A.2: the global batch ``choose()`` returns, in the assessment's range."""
    from utils.checks import exercise

    from . import criteria, settings
    with exercise("A.2"):
        batch = settings.check_global_batch(choose())
    per_rank = batch // settings.WORKERS
    steps = criteria.steps_to_target(0, batch, settings.TRAIN_SIZE, settings.WORKERS)
    print(f"global batch {batch}: {per_rank} images per process a step, {steps} steps an epoch, "
          f"{criteria.modelled_seconds(steps, per_rank):.1f} s an epoch modelled")
    return batch


if __name__ == "__main__":   # the grader's sandbox: python -m assessment.job SCRIPT FOLDER SEED
    supervised.forget_working_folder()   # the script's folder: it may write modules there
    run(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
