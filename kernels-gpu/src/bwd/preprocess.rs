//! The backward's first launch: per query row `D = rowsum(dO ∘ O)` and the LSE times
//! log2 e into the padded workspaces (rows past `seqlen_q`: D = 0, LSE = +inf, so that
//! their `P` is 0), the row of the fp32 dQ accumulator zeroed, and in deterministic mode
//! the query block's semaphores; with attention sinks, each warp's partial sum of the
//! sink gradient `−exp(sink − LSE) · D` over its rows (summed by the postprocess). Grid `(padded_rows / PREPROCESS_ROWS, heads_q, batch)`,
//! [`AUX_THREADS`] threads: one warp per row at a time.
use crate::element::Element;
use crate::ptx::{global, math, sreg};
use common::bwd::{ACCUM_ROWS, AUX_THREADS, BwdParams, PREPROCESS_ROWS};

/// The preprocess kernel body for element type `E` at head dim `HDIM`.
///
/// # Safety
/// The host sized and validated every buffer of `p`.
#[inline(always)]
pub unsafe fn preprocess<E: Element, const HDIM: u32>(p: BwdParams) {
    let (head, batch) = (sreg::block_idx_y(), sreg::block_idx_z());
    let (warp, lane) = (sreg::thread_idx_x() / 32, sreg::thread_idx_x() % 32);
    let bh = (batch * p.heads_q + head) as u64;
    let warps = AUX_THREADS / 32;
    let mut row = sreg::block_idx_x() * PREPROCESS_ROWS + warp;
    // With sinks: this warp's part of the head's sink gradient (lane 0), in log2 units.
    let sink_log2 = if p.sinks != 0 {
        // SAFETY: the host checked that the sinks cover every query head.
        f32::from_bits(unsafe { global::ld_nc_u32(p.sinks + 4 * head as u64) }) * core::f32::consts::LOG2_E
    } else {
        0.0
    };
    let mut dsink = 0.0f32;
    while row < (sreg::block_idx_x() + 1) * PREPROCESS_ROWS && row < p.padded_rows {
        let mut dot = 0.0f32;
        if row < p.seqlen_q {
            let at = |base: u64, s: common::Strides, col: u32| {
                base + 2 * (batch as u64 * s.batch + row as u64 * s.row + head as u64 * s.head + col as u64)
            };
            for chunk in 0..HDIM / 64 {
                let col = 64 * chunk + 2 * lane;
                // SAFETY: inside the host-checked o and dout; 4 B aligned (even column).
                let (o, d) = unsafe { (global::ld_nc_u32(at(p.o, p.o_strides, col)), global::ld_nc_u32(at(p.dout, p.dout_strides, col))) };
                let (o, d) = (E::unpack2(o), E::unpack2(d));
                dot = math::fma(o[0], d[0], math::fma(o[1], d[1], dot));
            }
        }
        for mask in [16, 8, 4, 2, 1] {
            dot += math::shfl_xor_f32(dot, mask);
        }
        let vector = bh * p.padded_rows as u64 + row as u64;
        if lane == 0 {
            let lse = if row < p.seqlen_q {
                // SAFETY: the forward's LSE, `[batch, heads_q, seqlen_q]`.
                let lse = unsafe { global::ld_nc_u32(p.lse + 4 * (bh * p.seqlen_q as u64 + row as u64)) };
                f32::from_bits(lse) * core::f32::consts::LOG2_E
            } else {
                f32::INFINITY
            };
            // SAFETY: inside the padded workspaces.
            unsafe {
                global::st_f32(p.lse_log2 + 4 * vector, lse);
                global::st_f32(p.dpsum + 4 * vector, dot);
            }
            // Padded rows: exp2(-inf) = 0.
            dsink -= math::exp2(sink_log2 - lse) * dot;
            // (Rows padded past the last 64-row block have no counter.)
            if p.dq_semaphore != 0 && row % ACCUM_ROWS == 0 && row < p.seqlen_q {
                let blocks = p.seqlen_q.div_ceil(ACCUM_ROWS) as u64;
                // SAFETY: one u32 per (batch, head, query block), host-sized.
                unsafe { global::st_u32(p.dq_semaphore + 4 * (bh * blocks + (row / ACCUM_ROWS) as u64), 0) };
            }
        }
        // The row of the dQ accumulator: 4 floats a lane.
        let accum = p.dq_accum + 4 * vector * HDIM as u64;
        let mut col = 4 * lane;
        while col < HDIM {
            // SAFETY: inside the padded accumulator; 16 B aligned.
            unsafe { global::st_v4_f32(accum + 4 * col as u64, [0.0; 4]) };
            col += 128;
        }
        row += warps;
    }
    if p.sinks != 0 && lane == 0 {
        let blocks = p.padded_rows.div_ceil(PREPROCESS_ROWS) as u64;
        let slot = (bh * blocks + sreg::block_idx_x() as u64) * warps as u64 + warp as u64;
        // SAFETY: one f32 per (batch, head, row block, warp), host-sized.
        unsafe { global::st_f32(p.sink_partials + 4 * slot, dsink) };
    }
}
