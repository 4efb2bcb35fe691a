//! FlashAttention-2 forward on `mma.sync` (sm_80+): the portable kernel and the
//! reference point for the Hopper kernel.
//!
//! One CTA computes a `BLOCK_M x D` tile of O for one (batch, head): 4 warps, each owning
//! 16 query rows ("split-Q"). K and V tiles stream through shared memory with `cp.async`
//! (the K load of step j+1 overlaps the PV product of step j), S and O live in
//! registers, the softmax is online with an unscaled accumulator and one final rescale.
mod tile;

use crate::element::{Element, a_fragment};
use crate::ptx::{barrier, global, mma, smem, sreg};
use crate::softmax::{OnlineSoftmax, apply_mask};
use common::{FwdParams, fa2::*};
use tile::{FragAddr, load_tile};

const BN_TILES: usize = (BLOCK_N / 8) as usize;

/// The kernel body, instantiated per element type and head dim `D`
/// (`DT = D / 8` output n-tiles, `DK = D / 16` k-steps of the QK^T product).
#[inline(always)]
pub unsafe fn fwd<E: Element, const D: u32, const DT: usize, const DK: usize>(p: FwdParams) {
    const { assert!(DT as u32 * 8 == D && DK as u32 * 16 == D && D >= 64) };
    let tid = sreg::thread_idx_x();
    let lane = tid % 32;
    let warp = tid / 32;
    let (g, t) = ((lane / 4) as i32, (lane % 4) as i32);

    // Heaviest (causal) query blocks first: they are scheduled at launch, the light ones fill in.
    let m_block = sreg::grid_dim_x() - 1 - sreg::block_idx_x();
    let head = sreg::block_idx_y();
    let batch = sreg::block_idx_z();
    let head_k = p.kv_head(head);
    let m0 = m_block * BLOCK_M;
    let causal_offset = p.causal_offset();
    let n_blocks = p.n_blocks(m0 as i32, BLOCK_M, BLOCK_N) as i32;

    let base = smem::dynamic_smem_base();
    let q_s = base;
    let k_s = base.add(BLOCK_M * D * 2);
    let v_s = k_s.add(BLOCK_N * D * 2);

    let q_head = p.q + 2 * (batch as u64 * p.q_strides.batch + head as u64 * p.q_strides.head);
    let k_head = p.k + 2 * (batch as u64 * p.k_strides.batch + head_k as u64 * p.k_strides.head);
    let v_head = p.v + 2 * (batch as u64 * p.v_strides.batch + head_k as u64 * p.v_strides.head);

    load_tile::<BLOCK_M, D>(q_s, q_head, 2 * p.q_strides.row, m0, p.seqlen_q, tid);
    if n_blocks > 0 {
        load_tile::<BLOCK_N, D>(k_s, k_head, 2 * p.k_strides.row, 0, p.seqlen_k, tid);
    }
    smem::cp_async_commit();

    let mut o = [[0.0f32; 4]; DT];
    let mut softmax = OnlineSoftmax::new();
    let row_g = (m0 + warp * 16) as i32 + g;

    // ldmatrix row addresses of this lane (see FragAddr): Q as the A operand, K as B of
    // S = QK^T (non-transposed), V as B of O = PV (transposed).
    let q_frag = FragAddr::new::<D>(q_s, warp * 16 + lane % 16, lane / 16);
    let k_frag = FragAddr::new::<D>(k_s, lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
    let v_frag = FragAddr::new::<D>(v_s, lane % 8 + ((lane / 8) % 2) * 8, lane / 16);

    let mut j = 0i32;
    while j < n_blocks {
        let n0 = j as u32 * BLOCK_N;
        // K_j (and Q) landed; every warp is done with V_{j-1}.
        smem::cp_async_wait::<0>();
        barrier::sync_threads();
        load_tile::<BLOCK_N, D>(v_s, v_head, 2 * p.v_strides.row, n0, p.seqlen_k, tid);
        smem::cp_async_commit();

        // S = Q K_j^T
        let mut s = [[0.0f32; 4]; BN_TILES];
        for kk in 0..DK as u32 {
            let a = unsafe { mma::ldmatrix_x4(q_frag.at::<D>(kk, 0)) };
            for nt2 in 0..BN_TILES / 2 {
                let b = unsafe { mma::ldmatrix_x4(k_frag.at::<D>(kk, nt2 as u32 * 16)) };
                E::mma_m16n8k16(&mut s[2 * nt2], a, [b[0], b[1]]);
                E::mma_m16n8k16(&mut s[2 * nt2 + 1], a, [b[2], b[3]]);
            }
        }

        let needs_mask = n0 + BLOCK_N > p.seqlen_k
            || causal_offset.is_some_and(|off| (n0 + BLOCK_N - 1) as i32 > m0 as i32 + off);
        if needs_mask {
            apply_mask(&mut s, row_g, n0 as i32 + 2 * t, p.seqlen_k as i32, causal_offset);
        }
        let alpha = softmax.update(&mut s, p.scale_log2);
        OnlineSoftmax::rescale(&mut o, alpha);

        // V_j landed; every warp is done with K_j.
        smem::cp_async_wait::<0>();
        barrier::sync_threads();
        if j + 1 < n_blocks {
            load_tile::<BLOCK_N, D>(k_s, k_head, 2 * p.k_strides.row, n0 + BLOCK_N, p.seqlen_k, tid);
        }
        smem::cp_async_commit();

        // O += P V_j, with P rounded to the input type (the tensor cores' operand).
        for kb in 0..BN_TILES / 2 {
            let a = a_fragment::<E>(&s[2 * kb], &s[2 * kb + 1]);
            for dt2 in 0..DT / 2 {
                let b = unsafe { mma::ldmatrix_x4_trans(v_frag.at::<D>(dt2 as u32, kb as u32 * 16)) };
                E::mma_m16n8k16(&mut o[2 * dt2], a, [b[0], b[1]]);
                E::mma_m16n8k16(&mut o[2 * dt2 + 1], a, [b[2], b[3]]);
            }
        }
        j += 1;
    }

    // Epilogue: O = acc / rowsum, LSE.
    let (inv, lse) = softmax.finalize(p.softmax_scale);
    let o_head = p.o + 2 * (batch as u64 * p.o_strides.batch + head as u64 * p.o_strides.head);
    for r in 0..2 {
        let row = row_g + 8 * r as i32;
        if row < p.seqlen_q as i32 {
            let row_addr = o_head + 2 * row as u64 * p.o_strides.row;
            for dt in 0..DT {
                let col = dt as u64 * 8 + 2 * t as u64;
                let v = E::pack2(o[dt][2 * r] * inv[r], o[dt][2 * r + 1] * inv[r]);
                unsafe { global::st_u32(row_addr + 2 * col, v) };
            }
            if t == 0 {
                let idx = ((batch * p.heads_q + head) as u64) * p.seqlen_q as u64 + row as u64;
                unsafe { global::st_f32(p.lse + 4 * idx, lse[r]) };
            }
        }
    }
}
