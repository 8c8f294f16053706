"""FlashInfer attention (CUDA): ragged, non-causal, planned once per step for every layer.

Documents are told apart by the plan's indptr (a CPU tensor, so planning never syncs). Plans
alternate between two wrappers so a plan's pending host-to-device copy is never overwritten;
graphs get a CUDA-graph-mode wrapper per bucket (`GraphPlanner`); small steps go to the Triton
kernel (`triton_backend`) when its start-up check passes (docs/architecture.md, "Kernels").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from server import envs
from server.engine.kernels.attention import triton_backend as triton_attention
from server.engine.kernels.attention.base import graph_layout
from server.engine.kernels.triton_env import checked_error
from server.engine.upstream import missing_names

log = logging.getLogger(__name__)

FLASHINFER_VERSION = "0.6.15.post1"
# Every FlashInfer name Chorus calls: (module, attribute).
REQUIRED_NAMES: tuple[tuple[str, str], ...] = (
    ("flashinfer", "BatchPrefillWithRaggedKVCacheWrapper"),
    ("flashinfer.norm", "rmsnorm"),
    ("flashinfer.norm", "fused_add_rmsnorm"),
    ("flashinfer.rope", "apply_rope_pos_ids_inplace"),
    ("flashinfer.activation", "silu_and_mul"),
)
WORKSPACE_BYTES = 128 * 1024 * 1024
# Steps of at most this many packed rows attend with the Triton kernel (0: never), by how it
# can load (`triton_backend`: TMA on Hopper, pointers elsewhere): up to where it stays ahead of
# FlashInfer's kernel (docs/performance.md). CHORUS_SMALL_ATTENTION_ROWS overrides it.
SMALL_ROWS = 1024
SMALL_ROWS_TMA = 4608


def default_small_rows(device: torch.device) -> int:
    return SMALL_ROWS_TMA if triton_attention.tma_loads(torch.device(device)) else SMALL_ROWS


class FlashInferMissing(ImportError):
    """FlashInfer is absent, or lacks a name Chorus calls."""


def check_flashinfer() -> str:
    """Boot check: import FlashInfer and verify every name Chorus uses; returns its version.

    Raises `FlashInferMissing` naming what is absent, so an upgrade that moved a name fails
    at start-up (and `auto` falls back to the torch path, logged) instead of mid-request.
    """
    try:
        import flashinfer  # lazy: optional, CUDA installs only
    except Exception as exc:  # ImportError, or a CUDA/ABI error raised while importing
        raise FlashInferMissing(f"flashinfer does not import: {exc}") from exc

    missing = missing_names(REQUIRED_NAMES)
    if missing:
        raise FlashInferMissing(
            "the installed flashinfer lacks names Chorus calls: " + ", ".join(missing)
            + f" (Chorus is built against flashinfer-python=={FLASHINFER_VERSION})"
        )
    version = getattr(flashinfer, "__version__", "unknown")
    if version != FLASHINFER_VERSION:
        log.warning("flashinfer %s found; Chorus is measured with %s", version, FLASHINFER_VERSION)
    return version


def doc_indptr(doc_lens: list[int]) -> torch.Tensor:
    """CPU int32 prefix sums [0, l0, l0+l1, ...]: FlashInfer's ragged indptr."""
    out = torch.zeros(len(doc_lens) + 1, dtype=torch.int32)
    if doc_lens:
        torch.cumsum(torch.tensor(doc_lens, dtype=torch.int32), 0, out=out[1:])
    return out


def _backend_for(device: torch.device) -> str:
    # The prebuilt kernels Chorus ships for Hopper are FA3 ("_sm90") modules; elsewhere let
    # FlashInfer choose (it compiles what it picks on first use).
    major, _ = torch.cuda.get_device_capability(device)
    return "fa3" if major == 9 else "auto"


@dataclass
class _Slot:
    wrapper: object
    planned: torch.cuda.Event | None = None
    layout: tuple[int, ...] | None = None  # doc_lens of its current plan


