//! The backward's last launch: dQ = fp32 accumulator (in `dq_accum_index` order) ×
//! softmax scale, rounded to the element type, into the (strided) dq; with attention
//! sinks, the first CTA of each head (y = 0, batch 0) sums the preprocess' partial sink
//! gradients of the head in a fixed order (bit-identical across runs). Grid
//! `(heads_q, row blocks of PREPROCESS_ROWS, batch)` as the preprocess'
//! ([`row_blocks`]), [`AUX_THREADS`] threads, two columns a thread.
use super::preprocess::row_blocks;
use crate::element::Element;
use crate::ptx::{global, math, sreg};
use common::bwd::{ACCUM_ROWS, AUX_THREADS, BwdParams, PREPROCESS_ROWS, dq_accum_index, sink_partials_per_head};

/// The postprocess kernel body for element type `E` at head dim `HDIM`.
///
/// # Safety
/// The host sized and validated every buffer of `p`.
#[inline(always)]
pub unsafe fn postprocess<E: Element, const HDIM: u32>(p: BwdParams) {
    let (head, batch) = (sreg::block_idx_x(), sreg::block_idx_z());
    let threads_per_row = HDIM / 2;
    let rows_per_pass = AUX_THREADS / threads_per_row;
    let t = sreg::thread_idx_x();
    let col = 2 * (t % threads_per_row);
    let bh = (batch * p.heads_q + head) as u64;
    row_blocks(p.seqlen_q, |block| {
        let first = block * PREPROCESS_ROWS;
        let mut row = first + t / threads_per_row;
        while row < first + PREPROCESS_ROWS && row < p.seqlen_q {
            // The query block's floats, in fragment order: (row, col) and (row, col + 1) are
            // adjacent.
            let bm = ACCUM_ROWS;
            let base = (bh * p.padded_rows as u64 + (row / bm * bm) as u64) * HDIM as u64;
            let accum = p.dq_accum + 4 * (base + dq_accum_index(HDIM, row % bm, col) as u64);
            // SAFETY: inside the padded accumulator; 8 B aligned (even column).
            let v = unsafe { global::ld_v2_f32(accum) };
            let dst = p.dq + 2 * p.dq_strides.element(batch, row, head, col);
            // SAFETY: inside the host-checked dq; 4 B aligned (even column).
            unsafe { global::st_u32(dst, E::pack2(v[0] * p.softmax_scale, v[1] * p.softmax_scale)) };
            row += rows_per_pass;
        }
    });
    if p.sinks != 0 && sreg::block_idx_y() == 0 && batch == 0 && t < 32 {
        // Lane t sums partials t, t + 32, ... of every batch, then a fixed butterfly.
        let per_bh = sink_partials_per_head(p.padded_rows) as u64;
        let mut sum = 0.0f32;
        for b in 0..p.batch as u64 {
            let base = (b * p.heads_q as u64 + head as u64) * per_bh;
            let mut i = t as u64;
            while i < per_bh {
                // SAFETY: inside the host-sized partials.
                sum += f32::from_bits(unsafe { global::ld_nc_u32(p.sink_partials + 4 * (base + i)) });
                i += 32;
            }
        }
        for mask in [16, 8, 4, 2, 1] {
            sum += math::shfl_xor_f32(sum, mask);
        }
        if t == 0 {
            // SAFETY: one f32 per query head, host-checked.
            unsafe { global::st_f32(p.dsinks + 4 * head as u64, sum) };
        }
    }
}
