"""Accelerator utilization through NVML, where a CUDA device exists; silent on every other machine."""

from __future__ import annotations

from typing import Any

import torch


class GpuUtilization:
    """Reads the utilization (0..1) of the CUDA device a training process runs on.

    ``read()`` returns ``None`` when there is nothing to measure (no CUDA device, no NVML); the reason is in
    ``unavailable`` so the caller can say it once.
    """

    def __init__(self, device: torch.device) -> None:
        self.unavailable: str | None = None
        self._handle: Any = None
        self._nvml: Any = None
        if device.type != "cuda":
            self.unavailable = "not a CUDA device"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            if not uuid.startswith("GPU-"):
                uuid = f"GPU-{uuid}"
            self._handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            self._nvml = pynvml
        except Exception as err:
            self.unavailable = f"NVML is not usable here ({err})"

    def read(self) -> float | None:
        if self._handle is None:
            return None
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu) / 100.0
        except Exception as err:
            self.unavailable = f"NVML stopped answering ({err})"
            self._handle = None
            return None
