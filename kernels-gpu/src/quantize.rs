//! 16-bit Q, K or V to e4m3 with one dequantization factor per block of rows of a head
//! (the FP8 forward's block quantization), optionally after incoherent processing (each
//! row times `diag(signs) · H / sqrt(d)`, H the Sylvester Hadamard matrix: the fast
//! Walsh–Hadamard transform over the head dim, in registers and across the lanes of a
//! warp). One CTA per (block, head, batch) reads its rows twice, for the block's largest
//! magnitude and then to write the rounded values (the second read hits L2); V can be
//! written transposed, in the layout the FP8 forward reads (`common::fp8::vt_position`).
//! The arithmetic is the CPU reference's (`host::reference::fp8`), operation for
//! operation, so both give the same codes.
use crate::element::Element;
use crate::ptx::{barrier, global, math, smem, sreg};
use common::fp8::{QUANTIZE_THREADS, QuantizeOutput, QuantizeParams, block_factor, vt_len, vt_position};

/// One row's `PER_LANE` elements of this lane (`lane * PER_LANE ..`), transformed when
/// `signs != 0`.
#[inline(always)]
unsafe fn load_row<E: Element, const HDIM: u32, const PER_LANE: usize>(p: &QuantizeParams, batch: u32, head: u32, row: u32, lane: u32) -> [f32; PER_LANE] {
    let base = p.src + 2 * p.src_strides.element(batch, row, head, lane * PER_LANE as u32);
    let mut x = [0.0f32; PER_LANE];
    for w in 0..PER_LANE / 2 {
        // SAFETY: inside the host-checked input row; 4 B aligned (even column, 16 B rows).
        let v = E::unpack2(unsafe { global::ld_nc_u32(base + 4 * w as u64) });
        (x[2 * w], x[2 * w + 1]) = (v[0], v[1]);
    }
    if p.signs != 0 {
        for (i, xi) in x.iter_mut().enumerate() {
            // SAFETY: `HDIM` host-written f32 signs.
            *xi *= f32::from_bits(unsafe { global::ld_nc_u32(p.signs + 4 * (lane as usize * PER_LANE + i) as u64) });
        }
        // Butterflies of strides 1 .. PER_LANE/2 inside the lane, then of PER_LANE ·
        // (1 .. 16) across lanes: the lower index keeps a + b, the upper a − b.
        let mut half = 1;
        while half < PER_LANE {
            for block in (0..PER_LANE).step_by(2 * half) {
                for i in block..block + half {
                    let (a, b) = (x[i], x[i + half]);
                    (x[i], x[i + half]) = (a + b, a - b);
                }
            }
            half *= 2;
        }
        for m in [1u32, 2, 4, 8, 16] {
            for xi in x.iter_mut() {
                let other = math::shfl_xor_f32(*xi, m);
                *xi = if lane & m == 0 { *xi + other } else { other - *xi };
            }
        }
        let norm = 1.0 / math::sqrt(HDIM as f32);
        for xi in x.iter_mut() {
            *xi *= norm;
        }
    }
    x
}

