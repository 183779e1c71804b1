"""Loads the model file a submission saved (a ``torch.save``d state_dict) as untrusted input.

    load_state_dict(path, expected) -> {name: tensor}, or ModelFileError saying what is wrong

The file comes out of the learner's sandbox and may be anything: a zip bomb, a pickle that runs
code, tensors that are not plain numbers. Three layers, each cheap:

1. Here, before anything is decompressed or unpickled: the file's size, and the zip archive's
   central directory (entry count, each entry's declared size, the total, compression ratios)
   against caps derived from the tensors the grader expects.
2. In a child process (this file run as a script) under RLIMIT_AS and a wall timeout per file:
   ``torch.load(weights_only=True)`` (no code is unpickled), then every check on the contents.
   The child writes back only the tensors' raw bytes, in the expected order. It serves one file
   after another (one per thread of the caller), so torch is imported once, not once per file.
3. Here again: the bytes become tensors of the expected shapes and dtypes (so nothing the child
   produced is unpickled in the grader) and are checked for finite values once more.
"""
from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
import zipfile
from pathlib import Path

PICKLE_SLACK = 1 << 20    # bytes allowed beyond the tensors' own: data.pkl, version records, names
EXTRA_ENTRIES = 300       # entries allowed beyond one per tensor (torch.save writes 6 small records)
MAX_RATIO = 100           # deflate shrinks real weights < 2x; a zip bomb shrinks zeros ~1000x
RATIO_FLOOR = 1 << 20     # entries smaller than this may have any ratio: they cannot be a bomb
_SAVE = ("Save the trained model's state_dict() with torch.save (model.module.state_dict() for a model wrapped in "
         "DistributedDataParallel) and leave the file as torch.save wrote it.")


