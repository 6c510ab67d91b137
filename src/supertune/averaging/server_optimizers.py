"""The server optimizers: how a round's averaged change moves the global model, one slice at a time.
One record per optimizer in SERVER_OPTIMIZERS, and nothing else anywhere knows them by name: the
federation config's choices (aggregation.server_optimizer), `supertune average --server-optimizer`,
their defaults, the state files an average keeps and the table in docs/federated/server-optimizers.md all derive from
it. Adding an optimizer is one record (and its reference in tests/test_server_optimizers.py).

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

numpy is imported inside the steps, not here: the command line offers these names in `--help`,
which imports no numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "DEFAULT_SERVER_OPTIMIZER",
    "Moments",
    "ServerOptimizer",
    "SERVER_OPTIMIZERS",
    "server_optimizer_names",
    "get_server_optimizer",
    "default_lr",
    "default_momentum",
    "moments_kept",
    "step_slice",
]


@dataclass  # not frozen: `moments.first *= beta` works in place, then assigns the same array back
class Moments:
    """The state a step reads and writes in place, one slice of each: the first moment (v or m), the
    second (s), a scratch buffer of the same size, and whether the state was read from a previous
    round (else it is started here)."""

    first: np.ndarray
    second: np.ndarray
    scratch: np.ndarray
    have_state: bool


Step = Callable[["np.ndarray", Moments, float, float, float], None]
"""step(d, moments, momentum, beta2, tau): on entry d holds the averaged change, on return the
direction the global model moves by eta times; the moments it keeps are updated in place."""


@dataclass(frozen=True)
class ServerOptimizer:
    """One server optimizer: its name, defaults, the state it keeps and its step."""

    name: str
    lr: float
    """Server learning rate where none is given."""
    momentum: float
    """Momentum (beta1) where none is given."""
    second_moment: bool
    """Keeps a second moment s beside the first (two state tensors per weight); else only v, and only when beta > 0."""
    uses: tuple[str, ...]
    """Which of server_beta2, server_tau its step reads (documentation: the others are not used)."""
    state: str
    """The state's rule, as docs/federated/server-optimizers.md prints it."""
    update: str
    """The new global model, as docs/federated/server-optimizers.md prints it."""
    step: Step
    defaults_why: str = ""
    """Where its defaults come from, when that is not obvious."""

    def moments_kept(self, momentum: float) -> int:
        """How many moment tensors per weight it keeps between rounds: 0, 1 (v or m) or 2 (m and s)."""
        if self.second_moment:
            return 2
        return 1 if momentum > 0 else 0


def _heavy_ball(d: np.ndarray, s: Moments, momentum: float, beta2: float, tau: float) -> None:
    """v = beta v' + d, started at d; leaves d (beta = 0: the plain average's change) or v in `d`."""
    import numpy as np

    if momentum > 0:
        if s.have_state:
            s.first *= momentum
            s.first += d  # v
        else:
            np.copyto(s.first, d)


def _fedavgm(d: np.ndarray, s: Moments, momentum: float, beta2: float, tau: float) -> None:
    import numpy as np

    _heavy_ball(d, s, momentum, beta2, tau)
    if momentum > 0:
        np.copyto(d, s.first)


def _nesterov(d: np.ndarray, s: Moments, momentum: float, beta2: float, tau: float) -> None:
    import numpy as np

    _heavy_ball(d, s, momentum, beta2, tau)
    if momentum > 0:
        np.multiply(s.first, momentum, out=s.scratch)
        d += s.scratch  # d + beta v


SecondMoment = Callable[["np.ndarray", "np.ndarray", "np.ndarray", float], None]
"""rule(s, d2, work, beta2): s updated in place from d^2 (which it may overwrite); `work` is free."""


def _adam_second(s: np.ndarray, d2: np.ndarray, work: np.ndarray, beta2: float) -> None:
    s *= beta2
    d2 *= 1.0 - beta2
    s += d2


def _yogi_second(s: np.ndarray, d2: np.ndarray, work: np.ndarray, beta2: float) -> None:
    import numpy as np

    np.subtract(s, d2, out=work)  # s' - d^2
    np.sign(work, out=work)
    d2 *= 1.0 - beta2
    d2 *= work
    s -= d2


