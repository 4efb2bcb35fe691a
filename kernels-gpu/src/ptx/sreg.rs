//! Special registers.
use core::arch::asm;

macro_rules! sreg {
    ($(#[$doc:meta])* $name:ident, $reg:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name() -> u32 {
            let r: u32;
            // SAFETY: reading a special register has no side effects.
            unsafe { asm!(concat!("mov.u32 {0}, ", $reg, ";"), out(reg32) r, options(pure, nomem, nostack)) };
            r
        }
    };
}

sreg!(/// Thread index in the CTA (x).
    thread_idx_x, "%tid.x");
sreg!(/// CTA index in the grid (x).
    block_idx_x, "%ctaid.x");
sreg!(/// CTA index in the grid (y).
    block_idx_y, "%ctaid.y");
sreg!(/// CTA index in the grid (z).
    block_idx_z, "%ctaid.z");
sreg!(/// Grid size in CTAs (x).
    grid_dim_x, "%nctaid.x");
sreg!(/// Grid size in CTAs (y).
    grid_dim_y, "%nctaid.y");
sreg!(/// Lane in the warp, 0..32.
    lane_id, "%laneid");
sreg!(/// This CTA's rank in its cluster.
    cluster_ctarank, "%cluster_ctarank");
sreg!(/// CTAs per cluster (1 without a cluster launch).
    cluster_nctarank, "%cluster_nctarank");
