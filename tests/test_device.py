"""tdiag.device: the roofline estimate, GPUs' data sheets by CUDA device name, and the local CPU
measured once, cached, and overridden by arguments or the environment."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from tdiag import device
from tdiag.cli import main
from tdiag.device import DeviceModel, data_sheet, for_device, local_cpu

FAKE = DeviceModel("cpu", peak_flops=1e11, bandwidth=1e10, overhead=1e-6)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder, no overrides in the environment, and a measurement that counts its calls."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for variable in (device.PEAK_FLOPS_ENV, device.BANDWIDTH_ENV, device.OVERHEAD_ENV):
        monkeypatch.delenv(variable, raising=False)
    calls = []
    monkeypatch.setattr(device, "measure_cpu", lambda: calls.append(1) or FAKE)
    return calls


def test_estimate_is_the_slower_of_arithmetic_and_memory_plus_the_overhead():
    model = DeviceModel("toy", peak_flops=100.0, bandwidth=10.0, overhead=0.5)
    assert model.estimate(flops=1000, bytes=10) == pytest.approx(10.5)  # compute bound
    assert model.estimate(flops=10, bytes=1000) == pytest.approx(100.5)  # memory bound
    assert model.ridge == 10.0


@pytest.mark.parametrize(
    ("name", "sheet"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ],
)
def test_a_cuda_device_name_finds_its_own_data_sheet_not_a_relatives(name, sheet):
    assert data_sheet(name).name == sheet


def test_data_sheet_figures_are_dense_bf16_and_bandwidth_in_bytes_per_second():
    h100 = data_sheet("NVIDIA H100 80GB HBM3")
    assert (h100.peak_flops, h100.bandwidth) == (989.4e12, 3.35e12)


def test_an_unknown_gpu_has_no_data_sheet_and_for_device_says_how_to_give_one(monkeypatch):
    monkeypatch.delenv(device.PEAK_FLOPS_ENV, raising=False)
    assert data_sheet("Tesla T4") is None
    with pytest.raises(ValueError, match=device.PEAK_FLOPS_ENV):
        for_device("Tesla T4")
    assert for_device("Tesla T4", peak_flops=65e12, bandwidth=320e9).peak_flops == 65e12


def test_local_cpu_is_measured_once_then_read_from_the_cache_file(cache, tmp_path):
    first = local_cpu()
    files = list((tmp_path / "tdiag").glob("device-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["peak_flops"] == FAKE.peak_flops
    assert local_cpu() == first == FAKE
    assert len(cache) == 1


def test_a_corrupt_cache_file_is_measured_again(cache):
    device.cache_path().parent.mkdir(parents=True)
    device.cache_path().write_text("{not json")
    assert local_cpu() == FAKE and len(cache) == 1


def test_environment_variables_override_the_measured_figures(cache, monkeypatch):
    monkeypatch.setenv(device.PEAK_FLOPS_ENV, "2e12")
    model = for_device("cpu")
    assert (model.peak_flops, model.bandwidth) == (2e12, FAKE.bandwidth)


def test_explicit_figures_override_the_environment_and_need_no_measurement(cache, monkeypatch):
    monkeypatch.setenv(device.BANDWIDTH_ENV, "5e9")
    model = local_cpu(peak_flops=1e9, bandwidth=2e9, overhead=0.0)
    assert (model.peak_flops, model.bandwidth, model.overhead) == (1e9, 2e9, 0.0)
    assert cache == []


def test_a_gpu_data_sheet_takes_overrides_too(monkeypatch):
    monkeypatch.setenv(device.BANDWIDTH_ENV, "1e12")
    assert for_device("NVIDIA H200").bandwidth == 1e12


def test_a_real_measurement_gives_positive_finite_figures():
    model = device.measure_cpu(matmul=128, copy_bytes=2**20, repeats=1, kind_shapes=((2, 2, 16, 16), (2, 2, 32, 32)))
    assert all(0 < f < math.inf for f in (model.peak_flops, model.bandwidth, model.overhead))


def test_importing_the_device_model_does_not_import_torch():
    code = "import sys, tdiag.device; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_an_op_kind_not_measured_costs_its_roofline():
    model = DeviceModel("toy", peak_flops=100.0, bandwidth=10.0, kinds=(("normalize", 4.0),))
    assert model.factor("normalize") == 4.0
    assert model.factor("softmax") == 1.0
    assert model.factor(None) == 1.0


def test_the_measured_op_kinds_are_kept_in_the_cache_file(cache, monkeypatch):
    measured = DeviceModel("cpu", 1e11, 1e10, 1e-6, kinds=(("normalize", 4.2), ("mask", 2.3)))
    monkeypatch.setattr(device, "measure_cpu", lambda: measured)
    local_cpu()
    (path,) = (device._cache_dir()).glob("device-*-v4.json")
    assert json.loads(path.read_text())["kinds"] == [["normalize", 4.2], ["mask", 2.3]]
    assert device._read(path) == measured


def test_a_real_measurement_calibrates_every_elementwise_kind():
    model = DeviceModel("cpu", 1e11, 1e10, 1e-6)
    kinds = dict(device.measure_kinds(model, shape=(2, 2, 16, 16), repeats=1))
    assert set(kinds) == set(device.PASSES)
    assert all(0 < factor < math.inf for factor in kinds.values())


def test_a_cache_file_that_is_a_fifo_is_ignored_without_blocking(cache, tmp_path):
    os.makedirs(tmp_path / "tdiag")
    os.mkfifo(device.cache_path())
    assert device.planning_device() == device.NOMINAL_CPU
    assert local_cpu() == FAKE and cache == [1]


def test_a_cache_folder_that_cannot_be_written_still_gives_the_measurement(cache, tmp_path):
    (tmp_path / "tdiag").write_text("a file where the cache folder would be")
    assert local_cpu() == FAKE and local_cpu() == FAKE and cache == [1, 1]


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (device.DEVICE_ENV, "bogus", "TDIAG_DEVICE='bogus': no data sheet"),
        (device.PEAK_FLOPS_ENV, "fast", "TDIAG_DEVICE_PEAK_FLOPS='fast' is not a number"),
    ],
)
def test_a_wrong_device_setting_is_a_one_line_error_of_the_command(capsys, monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    assert main(["plan", "mhsa", "--at", "N=64"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tdiag: error: {message}") and len(err.splitlines()) == 1


# ---- the planning device: chosen by machine and thread count ---------------------------------


def _cached(threads: int, peak: float, age: float) -> None:
    """A cache file for `threads` threads with peak `peak`, modified `age` seconds ago."""
    path = device._cache_file(threads)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = DeviceModel("cpu", peak, 1e10, 1e-6, threads=threads)
    path.write_text(json.dumps(dataclasses.asdict(model)))
    stamp = path.stat().st_mtime - age
    os.utime(path, (stamp, stamp))


@pytest.fixture
def threads(cache, monkeypatch):
    """A 4-core CPU whose thread count is set by OMP_NUM_THREADS alone."""
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_DYNAMIC", raising=False)
    monkeypatch.setattr(device, "physical_cores", lambda: 4)
    return lambda count: monkeypatch.setenv("OMP_NUM_THREADS", str(count))


@pytest.mark.parametrize(("count", "newest"), [(1, 2), (2, 1)])
def test_the_planning_device_is_the_measurement_of_the_thread_count_torch_will_use_whatever_is_newest(
    threads, count, newest
):
    _cached(1, 1e11, age=100 if newest == 2 else 0)
    _cached(2, 2e11, age=100 if newest == 1 else 0)
    threads(count)
    assert device.planning_device().peak_flops == count * 1e11


def test_the_planning_device_without_a_measurement_of_its_thread_count_is_the_nominal_cpu(threads):
    _cached(1, 1e11, age=0)
    threads(3)
    assert device.planning_device() == device.NOMINAL_CPU


@pytest.mark.parametrize(
    "environment",
    [{}, {"OMP_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "1"}, {"OMP_NUM_THREADS": "64"}],
)
def test_the_predicted_thread_count_is_torchs(environment):
    """torch's own count, read in a new process started with the variables, equals the prediction."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_DYNAMIC")}
    code = "import torch; from tdiag.device import planning_threads; print(torch.get_num_threads(), planning_threads())"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env | environment, cwd=ROOT, capture_output=True, text=True, check=True
    )
    torch_count, predicted = result.stdout.split()
    assert predicted == torch_count


