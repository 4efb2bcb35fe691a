//! The backward's first launch: per query row `D = rowsum(dO ∘ O)` and the LSE times
//! log2 e into the padded workspaces (rows past `seqlen_q`: D = 0, LSE = +inf, so that
//! their `P` is 0), the row block of the fp32 dQ accumulator zeroed, and in deterministic
//! mode the query block's semaphore; with attention sinks, each warp's partial sum of the
//! sink gradient `−exp(sink − LSE) · D` over its rows (summed by the postprocess).
//! Grid `(heads_q, row blocks of PREPROCESS_ROWS, batch)` ([`row_blocks`]),
//! [`AUX_THREADS`] threads.
//!
//! The kernel is a pure memory pass (hdim 128, 16 x 1k x 16 heads: 64 MiB of O and of dO
//! read, 128 MiB of accumulator zeroed), so it keeps as many bytes in flight as it can:
//! 16-byte loads, every load of a warp's rows issued before the first is used, and the
//! accumulator's zeros stored while they are in flight.
use crate::element::Element;
use crate::ptx::{global, math, sreg};
use common::bwd::{ACCUM_ROWS, AUX_THREADS, BwdParams, PREPROCESS_ROWS, PreprocessLanes, sink_partials_per_head};

const WARPS: u32 = AUX_THREADS / 32;
// One semaphore per accumulator block: the row block's first row owns it.
const _: () = assert!(PREPROCESS_ROWS == ACCUM_ROWS && PREPROCESS_ROWS % WARPS == 0);

/// Runs `f(block)` for each row block (of [`PREPROCESS_ROWS`] rows, `rows` in all) of
/// this CTA. The heads are the grid's x, so that the CTAs that run together cover every
/// head of the same tokens: whole `[b, s, h, d]` rows of O, dO and dQ rather than one
/// head's 128-512 bytes of each, 2-4 KiB apart. The row blocks are y, strided by the grid
/// (the host caps y at 65535).
#[inline(always)]
pub(crate) fn row_blocks(rows: u32, mut f: impl FnMut(u32)) {
    let blocks = rows.div_ceil(PREPROCESS_ROWS);
    let mut block = sreg::block_idx_y();
    while block < blocks {
        f(block);
        block += sreg::grid_dim_y();
    }
}

/// The preprocess kernel body for element type `E` at head dim `HDIM`.
///
/// # Safety
/// The host sized and validated every buffer of `p` (rows of O and dO start 16-byte
/// aligned).
#[inline(always)]
pub unsafe fn preprocess<E: Element, const HDIM: u32>(p: BwdParams) {
    let (head, batch) = (sreg::block_idx_x(), sreg::block_idx_z());
    let t = sreg::thread_idx_x();
    let (warp, lane) = (t / 32, t % 32);
    let bh = (batch * p.heads_q + head) as u64;
    // 16 bytes (8 elements) a lane; `PreprocessLanes` maps lanes to rows and columns.
    let lanes = PreprocessLanes::new(HDIM);
    let (passes, col, leader) = (lanes.passes, lanes.col(lane), lanes.leads(lane));
    // With sinks: the head's sink in log2 units.
    let sink_log2 = if p.sinks != 0 {
        // SAFETY: the host checked that the sinks cover every query head.
        f32::from_bits(unsafe { global::ld_nc_u32(p.sinks + 4 * head as u64) }) * core::f32::consts::LOG2_E
    } else {
        0.0
    };
    row_blocks(p.padded_rows, |block| {
        let first = block * PREPROCESS_ROWS;
        let row_of = |pass: u32| first + lanes.row(warp, lane, pass);
        let at = |base: u64, s: common::Strides, row: u32| base + 2 * s.element(batch, row, head, col);
        // (At most 8 passes, at hdim 256; unrolled, the arrays live in registers.)
        let (mut o, mut d, mut lse) = ([[0u32; 4]; 8], [[0u32; 4]; 8], [f32::INFINITY.to_bits(); 8]);
        for pass in 0..passes {
            let row = row_of(pass);
            if row < p.seqlen_q {
                // SAFETY: inside the host-checked o and dout; rows start 16 B aligned.
                unsafe {
                    o[pass as usize] = global::ld_nc_v4_u32(at(p.o, p.o_strides, row));
                    d[pass as usize] = global::ld_nc_v4_u32(at(p.dout, p.dout_strides, row));
                }
            }
        }
        if leader {
            for pass in 0..passes {
                let row = row_of(pass);
                if row < p.seqlen_q {
                    // SAFETY: the forward's LSE, `[batch, heads_q, seqlen_q]`.
                    lse[pass as usize] = unsafe { global::ld_nc_u32(p.lse + 4 * (bh * p.seqlen_q as u64 + row as u64)) };
                }
            }
        }
        // The block's accumulator rows are contiguous (`dq_accum_index` orders within a
        // block): zeroed with 16-byte stores while the loads are in flight.
        let accum = p.dq_accum + 4 * (bh * p.padded_rows as u64 + first as u64) * HDIM as u64;
        let mut i = 4 * t;
        while i < PREPROCESS_ROWS * HDIM {
            // SAFETY: inside the padded accumulator; 16 B aligned.
            unsafe { global::st_v4_f32(accum + 4 * i as u64, [0.0; 4]) };
            i += 4 * AUX_THREADS;
        }
        if p.dq_semaphore != 0 && t == 0 && first < p.seqlen_q {
            // (Rows padded past the last query block have no counter.)
            let blocks = p.seqlen_q.div_ceil(ACCUM_ROWS) as u64;
            // SAFETY: one u32 per (batch, head, query block), host-sized.
            unsafe { global::st_u32(p.dq_semaphore + 4 * (bh * blocks + block as u64), 0) };
        }
        let mut dsink = 0.0f32;
        for pass in 0..passes {
            let (o, d) = (o[pass as usize], d[pass as usize]);
            let mut dot = 0.0f32;
            for k in 0..4 {
                let (o, d) = (E::unpack2(o[k]), E::unpack2(d[k]));
                dot = math::fma(o[0], d[0], math::fma(o[1], d[1], dot));
            }
            let mut mask = lanes.lanes / 2;
            while mask > 0 {
                dot += math::shfl_xor_f32(dot, mask);
                mask /= 2;
            }
            if leader {
                let row = row_of(pass);
                let lse = f32::from_bits(lse[pass as usize]) * core::f32::consts::LOG2_E;
                let vector = bh * p.padded_rows as u64 + row as u64;
                // SAFETY: inside the padded workspaces (the grid covers `padded_rows`).
                unsafe {
                    global::st_f32(p.lse_log2 + 4 * vector, lse);
                    global::st_f32(p.dpsum + 4 * vector, dot);
                }
                // Padded rows: exp2(-inf) = 0.
                dsink -= math::exp2(sink_log2 - lse) * dot;
            }
        }
        if p.sinks != 0 {
            for mask in [16, 8, 4, 2, 1] {
                dsink += math::shfl_xor_f32(dsink, mask);
            }
            if lane == 0 {
                let slot = bh * sink_partials_per_head(p.padded_rows) as u64 + block as u64 * WARPS as u64 + warp as u64;
                // SAFETY: one f32 per (batch, head, row block, warp), host-sized.
                unsafe { global::st_f32(p.sink_partials + 4 * slot, dsink) };
            }
        }
    });
}
