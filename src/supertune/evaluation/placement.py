"""Where a model's forward pass computes, which is where its inputs must go.

Usually the device of its first parameter. Not under FSDP with `cpu_offload`: the sharded parameters
rest in CPU memory and each unit is gathered onto its mesh's device (the GPU) for the forward, whose
outputs are then on the GPU; inputs and labels sent to the parameters' device (the CPU) would meet
GPU logits there (seen on an H200: the final eval stopped with "Expected all tensors to be on the
same device"). A sharded parameter (a DTensor) names its mesh, and the mesh names the device type.
"""

from __future__ import annotations

from typing import Any

__all__ = ["input_device"]


def input_device(model: Any) -> Any:
    import torch

    param = next(model.parameters())
    mesh = getattr(param, "device_mesh", None)
    if mesh is not None and mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return param.device
