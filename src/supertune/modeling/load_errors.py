"""What a failed load of model files says, in one line naming the field: damaged weights (a
safetensors file cut short or overwritten) apart from files that cannot be read or are not a model.
Training's model, `supertune eval` and `supertune generate` load through it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from safetensors import SafetensorError

from ..errors import UserError, first_line

__all__ = ["model_load_errors"]


@contextmanager
def model_load_errors(field: str, ref: str) -> Iterator[None]:
    """UserError for `field` when loading `ref` inside the block fails the way files fail."""
    try:
        yield
    except SafetensorError as exc:  # not an OSError: safetensors' own type, raised from Rust
        raise UserError(f"{field}: the weights of {ref!r} are damaged ({exc}); save or copy the model again") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{field}: cannot load {ref!r}: {first_line(exc)}") from None
