"""The grader's readers of files a submission controls: the saved model (assessment.grader.model_file) and the
notebook (assessment.grader.submission.read). Every bad file is refused with its own message, and nothing but
ModelFileError / SubmissionError ever comes out.

Loading a model file starts a child that imports torch (3-10 s on a busy 2-core machine), so only what
needs the child (a correct file, the memory limit, the timeout) goes through it, in one shared fixture;
every kind of bad content is refused by the checks the child runs (model_file.load_and_check), called
here on files these tests wrote.
"""
import json
import os
import resource
import struct
import threading
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import nbformat
import psutil
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from assessment.grader import model_file
from assessment.grader.model_file import ModelFileError, load_state_dict
from assessment.grader.submission import INSTRUCTOR, Submission, SubmissionError, owned_cells, read, restore
from utils.models import CNN

GIB = 1 << 30


pytestmark = pytest.mark.slow   # real processes or notebooks: left out of make test-fast


def cnn_state() -> dict:
    """The same fresh CNN weights each call, leaving the global random state as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return CNN((1, 28, 28)).state_dict()


EXPECTED = {k: (tuple(v.shape), v.dtype) for k, v in cnn_state().items()}


# ---- helpers: zip archives written byte by byte (zipfile cannot write a lying one), memory watch ----

def write_zip(path, entries):
    """entries: (name, method, data, declared uncompressed size). CRCs are left 0: nothing here reads the data."""
    out, central = bytearray(), bytearray()
    for name, method, data, size in entries:
        raw, offset = name.encode(), len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, 0, len(data), size, len(raw), 0)
        out += raw + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0x21, 0, len(data), size,
                               len(raw), 0, 0, 0, 0, 0, offset) + raw
    start = len(out)
    out += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), start, 0)
    path.write_bytes(bytes(out))
    return path


def deflated_zeros(mib: int) -> bytes:
    """A raw deflate stream of ``mib`` MiB of zeros (~1 KB per MiB), built without compressing them all:
    after a sync flush, every further MiB of zeros compresses to the same bytes."""
    pack = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = pack.compress(bytes(1 << 20)) + pack.flush(zlib.Z_SYNC_FLUSH)
    more = pack.compress(bytes(1 << 20)) + pack.flush(zlib.Z_SYNC_FLUSH)
    return first + more * (mib - 1) + pack.flush()


def test_the_zip_bomb_helper_makes_what_it_says():
    stream = deflated_zeros(8)
    assert zlib.decompressobj(-15).decompress(stream) == bytes(8 << 20)
    assert len(deflated_zeros(1024)) < 1_100_000  # the bombs below are ~1 MB files that expand to 1 GiB


@contextmanager
def memory_growth():
    """Yields a dict that gets 'bytes': how far this process's RSS rose meanwhile (sampled, and the peak)."""
    me, box, stop = psutil.Process(), {}, threading.Event()
    start = me.memory_info().rss
    peak, max_before = [start], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def sample():
        while not stop.wait(0.002):
            peak[0] = max(peak[0], me.memory_info().rss)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        yield box
    finally:
        stop.set()
        watcher.join()
        max_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        box["bytes"] = max(peak[0] - start, max_after - max_before)


# ---- the model file: refused from the zip's directory, before anything is decompressed ----

def refused(path, expected=EXPECTED, **kw) -> str:
    with pytest.raises(ModelFileError) as caught:
        load_state_dict(path, expected, **kw)
    return str(caught.value)