class FlashInferAttention:
    """The AttentionBackend protocol on FlashInfer's ragged prefill kernel (NHD layout)."""

    name = "flashinfer"

    def __init__(self, device: torch.device, dtype: torch.dtype, scale: float,
                 num_q_heads: int, num_kv_heads: int, head_dim: int, small_rows: int | None = None):
        check_flashinfer()
        import flashinfer  # lazy: optional, CUDA installs only

        self.device = torch.device(device)
        self.dtype = dtype
        self.scale = scale
        self.num_q_heads, self.num_kv_heads, self.head_dim = num_q_heads, num_kv_heads, head_dim
        self.backend = _backend_for(self.device)
        # One float workspace serves every wrapper: they run one after another on one stream.
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self._slots = [
            _Slot(flashinfer.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD", backend=self.backend))
            for _ in range(2)
        ]
        self._next = 0
        if small_rows is None:
            small_rows = envs.CHORUS_SMALL_ATTENTION_ROWS
        if small_rows is None:
            small_rows = default_small_rows(self.device)
        self.small, self.small_rows = self._small_kernel(small_rows)

    def _small_kernel(self, rows: int):
        """The Triton attention for steps of up to `rows` rows, if it runs here and passes its
        check; else (None, 0), logged."""
        if rows <= 0:
            return None, 0
        if not triton_attention.available(self.device):
            log.info("small-step attention: Triton unavailable, FlashInfer for every step")
            return None, 0
        err = checked_error("small-step attention", lambda: triton_attention.check(
            self.device, self.dtype, self.num_q_heads, self.num_kv_heads, self.head_dim),
            self.dtype, "FlashInfer for every step")
        if err is None:
            return None, 0
        self.small_check_error = err
        return triton_attention.TritonAttention(self.device, self.scale), rows

    def _plan_wrapper(self, wrapper, indptr: torch.Tensor) -> None:
        wrapper.plan(
            indptr, indptr, self.num_q_heads, self.num_kv_heads, self.head_dim,
            causal=False, sm_scale=self.scale, q_data_type=self.dtype, kv_data_type=self.dtype,
        )

    def plan(self, doc_lens: list[int]) -> object:
        if self.small is not None and sum(doc_lens) <= self.small_rows:
            return self.small.plan(doc_lens)
        layout = tuple(doc_lens)
        for slot in self._slots:
            if slot.layout == layout:  # same documents as a live plan: nothing to do
                return slot.wrapper
        slot = self._slots[self._next]
        self._next ^= 1
        if slot.planned is not None:
            slot.planned.synchronize()  # its previous host->device plan copy has run
        slot.layout = None
        self._plan_wrapper(slot.wrapper, doc_indptr(doc_lens))
        slot.layout = layout
        if slot.planned is None:
            slot.planned = torch.cuda.Event()
        slot.planned.record()
        return slot.wrapper

    def attend(self, plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               out: torch.Tensor | None = None) -> torch.Tensor:
        return plan.run(q, k, v, out=out)

    def graph_planner(self, num_docs: int, max_rows: int):
        if self.small is not None and max_rows <= self.small_rows:
            return self.small.graph_planner(num_docs, max_rows)
        return GraphPlanner(self, num_docs, max_rows)


class GraphPlanner:
    """A FlashInfer wrapper in CUDA-graph mode for exactly `num_docs` documents and
    `max_rows` packed rows: plan it (outside the graph) before every replay."""

    def __init__(self, attn: FlashInferAttention, num_docs: int, max_rows: int):
        import flashinfer  # lazy: optional, CUDA installs only

        self.attn = attn
        self.num_docs, self.max_rows = num_docs, max_rows
        self.qo_indptr = torch.zeros(num_docs + 1, dtype=torch.int32, device=attn.device)
        self.kv_indptr = torch.zeros(num_docs + 1, dtype=torch.int32, device=attn.device)
        self.wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            attn.workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=self.qo_indptr,
            kv_indptr_buf=self.kv_indptr, backend=attn.backend,
        )
        self._planned: torch.cuda.Event | None = None
        self._layout: tuple[int, ...] | None = None

    def plan(self, doc_lens: list[int]) -> object:
        layout = graph_layout(doc_lens, self.num_docs, self.max_rows)
        if layout == self._layout:  # a steady step: the plan in the workspace still holds
            return self.wrapper
        if self._planned is not None:
            self._planned.synchronize()
        self._layout = None
        self.attn._plan_wrapper(self.wrapper, doc_indptr(doc_lens))
        self._layout = layout
        if self._planned is None:
            self._planned = torch.cuda.Event()
        self._planned.record()
        return self.wrapper