class ModelFileError(ValueError):
    """The model file cannot be used; the message says why and what to save instead, for the learner."""


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def _check_archive(path: Path, expected: dict) -> None:
    """Refuse, from the zip's central directory alone, anything that could not be these tensors."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise ModelFileError(f"there is no model file ({path.name}). {_SAVE}") from None
    if not stat.S_ISREG(info.st_mode):  # a link or a FIFO could point the grader at /dev/zero
        raise ModelFileError(f"the model file {path.name} is a link or not a regular file. {_SAVE}")
    if info.st_size == 0:
        raise ModelFileError(f"the model file {path.name} is empty (was the saving interrupted?). {_SAVE}")
    tensors = sum(_nbytes(shape, dtype) for shape, dtype in expected.values())
    largest = max((_nbytes(shape, dtype) for shape, dtype in expected.values()), default=0)
    max_total = tensors + PICKLE_SLACK
    max_file = max_total + PICKLE_SLACK  # zip headers and torch's 64-byte alignment padding
    if info.st_size > max_file:
        raise ModelFileError(f"the model file is {_mb(info.st_size)}, but the model's weights take {_mb(tensors)} "
                             f"(at most {_mb(max_file)} is read). {_SAVE}")
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except Exception as error:  # BadZipFile, but a hostile directory can raise OSError, ValueError, ...
        raise ModelFileError(f"the model file is not a zip archive, which torch.save writes "
                             f"({type(error).__name__}: {error}). {_SAVE}") from None
    if len(entries) > len(expected) + EXTRA_ENTRIES:
        raise ModelFileError(f"the model file's archive has {len(entries)} entries; a state_dict of {len(expected)} "
                             f"tensors has at most {len(expected) + EXTRA_ENTRIES}. {_SAVE}")
    for entry in entries:
        name, size, packed = entry.filename[:80], entry.file_size, entry.compress_size
        if entry.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ModelFileError(f"the model file's entry {name} is compressed with method {entry.compress_type}, "
                                 f"which torch.load cannot read. {_SAVE}")
        if entry.compress_type == zipfile.ZIP_STORED and packed != size:
            raise ModelFileError(f"the model file's entry {name} is damaged: stored uncompressed, yet its sizes "
                                 f"differ ({packed} and {size} bytes). {_SAVE}")
        # Deflate never grows data by more than ~0.03% plus a few bytes: more means the declared size lies.
        if packed > size + size // 1000 + 64:
            raise ModelFileError(f"the model file's entry {name} declares {size} bytes but holds {packed} compressed "
                                 f"bytes: its declared size is false (a zip bomb?). {_SAVE}")
        if size > RATIO_FLOOR and size > MAX_RATIO * packed:
            raise ModelFileError(f"the model file's entry {name} expands {size // max(packed, 1)}x (to "
                                 f"{_mb(size)}): that is a zip bomb, not a model's weights. {_SAVE}")
        if size > max(largest, PICKLE_SLACK):
            raise ModelFileError(f"the model file's entry {name} declares {_mb(size)}, more than the model's largest "
                                 f"tensor ({_mb(largest)}). {_SAVE}")
    total = sum(entry.file_size for entry in entries)
    if total > max_total:
        raise ModelFileError(f"the model file's entries declare {_mb(total)} in all, but the model's weights take "
                             f"{_mb(tensors)}. {_SAVE}")


class _Loader:
    """One child process that loads model files one request at a time: torch is imported once per loader, not
    once per file (a grader judging 8 checkpoints spent 30 s importing torch). Each request has its own
    timeout; a child that times out or crashes is ended, and the next request starts a fresh one."""

    def __init__(self, memory_bytes: int):
        self.memory_bytes = memory_bytes
        self.log = tempfile.TemporaryFile()   # the child's stderr: a pipe nobody reads could fill and block it
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        # -I: the script's folder (assessment/grader/, with modules named like stdlib ones) is not on sys.path.
        self.proc = subprocess.Popen([sys.executable, "-I", str(Path(__file__).resolve()), str(int(memory_bytes))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env)
        self._end = weakref.finalize(self, _end_child, self.proc, self.log)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def end(self) -> None:
        self._end()

    def ask(self, request: dict, timeout_s: float):
        """(exit code or None while it runs, the answer line or "", the last line of its stderr).
        Raises TimeoutError (the child is then ended)."""
        deadline = time.monotonic() + timeout_s
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            pass   # it died: its exit code below says how
        line = b""
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as waiting:
            waiting.register(fd, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not waiting.select(left):
                    self.end()
                    raise TimeoutError
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                line += chunk
        code = None if line.endswith(b"\n") else self.proc.wait()
        self.log.seek(0, os.SEEK_END)
        self.log.seek(max(0, self.log.tell() - 2000))
        tail = self.log.read().decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        return code, line.decode("utf-8", "replace"), tail[0]


def _end_child(proc, log) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, log):
        try:
            stream.close()
        except OSError:
            pass


_loaders = threading.local()   # one loader per thread: concurrent loads (a test's threads) keep apart


def _loader(memory_bytes: int) -> _Loader:
    loader = getattr(_loaders, "loader", None)
    if loader is None or not loader.alive() or loader.memory_bytes != memory_bytes:
        if loader is not None:
            loader.end()
        loader = _loaders.loader = _Loader(memory_bytes)
    return loader


def load_state_dict(path, expected: dict, memory_bytes: int = 1 << 30, timeout_s: float = 60) -> dict:
    """The state_dict saved at ``path``, checked against ``expected`` (name -> (shape, dtype)).

    Returns plain contiguous CPU tensors, keyed and ordered as ``expected``. Raises ModelFileError, and
    nothing else, for any file. ``memory_bytes`` is the address space the loading child may use beyond
    the interpreter with torch imported (torch alone maps ~3 GB, so RLIMIT_AS is set after the import).
    ``timeout_s`` counts from the request, including the start of a new child (a torch import).
    """
    import torch
    path = Path(path)
    _check_archive(path, expected)
    order = list(expected)
    total = sum(_nbytes(*expected[k]) for k in order)
    scratch = Path(tempfile.mkdtemp(prefix="course-model-"))
    out = scratch / "tensors.bin"
    request = {"src": str(path), "dst": str(out),
               "expected": [[k, list(expected[k][0]), str(expected[k][1]).removeprefix("torch.")] for k in order]}
    try:
        try:
            code, line, tail = _loader(memory_bytes).ask(request, timeout_s)
        except TimeoutError:
            raise ModelFileError(f"reading the model file took longer than {timeout_s:g} s and was stopped. "
                                 f"{_SAVE}") from None
        try:
            answer = json.loads(line) if line.strip() else {}
        except ValueError:
            answer = None
        answer = answer if isinstance(answer, dict) else {}
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else "?"
            why = (f"killed (likely over the memory limit of {memory_bytes >> 20} MiB)"
                   if code == -signal.SIGKILL else f"crashed ({name})")
            raise ModelFileError(f"loading the model file was {why}. {_SAVE}")
        if "error" in answer:
            raise ModelFileError(str(answer["error"]))
        if code or not answer.get("ok"):
            raise ModelFileError(f"loading the model file failed (exit status {code}: {tail[:200]}). {_SAVE}")
        written = out.stat().st_size if out.exists() else 0
        if written != total:  # checked before reading: the grader reads no more than the model's size
            raise ModelFileError(f"the model file could not be checked (the loader wrote {written} bytes, not "
                                 f"{total}). {_SAVE}")
        data = out.read_bytes()
    except ModelFileError:
        raise
    except Exception as error:  # the grader's own trouble (no disk, no fork): still a refusal, never a crash
        raise ModelFileError(f"the model file could not be checked ({type(error).__name__}: {error})") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    state, offset = {}, 0
    for key in order:
        shape, dtype = expected[key]
        size = _nbytes(shape, dtype)
        if size:  # its own buffer (a bytearray: writable, aligned); nothing from the child is unpickled
            state[key] = torch.frombuffer(bytearray(data[offset:offset + size]), dtype=dtype).reshape(shape)
        else:
            state[key] = torch.empty(shape, dtype=dtype)
        offset += size
        if state[key].is_floating_point() and not torch.isfinite(state[key]).all():
            raise ModelFileError(f"{key} holds NaN or infinite values. {_SAVE}")
    return state


# ---- the child: everything below runs in the subprocess, on the untrusted file ----

def _refusal(obj, expected: dict) -> str | None:
    """Why ``obj`` (what torch.load returned) is not the expected state_dict, or None."""
    import torch
    if not isinstance(obj, dict):
        return (f"the model file holds a value of type {type(obj).__name__}, not a state_dict (a dict of tensors by "
                f"name). {_SAVE}")
    odd = [k for k in obj if not isinstance(k, str)]
    if odd:
        return f"the model file's dict has a key that is not a name ({type(odd[0]).__name__} {odd[0]!r:.40}). {_SAVE}"
    missing, extra = [k for k in expected if k not in obj], [k for k in obj if k not in expected]
    if missing or extra:
        def some(keys):
            return ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
        parts = ([f"it lacks {some(missing)}"] if missing else []) + ([f"it has {some(extra)}, which the model "
                                                                         f"does not"] if extra else [])
        hint = ""
        for prefix in {k.split(".", 1)[0] + "." for k in extra}:
            if sorted(k[len(prefix):] for k in extra if k.startswith(prefix)) == sorted(missing):
                hint = (f" (every name starts with '{prefix}': you saved the wrapper's state_dict; save the inner "
                        f"model's, e.g. model.module.state_dict())")
        return f"the model file is not this model's state_dict: {'; '.join(parts)}{hint}. {_SAVE}"
    for key, (shape, dtype) in expected.items():
        value = obj[key]
        if not isinstance(value, torch.Tensor):
            return f"the model file holds a value of type {type(value).__name__} under {key}, not a tensor. {_SAVE}"
        if type(value) not in (torch.Tensor, torch.nn.Parameter):  # a Parameter is a plain tensor with a flag
            return f"{key} is of type {type(value).__name__}, a tensor subclass, not a plain tensor. {_SAVE}"
        if value.is_nested:
            return f"{key} is a nested tensor, not a plain tensor. {_SAVE}"
        if value.layout != torch.strided:
            return (f"{key} is a {str(value.layout).removeprefix('torch.')} tensor, not a dense one: save the "
                    f"weights as the model holds them (no .to_sparse()). {_SAVE}")
        if value.device.type != "cpu":
            return f"{key} is a {value.device.type} tensor, which has a shape but no stored values. {_SAVE}"
        if value.is_quantized:
            return (f"{key} is a quantized tensor ({str(value.dtype).removeprefix('torch.')}): save the "
                    f"floating-point weights, before any quantization. {_SAVE}")
        if value.dtype != dtype:
            return (f"{key} is {str(value.dtype).removeprefix('torch.')}, the model's is "
                    f"{str(dtype).removeprefix('torch.')}: convert the model back first (e.g. model.float()). {_SAVE}")
        if tuple(value.shape) != tuple(shape):
            return (f"{key} has shape {tuple(value.shape)}, the model's has {tuple(shape)}: save the state_dict of "
                    f"the assessment's model as built, without changing its layers. {_SAVE}")
        if value.is_floating_point() and not torch.isfinite(value).all():
            bad = int((~torch.isfinite(value)).sum())
            return (f"{key} holds NaN or infinite values ({bad} of {value.numel()}): the training diverged; "
                    f"lower the learning rate or check the loss. {_SAVE}")
    return None


def _why_unreadable(error: Exception) -> str:
    import pickle
    text = str(error)
    if isinstance(error, pickle.UnpicklingError) or "Weights only load failed" in text:
        # torch's message is long and tells how to turn the safety off; the line naming the refused global is
        # the one a learner can use (its wording differs between torch versions).
        detail = next((line.strip() for line in text.splitlines() if "GLOBAL" in line), "")
        detail = detail.removeprefix("WeightsUnpickler error: ").split(" Please use")[0][:200] or type(error).__name__
        return (f"the model file holds Python objects other than tensors, which the grader does not unpickle "
                f"({detail}). If you saved the whole model (torch.save(model)), save its state_dict() instead. "
                f"{_SAVE}")
    if isinstance(error, MemoryError) or any(s in text for s in ("can't allocate", "bad_alloc", "out of memory")):
        return f"loading the model file needs more memory than the grader allows. {_SAVE}"
    first = text.strip().splitlines()[0][:200] if text.strip() else ""
    return f"the model file could not be read by torch.load ({type(error).__name__}: {first}). {_SAVE}"


def load_and_check(src, expected: dict):
    """(state, None) or (None, why): the child's work, callable alone to test the checks on trusted files."""
    import torch
    try:
        state = torch.load(src, weights_only=True, map_location="cpu")
        why = _refusal(state, expected)
    except Exception as error:
        return None, _why_unreadable(error)
    return (None, why) if why else (state, None)


def cap_address_space(extra_bytes: int) -> None:
    """In a child that reads untrusted files: no core dumps, and an address space of what this process
    already maps (the interpreter, torch) plus ``extra_bytes``."""
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with open("/proc/self/statm") as f:  # size in pages: what the interpreter and torch already map
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    limit = mapped + extra_bytes
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY:  # the grader may itself run under a limit; one cannot raise it
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _child() -> None:
    """Answer one JSON line per request line on stdin, until stdin ends."""
    import gc

    import torch
    torch.set_num_threads(1)
    cap_address_space(int(sys.argv[1]))
    for line in sys.stdin:
        request = json.loads(line)
        expected = {k: (tuple(shape), getattr(torch, dtype)) for k, shape, dtype in request["expected"]}
        state, why = load_and_check(request["src"], expected)
        if state is not None:
            try:
                with open(request["dst"], "wb") as f:
                    for key in expected:
                        f.write(state[key].detach().contiguous().reshape(-1).view(torch.uint8).numpy())  # no copy
            except Exception as error:
                why = _why_unreadable(error)
        del state
        gc.collect()   # the next file gets the whole allowance again
        print(json.dumps({"error": why} if why else {"ok": True}), flush=True)


if __name__ == "__main__":
    _child()
