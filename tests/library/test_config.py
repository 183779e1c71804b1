from pathlib import Path

import pytest
import torch

from utils import config


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", " on "])
def test_quick_mode_on(course_env, value):
    course_env.setenv("COURSE_QUICK", value)
    assert config.quick_mode() is True
    assert config.pick("small", "big") == "small"


@pytest.mark.parametrize("value", [None, "0", "", "false", "no"])
def test_quick_mode_off(course_env, value):
    if value is not None:
        course_env.setenv("COURSE_QUICK", value)
    assert config.quick_mode() is False
    assert config.pick("small", "big") == "big"


def test_download_allowed_default_and_off(course_env):
    assert config.download_allowed() is True
    course_env.setenv("COURSE_DOWNLOAD", "0")
    assert config.download_allowed() is False


def test_data_dir_default_and_env(course_env, tmp_path):
    assert config.data_dir() == config.COURSE_ROOT / "data"
    course_env.setenv("COURSE_DATA_DIR", str(tmp_path / "sets"))
    assert config.data_dir() == tmp_path / "sets"
    course_env.setenv("COURSE_DATA_DIR", "~/somewhere")
    assert config.data_dir() == Path.home() / "somewhere"


def test_dataset_name(course_env):
    assert config.dataset_name() == "mnist1d"
    course_env.setenv("COURSE_DATASET", " CIFAR10 ")
    assert config.dataset_name() == "cifar10"


@pytest.mark.skipif(torch.cuda.is_available() or config._mps_available(), reason="needs a machine without GPU")
def test_auto_is_cpu_without_gpu(course_env):
    assert config.get_device("auto") == torch.device("cpu")
    assert config.get_device() == torch.device("cpu")


def test_cpu_by_name_and_env(course_env):
    assert config.get_device("cpu") == torch.device("cpu")
    assert config.get_device(" CPU ") == torch.device("cpu")
    course_env.setenv("COURSE_DEVICE", "cpu")
    assert config.get_device() == torch.device("cpu")


def test_unknown_device_names_choices(course_env):
    with pytest.raises(ValueError) as info:
        config.get_device("tpu")
    message = str(info.value)
    assert "'tpu'" in message
    for choice in ("'auto'", "'cpu'", "'cuda'", "'mps'"):
        assert choice in message


def test_unknown_device_from_env(course_env):
    course_env.setenv("COURSE_DEVICE", "gpu0")
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        config.get_device()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_without_gpu_names_fix(course_env, name):
    with pytest.raises(ValueError) as info:
        config.get_device(name)
    message = str(info.value)
    assert "no CUDA GPU" in message
    assert "device='auto' or 'cpu'" in message and "COURSE_DEVICE" in message


@pytest.mark.skipif(config._mps_available(), reason="needs a machine without MPS")
def test_mps_absent_names_fix(course_env):
    with pytest.raises(ValueError) as info:
        config.get_device("mps")
    message = str(info.value)
    assert "'mps' is not available" in message
    assert "device='auto' or 'cpu'" in message


def test_describe_device_cpu():
    text = config.describe_device(torch.device("cpu"))
    assert text.startswith("cpu (") and f"{torch.get_num_threads()} threads" in text


def test_cores_default_is_what_this_process_may_use(course_env):
    import os
    assert config.cores() == len(os.sched_getaffinity(0)) == config.real_cores()
    assert not config.oversubscribed()


def test_cores_from_env_plans_a_learners_machine(course_env):
    course_env.setenv("COURSE_CORES", "8")
    assert config.cores() == 8
    assert config.oversubscribed() == (config.real_cores() < 8)


@pytest.mark.parametrize("value", ["0", "-2", "eight", "2.5"])
def test_bad_cores_says_what_to_give(course_env, value):
    course_env.setenv("COURSE_CORES", value)
    with pytest.raises(ValueError, match="whole number of cores"):
        config.cores()
