"""The server optimizers: how a round's averaged change moves the global model, one slice at a time.

With g the previous global model, a the weighted average of the sites' models and d = a - g the
averaged change (the pseudo-gradient of Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
who write it Delta_t; DiLoCo's outer gradient is its negative, -d), eta the server learning rate,
beta the momentum (beta1), beta2 and tau:

    fedavgm     v = beta v' + d                                      g_new = g + eta v
    nesterov    v = beta v' + d                                      g_new = g + eta (d + beta v)
    fedadam     m = beta m' + (1 - beta) d,  s = beta2 s' + (1 - beta2) d^2        g_new = g + eta m / (sqrt(s) + tau)
    fedyogi     m as fedadam,  s = s' - (1 - beta2) d^2 sign(s' - d^2)             the same update
    fedadagrad  m as fedadam,  s = s' + d^2                                        the same update

Primes are the previous round's state: zero for the first moment (v, m) and tau^2 for the second
(s) before the first round, as Reddi et al.'s Algorithm 2 starts it (v_-1 >= tau^2). No bias
correction (the paper has none). nesterov is SGD with Nesterov momentum (PyTorch's form) on -d, as
DiLoCo's outer optimizer between islands of compute (Douillard et al., 2023). fedavgm with beta = 0
and eta = 1 is plain FedAvg. The state is kept in float32; the arithmetic runs in the sum's dtype
(float32, or float64 for float64 tensors).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ADAPTIVE", "SERVER_OPTIMIZERS", "default_lr", "default_momentum", "moments_kept", "step_slice"]

SERVER_OPTIMIZERS = ("fedavgm", "fedadam", "fedyogi", "fedadagrad", "nesterov")
ADAPTIVE = ("fedadam", "fedyogi", "fedadagrad")

# Defaults when the server learning rate or momentum is not given. fedavgm's keep plain FedAvg;
# nesterov's are DiLoCo's outer settings; the adaptive ones take Reddi et al.'s beta1 = 0.9 and a
# small server rate: their step is about eta per element whatever d's size, so eta = 1 would move
# every weight by about 1 in the first round.
_DEFAULT_LR = {"fedavgm": 1.0, "nesterov": 0.7, "fedadam": 0.01, "fedyogi": 0.01, "fedadagrad": 0.01}
_DEFAULT_MOMENTUM = {"fedavgm": 0.0, "nesterov": 0.9, "fedadam": 0.9, "fedyogi": 0.9, "fedadagrad": 0.9}


def default_lr(optimizer: str) -> float:
    return _DEFAULT_LR[optimizer]


def default_momentum(optimizer: str) -> float:
    return _DEFAULT_MOMENTUM[optimizer]


def moments_kept(optimizer: str, momentum: float) -> int:
    """How many moment tensors per weight the optimizer keeps between rounds: 0, 1 (v or m) or 2 (m and s)."""
    if optimizer in ADAPTIVE:
        return 2
    return 1 if momentum > 0 else 0


def step_slice(
    optimizer: str,
    lr: float,
    momentum: float,
    beta2: float,
    tau: float,
    acc: np.ndarray,
    g: np.ndarray,
    first: np.ndarray,
    second: np.ndarray,
    scratch: np.ndarray,
    have_state: bool,
) -> None:
    """One slice of the server step, in place. On entry `acc` holds the average a, `g` the previous
    global model, `first` and `second` the previous moments when `have_state` (else anything: they are
    started at 0 and tau^2). On return `acc` holds the new global model, `first` and `second` the new
    moments (those the optimizer keeps, see moments_kept). `scratch` is a buffer of the same size."""
    np.subtract(acc, g, out=acc)  # d
    if optimizer in ADAPTIVE:
        if not have_state:
            first.fill(0.0)
            second.fill(tau * tau)
        first *= momentum
        np.multiply(acc, 1.0 - momentum, out=scratch)
        first += scratch  # m
        np.multiply(acc, acc, out=scratch)  # d^2
        if optimizer == "fedadam":
            second *= beta2
            scratch *= 1.0 - beta2
            second += scratch
        elif optimizer == "fedyogi":
            np.subtract(second, scratch, out=acc)  # d is no longer needed: acc holds s' - d^2
            np.sign(acc, out=acc)
            scratch *= 1.0 - beta2
            scratch *= acc
            second -= scratch
        else:  # fedadagrad
            second += scratch
        np.sqrt(second, out=scratch)
        scratch += tau
        np.divide(first, scratch, out=acc)
    elif momentum > 0:
        if have_state:
            first *= momentum
            first += acc  # v
        else:
            np.copyto(first, acc)
        if optimizer == "nesterov":
            np.multiply(first, momentum, out=scratch)
            acc += scratch  # d + beta v
        else:
            np.copyto(acc, first)
    acc *= lr
    acc += g
