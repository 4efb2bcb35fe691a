//! The epilogue: O = acc / rowsum written through shared memory by TMA (rows past the
//! sequence end are clipped by the tensor map's bounds; the rows >= 0 of a warpgroup
//! that starts before row 0, in a causal first tile, go out from registers), and the
//! LSE (with attention sinks, the sink joins each row's denominator here).
use super::barriers::NamedBarrier;
use super::scheduler::Tile;
use super::traits::{FragTile, KernelTraits, WARPGROUP_ROWS};
use crate::element::Element;
use crate::ptx::mbarrier::Mbarrier;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::tma::{self, TensorMap};
use crate::ptx::{fence, global};
use crate::softmax::OnlineSoftmax;
use common::FwdParams;
use common::gmma::{sw128_offset, sw128_rows};

/// Writes one consumer warpgroup's 64 rows of O and LSE.
///
/// `o_smem`: the staging tile (`BLOCK_M` rows, `HDIM/64` chunks of `BLOCK_M x 128 B`, laid
/// out like Q; each warpgroup writes only its own rows). When it is Q's own buffer,
/// `q_empty` is released here once the store has read it, so the next Q cannot land
/// on O early.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn store<K: KernelTraits>(
    p: &FwdParams,
    tile: &Tile,
    tma_o: TensorMap,
    o_smem: SmemAddr,
    o: &K::Out,
    softmax: &OnlineSoftmax,
    wg: u32,
    thread_in_wg: u32,
    q_empty: Option<Mbarrier>,
) {
    let (inv, lse) = if K::FP8 {
        // The row sums carry P's offset into e4m3's range; the LSE takes it out.
        let (inv, mut lse) = softmax.finalize(super::descale::tile_scales::<K>(p, tile).1);
        for l in lse.iter_mut() {
            *l -= common::fp8::P_EXP2_OFFSET * core::f32::consts::LN_2;
        }
        (inv, lse)
    } else if p.sinks != 0 {
        // SAFETY: the host checked that the sinks cover every query head.
        let sink = f32::from_bits(unsafe { global::ld_nc_u32(p.sinks + 4 * tile.head as u64) });
        softmax.finalize_with_sink(p.softmax_scale, sink)
    } else {
        softmax.finalize(p.softmax_scale)
    };
    // The previous tile's store must be done reading the staging rows.
    if thread_in_wg == 0 {
        tma::store_wait_read::<0>();
    }
    NamedBarrier::Epilogue.sync(wg);
    let warp = thread_in_wg / 32;
    let lane = thread_in_wg % 32;
    let (g, t) = (lane / 4, lane % 4);
    // Fragments of O: 8 columns each.
    const { assert!(K::HDIM % 16 == 0) };
    let frags = (K::HDIM / 8) as usize;
    // n-tile j, row g + 8r: normalised and rounded to the output type.
    let packed = |j: usize, r: usize| K::OutElement::pack2(o.frag(j)[2 * r] * inv[r], o.frag(j)[2 * r + 1] * inv[r]);
    stage_swizzled(o_smem, K::BLOCK_M, wg * WARPGROUP_ROWS, warp, lane, frags, packed);
    // The TMA store reads through the async proxy.
    fence::proxy_async_shared();
    NamedBarrier::Epilogue.sync(wg);
    // Rows past `seqlen_q` are clipped by the TMA store, and skipped for the LSE.
    let row0 = tile.row0 + (wg * WARPGROUP_ROWS) as i32;
    // This thread's row `g + 8r` of its warp's 16, if it exists.
    let thread_row = |r: u32| {
        let row = row0 + (warp * 16 + g + 8 * r) as i32;
        (0..p.seqlen_q as i32).contains(&row).then_some(row)
    };
    if row0 >= 0 {
        if thread_in_wg == 0 {
            for chunk in 0..K::CHUNKS {
                let src = o_smem.add(sw128_rows(K::BLOCK_M, chunk, wg * WARPGROUP_ROWS));
                // SAFETY: 64 rows x 128 B written above and fenced.
                unsafe { tma_o.store_5d(src, [0, row0, chunk as i32, tile.head as i32, tile.batch as i32]) };
            }
            tma::store_commit();
        }
    } else {
        // Rows of a causal first tile that starts above row 0: the TMA unit faults on a
        // store box that starts there (CUDA_ERROR_ILLEGAL_INSTRUCTION on the H100, where
        // loads from there zero-fill), so these go out from registers, the rows before 0
        // dropped. At most one warpgroup's worth per (batch, head).
        let head_base = p.o + 2 * (tile.batch as u64 * p.o_strides.batch + tile.head as u64 * p.o_strides.head);
        for r in 0..2 {
            if let Some(row) = thread_row(r as u32) {
                let row_base = head_base + 2 * row as u64 * p.o_strides.row;
                for j in 0..frags {
                    // SAFETY: inside the host-checked O tensor; 4 B aligned (even column,
                    // strides that the TMA store already needs to be multiples of 16 B).
                    unsafe { global::st_u32(row_base + 2 * (8 * j as u64 + 2 * t as u64), packed(j, r)) };
                }
            }
        }
    }
    if t == 0 {
        for r in 0..2 {
            if let Some(row) = thread_row(r as u32) {
                let idx = ((tile.batch * p.heads_q + tile.head) as u64) * p.seqlen_q as u64 + row as u64;
                // SAFETY: the host sized the LSE buffer for batch * heads_q * seqlen_q.
                unsafe { global::st_f32(p.lse + 4 * idx, lse[r]) };
            }
        }
    }
    if let Some(q_empty) = q_empty {
        if thread_in_wg == 0 {
            tma::store_wait_read::<0>();
        }
        NamedBarrier::Epilogue.sync(wg);
        q_empty.arrive();
    }
}

