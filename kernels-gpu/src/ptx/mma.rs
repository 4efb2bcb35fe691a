//! Warp-level tensor-core MMA (`mma.sync`, sm_80+) and its operand loader `ldmatrix`.
//!
//! Fragment layouts (lane = 4*g + t, g = lane/4, t = lane%4), m16n8k16:
//! - A (16x16, row-major), 4 regs of 2 halves: a0 (g, 2t..2t+1), a1 (g+8, 2t..),
//!   a2 (g, 2t+8..), a3 (g+8, 2t+8..);
//! - B (16x8, k x n), 2 regs: b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8.., n = g);
//! - C/D (16x8 f32): c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1).
use super::smem::SmemAddr;
use core::arch::asm;

macro_rules! mma_m16n8k16 {
    ($(#[$doc:meta])* $name:ident, $ty:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
            // SAFETY: register-only; the warp must be converged (all callers are).
            unsafe {
                asm!(concat!("mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 ",
                             "{{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, {{{0}, {1}, {2}, {3}}};"),
                     inout(reg32) d[0], inout(reg32) d[1], inout(reg32) d[2], inout(reg32) d[3],
                     in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
                     in(reg32) b[0], in(reg32) b[1],
                     options(pure, nomem, nostack))
            }
        }
    };
}

mma_m16n8k16!(/// `D += A * B` with f16 operands and f32 accumulators.
    mma_m16n8k16_f16, "f16");
mma_m16n8k16!(/// `D += A * B` with bf16 operands and f32 accumulators.
    mma_m16n8k16_bf16, "bf16");

/// `ldmatrix.x4`: four 8x8 b16 matrices; lanes 8i..8i+8 give the row addresses of
/// matrix i, and register i of every lane receives its fragment of matrix i
/// (row lane/4, columns 2*(lane%4)..+1).
///
/// # Safety
/// `addr` must be a 16-byte aligned address inside the shared allocation, written
/// before the last barrier.
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: SmemAddr) -> [u32; 4] {
    let r: [u32; 4];
    unsafe {
        let (r0, r1, r2, r3);
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{0}, {1}, {2}, {3}}}, [{4}];",
             out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3, in(reg32) addr.0,
             options(readonly, nostack));
        r = [r0, r1, r2, r3];
    }
    r
}

/// `ldmatrix.x4.trans`: as [`ldmatrix_x4`] but each matrix is transposed, so a lane
/// receives (rows 2*(lane%4)..+1, column lane/4): the B fragment of a row-major K x N tile.
///
/// # Safety
/// As [`ldmatrix_x4`].
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(addr: SmemAddr) -> [u32; 4] {
    let r: [u32; 4];
    unsafe {
        let (r0, r1, r2, r3);
        asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{0}, {1}, {2}, {3}}}, [{4}];",
             out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3, in(reg32) addr.0,
             options(readonly, nostack));
        r = [r0, r1, r2, r3];
    }
    r
}
