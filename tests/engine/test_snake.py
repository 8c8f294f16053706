"""The codec's fused Snake activation: `install`'s gates (nothing changes on CPU; where it does
fuse, every Snake1d is replaced and the module computes what it computed before). The kernel
against `Snake1d`'s float32 expression through Triton's interpreter: tests/kernels/."""

from __future__ import annotations

import torch
from transformers import DacConfig, DacModel

from server.engine.kernels import snake


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
