"""The codec's fused Snake kernel against `Snake1d`'s own float32 expression, and `install` with
its device gate widened, on the CPU through Triton's interpreter (this folder: marker
`kernels`, a process started with `TRITON_INTERPRET=1`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from server.engine.kernels import snake
from tests.engine.test_snake import _snakes, _tiny_dac


def _numpy_sin_expression(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic, op by op, with numpy's float32 sin (the interpreter's `tl.sin`)."""
    x3 = x.reshape(x.shape[0], x.shape[1], -1)
    s = torch.from_numpy(np.sin((alpha * x3).numpy()))
    return (x3 + snake.inverse(alpha) * (s * s)).reshape(x.shape)


@pytest.mark.parametrize("shape", [(1, 7, 1), (2, 5, 2 * 1024 + 37), (3, 24, 511), (2, 3, 4, 5)])
def test_kernel_in_the_interpreter(shape):
    torch.manual_seed(1)
    alpha = torch.exp(torch.empty(1, shape[1], 1).uniform_(-2.3, 2.3))
    x = torch.randn(shape) * 20
    got = snake.fused_snake(x, alpha, snake.inverse(alpha))
    assert got.shape == x.shape and got.dtype == torch.float32
    # Same roundings, op by op: bit-exact against the same float32 ops using numpy's sin.
    assert torch.equal(got, _numpy_sin_expression(x, alpha)), shape
    # Against the module's torch expression: numpy's float32 sin and torch's CPU sin (SLEEF)
    # differ by an ulp on a sizeable share of inputs, so the interpreter cannot be bit-exact
    # here; within ~2 ulps of the two summed terms. (On CUDA both sides call libdevice's __nv_sinf.)
    diff = (got - snake.reference(x, alpha)).reshape(shape[0], shape[1], -1).abs()
    scale = x.reshape(shape[0], shape[1], -1).abs() + snake.inverse(alpha).abs()
    assert float((diff / scale).max()) < 3e-7, shape


def test_kernel_on_a_strided_view_and_its_check():
    """A non-contiguous (B, C, T) view, as a strided caller might pass it; the start-up check."""
    torch.manual_seed(2)
    alpha = torch.exp(torch.empty(1, 6, 1).uniform_(-2.3, 2.3))
    x = (torch.randn(2, 6, 300) * 10)[:, :, ::3]
    assert torch.equal(snake.fused_snake(x, alpha, snake.inverse(alpha)),
                       _numpy_sin_expression(x.contiguous(), alpha))
    err_abs, err_rel = snake._errors("cpu")
    assert 0 < err_abs < 2e-5 and err_rel < 3e-7, (err_abs, err_rel)
    assert snake.check("cpu") == err_abs


def test_install_in_the_interpreter_runs_every_snake_through_the_kernel(monkeypatch):
    """With the device gate widened to the interpreter's CPU: every Snake1d replaced, the
    decoder's output kept, and a changed alpha (as load_state_dict does) followed."""
    model, plain = _tiny_dac(), _tiny_dac()
    n_snakes = len(_snakes(model))
    monkeypatch.setattr(snake, "_device_ok", lambda device: True)
    calls = []
    real = snake.fused_snake
    monkeypatch.setattr(snake, "fused_snake", lambda *a: calls.append(1) or real(*a))
    assert snake.install(model) == n_snakes == 30
    calls.clear()  # install's own check ran the kernel too
    assert all("forward" in vars(s) for s in _snakes(model))
    sd, sd_plain = model.state_dict(), plain.state_dict()
    assert list(sd) == list(sd_plain) and all(torch.equal(sd[k], sd_plain[k]) for k in sd)
    z = torch.randn(2, model.config.hidden_size, 9)
    with torch.inference_mode():
        got, want = model.decoder(z), plain.decoder(z)
    assert len(calls) == 15  # the decoder's Snakes, each through the kernel
    assert got.shape == want.shape and float((got - want).abs().max()) < 1e-5 * float(want.abs().max()), \
        float((got - want).abs().max())

    s0 = _snakes(model)[0]
    with torch.no_grad():
        s0.alpha.mul_(3)
    x = torch.randn(1, s0.alpha.shape[1], 50) * 5
    assert torch.equal(s0(x), _numpy_sin_expression(x, s0.alpha.detach()))
