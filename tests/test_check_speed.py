"""`esqbe check speed`: the real command on the real default model and the shipped abstracts, briefly. Its
report's shape and arithmetic are checked, never its figures (they are the machine's); no temporary index is left
behind, after a run or after Ctrl-C."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from esqbe.encode.hardware import CPU_FLAGS, int8_kernel_class, machine
from esqbe.errors import ParameterError
from esqbe.index.speed import CPU_RUNTIMES, PROBE_PAPERS, check_speed, sample_path
from tests.conftest import REPO


def _env(tmp):
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp)}


def _ours(tmp) -> list[str]:
    """What check speed made under TMPDIR (torch leaves caches of its own there)."""
    return [p.name for p in tmp.iterdir() if p.name.startswith("esqbe-speed-")]


def _close(a: float, b: float, rel: float = 0.01) -> bool:
    """Equal up to the report's rounding (3 decimals) relative to the size of the numbers."""
    return abs(a - b) <= rel * max(abs(a), abs(b)) + 2e-3


def test_check_speed_reports_every_runtime_consistently_and_leaves_nothing(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run([sys.executable, "-m", "cli", "check", "speed", "--seconds", "10", "--papers", "8", "--json"],
                          cwd=REPO, env=_env(tmp), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _ours(tmp) == []  # the temporary index (and its input files) removed
    r = json.loads(done.stdout)
    assert "esqbe: fp32 forward pass: 8 papers" in done.stderr and "esqbe: esqbe index (" in done.stderr
    m = r["machine"]
    assert set(m["flags"]) <= set(CPU_FLAGS) and m["cores"] >= 1
    assert m["int8_kernels"] == int8_kernel_class(m["flags"], m["arch"])
    assert r["sample"]["papers"] == 300 and r["seconds_asked"] == 10 and r["threads"] >= 1
    forward, default, runtimes = r["fp32_forward"], r["default"], r["runtimes"]
    assert forward["ratio_to_fp32_forward"] is None and forward["runtime"] is None
    # the default run is the default settings' runtime here, every paper tagged (the sample's labels are removed)
    from esqbe.encode.loader import ModelSpec

    assert default["runtime"] == {"onnx-int8": "onnx-int8", "torch-int8": "torch-int8"}.get(
        ModelSpec(backend="auto").resolved_backend(), default["runtime"])
    assert r["default_tagged"] == default["papers"]
    # every CPU runtime in order, then CUDA when the machine has a GPU
    devices = [(x["device"], x["name"]) for x in runtimes]
    assert [d for d, _ in devices] == ["cpu"] * len(CPU_RUNTIMES) + (["cuda"] if m["gpu"] else [])
    names = [x["runtime"] for x in runtimes[: len(CPU_RUNTIMES)] if not x["skipped"]]
    assert names == [n for n in ("torch-fp32", "torch-int8", "onnx-fp32", "onnx-int8")
                     if n in names]  # the order of CPU_RUNTIMES, under their runtime names
    for rate in [forward, default, *runtimes]:
        if rate["skipped"]:
            assert rate["papers"] == 0 and rate["papers_per_s"] == 0
            continue
        assert rate["papers"] == PROBE_PAPERS  # --papers 8 caps each measurement at the probe's 8
        assert rate["seconds"] > 0 and rate["load_seconds"] >= 0
        assert _close(rate["papers_per_s"], rate["papers"] / rate["seconds"])
        assert _close(rate["hours_per_million"], 1e6 / rate["papers_per_s"] / 3600)
        if rate is not forward:
            assert _close(rate["ratio_to_fp32_forward"], rate["papers_per_s"] / forward["papers_per_s"])
    # whether others disturbed it (this machine may be busy: either way), said consistently
    d = r["disturbance"]
    assert r["reliable"] is (not d["disturbed"]) and (d["reason"] is None) is (not d["disturbed"]), d
    assert d["own_cpu_seconds"] > 0 and d["wall_seconds"] > 0
    # the words: test_check_speed_beside_busy_processes_says_its_figures_are_unreliable (the text report)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_during_the_default_run_removes_its_index(tmp_path, sig):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "check", "speed", "--seconds", "600", "--papers", "300", "--no-runtimes"],
                            cwd=REPO, env=_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the default run has started: its index exists
            if line.startswith("esqbe: esqbe index ("):
                break
        else:
            pytest.fail("the default run never started")
        assert len(_ours(tmp)) == 1
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted" in err
    assert _ours(tmp) == []


def test_bounds_are_checked_before_anything_loads():
    for kw in ({"seconds": 5}, {"seconds": 100_000}, {"papers": 2}, {"papers": 10**9}):
        with pytest.raises(ParameterError):
            check_speed(**kw)
    bad = subprocess.run([sys.executable, "-m", "cli", "check", "speed", "--seconds", "3"], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--seconds" in bad.stderr


def test_the_int8_kernel_class_follows_the_cpu_flags(tmp_path):
    """What ONNX Runtime's int8 products run on, by the flags: AMX and VNNI sum in 32 bits, AVX2 alone in saturating
    16-bit pairs (the vectors differ slightly, docs/performance.md)."""
    x86 = "x86_64"
    assert int8_kernel_class({"avx2": True, "amx_tile": True, "amx_int8": True, "avx512_vnni": True}, x86).startswith("AMX")
    assert int8_kernel_class({"avx2": True, "avx512bw": True, "avx512_vnni": True}, x86).startswith("AVX-512 VNNI")
    assert int8_kernel_class({"avx2": True, "avx_vnni": True}, x86).startswith("AVX-VNNI")
    assert "saturating" in int8_kernel_class({"avx2": True, "avx512bw": True}, x86)
    assert int8_kernel_class({"avx2": True}, x86).startswith("AVX2 without VNNI")
    assert int8_kernel_class({}, x86).startswith("unknown")
    assert "not x86-64" in int8_kernel_class({}, "aarch64")
    # /proc/cpuinfo as an AVX2-only AMD EPYC (Zen 2/3) writes it
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse4_2 avx avx2 fma bmi2\n\n"
                    "processor\t: 1\nmodel name\t: AMD EPYC 7B12\nflags\t\t: fpu sse4_2 avx avx2 fma bmi2\n")
    amd = machine(cpuinfo=str(info), gpu=False)
    assert amd.cpu == "AMD EPYC 7B12" and amd.flags["avx2"] and not amd.flags["avx512f"] and not amd.vnni
    if amd.arch == x86:
        assert amd.int8_kernels.startswith("AVX2 without VNNI")
    assert machine(cpuinfo=str(tmp_path / "absent"), gpu=False).flags == {}
    assert sample_path().is_file()


def test_the_disturbance_rule_both_ways():
    from esqbe.index.speed import judge

    quiet = judge({"others_cpu_share": 0.05, "steal_share": 0.0, "load_after": 1.0, "cores": 2})
    busy = judge({"others_cpu_share": 0.6, "steal_share": 0.0, "load_after": 5.6, "cores": 2})
    stolen = judge({"others_cpu_share": 0.0, "steal_share": 0.2, "load_after": 1.0, "cores": 2})
    no_proc = judge({"others_cpu_share": None, "steal_share": None, "load_after": 5.6, "cores": 2})
    assert not quiet["disturbed"] and quiet["reason"] is None
    assert busy["disturbed"] and "60% of the CPU" in busy["reason"]
    assert stolen["disturbed"] and "stole 20%" in stolen["reason"]
    assert no_proc["disturbed"] and "load average was 5.6 on 2 cores" in no_proc["reason"]


def test_check_speed_beside_busy_processes_says_its_figures_are_unreliable(tmp_path):
    """Busy loops on every core (bounded: killed at the end, and each stops itself after 5 minutes) while check speed
    measures: the text report (what a person reads; the JSON's shape is the test above) says what the machine is and
    that its figures are unreliable, and why, on stdout and stderr; no temporary index is left."""
    import re

    spin = "import time\nend = time.time() + 300\nwhile time.time() < end: pass\n"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 2)]
    try:
        run = subprocess.run([sys.executable, "-m", "cli", "check", "speed", "--seconds", "10", "--papers", "8",
                              "--no-runtimes"], cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                             timeout=600)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert run.returncode == 0, run.stderr
    assert f"int8 kernels: {machine(gpu=False).int8_kernels}" in run.stdout, run.stdout
    assert "h per million" in run.stdout and "encoder alone" not in run.stdout  # --no-runtimes: the two runs only
    assert run.stdout.count("(unreliable)") == 2, run.stdout  # the fp32 forward pass and the default run
    share = re.search(r"UNRELIABLE: other processes used (\d+)% of the CPU's time", run.stdout)
    assert share and int(share.group(1)) > 25, run.stdout
    assert "figures are unreliable" in run.stderr and "esqbe's own CPU" in run.stderr
    assert _ours(tmp_path) == []
