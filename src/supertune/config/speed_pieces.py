"""The speed-ups `training.speed: auto` may take, by name, and what each does.

When each one can run and how it is applied live in supertune.modeling.speed, one record per name
here (tests/test_speed.py holds the two tables to the same names); the config checks
`training.speed_skip` against these names.
"""

from __future__ import annotations

__all__ = ["SPEED_PIECES"]

SPEED_PIECES: dict[str, str] = {
    "chunked_cross_entropy": (
        "the output layer and the cross-entropy over chunks of rows, so that the full float32 logits "
        "(batch x sequence x vocabulary) are never in memory; exact (ddp, Llama-like models)"
    ),
    "fused_adamw": "training.optim adamw_torch as one fused kernel (adamw_torch_fused) on CPU and CUDA (ddp)",
    "flex_document_mask": (
        "document-masked packing (data.document_mask) through PyTorch's compiled flex attention with a document "
        "block mask instead of SDPA with a 4-D mask; exact (CUDA, sdpa models of verified types)"
    ),
    "compile": (
        "every decoder layer's training forward compiled by torch.compile (inductor), one graph for all the "
        "layers; the same arithmetic in fused kernels (CUDA, ddp or fsdp; not with training.torch_compile)"
    ),
}
