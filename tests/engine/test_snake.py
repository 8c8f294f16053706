"""The codec's fused Snake activation: the Triton kernel against `Snake1d`'s own float32
expression (on the CPU through Triton's interpreter, marker `kernels`: a process started with
`TRITON_INTERPRET=1`), and `install`'s gates: nothing changes on CPU, and where it does fuse,
every Snake1d is replaced and the module computes what it computed before."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DacConfig, DacModel

from server.engine.kernels import snake

kernels = pytest.mark.kernels  # under Triton's interpreter: `TRITON_INTERPRET=1 pytest -m kernels`


def _tiny_dac() -> DacModel:
    cfg = DacConfig(encoder_hidden_size=4, downsampling_ratios=[2, 2], decoder_hidden_size=16,
                    n_codebooks=2, codebook_size=16, codebook_dim=4)
    torch.manual_seed(0)
    model = DacModel(cfg).eval()
    with torch.no_grad():  # trained-like alphas (~0.1..10), not the initial ones
        for name, p in model.named_parameters():
            if name.endswith("alpha"):
                p.copy_(torch.exp(torch.empty_like(p).uniform_(-2.3, 2.3)))
    return model


def _snakes(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [s for s in model.modules() if type(s).__name__ == "Snake1d"]


def _numpy_sin_expression(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic, op by op, with numpy's float32 sin (the interpreter's `tl.sin`)."""
    x3 = x.reshape(x.shape[0], x.shape[1], -1)
    s = torch.from_numpy(np.sin((alpha * x3).numpy()))
    return (x3 + snake.inverse(alpha) * (s * s)).reshape(x.shape)


@kernels
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


@kernels
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


@kernels
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


def test_reference_is_the_modules_forward():
    from transformers.models.dac.modeling_dac import Snake1d

    module = Snake1d(5)
    with torch.no_grad():
        module.alpha.copy_(torch.rand(1, 5, 1) * 5 + 0.1)
    x = torch.randn(2, 5, 33) * 10
    assert torch.equal(snake.reference(x, module.alpha), module(x))


def test_install_is_a_no_op_on_cpu():
    model, plain = _tiny_dac(), _tiny_dac()
    assert snake.install(model) == 0
    assert not any("forward" in vars(s) for s in _snakes(model))
    z = torch.randn(1, model.config.hidden_size, 11)
    with torch.inference_mode():
        assert torch.equal(model.decoder(z), plain.decoder(z))


def test_install_gates(monkeypatch):
    monkeypatch.setattr(snake, "_device_ok", lambda device: True)
    monkeypatch.setattr(snake, "triton", object())  # "available", whether or not it is installed
    monkeypatch.setenv("CHORUS_FUSED_SNAKE", "0")
    assert snake.install(_tiny_dac()) == 0
    monkeypatch.delenv("CHORUS_FUSED_SNAKE")

    def broken(device):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(snake, "_errors", broken)
    assert snake.install(_tiny_dac()) == 0
    monkeypatch.setattr(snake, "_errors", lambda device: (1e-3, 1e-4))  # off: not fused
    assert snake.install(_tiny_dac()) == 0
    model = _tiny_dac().double()
    monkeypatch.setattr(snake, "_errors", lambda device: (0.0, 0.0))
    assert snake.install(model) == 0  # float64 parameters: not fused


def test_install_replaces_every_snake_and_keeps_the_output(monkeypatch):
    # The gates forced open on CPU: each Snake1d's forward is replaced (its alpha stays the
    # parameter), and off CUDA the replacement computes the module's torch expression with the
    # precomputed inverse: bit-identical.
    monkeypatch.setattr(snake, "_device_ok", lambda device: True)
    monkeypatch.setattr(snake, "triton", object())
    monkeypatch.setattr(snake, "_errors", lambda device: (0.0, 0.0))
    model, plain = _tiny_dac(), _tiny_dac()
    assert snake.install(model) == len(_snakes(model)) == 30
    assert all("forward" in vars(s) for s in _snakes(model))
    assert list(model.state_dict()) == list(plain.state_dict())
    z = torch.randn(2, model.config.hidden_size, 13)
    with torch.inference_mode():
        assert torch.equal(model.decoder(z), plain.decoder(z))
    x = torch.randn(2, 1, 40)
    assert torch.equal(model(x).audio_values, plain(x).audio_values)


def test_codec_fuses_nothing_on_cpu_but_finds_the_codecs_snakes(reference_model):
    from server.engine.model.codec import Codec

    codec = Codec(reference_model)
    assert codec.fused_snakes == 0
    assert len(snake._snakes(reference_model.audio_tokenizer)) >= 30  # the acoustic decoder's, at least
    assert not any("forward" in vars(s) for s in snake._snakes(reference_model.audio_tokenizer))