def _adagrad_second(s: np.ndarray, d2: np.ndarray, work: np.ndarray, beta2: float) -> None:
    s += d2


def _adaptive(second_rule: SecondMoment) -> Step:
    """m = beta m' + (1 - beta) d, s by `second_rule`, direction m / (sqrt(s) + tau): Reddi et al.'s
    three optimizers differ only in s."""

    def step(d: np.ndarray, s: Moments, momentum: float, beta2: float, tau: float) -> None:
        import numpy as np

        if not s.have_state:
            s.first.fill(0.0)
            s.second.fill(tau * tau)
        s.first *= momentum
        np.multiply(d, 1.0 - momentum, out=s.scratch)
        s.first += s.scratch  # m
        np.multiply(d, d, out=s.scratch)  # d^2
        second_rule(s.second, s.scratch, d, beta2)  # d is no longer needed: the rule may work in it
        np.sqrt(s.second, out=s.scratch)
        s.scratch += tau
        np.divide(s.first, s.scratch, out=d)

    return step


_ADAM_STATE = "m = β m' + (1 - β) d"
# The adaptive optimizers take Reddi et al.'s beta1 = 0.9 and a small server rate: their step is
# about eta per element whatever d's size, so eta = 1 would move every weight by about 1 in the
# first round.
SERVER_OPTIMIZERS: dict[str, ServerOptimizer] = {
    o.name: o
    for o in (
        ServerOptimizer(
            name="fedavgm",
            lr=1.0,  # with momentum 0: plain FedAvg, the global model is the average
            momentum=0.0,
            second_moment=False,
            uses=(),
            state="v = β v' + d (only when β > 0)",
            update="g_new = g + η v",
            step=_fedavgm,
        ),
        ServerOptimizer(
            name="fedadam",
            lr=0.01,
            momentum=0.9,
            second_moment=True,
            uses=("server_beta2", "server_tau"),
            state=f"{_ADAM_STATE}; s = β₂ s' + (1 - β₂) d²",
            update="g_new = g + η m / (√s + τ)",
            step=_adaptive(_adam_second),
        ),
        ServerOptimizer(
            name="fedyogi",
            lr=0.01,
            momentum=0.9,
            second_moment=True,
            uses=("server_beta2", "server_tau"),
            state="m as fedadam; s = s' - (1 - β₂) d² sign(s' - d²)",
            update="as fedadam",
            step=_adaptive(_yogi_second),
        ),
        ServerOptimizer(
            name="fedadagrad",
            lr=0.01,
            momentum=0.9,
            second_moment=True,
            uses=("server_tau",),
            state="m as fedadam; s = s' + d²",
            update="as fedadam",
            step=_adaptive(_adagrad_second),
        ),
        ServerOptimizer(
            name="nesterov",
            lr=0.7,
            momentum=0.9,
            second_moment=False,
            uses=(),
            state="v = β v' + d",
            update="g_new = g + η (d + β v)",
            step=_nesterov,
            defaults_why="DiLoCo's outer settings",
        ),
    )
}


DEFAULT_SERVER_OPTIMIZER = "fedavgm"
"""The one a federation and `supertune average --global-model` use when none is named."""


def server_optimizer_names() -> list[str]:
    return list(SERVER_OPTIMIZERS)


def get_server_optimizer(name: str) -> ServerOptimizer:
    return SERVER_OPTIMIZERS[name]


def default_lr(optimizer: str) -> float:
    return SERVER_OPTIMIZERS[optimizer].lr


def default_momentum(optimizer: str) -> float:
    return SERVER_OPTIMIZERS[optimizer].momentum


def moments_kept(optimizer: str, momentum: float) -> int:
    """How many moment tensors per weight the optimizer keeps between rounds: 0, 1 (v or m) or 2 (m and s)."""
    return SERVER_OPTIMIZERS[optimizer].moments_kept(momentum)


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
    import numpy as np

    np.subtract(acc, g, out=acc)  # d
    SERVER_OPTIMIZERS[optimizer].step(acc, Moments(first, second, scratch, have_state), momentum, beta2, tau)
    acc *= lr
    acc += g