def test_an_honest_zip_bomb_is_refused_without_expanding(tmp_path):
    bomb = write_zip(tmp_path / "bomb.pt", [("archive/data/0", zipfile.ZIP_DEFLATED, deflated_zeros(1024), GIB)])
    assert bomb.stat().st_size < 1_100_000
    with memory_growth() as grew:
        message = refused(bomb)
        # Weights that really take 1 GiB: the size caps allow it, the compression ratio does not.
        big = refused(bomb, {"w": ((GIB // 4,), torch.float32)})
    assert grew["bytes"] < 100e6
    assert "zip bomb" in message and "expands" in message and "1073.7 MB" in message
    assert "zip bomb" in big and "expands" in big


def test_a_zip_bomb_that_lies_about_its_size_is_refused_without_expanding(tmp_path):
    # A real torch.save archive whose largest record is swapped for 1 GiB of zeros declared as its true size:
    # torch's own reader would stop at the declared size, but the lie itself is enough to refuse it.
    torch.save(cnn_state(), tmp_path / "real.pt")
    entries = []
    with zipfile.ZipFile(tmp_path / "real.pt") as real:
        for info in real.infolist():
            data = real.read(info)
            lie = info.filename.endswith("data/4")
            entries.append((info.filename, 8 if lie else 0, deflated_zeros(1024) if lie else data, len(data)))
    bomb = write_zip(tmp_path / "lying.pt", entries)
    with memory_growth() as grew:
        message = refused(bomb)
    assert grew["bytes"] < 100e6
    assert "declares 147456 bytes but holds" in message and "declared size is false" in message


def test_files_that_cannot_be_a_state_dict_are_refused_before_loading(tmp_path):
    def stored(name, size):
        return (name, zipfile.ZIP_STORED, bytes(size), size)
    (tmp_path / "random.pt").write_bytes(os.urandom(1000))
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "huge.pt").write_bytes(bytes(3_000_000))
    (tmp_path / "folder.pt").mkdir()
    (tmp_path / "link.pt").symlink_to("/dev/zero")
    cases = {
        "random.pt": "not a zip archive",
        "empty.pt": "is empty (was the saving interrupted?)",
        "huge.pt": "the model file is 3.0 MB, but the model's weights take 0.2 MB",
        "folder.pt": "is a link or not a regular file",
        "link.pt": "is a link or not a regular file",
        "missing.pt": "there is no model file",
    }
    write_zip(tmp_path / "many.pt", [stored(f"a/{i}", 1) for i in range(400)])
    cases["many.pt"] = "has 400 entries; a state_dict of 8 tensors has at most 308"
    write_zip(tmp_path / "entry.pt", [stored("a/data.pkl", 2_000_000)])
    cases["entry.pt"] = "declares 2.0 MB, more than the model's largest tensor"
    write_zip(tmp_path / "total.pt", [stored("a/0", 700_000), stored("a/1", 700_000)])
    cases["total.pt"] = "entries declare 1.4 MB in all, but the model's weights take 0.2 MB"
    write_zip(tmp_path / "bzip.pt", [("a/data.pkl", zipfile.ZIP_BZIP2, b"x" * 10, 10)])
    cases["bzip.pt"] = "compressed with method 12, which torch.load cannot read"
    write_zip(tmp_path / "stored.pt", [("a/data.pkl", zipfile.ZIP_STORED, b"x" * 10, 5000)])
    cases["stored.pt"] = "stored uncompressed, yet its sizes differ"
    for name, words in cases.items():
        message = refused(tmp_path / name)
        assert words in message, (name, message)
        assert "torch.save" in message  # and what to save instead
    assert len({refused(tmp_path / name) for name in cases}) == len(cases)


# ---- the model file's contents: the checks the child makes, run here on files these tests wrote ----

class Payload:
    """Unpickling this runs os.mkdir: weights_only must refuse it before it can."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def with_value(key, value) -> dict:
    state = cnn_state()
    state[key] = value
    return state


def content_cases(tmp_path):
    state = cnn_state()
    nan = state["fc1.weight"].clone()
    nan[3, 5] = float("nan")
    quantized = torch.quantize_per_tensor(state["fc2.bias"], 0.1, 0, torch.qint8)
    missing = {k: v for k, v in state.items() if k != "fc2.bias"}
    return {
        "sparse": (with_value("fc2.weight", state["fc2.weight"].to_sparse()), "fc2.weight is a sparse_coo tensor"),
        "meta": (with_value("fc2.bias", torch.empty(10, device="meta")), "fc2.bias is a meta tensor"),
        "quantized": (with_value("fc2.bias", quantized), "fc2.bias is a quantized tensor (qint8)"),
        "nested": (with_value("fc2.bias", torch.nested.nested_tensor([torch.zeros(3), torch.zeros(7)])),
                   "fc2.bias is a nested tensor"),
        "dtype": (with_value("fc1.weight", state["fc1.weight"].double()),
                  "fc1.weight is float64, the model's is float32: convert the model back first (e.g. model.float())"),
        "shape": (with_value("fc1.weight", torch.zeros(64, 288)),
                  "fc1.weight has shape (64, 288), the model's has (128, 288)"),
        "extra": (with_value("fc3.weight", torch.zeros(3)), "it has fc3.weight, which the model does not"),
        "missing": (missing, "it lacks fc2.bias"),
        "ddp": ({f"module.{k}": v for k, v in state.items()}, "every name starts with 'module.'"),
        "nan": (with_value("fc1.weight", nan), "fc1.weight holds NaN or infinite values (1 of 36864)"),
        "not a tensor": (with_value("fc2.bias", 3), "holds a value of type int under fc2.bias, not a tensor"),
        "not a dict": (list(state.values()), "holds a value of type list, not a state_dict"),
        "whole model": (CNN((1, 28, 28)), "GLOBAL utils.models.CNN"),
        "payload": (with_value("fc2.bias", Payload(str(tmp_path / "pwned"))), "GLOBAL posix.mkdir"),
    }


def test_every_bad_content_is_refused_with_its_own_message(tmp_path):
    messages = set()
    for name, (obj, words) in content_cases(tmp_path).items():
        torch.save(obj, tmp_path / f"{name}.pt")
        state, why = model_file.load_and_check(tmp_path / f"{name}.pt", EXPECTED)
        assert state is None and words in why, (name, why)
        messages.add(why)
    with zipfile.ZipFile(tmp_path / "other.pt", "w") as other:  # a zip, but not one torch.save wrote
        other.writestr("notes.txt", "hello")
    state, why = model_file.load_and_check(tmp_path / "other.pt", EXPECTED)
    assert state is None and "could not be read by torch.load" in why
    assert len(messages | {why}) == len(content_cases(tmp_path)) + 1
    assert not (tmp_path / "pwned").exists()  # the __reduce__ payload never ran


# ---- the model file end to end: the child process, its limits, and what comes back ----

@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """name -> what load_state_dict returned or raised, for files run through the real child process.

    Each child costs a torch import (3-10 s on a busy 2-core machine): the refusals of each kind of
    content are tested above, on the same checks run in this process; here, only what needs the child."""
    folder = tmp_path_factory.mktemp("model-files")
    torch.save(cnn_state(), folder / "good.pt")
    torch.save({"w": torch.zeros(8 << 20)}, folder / "big.pt")  # 32 MiB to load, against an 8 MiB limit
    runs = {"good": ("good.pt", EXPECTED, {}),
            "memory": ("big.pt", {"w": ((8 << 20,), torch.float32)}, {"memory_bytes": 8 << 20}),
            "slow": ("good.pt", EXPECTED, {"timeout_s": 0.2})}

    def run(name):
        file, expected, options = runs[name]
        try:
            return load_state_dict(folder / file, expected, **options)
        except Exception as error:  # kept, not raised: the tests check its type
            return error

    # A thread each, at once: concurrent loads keep apart, and each thread's loader is a new child, so "slow"
    # pays a torch import (seconds) against its 0.2 s limit whatever ran before it.
    with ThreadPoolExecutor(len(runs)) as pool:
        return dict(zip(runs, pool.map(run, runs)))


def test_one_loader_serves_file_after_file_and_a_refusal_does_not_end_it(tmp_path):
    """The grader loads up to 8 checkpoints per submission: one child imports torch once for all of them."""
    torch.save(cnn_state(), tmp_path / "good.pt")
    torch.save({"w": torch.zeros(8 << 20)}, tmp_path / "big.pt")
    first = load_state_dict(tmp_path / "good.pt", EXPECTED)
    loader = model_file._loaders.loader
    with pytest.raises(ModelFileError, match="needs more memory"):
        load_state_dict(tmp_path / "big.pt", {"w": ((8 << 20,), torch.float32)}, memory_bytes=8 << 20)
    again = load_state_dict(tmp_path / "good.pt", EXPECTED)
    assert all(torch.equal(first[k], again[k]) for k in first)
    with pytest.raises(ModelFileError, match="took longer than 0.001 s"):
        load_state_dict(tmp_path / "good.pt", EXPECTED, timeout_s=0.001)
    assert not model_file._loaders.loader.alive(), "a loader that timed out is ended"
    load_state_dict(tmp_path / "good.pt", EXPECTED)   # and the next file gets a fresh one
    assert model_file._loaders.loader.alive() and model_file._loaders.loader is not loader


def test_a_correct_state_dict_comes_back_equal_as_plain_tensors(loaded):
    state, saved = loaded["good"], cnn_state()
    assert isinstance(state, dict) and list(state) == list(saved)
    for key, value in saved.items():
        assert type(state[key]) is torch.Tensor and state[key].is_contiguous() and state[key].device.type == "cpu"
        assert state[key].dtype == value.dtype and torch.equal(state[key], value)
    model = CNN((1, 28, 28))
    model.load_state_dict(state)  # what the grader does next


@pytest.mark.parametrize("name, words", [
    ("memory", "needs more memory than the grader allows"),
    ("slow", "took longer than 0.2 s and was stopped"),
])
def test_the_child_refuses_with_its_own_message(loaded, name, words):
    assert isinstance(loaded[name], ModelFileError), loaded[name]
    assert words in str(loaded[name]) and "torch.save" in str(loaded[name])


def test_a_crashed_or_failing_child_is_a_model_file_error(tmp_path, monkeypatch):
    torch.save(cnn_state(), tmp_path / "good.pt")

    def answer(returncode, stdout="", stderr="no message"):   # what the loader's child gave back
        monkeypatch.setattr(model_file._Loader, "ask", lambda self, request, timeout_s: (returncode, stdout, stderr))
        return refused(tmp_path / "good.pt")

    assert "was killed (likely over the memory limit of 1024 MiB)" in answer(-9)
    assert "crashed (SIGSEGV)" in answer(-11)
    assert "exit status 1: Fatal Python error" in answer(1, "", "Fatal Python error: Aborted")
    size = sum(v.numel() * v.element_size() for v in cnn_state().values())
    assert f"loader wrote 0 bytes, not {size}" in answer(None, '{"ok": true}\n')  # it said ok but wrote nothing

    def fail(*args, **kwargs):
        raise OSError(24, "Too many open files")
    monkeypatch.setattr(model_file, "_loader", fail)
    assert "could not be checked (OSError" in refused(tmp_path / "good.pt")


def test_a_child_that_really_dies_is_named_and_replaced(tmp_path):
    torch.save(cnn_state(), tmp_path / "good.pt")
    load_state_dict(tmp_path / "good.pt", EXPECTED)
    model_file._loaders.loader.proc.kill()   # as the kernel's OOM killer would, between two files
    model_file._loaders.loader.proc.wait()
    assert set(load_state_dict(tmp_path / "good.pt", EXPECTED)) == set(EXPECTED)   # a new child took over


# ---- the notebook: strict reading before nbformat ----

def instructor_json() -> dict:
    return json.loads(INSTRUCTOR.read_text())


def edited(edit) -> str:
    nb = instructor_json()
    edit(nb)
    return json.dumps(nb)


def cell_set(field, value, index=3) -> str:
    return edited(lambda nb: nb["cells"][index].__setitem__(field, value))


def cell_pop(field) -> str:
    return edited(lambda nb: nb["cells"][3].pop(field))


def top_set(field, value) -> str:
    return edited(lambda nb: nb.__setitem__(field, value))


def malformed_notebooks() -> dict:
    """name -> (the file's content, words its refusal must hold)."""
    return {
        "top-level list": ("[1, 2]", "is JSON but not a notebook (it is a JSON list, not an object with cells)"),
        "cells a dict": (top_set("cells", {}), "it has no list of cells). Save it"),
        "cell a string": (edited(lambda nb: nb["cells"].__setitem__(2, "x")), "cell 2 of the notebook is of type str"),
        "no cell_type": (cell_pop("cell_type"), "cell 3 of the notebook has no cell_type"),
        "cell_type int": (cell_set("cell_type", 3), "has cell_type 3; a cell is code, markdown or raw"),
        "cell_type name": (cell_set("cell_type", "python"), "has cell_type 'python'; a cell is"),
        "source int": (cell_set("source", 5), "has a source of type int, not text"),
        "source list": (cell_set("source", ["a", 1]), "has a source of type list, not text"),
        "no source": (cell_pop("source"), "cell 3 of the notebook has no source"),
        "id int": (cell_set("id", 7), "has an id of type int, not a string"),
        "metadata list": (cell_set("metadata", []), "has metadata of type list, not a JSON object"),
        "no metadata": (cell_pop("metadata"), "cell 3 of the notebook has no metadata"),
        "outputs dict": (cell_set("outputs", {}), "has outputs of type dict, not a list"),
        "format string": (top_set("nbformat", "4"), "is in format '4', not format 4"),
        "format 3": (top_set("nbformat", 3), "is in format 3, not format 4"),
        "no format": (edited(lambda nb: nb.pop("nbformat")), "is in format None, not format 4"),
        "minor string": (top_set("nbformat_minor", "5"), "nbformat_minor is not a whole number"),
        "top metadata": (top_set("metadata", "x"), "the notebook has no metadata (a JSON"),
        "many cells": (edited(lambda nb: nb.__setitem__("cells", nb["cells"] * 60)),   # over MAX_CELLS
                       f"has {60 * len(nbformat.read(INSTRUCTOR, as_version=4).cells)} cells; the grader"),
        "long source": (cell_set("source", "x" * 2_000_001), "more than 2,000,000 characters of source"),
        "lone surrogate": (cell_set("source", "\ud800"), "holds characters that are not valid Unicode text"),
        "not utf-8": ('{"cells": []}'.encode("utf-16"), "it is not UTF-8 text"),
        "not json": ('{"cells": [', "it is not valid JSON (Expecting value"),
        "100000 deep": ("[" * 100000 + "]" * 100000, "its JSON nests too deeply to read"),
        "150 deep": (edited(lambda nb: nb["metadata"].__setitem__("x", json.loads("[" * 150 + "]" * 150))),
                     "nests more than 100 levels deep"),
        "5000 digits": ('{"cells": [], "x": ' + "7" * 5000 + "}", "holds a number too long to read (over 4300"),
        "30 MB": (edited(lambda nb: nb["metadata"].__setitem__("x", "y" * 30_000_000)),
                  "the notebook file is 30.0 MB; the grader reads at most 20 MB. Clear the outputs"),
    }


def test_every_malformed_notebook_is_a_submission_error_with_its_own_message(tmp_path):
    messages, cases = set(), malformed_notebooks()
    for name, (content, words) in cases.items():
        path = tmp_path / "submission.ipynb"
        path.write_bytes(content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content)
        with pytest.raises(SubmissionError) as caught:
            read(path)
        assert words in str(caught.value), (name, str(caught.value))
        messages.add(str(caught.value))
    assert len(messages) == len(cases)
    (tmp_path / "folder.ipynb").mkdir()
    with pytest.raises(SubmissionError, match="is not a regular file"):
        read(tmp_path / "folder.ipynb")


def test_a_notebook_jupyter_saved_still_reads():
    nb = nbformat.read(INSTRUCTOR, as_version=4)
    assert [c.id for c in read(INSTRUCTOR).cells] == [c.id for c in nb.cells]
    assert isinstance(restore(INSTRUCTOR), Submission)


# Random JSON, mostly a notebook with one field spoilt, so that much of it gets past read() into restore().
IDS = sorted({c["id"] for c in instructor_json()["cells"]} | {"x"})
OWNED = owned_cells(nbformat.read(INSTRUCTOR, as_version=4))
anything = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3), max_leaves=8)
odd = anything | st.just("\udc80")  # a lone surrogate: valid JSON ("\\udc80"), not valid text


def spoil(thing: dict, key: str, value, drop: bool) -> dict:
    thing = dict(thing)
    if drop:
        thing.pop(key, None)
    else:
        thing[key] = value
    return thing


good_cells = st.fixed_dictionaries({
    "cell_type": st.sampled_from(["code", "markdown", "raw"]), "id": st.sampled_from(IDS),
    "source": st.text(max_size=20) | st.lists(st.text(max_size=5), max_size=3),
    "metadata": st.just({}), "outputs": st.just([]), "execution_count": st.none()})
cells = good_cells | st.builds(spoil, good_cells, st.sampled_from(
    ["cell_type", "id", "source", "metadata", "outputs", "execution_count"]), odd, st.booleans()) | anything
good_notebooks = st.fixed_dictionaries({"cells": st.lists(cells, max_size=8), "nbformat": st.just(4),
                                        "nbformat_minor": st.just(5), "metadata": st.just({})})
notebooks = good_notebooks | st.builds(spoil, good_notebooks, st.sampled_from(
    ["cells", "nbformat", "nbformat_minor", "metadata"]), odd, st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=notebooks.map(json.dumps) | anything.map(json.dumps) | st.binary(max_size=64))
def test_restore_raises_only_submission_error_for_any_json(tmp_path_factory, content):
    path = tmp_path_factory.getbasetemp() / "fuzz.ipynb"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass"))
    try:
        submission = restore(path)
    except SubmissionError as error:
        assert str(error)
        return
    assert isinstance(submission, Submission) and set(submission.answers) <= set(OWNED)
    nbformat.writes(submission.restored).encode("utf-8")  # the grader can write out what it runs


# ---- the script's runs: files written inside the sandbox, read by the grader ----

def _returned_files(folder, scenario="two", records=None, code="0"):
    from assessment import job
    folder.mkdir(exist_ok=True)
    (folder / f"{scenario}_code.txt").write_text(code)
    (folder / f"{scenario}_output.txt").write_text("")
    for rank, record in (records or {}).items():
        (folder / f"{scenario}_rank{rank}.json").write_text(record)
    return job


def _no_state(path):
    raise AssertionError("the judge loaded a checkpoint of a run that had already failed")


def test_records_the_script_forged_or_broke_fail_the_criterion_with_a_reason(tmp_path):
    """Each file comes from the sandbox: whatever it holds, the criterion fails with a reason, and nothing else."""
    cases = {
        "not json": {0: "{not json", 1: "{}"},
        "a list": {0: "[1, 2]", 1: "[]"},
        "another rank's": {0: json.dumps({"rank": "1"}), 1: json.dumps({"rank": "1"})},
        "fields missing": {0: json.dumps({"rank": "0"}), 1: json.dumps({"rank": "1", "forged": True})},
        "deep": {0: "[" * 50_000 + "]" * 50_000, 1: "{}"},
        "huge": {0: '{"rank": "0", "printed": "' + "x" * (8 << 20) + '"}', 1: "{}"},
    }
    for name, records in cases.items():
        job = _returned_files(tmp_path / name.replace(" ", "_"), records=records)
        verdicts = job.judge(tmp_path / name.replace(" ", "_"), 0, _no_state)
        assert verdicts["job"] and verdicts["job"].startswith("A.1:"), (name, verdicts)
        assert verdicts["failure"] and verdicts["refusal"], (name, verdicts)   # not run: no file, no point
    job = _returned_files(tmp_path / "code", code="rm -rf /")
    assert "could not be read" in job.judge(tmp_path / "code", 0, _no_state)["job"]
    for name, records in cases.items():    # the same files as the run that counts left them
        folder = tmp_path / f"counted_{name.replace(' ', '_')}"
        folder.mkdir()
        for rank, record in records.items():
            (folder / f"rank{rank}.json").write_text(record)
        verdict = job.judge_counted_run(folder, 0, folder)
        assert verdict and verdict.startswith("the run that counts"), (name, verdict)


def test_a_tiny_jobs_checkpoint_is_loaded_as_untrusted_input(tmp_path):
    """A zip bomb saved by the script's rank 0 is refused by model_file before it expands."""
    from assessment.grader import grade
    entries = [(f"archive/data/{i}", zipfile.ZIP_DEFLATED, deflated_zeros(256), 256 << 20) for i in range(8)]
    write_zip(tmp_path / "bomb.pt", [("archive/data.pkl", zipfile.ZIP_STORED, b"x", 1), *entries])
    from utils.checks import Incorrect
    with memory_growth() as grew, pytest.raises(Incorrect, match="A.1: bomb.pt was refused"):
        grade.load_job_state(tmp_path / "bomb.pt")
    assert grew["bytes"] < 100e6
    with pytest.raises(Incorrect, match="no model was saved"):
        grade.load_job_state(tmp_path / "nowhere.pt")


# Found by an outside test: one trained model saved under every epoch's name passed "two evaluations in a
# row". Every checkpoint is loaded for real (model_file's child); only the accuracy is stood in for, so
# that no test has to train a model to the target.
def _checkpoints(folder, states):
    from assessment import settings
    folder.mkdir()
    for epoch, state in enumerate(states, 1):
        if state is not None:
            torch.save(state, folder / settings.checkpoint_name(epoch))
    return folder


def _accuracy_by_first_weight(state, seed):
    return float(state["conv1.bias"][0])   # each test model carries its accuracy in one weight


@pytest.fixture
def checks_in_process(monkeypatch):
    """The grader's checkpoint rules with each file checked in this process (``model_file.load_and_check``, the
    child's own checks) instead of a child that imports torch: the child itself is tested above."""
    def load_state_dict(path, expected, **limits):
        state, why = model_file.load_and_check(path, expected)
        if why:
            raise ModelFileError(why)
        return state
    monkeypatch.setattr(model_file, "load_state_dict", load_state_dict)


def _model(accuracy):
    from utils import models
    state = models.CNN((1, 28, 28)).state_dict()
    state["conv1.bias"][0] = accuracy
    return state


def test_one_model_under_every_name_is_one_evaluation_not_two(tmp_path, monkeypatch, checks_in_process):
    from assessment import settings
    from assessment.grader import grade
    monkeypatch.setattr(settings, "EPOCHS", 4)   # the rule, not the count
    monkeypatch.setattr(grade, "accuracy_on_fresh_images", _accuracy_by_first_weight)
    good = _model(0.99)
    passed, why = grade.judge_checkpoints(_checkpoints(tmp_path / "same", [good] * settings.EPOCHS), 0)
    assert not passed and "same as before" in why and "not a new evaluation" in why, why
    states = [_model(0.05)] + [_model(0.9 + epoch / 100) for epoch in range(1, settings.EPOCHS)]
    passed, why = grade.judge_checkpoints(_checkpoints(tmp_path / "trained", states), 0)
    assert passed == 2 and "after epochs 2 and 3" in why, why    # the first epoch of the held pair: the speed rule's


def test_refused_checkpoints_say_why_and_missing_ones_break_the_run(tmp_path, monkeypatch, checks_in_process):
    from assessment import settings
    from assessment.grader import grade
    monkeypatch.setattr(settings, "EPOCHS", 4)   # the rule, not the count
    monkeypatch.setattr(grade, "accuracy_on_fresh_images", _accuracy_by_first_weight)
    wrapped = [{f"module.{k}": v for k, v in _model(0.9).items()}] * settings.EPOCHS
    passed, why = grade.judge_checkpoints(_checkpoints(tmp_path / "ddp", wrapped), 0)
    assert not passed and "every checkpoint in checkpoints/ was refused" in why and "module." in why, why
    gaps = [_model(0.9), None] + [_model(0.95)] * (settings.EPOCHS - 2)
    passed, why = grade.judge_checkpoints(_checkpoints(tmp_path / "gap", gaps), 0)
    assert not passed and "missing" in why and "breaks the run" in why, why
    passed, why = grade.judge_checkpoints(tmp_path / "nowhere", 0)
    assert not passed and "saved no checkpoint" in why, why
    assert f"epoch_01.pt to {settings.checkpoint_name(settings.EPOCHS)}" in why, why


def test_a_run_that_reaches_the_target_and_then_collapses_has_not_held_it(tmp_path, monkeypatch, checks_in_process):
    """Recorded: linear scaling with warm-up, seed 4, was over the target for epochs and ended at chance."""
    from assessment import criteria, settings
    from assessment.grader import grade
    monkeypatch.setattr(settings, "EPOCHS", 4)
    monkeypatch.setattr(grade, "accuracy_on_fresh_images", _accuracy_by_first_weight)
    above, chance = settings.TARGET + 0.05, 0.1
    states = [_model(0.05), _model(above), _model(above + 0.01), _model(chance)]
    passed, why = grade.judge_checkpoints(_checkpoints(tmp_path / "collapsed", states), 0)
    assert not passed and "after epochs 2 and 3" in why and f"not at the floor {settings.FLOOR:.2f}" in why, why
    # the rule alone, as the notebook's verdict uses it: the floor counts only the last checkpoint
    assert criteria.target_held([0.1, 0.7, 0.7, 0.55], 0.6, 0.5) == (2, "")
    assert criteria.target_held([0.1, 0.7, 0.7, 0.45], 0.6, 0.5)[0] is None
    assert criteria.target_held([0.1, 0.7, None, 0.7, 0.7], 0.6, 0.5) == (4, "")
    assert criteria.target_held([0.7, 0.7, 0.7, None], 0.6, 0.5)[0] is None
    assert "two consecutive" in criteria.target_held([0.7, 0.5, 0.7], 0.6, 0.5)[1]


def test_checkpoints_not_from_the_recorded_training_are_refused_with_their_own_message(tmp_path):
    """``job.judge_provenance`` on the files a run left (the real probe's records of forged runs are in
    tests/test_assessment_job.py): a run's records and checkpoints made to agree pass; a checkpoint rewritten
    after its save, one no torch.save wrote, and input sums that are not numbers are each refused."""
    from assessment import job, settings
    from utils.checks.job.check import JobCheck, REPLAYED_OPTIMIZER, _rank_batches
    from utils.checks.job.probe import state_digest

    seed = 3
    check = JobCheck("the run that counts", settings.counted_run(seed), optimizer=REPLAYED_OPTIMIZER,
                     checkpoint_every_epoch=True)
    run, dataset = check.job, check.dataset()
    per_rank, epochs = run["global_batch"] // settings.WORKERS, list(range(run["epochs"]))
    torch.manual_seed(seed)
    model = CNN(dataset.input_shape, dropout=run["dropout"])
    records = {rank: {"rank": str(rank), "initial": state_digest(model.state_dict()), "saved": [],
                      "samplers": [{"size": run["train_size"], "iterated": epochs}], "batches": [], "input_sums": []}
               for rank in range(settings.WORKERS)}
    for rank, rec in records.items():
        for epoch in epochs:
            for batch in _rank_batches(len(dataset.x_train), settings.WORKERS, per_rank, epoch, seed)[rank]:
                rec["batches"].append(len(batch))
                rec["input_sums"].append(float(dataset.x_train[torch.tensor(batch)].sum()))
    steps = len(records[0]["batches"]) // len(epochs)
    for epoch in epochs:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)            # a model that changes from epoch to epoch
        torch.save(model.state_dict(), tmp_path / settings.checkpoint_name(epoch + 1))
        digest = state_digest(model.state_dict())
        records[0]["saved"].append({"file": settings.checkpoint_name(epoch + 1), "steps": (epoch + 1) * steps,
                                    "digest": digest, "model": digest})
    assert job.judge_provenance(check, records, tmp_path, job._load_trusted_state) is None

    first = tmp_path / settings.checkpoint_name(1)
    kept = first.read_bytes()
    torch.save(cnn_state(), first)          # a friend's model written over the saved file
    assert "epoch_01.pt is not what any torch.save of rank 0 wrote" in job.judge_provenance(
        check, records, tmp_path, job._load_trusted_state)
    first.write_bytes(b"not a checkpoint")
    assert "is not what any torch.save" in job.judge_provenance(check, records, tmp_path, job._load_trusted_state)
    first.write_bytes(kept)
    saved = records[0]["saved"].pop(1)      # a checkpoint no torch.save of the run wrote (copied in)
    assert "epoch_02.pt is not what any torch.save of rank 0 wrote" in job.judge_provenance(
        check, records, tmp_path, job._load_trusted_state)
    records[0]["saved"].insert(1, dict(saved, file="epoch_02.pt.tmp"))   # saved to a temporary name, renamed after
    assert job.judge_provenance(check, records, tmp_path, job._load_trusted_state) is None
    records[0]["samplers"].append({"size": len(dataset.x_test), "iterated": epochs})   # a test-set sampler: not training
    assert job.judge_provenance(check, records, tmp_path, job._load_trusted_state) is None
    for forged in (float("nan"), "1.0", None):
        records[1]["input_sums"][5] = forged
        assert "rank 1's training forward 6 (epoch 1) was not given the course's images" in job.judge_provenance(
            check, records, tmp_path, job._load_trusted_state)
    records[1]["input_sums"] = "unknown (RuntimeError)"
    assert "rank 1 recorded no training inputs" in job.judge_provenance(check, records, tmp_path, job._load_trusted_state)


def test_the_probes_digest_never_fails_a_save_whatever_is_saved(tmp_path):
    """The probe digests whatever a script saves (an outside test saved sparse weights, and its save then raised in
    the probe): anything but a dict of dense tensors named by strings has no digest; weights and the file they were
    saved to have the same one."""
    from utils.checks.job.probe import state_digest
    state = cnn_state()
    torch.save(state, tmp_path / "w.pt")
    assert state_digest(state) == state_digest(torch.load(tmp_path / "w.pt", weights_only=True)) is not None
    assert state_digest({k: v.clone() for k, v in state.items()}) == state_digest(state)
    changed = dict(state, **{"conv1.bias": state["conv1.bias"] + 1e-7})
    assert state_digest(changed) != state_digest(state)
    odd = [{k: v.to_sparse() for k, v in state.items()}, {1: torch.ones(2)}, {"w": [torch.ones(2)]}, {}, [state],
           {"w": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)},
           {"w": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])}]
    assert [state_digest(value) for value in odd] == [None] * len(odd)
