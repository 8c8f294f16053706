"""The codec decoder's Snake activations as one Triton kernel each (CUDA only).

Each `Snake1d` becomes one launch doing the module's float32 arithmetic with the same roundings
(the reciprocal made once by the module's own expression, no FMA contraction, libdevice's
`sinf` as torch's CUDA `sin`). `install()` swaps a module only where `check()` finds the kernel
equal to its expression, and `CHORUS_FUSED_SNAKE=0` keeps torch's (docs/architecture.md).
"""

from __future__ import annotations

import logging

import torch

from server import envs

try:  # the codec's activation class; matched by class name below as well
    from transformers.models.dac.modeling_dac import Snake1d
except Exception:  # noqa: BLE001
    Snake1d = None

from server.engine.kernels.triton_env import INTERPRET as _INTERPRET

log = logging.getLogger(__name__)

try:  # Triton is optional: CPU installs and machines without it keep the torch expression
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001
    triton = None

_BLOCK = 1024
_MAX_GRID_Y = 65535
_REL_LIMIT = 1e-6

if triton is not None:
    from triton.language.extra import libdevice

    @triton.jit
    def _snake_kernel(x_ptr, alpha_ptr, inv_ptr, out_ptr, C, T, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
        row = tl.program_id(0)  # over B * C rows of the contiguous (B, C, T) input
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < T
        c = row % C
        a = tl.load(alpha_ptr + c)
        inv = tl.load(inv_ptr + c)
        base = row.to(tl.int64) * T
        x = tl.load(x_ptr + base + offs, mask=mask, other=0.0)
        t = a * x
        # Compiled for CUDA: libdevice's precise `__nv_sinf`. Triton's interpreter (the CPU
        # tests) cannot call libdevice (`extern_elementwise` is unsupported there), so under it
        # `tl.sin` (numpy's float32 sin); the branch is resolved at compile time.
        if INTERPRET:
            s = tl.sin(t)
        else:
            s = libdevice.sin(t)
        y = x + inv * (s * s)
        tl.store(out_ptr + base + offs, y, mask=mask)


def available(device: torch.device | str | None = None) -> bool:
    return triton is not None and (device is None or torch.device(device).type == "cuda")


def inverse(alpha: torch.Tensor) -> torch.Tensor:
    """The module's `(alpha + 1e-9).reciprocal()`, by the same torch expression."""
    with torch.no_grad():
        return (alpha.detach() + 1e-9).reciprocal()


def reference(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """`Snake1d.forward` of transformers' DAC, verbatim (the yardstick of `check` and the tests)."""
    shape = x.shape
    x = x.reshape(shape[0], shape[1], -1)
    x = x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)
    return x.reshape(shape)


def fused_snake(x: torch.Tensor, alpha: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """Snake of x (B, C, ...) with alpha and inv = `inverse(alpha)`, each of C elements
    (any shape, e.g. the module's (1, C, 1)); a new tensor shaped like x."""
    shape = x.shape
    x3 = x.reshape(shape[0], shape[1], -1)
    rows, t = x3.shape[0] * x3.shape[1], x3.shape[2]
    use_kernel = (triton is not None and x.dtype == torch.float32 and (x.is_cuda or _INTERPRET)
                  and x3.numel() > 0 and alpha.dtype == torch.float32 and inv.dtype == torch.float32
                  and alpha.device == x.device and inv.device == x.device
                  and triton.cdiv(t, _BLOCK) <= _MAX_GRID_Y)
    if not use_kernel:  # the module's own expression (its reciprocal is `inv`, bit for bit)
        return reference(x, alpha.reshape(1, -1, 1))
    x3 = x3.contiguous()
    a1, i1 = alpha.detach().reshape(-1).contiguous(), inv.reshape(-1).contiguous()
    assert a1.numel() == x3.shape[1] and i1.numel() == x3.shape[1]
    out = torch.empty_like(x3)
    _snake_kernel[(rows, triton.cdiv(t, _BLOCK))](
        x3, a1, i1, out, x3.shape[1], t, BLOCK=_BLOCK, INTERPRET=_INTERPRET, num_warps=4,
        enable_fp_fusion=False, enable_reflect_ftz=False,
    )
    return out.reshape(shape)


def _errors(device) -> tuple[float, float]:
    """(max abs, max relative) difference of the kernel from `reference` on random data."""
    if triton is None or not (torch.device(device).type == "cuda" or _INTERPRET):
        raise RuntimeError(f"the Snake kernel cannot run on {device}" + (" (no Triton)" if triton is None else ""))
    gen = torch.Generator(device="cpu").manual_seed(3)
    worst_abs = worst_rel = 0.0
    for b, c, t in ((1, 7, 1), (1, 16, 1000), (2, 5, 2 * _BLOCK + 37), (3, 24, 511)):
        # |alpha| ~0.1..10 (log-uniform, a few negative, as trained alphas may be), |x| up to ~50
        alpha = torch.exp(torch.empty(1, c, 1).uniform_(-2.3, 2.3, generator=gen))
        alpha = alpha * torch.where(torch.rand(1, c, 1, generator=gen) < 0.1, -1.0, 1.0)
        x = torch.randn(b, c, t, generator=gen) * torch.empty(b, c, 1).uniform_(0.01, 20, generator=gen)
        x = x.clamp(-50, 50)
        alpha, x = alpha.to(device), x.to(device)
        got = fused_snake(x, alpha, inverse(alpha))
        want = reference(x, alpha)
        if got.shape != want.shape or not torch.isfinite(got).all():
            raise RuntimeError(f"Snake kernel gave shape {tuple(got.shape)} or non-finite values")
        diff = (got - want).abs()
        worst_abs = max(worst_abs, float(diff.max()))
        # relative to the size of the two terms summed (want itself can cancel to ~0)
        scale = x.abs() + inverse(alpha).abs()
        worst_rel = max(worst_rel, float((diff / scale).max()))
    return worst_abs, worst_rel


def check(device) -> float:
    """Max abs difference of the kernel from the module's expression on random data (0.0 when
    bit-identical); raises when the kernel cannot run."""
    return _errors(device)[0]


def _snake_classes() -> tuple[type, ...]:
    return () if Snake1d is None else (Snake1d,)


def _snakes(module: torch.nn.Module) -> list[torch.nn.Module]:
    classes = _snake_classes()
    return [m for m in module.modules()
            if (classes and isinstance(m, classes)) or type(m).__name__ == "Snake1d"]


def _device_ok(device: torch.device) -> bool:
    """The gate on where the kernel runs: a CUDA device (Triton's interpreter is never chosen
    for the codec)."""
    return device.type == "cuda"


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version counter
        return None


def _make_forward(module: torch.nn.Module, inv: torch.Tensor):
    alpha = module.alpha  # the Parameter itself: state_dict and load_state_dict are unchanged
    state = {"inv": inv, "version": _version(alpha)}

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        version = _version(alpha)
        if version != state["version"]:  # alpha changed in place (e.g. load_state_dict)
            state["inv"], state["version"] = inverse(alpha), version
        if state["inv"].device != alpha.device:  # the module was moved: its own expression
            return reference(hidden_states, alpha)
        return fused_snake(hidden_states, alpha, state["inv"])

    return forward


def install(module: torch.nn.Module) -> int:
    """Replace the forward of every `Snake1d` under `module` by the fused kernel, where it
    qualifies (see the module docstring); the number replaced, 0 when none (logged why)."""
    snakes = _snakes(module)
    if not snakes:
        log.info("Snake kernel: no Snake1d modules found; nothing to fuse")
        return 0
    alphas = [getattr(m, "alpha", None) for m in snakes]
    if any(not isinstance(a, torch.Tensor) for a in alphas):
        log.info("Snake kernel: a Snake1d has no alpha tensor; keeping the torch expression")
        return 0
    devices = {a.device for a in alphas}
    if len(devices) != 1 or not _device_ok(next(iter(devices))):
        log.info("Snake kernel: Snake parameters on %s, not one CUDA device; keeping the torch expression",
                 sorted(str(d) for d in devices))
        return 0
    device = next(iter(devices))
    if any(a.dtype != torch.float32 for a in alphas):
        log.info("Snake kernel: Snake parameters are not float32; keeping the torch expression")
        return 0
    if not envs.CHORUS_FUSED_SNAKE:
        log.info("Snake kernel: off (CHORUS_FUSED_SNAKE=0); keeping the torch expression")
        return 0
    if triton is None:
        log.info("Snake kernel: Triton unavailable; keeping the torch expression")
        return 0
    try:
        err_abs, err_rel = _errors(device)
    except Exception as exc:  # noqa: BLE001 - fall back, loudly
        log.warning("Snake kernel failed its check (%s); keeping the torch expression", exc)
        return 0
    if err_abs == 0.0:
        how = "bit-identical to the torch expression"
    elif err_rel < _REL_LIMIT:
        how = f"NOT bit-identical: max abs difference {err_abs:.2e}, max relative {err_rel:.2e} (< {_REL_LIMIT:.0e})"
    else:
        log.warning("Snake kernel off by %.2e abs, %.2e relative (limit 0 or %.0e relative); "
                    "keeping the torch expression", err_abs, err_rel, _REL_LIMIT)
        return 0
    for m in snakes:
        m.forward = _make_forward(m, inverse(m.alpha))
    log.info("Snake kernel: %d Snake1d activations fused, one launch each (%s)", len(snakes), how)
    return len(snakes)
