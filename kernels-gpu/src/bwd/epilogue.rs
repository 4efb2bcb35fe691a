//! The backward epilogue: a warpgroup's dK (times the softmax scale) and dV, 64 keys
//! each (by its columns, [`WgTile`]), rounded to the element type and stored from
//! registers (rows past `seqlen_k` dropped). Once per CTA, so no staging through shared
//! memory.
use super::mainloop::KeyBlockGrads;
use super::traits::{BwdTraits, WgTile};
use crate::element::Element;
use crate::fa3::traits::FragTile;
use crate::ptx::global;
use common::Strides;
use common::bwd::BwdParams;

/// Stores this warpgroup's rows of dK and dV for key block `n_block` of K/V head `head_k`.
#[inline(always)]
pub fn store<K: BwdTraits>(p: &BwdParams, grads: &KeyBlockGrads<K>, n_block: u32, head_k: u32, batch: u32, wg: u32, thread_in_wg: u32) {
    let (warp, lane) = (thread_in_wg / 32, thread_in_wg % 32);
    let tile = WgTile::of::<K>(wg);
    let key0 = n_block * K::BLOCK_N + tile.key0 + warp * 16 + lane / 4;
    let col_2t = tile.col0 + 2 * (lane % 4);
    let store_tile = |base: u64, strides: Strides, tile: &K::KeyGrads, scale: f32| {
        let head_base = base + 2 * (batch as u64 * strides.batch + head_k as u64 * strides.head);
        for r in 0..2 {
            let key = key0 + 8 * r;
            if key >= p.seqlen_k {
                continue;
            }
            let row_base = head_base + 2 * key as u64 * strides.row;
            for j in 0..<K::KeyGrads as FragTile>::FRAGS {
                let f = tile.frag(j);
                let packed = K::Element::pack2(f[2 * r as usize] * scale, f[2 * r as usize + 1] * scale);
                // SAFETY: inside the host-checked output tensor (key < seqlen_k, column <
                // hdim); 4 B aligned (even column, strides multiples of 8 elements).
                unsafe { global::st_u32(row_base + 2 * (8 * j as u64 + col_2t as u64), packed) };
            }
        }
    };
    store_tile(p.dk, p.dk_strides, &grads.dk, p.softmax_scale);
    store_tile(p.dv, p.dv_strides, &grads.dv, 1.0);
}