/// The kernel body for input type `E` at head dim `HDIM` (`PER_LANE = HDIM / 32`).
///
/// # Safety
/// The host sized and validated every buffer of `p`.
#[inline(always)]
pub unsafe fn quantize<E: Element, const HDIM: u32, const PER_LANE: usize>(p: QuantizeParams) {
    const { assert!(PER_LANE as u32 * 32 == HDIM && PER_LANE % 2 == 0) };
    let (blk, head, batch) = (sreg::block_idx_x(), sreg::block_idx_y(), sreg::block_idx_z());
    let (warp, lane) = (sreg::thread_idx_x() / 32, sreg::thread_idx_x() % 32);
    let warps = QUANTIZE_THREADS / 32;
    let row0 = blk * p.block_rows;
    let rows_end = (row0 + p.block_rows).min(p.seqlen);

    // The block's largest magnitude: per warp, then over the CTA through shared memory.
    let mut amax = 0.0f32;
    let mut row = row0 + warp;
    while row < rows_end {
        // SAFETY: a row of the input.
        let x = unsafe { load_row::<E, HDIM, PER_LANE>(&p, batch, head, row, lane) };
        for xi in x {
            amax = math::fmax(amax, xi.abs());
        }
        row += warps;
    }
    for m in [16, 8, 4, 2, 1] {
        amax = math::fmax(amax, math::shfl_xor_f32(amax, m));
    }
    let partials = smem::dynamic_smem_base();
    if lane == 0 {
        // SAFETY: one f32 per warp of the launch's shared memory.
        unsafe { smem::st_u32(partials.add(4 * warp), amax.to_bits()) };
    }
    barrier::sync_threads();
    for w in 0..warps {
        // SAFETY: as above.
        amax = math::fmax(amax, f32::from_bits(unsafe { smem::ld_u32(partials.add(4 * w)) }));
    }
    let scale = block_factor(amax, p.pow2_factors != 0);
    if sreg::thread_idx_x() == 0 {
        let blocks = p.seqlen.div_ceil(p.block_rows.max(1)) as u64;
        // SAFETY: `[batch, heads, blocks]` host-sized factors.
        unsafe { global::st_f32(p.scales + 4 * ((batch as u64 * p.heads as u64 + head as u64) * blocks + blk as u64), scale) };
    }

    // The codes. A transposed V also zeroes its padding keys (the last block's rows up to
    // `vt_len`, a whole number of 32-key steps inside it).
    let transposed = p.output == QuantizeOutput::VTransposed;
    let (vt, rows_end) = if transposed {
        let vt = vt_len(p.seqlen);
        (vt, (row0 + p.block_rows).min(vt))
    } else {
        (0, rows_end)
    };
    let mut row = row0 + warp;
    while row < rows_end {
        let x = if row < p.seqlen {
            // SAFETY: a row of the input.
            unsafe { load_row::<E, HDIM, PER_LANE>(&p, batch, head, row, lane) }
        } else {
            [0.0; PER_LANE]
        };
        let mut codes = [0u32; PER_LANE];
        for q in 0..PER_LANE / 2 {
            codes[q] = math::pack_e4m3x4([x[2 * q] / scale, x[2 * q + 1] / scale, 0.0, 0.0]);
        }
        let col0 = (lane as usize * PER_LANE) as u64;
        if transposed {
            let bh = batch as u64 * p.heads as u64 + head as u64;
            let pos = vt_position(row) as u64;
            for i in 0..PER_LANE {
                let byte = (codes[i / 2] >> (8 * (i % 2))) as u8;
                // SAFETY: inside the host-sized `[b, h, d, vt_len]` output.
                unsafe { global::st_u8(p.dst + (bh * HDIM as u64 + col0 + i as u64) * vt as u64 + pos, byte) };
            }
        } else {
            let at = p.dst + ((batch as u64 * p.seqlen as u64 + row as u64) * p.heads as u64 + head as u64) * HDIM as u64 + col0;
            for q in 0..PER_LANE / 2 {
                // SAFETY: inside the host-sized packed output; 2 B aligned.
                unsafe { global::st_u16(at + 2 * q as u64, codes[q] as u16) };
            }
        }
        row += warps;
    }
}

/// e4m3 V `[b, s, h, d]` (packed, `p.src`) rearranged as the FP8 forward reads it
/// (`common::fp8::vt_position`, `p.dst`), for callers whose V is already e4m3: one CTA per
/// 32 keys of a (head, batch), the padding keys written as zeros. Byte by byte: one pass
/// over V, not tuned.
///
/// # Safety
/// The host sized and validated both buffers.
#[inline(always)]
pub unsafe fn transpose_v(p: QuantizeParams) {
    let (blk, head, batch) = (sreg::block_idx_x(), sreg::block_idx_y(), sreg::block_idx_z());
    let (d, vt) = (p.hdim, vt_len(p.seqlen));
    let key0 = blk * common::fp8::TRANSPOSE_KEYS;
    let bh = batch as u64 * p.heads as u64 + head as u64;
    let mut idx = sreg::thread_idx_x();
    while idx < common::fp8::TRANSPOSE_KEYS * d {
        let (key, col) = (key0 + idx / d.max(1), idx % d.max(1));
        let byte = if key < p.seqlen {
            // SAFETY: inside the host-checked packed input.
            unsafe { global::ld_nc_u8(p.src + ((batch as u64 * p.seqlen as u64 + key as u64) * p.heads as u64 + head as u64) * d as u64 + col as u64) }
        } else {
            0
        };
        if key < vt {
            // SAFETY: inside the host-sized transposed output.
            unsafe { global::st_u8(p.dst + (bh * d as u64 + col as u64) * vt as u64 + vt_position(key) as u64, byte) };
        }
        idx += QUANTIZE_THREADS;
    }
}