def test_a_measurement_records_its_thread_count():
    import torch

    model = device.measure_cpu(matmul=64, copy_bytes=2**16, repeats=1, kind_shapes=((2, 2, 16, 16), (2, 2, 32, 32)))
    assert model.threads == torch.get_num_threads()


def test_an_op_beyond_the_caches_costs_the_factor_measured_there():
    model = DeviceModel("toy", 1e9, 1e9, kinds=(("mask", 2.0),), large_kinds=(("mask", 6.0),))
    small, large = (device.PASSES["mask"] * math.prod(s) * 4 for s in (device.KIND_SHAPE, device.LARGE_KIND_SHAPE))
    assert model.factor("mask", small / 2) == 2.0
    assert model.factor("mask", large * 2) == 6.0
    assert model.factor("mask", math.sqrt(small * large)) == pytest.approx(4.0)
    assert model.factor("mask") == 2.0


def test_a_measurement_calibrates_each_kind_in_and_beyond_the_caches(cache, monkeypatch):
    measured = DeviceModel("cpu", 1e11, 1e10, 1e-6, kinds=(("mask", 2.3),), large_kinds=(("mask", 5.1),))
    monkeypatch.setattr(device, "measure_cpu", lambda: measured)
    local_cpu()
    (path,) = (device._cache_dir()).glob("device-*-v4.json")
    assert device._read(path) == measured
