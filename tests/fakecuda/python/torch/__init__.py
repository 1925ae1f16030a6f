"""A stand-in for PyTorch in Sextant's tests: just the calls scripts/gemm_vs_torch.py
makes, on a made-up clock (each matmul takes 1 us plus 2mnk per 1e14 s). It runs
nothing and measures nothing."""
import types

__version__ = "0.0-sextant-test-stand-in"
version = types.SimpleNamespace(cuda="13.0")
bfloat16 = "bfloat16"
_clock = [0.0]


class _Tensor:
    def __init__(self, shape):
        self.shape = tuple(shape)

    def uniform_(self, lo, hi):
        return self


def device(kind, index):
    return (kind, index)


def empty(shape, dtype=None, device=None):
    return _Tensor(shape)


def matmul(a, b, out=None):
    *lead, m, k = a.shape
    k2, n = b.shape[-2:]
    assert k == k2 and out.shape[-2:] == (m, n)
    batch = lead[0] if lead else 1
    _clock[0] += 1e-6 + 2.0 * m * n * k * batch / 1e14
    return out


class _Event:
    def __init__(self, enable_timing=False):
        self.at = None

    def record(self):
        self.at = _clock[0]

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


def _sleep(cycles):
    _clock[0] += cycles / 1.5e9


cuda = types.SimpleNamespace(
    is_available=lambda: True,
    set_device=lambda d: None,
    synchronize=lambda d=None: None,
    Event=_Event,
    _sleep=_sleep,
    get_device_name=lambda d: "stand-in GPU",
)
backends = types.SimpleNamespace(
    cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_bf16_reduced_precision_reduction=True))
)