/// Writes a warpgroup's accumulator tile (64 rows, `frags` n-tiles of 8 columns, each
/// element pair packed by `packed(n_tile, row_half)`) into rows `row0..row0 + 64` of a
/// 128 B-swizzled tile of `tile_rows` rows (64-column chunks stacked, as TMA and WGMMA
/// read it), with `stmatrix`. Every thread of the warpgroup takes part, as lane `lane`
/// of warp `warp` (of the warpgroup).
#[inline(always)]
pub fn stage_swizzled(tile: SmemAddr, tile_rows: u32, row0: u32, warp: u32, lane: u32, frags: usize, packed: impl Fn(usize, usize) -> u32) {
    stage_swizzled_at(tile, tile_rows, row0, 0, warp, lane, frags, packed)
}

/// As [`stage_swizzled`], into columns `col0..col0 + 8 frags` (`col0` a multiple of 16).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn stage_swizzled_at(tile: SmemAddr, tile_rows: u32, row0: u32, col0: u32, warp: u32, lane: u32, frags: usize, packed: impl Fn(usize, usize) -> u32) {
    // stmatrix x4 per two n-tiles: matrices (rows 0-7, n-tile j), (rows 8-15, j),
    // (rows 0-7, j + 1), (rows 8-15, j + 1) of this warp's 16 rows; this lane addresses
    // row `lane % 8` of matrix `lane / 8`.
    let m = lane / 8;
    let row = row0 + warp * 16 + (m % 2) * 8 + lane % 8;
    for j in (0..frags).step_by(2) {
        let col = col0 + 8 * (j as u32 + m / 2);
        let r = [packed(j, 0), packed(j, 1), packed(j + 1, 0), packed(j + 1, 1)];
        // SAFETY: 16 B rows inside this warpgroup's rows of the staging tile; 16 B aligned
        // (a whole swizzle unit).
        unsafe { smem::stmatrix_x4(tile.add(sw128_offset(tile_rows, row, col)), r) };
    }
}

/// Before the CTA exits: shared memory must outlive the last store's reads.
#[inline(always)]
pub fn drain(thread_in_wg: u32) {
    if thread_in_wg == 0 {
        tma::store_wait_read::<0>();
    }
}
