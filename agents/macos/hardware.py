"""What this machine is: OS, chip, memory, CPU count and the inference device it will use."""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEVICES = ("mps", "cuda", "cpu")


@dataclass(frozen=True)
class Hardware:
    os: str
    chip: str
    memory_gb: int
    device: str
    cpu_count: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def detect(device: str | None = None, probe_torch: bool = True) -> Hardware:
    """Describe this machine. `device` forces a device; otherwise it is chosen by `choose_device`."""
    return Hardware(
        os=os_name(),
        chip=chip_name(),
        memory_gb=memory_gb(),
        device=device or choose_device(probe_torch),
        cpu_count=os.cpu_count() or 1,
    )


def choose_device(probe_torch: bool = True) -> str:
    """mps, then cuda, then cpu.

    With `probe_torch` false (an agent serving only sleep or Ollama work) torch is not imported,
    since importing it costs seconds and hundreds of MB; the device is then guessed from the
    platform, which is what Ollama itself will use.
    """
    if probe_torch:
        try:
            import torch
        except ImportError:
            return "cpu"
        if torch.backends.mps.is_available():
            return "mps"
        if torch.cuda.is_available():
            return "cuda"
        return "cpu"
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return "mps"
    if shutil.which("nvidia-smi"):
        return "cuda"
    return "cpu"


def os_name() -> str:
    system = platform.system()
    if system == "Darwin":
        return f"macOS {platform.mac_ver()[0]}".strip()
    if system == "Linux":
        return _linux_pretty_name() or f"Linux {platform.release()}"
    return f"{system} {platform.release()}".strip()


def _linux_pretty_name() -> str | None:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.partition("=")[2].strip().strip('"') or None
    return None


def chip_name() -> str:
    if platform.system() == "Darwin":
        brand = _sysctl("machdep.cpu.brand_string")
        if brand:
            return brand
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gb() -> int:
    if platform.system() == "Darwin":
        raw = _sysctl("hw.memsize")
        if raw and raw.isdigit():
            return round(int(raw) / 2**30)
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (ValueError, OSError, AttributeError):
        return 0


def _sysctl(name: str) -> str | None:
    # Runs once at start-up, before the event loop is busy, so a blocking call is acceptable.
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
