"""Hardware description, and that agents not serving torch kinds never import torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from minions.agents.macos import hardware

ROOT = Path(__file__).resolve().parents[2]


def test_detect_describes_this_machine() -> None:
    machine = hardware.detect(probe_torch=False)
    assert machine.device in hardware.DEVICES
    assert machine.cpu_count >= 1 and machine.memory_gb >= 1
    assert machine.os and machine.chip
    assert set(machine.to_json()) == {"os", "chip", "memory_gb", "device", "cpu_count"}
    assert hardware.detect(device="cpu", probe_torch=False).device == "cpu"
    assert hardware.choose_device(probe_torch=True) == "cpu"  # this machine has no GPU


def test_sleep_and_ollama_agents_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from minions.agents.macos import agent, cli, serve\n"
        "from minions.agents.macos.config import build\n"
        "from minions.agents.macos.runners.registry import build_runners\n"
        "cfg = build({'token': 't', 'kinds': ['sleep', 'completion', 'embedding']})\n"
        "build_runners(cfg, 'cpu')\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]  # runners import them only when they first run
