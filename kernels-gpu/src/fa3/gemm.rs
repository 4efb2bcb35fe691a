//! The warpgroup GEMM discipline (FA3's `flash::gemm`), in one place: every GEMM of the
//! mainloop is [`issue`]d (`wgmma.fence`, the WGMMAs, `commit`) after compiler fences on
//! its register operands, and [`wait`]ed for (`wgmma.wait_group`, then a compiler fence
//! on the accumulator). Split in two because a pingpong turn ends between them.
//!
//! Why the compiler fences: a WGMMA reads and writes its register operands
//! asynchronously, which LLVM cannot see. An operand written by ordinary code must be
//! fenced before `wgmma.fence` (so the write is not sunk past the issue), and an
//! accumulator after the wait (so its reads are not hoisted above it).
use crate::ptx::wgmma::{self, WgmmaAcc};

/// Issues one commit group: `wgmma.fence` (orders the register writes before it; the
/// caller has fenced the operands it wrote), the WGMMAs of `mma`, `commit`.
#[inline(always)]
pub fn issue(mma: impl FnOnce()) {
    wgmma::fence();
    mma();
    wgmma::commit();
}

/// Waits until at most `PENDING` of this warpgroup's commit groups are in flight, then
/// fences `acc`, the accumulator of a group that has now landed.
#[inline(always)]
pub fn wait<const PENDING: u32>(acc: &mut impl WgmmaAcc) {
    wgmma::wait::<PENDING>();
    acc.fence_operand();
}
