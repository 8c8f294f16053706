"""`python -m microbench.cute_build` and `cutlass_gemm --kind cute` on the CPU: the configuration
table, the C++ entry points written over the exported kernels' headers (which dynamic fields each
tensor struct has depends on the shapes left to run time), and the harness's refusal."""

from __future__ import annotations

import pytest
import torch

from microbench import cute_build, cutlass_gemm
from microbench.cute_configs import CUTE_CONFIGS, CuteConfig
from microbench.cutlass_configs import PROJECTIONS

pytestmark = pytest.mark.bench

HEADER = """typedef struct {
    cudaLibrary_t module;
} NAME_Kernel_Module_t;
typedef struct {
    void *data;
} NAME_Tensor_w_t;
typedef struct {
    void *data;
    int32_t dynamic_shapes[1];
    int64_t dynamic_strides[1];
} NAME_Tensor_x_t;
typedef struct {
    void *data;
    int32_t dynamic_shapes[1];
} NAME_Tensor_y_t;
"""


def test_configurations_are_named_once_and_fit_the_projections_they_are_built_for():
    names = [c.name for c in CUTE_CONFIGS]
    assert len(names) == len(set(names))
    assert set(cutlass_gemm.configs_of("cute")) == set(names)
    assert CuteConfig(64, 144, ksplit=4).name == "dsl_sw_64x144_k4"
    assert CuteConfig(64, 128, mcast=4).name == "dsl_sw_64x128_m4"
    # down's k (3072) is 48 tiles of 64: a split in 8 fits, in 32 would not; o's 1024 weight rows
    # are 16 tiles of 64 for a multicast cluster of 4, 8 tiles of 128 for one of 16
    assert CuteConfig(64, 144, ksplit=8).fits(*PROJECTIONS["down"])
    assert not CuteConfig(64, 144, ksplit=32).fits(*PROJECTIONS["down"])
    assert CuteConfig(64, 128, mcast=4).fits(*PROJECTIONS["o"])
    assert not CuteConfig(128, 128, mcast=16).fits(*PROJECTIONS["o"])
    # bf16 out and unsplit as the harness sees them: the k split is inside the cluster
    assert all(not c.partials and c.splits(p, 135) == (1,) for c in CUTE_CONFIGS for p in PROJECTIONS)


def test_a_tensor_struct_is_filled_with_the_dynamic_fields_its_header_declares():
    header = HEADER.replace("NAME", "k")
    assert cute_build._tensor(header, "k_Tensor_w_t", "(void*)w", {}) == "{(void*)w}"
    x = cute_build._tensor(header, "k_Tensor_x_t", "(void*)x", {"dynamic_shapes": "t", "dynamic_strides": "s"})
    assert x == "{(void*)x, {t}, {s}}"
    y = cute_build._tensor(header, "k_Tensor_y_t", "d", {"dynamic_shapes": "t", "dynamic_strides": "s"})
    assert y == "{d, {t}}"


def test_each_configuration_dispatches_on_its_projection_and_launch_kind(tmp_path):
    one = CuteConfig(64, 144)
    made = []
    for proj in ("qkv", "o"):
        for pdl in (False, True):
            name = cute_build._variant(one, proj, pdl)
            (tmp_path / f"{name}.h").write_text(HEADER.replace("NAME", name))
            made.append((one, proj, pdl, name))
    src = cute_build._entry_points(tmp_path, made)
    assert 'extern "C" {' in src and src.count("int dsl_sw_64x144_run(") == 1
    assert "size_t dsl_sw_64x144_workspace(" in src and "int chorus_cute_load(void)" in src
    n, k = PROJECTIONS["o"]
    assert (f"if (n == {n} && k == {k} && splits == 1 && (flags & 1) == 1) "
            f"return dsl_sw_64x144_o_pdl_call(x, w, d, m, n, k, stream) ? 4 : 0;") in src
    assert "dsl_sw_64x144_qkv_Tensor_x_t tx = {(void*)x, {t}, {(int64_t)t * k}};" in src
    assert "dsl_sw_64x144_qkv_Tensor_y_t ty = {d, {t}};" in src
    for _, _, _, name in made:
        assert f'#include "{name}.h"' in src and f"{name}_Kernel_Module_Load(&{name}_module)" in src


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_cute_sweep_refuses_a_machine_without_cuda(tmp_path, capsys):
    out = tmp_path / "out.json"
    assert cutlass_gemm.main(["--kind", "cute", "--lib", str(tmp_path / "none.so"), "--out", str(out)]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not out.exists()
