import json
import os
from pathlib import Path

import pytest

from reusebench.machine import host
from reusebench.machine.host import HostState, capture, page_cache_fraction


def write_file(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.write(os.urandom(size))
    return path


def test_capture_reads_this_machine(tmp_path):
    model = write_file(tmp_path / "model.gguf", 1 << 20)
    state = capture(model)
    assert state.cpu_model  # /proc/cpuinfo has a model name here
    assert state.cpu_count and state.cpu_count >= 1
    assert state.cpu_mhz_mean is not None and state.cpu_mhz_mean > 0  # sysfs or /proc/cpuinfo has it on Linux
    assert state.load_avg_1m is not None and state.load_avg_1m >= 0
    assert state.mem_total_mib and 0 < state.mem_available_mib <= state.mem_total_mib
    assert state.model_path == str(model) and state.model_page_cache_fraction is not None
    assert list(json.loads(json.dumps(state.to_dict()))) == [f for f in HostState.__dataclass_fields__]


def test_capture_without_a_model_leaves_the_cache_figure_out():
    state = capture()
    assert state.model_path is None and state.model_page_cache_fraction is None


def test_cpu_mhz_falls_back_to_proc_cpuinfo(tmp_path, monkeypatch):
    (tmp_path / "cpuinfo").write_text("model name\t: Test CPU\ncpu MHz\t\t: 1000.0\n\nmodel name\t: Test CPU\ncpu MHz\t\t: 3000.0\n")
    monkeypatch.setattr(host, "PROC", tmp_path)
    monkeypatch.setattr(host, "SYS_CPU", tmp_path / "absent")
    assert host.cpu_mhz_mean() == 2000.0 and host.cpu_model() == "Test CPU"


def test_missing_proc_gives_none_not_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(host, "PROC", tmp_path / "absent")
    monkeypatch.setattr(host, "SYS_CPU", tmp_path / "absent")
    state = capture()
    assert (state.cpu_model, state.cpu_mhz_mean, state.mem_total_mib) == (None, None, None)


def test_page_cache_fraction_of_a_file_just_written_then_dropped(tmp_path):
    path = write_file(tmp_path / "blob", 4 << 20)
    written = page_cache_fraction(path)
    assert written == pytest.approx(1.0, abs=0.05)  # None (no mincore) fails: Linux has it
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    dropped = page_cache_fraction(path)
    assert dropped is not None and dropped < 0.5 < written  # most pages left the cache, and the count saw it


def test_page_cache_fraction_counts_partial_files(tmp_path):
    path = write_file(tmp_path / "odd", 3 * 4096 + 1)  # four pages, the last one partial
    assert page_cache_fraction(path) == 1.0  # all four pages, just written


def test_page_cache_fraction_of_nothing_is_none(tmp_path):
    assert page_cache_fraction(tmp_path / "missing") is None
    assert page_cache_fraction(write_file(tmp_path / "empty", 0)) is None


def test_a_step_is_flagged_under_load_above_one_task_per_core_plus_the_margin():
    # 2 cores: the suite's own server keeps the load near 2; 2 + 0.5 is the line.
    assert host.under_load({"load_avg_1m": 2.07, "cpu_count": 2}) is None
    assert host.under_load({"load_avg_1m": 2.6, "cpu_count": 2}) == "load average 2.60 on 2 cores before the step"
    assert host.under_load({"load_avg_1m": 16.4, "cpu_count": 16}) is None
    assert host.under_load({"load_avg_1m": None, "cpu_count": 2}) is None and host.under_load(None) is None
