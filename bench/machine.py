"""What machine a figure was measured on: the processor's name as `lscpu` gives it (the guide asks for
it beside every CPU figure: AMX and avx512_bf16 change bf16 speed), and the flags that matter."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

FLAGS_OF_NOTE = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_model() -> str:
    """`lscpu`'s model name, else /proc/cpuinfo's, else the platform's word for it."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe() -> str:
    """`host, N CPUs, MODEL (flags of note)`: one line for a benchmark's header."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    noted = [f for f in FLAGS_OF_NOTE if f in flags]
    return f"{platform.node()}, {os.cpu_count()} CPUs, {cpu_model()}" + (f" ({', '.join(noted)})" if noted else "")
