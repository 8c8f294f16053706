"""A small step's projection as a CuTe DSL kernel: Y (t x n) = X (t x k) @ W (n x k)^T in bf16.

Laid out for few tokens: the weights are the WGMMA's M side (`tile_m` weight rows a CTA, one
warp group per 64), the tokens its N side (`tile_n` a CTA, a multiple of 16 up to 256: 80 or 144
for a fast-start step's 135 rows), k in 64-wide stages as deep as shared memory allows. Warp 0
also issues the TMA loads. With `pdl`, the kernel is launched with programmatic dependent
launch: it loads its first stages' weights (which no earlier kernel writes) before it waits on
the kernel before it, and lets the next kernel start as soon as it has waited. The result goes
out through shared memory with TMA stores, which clip the last token tile.

Two cluster variants: `split` CTAs share one output tile, each a share of k, their fp32 tiles
summed through distributed shared memory (bf16 out, no second kernel); `mcast` CTAs of
neighbouring weight rows load the token tile once between them, multicast to all.

Compiled ahead of time on any machine with the DSL (no GPU): `microbench/cute_build.py`.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

WARP_GROUP = 128
K_TILE = 64
SMEM_BYTES = 227 * 1024
BARRIER_BYTES = 1024
EPI_STAGES = 2


@dsl_user_op
def cluster_smem_address(ptr: cute.Pointer, rank: cutlass.Int32, *, loc=None, ip=None) -> cutlass.Int32:
    """The shared::cluster address of `ptr` (this CTA's shared memory) in CTA `rank`'s."""
    local = llvm.ptrtoint(T.i32(), ptr.to_llvm_ptr(loc=loc, ip=ip), loc=loc, ip=ip)
    return cutlass.Int32(llvm.inline_asm(T.i32(), [local, cutlass.Int32(rank).ir_value(loc=loc, ip=ip)],
                                         "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r",
                                         has_side_effects=False, loc=loc, ip=ip))


@dsl_user_op
def load_cluster_f32x4(address: cutlass.Int32, *, loc=None, ip=None) -> tuple:
    """Four consecutive fp32 from a 16-byte aligned shared::cluster address (another CTA's)."""
    four = llvm.inline_asm(llvm.StructType.get_literal([T.f32()] * 4),
                           [cutlass.Int32(address).ir_value(loc=loc, ip=ip)],
                           "ld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,r",
                           has_side_effects=True, loc=loc, ip=ip)
    return tuple(cutlass.Float32(llvm.extractvalue(T.f32(), four, [i], loc=loc, ip=ip)) for i in range(4))


class SmallStepGemm:
    """One kernel configuration; `__call__` is the host function `cute.compile` traces."""

    def __init__(self, tile_m: int, tile_n: int, pdl: bool, split: int = 1, mcast: int = 1, max_stages: int = 8):
        if tile_m not in (64, 128) or tile_n % 16 or not 16 <= tile_n <= 256:
            raise ValueError(f"tile {tile_m}x{tile_n}: 64 or 128 weight rows, 16..256 tokens in steps of 16")
        if split not in (1, 2, 4, 8) or tile_n % split:
            raise ValueError(f"split {split}: 1, 2, 4 or 8 CTAs of a cluster (each a share of k, then of the tokens)")
        if mcast not in (1, 2, 4) or (mcast > 1 and split > 1) or (tile_n // mcast) % 8:
            raise ValueError(f"mcast {mcast}: 1, 2 or 4 CTAs of a cluster (not with a k split), 8-row token shares")
        self.tile = (tile_m, tile_n, K_TILE)
        self.pdl = pdl
        self.split = split
        self.mcast = mcast
        self.cluster = split * mcast
        self.warp_groups = tile_m // 64
        self.threads = self.warp_groups * WARP_GROUP
        stage_bytes = (tile_m + tile_n) * K_TILE * 2
        self.epi_n = 32 if tile_n % 32 == 0 else 16  # the store's tile must divide the CTA's
        epi_bytes = EPI_STAGES * tile_m * self.epi_n * 2
        self.red_elems = tile_m * tile_n if split > 1 else 1  # fp32 partial tile a peer reads (split > 1)
        self.stages = min(max_stages, (SMEM_BYTES - BARRIER_BYTES - epi_bytes - 4 * self.red_elems) // stage_bytes)

    @cute.jit
    def __call__(self, w: cute.Tensor, x: cute.Tensor, y: cute.Tensor, stream: cuda.CUstream):
        """w: (n, k, 1) k-major; x: (t, k, 1) k-major; y: (n, t, 1) n-major (Y row-major)."""
        self.dtype = w.element_type
        w_major = utils.LayoutEnum.from_tensor(w)
        x_major = utils.LayoutEnum.from_tensor(x)
        self.y_major = utils.LayoutEnum.from_tensor(y)
        self.mma = sm90.make_trivial_tiled_mma(self.dtype, self.dtype, w_major.sm90_mma_major_mode(),
                                               x_major.sm90_mma_major_mode(), cutlass.Float32,
                                               (self.warp_groups, 1, 1), tiler_mn=(64, self.tile[1]))
        self.epi_tile = (self.tile[0], self.epi_n)
        w_smem = sm90.make_smem_layout_a(w_major, self.tile, self.dtype, self.stages)
        x_smem = sm90.make_smem_layout_b(x_major, self.tile, self.dtype, self.stages)
        y_smem = sm90.make_smem_layout_epi(self.dtype, self.y_major, self.epi_tile, EPI_STAGES)
        g2s = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        w_atom, w_tma = cute.nvgpu.cpasync.make_tiled_tma_atom(
            g2s, w, cute.slice_(w_smem, (None, None, 0)), (self.tile[0], self.tile[2]))
        # mcast > 1: the CTAs of a cluster (neighbouring weight rows, the same tokens) each load a
        # share of the token tile and multicast it to all, so the L2 cache serves it once a cluster
        x_op = cute.nvgpu.cpasync.CopyBulkTensorTileG2SMulticastOp() if self.mcast > 1 else g2s
        x_atom, x_tma = cute.nvgpu.cpasync.make_tiled_tma_atom(
            x_op, x, cute.slice_(x_smem, (None, None, 0)), (self.tile[1], self.tile[2]), num_multicast=self.mcast)
        y_atom, y_tma = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileS2GOp(), y, cute.slice_(y_smem, (None, None, 0)), self.epi_tile)

        @cute.struct
        class Storage:
            barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            sw: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(w_smem)], 1024]
            sx: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(x_smem)], 1024]
            sy: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(y_smem)], 1024]
            red: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, self.red_elems], 128]

        self.storage = Storage
        tiles = cute.get(cute.zipped_divide(y, tiler=self.tile[:2]).layout, mode=[1]).shape
        grid = (tiles[0] * self.split, tiles[1], tiles[2])
        self.kernel(w_atom, w_tma, x_atom, x_tma, y_atom, y_tma, y, self.mma, w_smem, x_smem, y_smem).launch(
            grid=grid, block=[self.threads, 1, 1], cluster=(self.cluster, 1, 1), stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, w_atom: cute.CopyAtom, mw: cute.Tensor, x_atom: cute.CopyAtom, mx: cute.Tensor,
               y_atom: cute.CopyAtom, my: cute.Tensor, y: cute.Tensor, mma: cute.TiledMma,
               w_smem: cute.ComposedLayout, x_smem: cute.ComposedLayout, y_smem: cute.ComposedLayout):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        bx, bn, _ = cute.arch.block_idx()
        # split > 1: a cluster of `split` CTAs shares one output tile, each a 1/split share of k
        rank = cutlass.Int32(0)
        bm = bx
        if cutlass.const_expr(self.cluster > 1):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        if cutlass.const_expr(self.split > 1):
            bm = bx // self.split
        cta_layout = cute.make_layout((self.mcast, 1, 1))  # the cluster along the weight rows (multicast)
        if warp == 0:
            cute.nvgpu.cpasync.prefetch_descriptor(w_atom)
            cute.nvgpu.cpasync.prefetch_descriptor(x_atom)

        smem = cutlass.utils.SmemAllocator()
        st = smem.allocate(self.storage)
        stage_bytes = (cute.size_in_bytes(self.dtype, cute.slice_(w_smem, (None, None, 0)))
                       + cute.size_in_bytes(self.dtype, cute.slice_(x_smem, (None, None, 0))))
        # a stage is free once every CTA it was multicast to has read it
        loads = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.barriers.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.mcast * self.threads // 32),
            tx_count=stage_bytes, cta_layout_vmnk=cute.make_layout((1, self.mcast, 1, 1)), defer_sync=True)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(self.mcast, 1), is_relaxed=True)

        sw = st.sw.get_tensor(w_smem.outer, swizzle=w_smem.inner)
        sx = st.sx.get_tensor(x_smem.outer, swizzle=x_smem.inner)
        sy = st.sy.get_tensor(y_smem.outer, swizzle=y_smem.inner)
        coord = (bm, bn, None, 0)
        gw = cute.local_tile(mw, self.tile, coord, proj=(1, None, 1))
        gx = cute.local_tile(mx, self.tile, coord, proj=(None, 1, 1))
        gy = cute.local_tile(my, self.tile, coord, proj=(1, 1, None))
        one = cute.make_layout(1)
        tws, twg = cute.nvgpu.cpasync.tma_partition(w_atom, 0, one, cute.group_modes(sw, 0, 2),
                                                     cute.group_modes(gw, 0, 2))
        x_mask = 0
        x_rank = 0
        if cutlass.const_expr(self.mcast > 1):
            x_rank = rank
            x_mask = cute.make_layout_image_mask(cta_layout, cta_layout.get_flat_coord(rank), mode=0)
        txs, txg = cute.nvgpu.cpasync.tma_partition(x_atom, x_rank, cute.make_layout(self.mcast),
                                                     cute.group_modes(sx, 0, 2), cute.group_modes(gx, 0, 2))

        wg = cute.arch.make_warp_uniform(tidx // WARP_GROUP)
        thr = mma.get_slice(cute.make_layout(self.warp_groups, stride=WARP_GROUP)(wg))
        frag_w = mma.make_fragment_A(thr.partition_A(sw))
        frag_x = mma.make_fragment_B(thr.partition_B(sx))
        acc = cute.make_rmem_tensor(thr.partition_C(gy).shape, cutlass.Float32)
        pipeline.pipeline_init_wait(cluster_shape_mn=(self.mcast, 1))

        k_tiles = cute.size(gw, mode=[2]) // self.split
        k0 = rank * k_tiles if self.split > 1 else 0
        first = cutlass.min(self.stages, k_tiles)
        produce = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        if warp == 0:
            # the weights of the first stages need nothing from the kernel before this one
            weights_state = produce.clone()
            for _ in cutlass.range(first, unroll=1):
                loads.producer_acquire(weights_state)
                cute.copy(w_atom, twg[(None, k0 + weights_state.count)], tws[(None, weights_state.index)],
                          tma_bar_ptr=loads.producer_get_barrier(weights_state))
                weights_state.advance()
            if cutlass.const_expr(self.pdl):
                cute.arch.griddepcontrol_wait()
            for _ in cutlass.range(first, unroll=1):
                cute.copy(x_atom, txg[(None, k0 + produce.count)], txs[(None, produce.index)],
                          tma_bar_ptr=loads.producer_get_barrier(produce), mcast_mask=x_mask)
                loads.producer_commit(produce)
                produce.advance()
        if cutlass.const_expr(self.pdl):
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        blocks = cute.size(frag_w, mode=[2])
        acc.fill(0.0)  # accumulate from the start: no MMA state carried through the k loop
        mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
        for kt in cutlass.range(k_tiles, unroll=1):
            loads.consumer_wait(read)
            cute.nvgpu.warpgroup.fence()
            for kb in cutlass.range(blocks, unroll_full=True):
                at = (None, None, kb, read.index)
                cute.gemm(mma, acc, frag_w[at], frag_x[at], acc)
            cute.nvgpu.warpgroup.commit_group()
            read.advance()
            if kt > 0:
                # the stage read one step ago is free once at most this step's MMAs are in flight;
                # warp 0 refills it only after releasing it itself (it is a consumer too)
                cute.nvgpu.warpgroup.wait_group(1)
                loads.consumer_release(release)
                release.advance()
                if warp == 0 and produce.count < k_tiles:
                    loads.producer_acquire(produce)
                    cute.copy(w_atom, twg[(None, k0 + produce.count)], tws[(None, produce.index)],
                              tma_bar_ptr=loads.producer_get_barrier(produce))
                    cute.copy(x_atom, txg[(None, k0 + produce.count)], txs[(None, produce.index)],
                              tma_bar_ptr=loads.producer_get_barrier(produce), mcast_mask=x_mask)
                    loads.producer_commit(produce)
                    produce.advance()
        cute.nvgpu.warpgroup.wait_group(0)
        if cutlass.const_expr(self.mcast > 1):  # no CTA leaves while a peer may still signal its barriers
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        if cutlass.const_expr(self.split > 1):
            red = st.red.get_tensor(cute.make_layout((self.tile[0], self.tile[1]), stride=(1, self.tile[0])))
            self.reduce_store(acc, red, mma, y, bm, bn, rank, tidx)
        else:
            self.store(acc, sy, gy, y_atom, mma, tidx, warp)

    @cute.jit
    def reduce_store(self, acc: cute.Tensor, red: cute.Tensor, mma: cute.TiledMma, y: cute.Tensor, bm: cutlass.Int32,
                     bn: cutlass.Int32, rank: cutlass.Int32, tidx: cutlass.Int32):
        """The cluster's partial tiles summed through distributed shared memory: each CTA puts
        its fp32 tile in its own shared memory, then sums one 1/split share of the tokens over
        every CTA's tile and stores it (weight rows fastest, so a warp's stores are contiguous)."""
        to_smem = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32), mma)
        mine = to_smem.get_slice(tidx)
        cute.copy(to_smem, mine.retile(acc), mine.partition_D(red))
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        tm, tn = self.tile[0], self.tile[1]
        share = tn // self.split
        peers = [cluster_smem_address(red.iterator, q) for q in range(self.split)]
        tokens = cute.size(y, mode=[1])
        quads = tm // 4  # each thread sums four consecutive weight rows of one token
        for e in cutlass.range(tidx, quads * share, self.threads, unroll=2):
            m = (e % quads) * 4
            tok = rank * share + e // quads
            offset = (tok * tm + m) * 4  # red is (tm, tn) with the weight rows fastest
            total = list(load_cluster_f32x4(peers[0] + offset))
            for q in cutlass.range_constexpr(1, self.split):
                more = load_cluster_f32x4(peers[q] + offset)
                total = [a + b for a, b in zip(total, more)]
            if bn * tn + tok < tokens:
                for j in cutlass.range_constexpr(4):
                    y[bm * tm + m + j, bn * tn + tok, 0] = total[j].to(self.dtype)
        cute.arch.cluster_arrive()  # no CTA leaves while a peer may still read its tile
        cute.arch.cluster_wait()

    @cute.jit
    def store(self, acc: cute.Tensor, sy: cute.Tensor, gy: cute.Tensor, y_atom: cute.CopyAtom,
              mma: cute.TiledMma, tidx: cutlass.Int32, warp: cutlass.Int32):
        """Registers -> shared memory (stmatrix) -> global memory (TMA), one epilogue tile at a time."""
        r2s_atom = sm90.sm90_get_smem_store_op(self.y_major, elem_ty_d=self.dtype, elem_ty_acc=cutlass.Float32)
        c_atom = cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(self.y_major.is_m_major_c(), 4), self.dtype)
        r2s = cute.make_tiled_copy_S(r2s_atom, cute.make_tiled_copy_C_atom(c_atom, mma))
        thr = r2s.get_slice(tidx)
        dst = thr.partition_D(sy)
        acc_view = r2s.retile(acc)
        part_layout = cute.make_layout(cute.shape(thr.partition_S(sy))[:3])
        part = cute.make_rmem_tensor_like(part_layout, cutlass.Float32)
        n_part = cute.size(part)
        tiles = cute.zipped_divide(gy, self.epi_tile)
        s_part, g_part = cute.nvgpu.cpasync.tma_partition(y_atom, 0, cute.make_layout(1),
                                                          cute.group_modes(sy, 0, 2), tiles)
        n_tiles = cute.size(tiles, mode=[1])
        tile_shape = tiles.shape[1]
        tile_order = cute.make_layout(tile_shape, stride=(tile_shape[1], 1))
        stores = pipeline.PipelineTmaStore.create(
            num_stages=EPI_STAGES, producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.threads))
        for e in cutlass.range_constexpr(n_tiles):
            for v in cutlass.range_constexpr(n_part):
                part[v] = acc_view[e * n_part + v]
            out = cute.make_rmem_tensor_like(part_layout, self.dtype)
            out.store(part.load().to(self.dtype))
            buf = e % EPI_STAGES
            cute.copy(r2s, out, dst[(None, None, None, buf)])
            cute.arch.fence_proxy("async.shared", space="cta")
            pipeline.sync(barrier_id=1)
            if warp == 0:
                cute.copy(y_atom, s_part[(None, buf)], g_part[(None, tile_order.get_hier_coord(e))])
                stores.producer_commit()
                stores.producer_acquire()
            pipeline.sync(barrier_id=1)
        if warp == 0:
            stores.producer_tail()
