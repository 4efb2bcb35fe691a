//! The Tensor Memory Accelerator: `cp.async.bulk.tensor` loads (completing on an mbarrier)
//! and stores (bulk groups), and tensor-map prefetch. Tensor maps are built on the host
//! (`cuTensorMapEncodeTiled`) and passed by value as the kernel's first parameter.
use super::mbarrier::Mbarrier;
use super::smem::SmemAddr;
use core::arch::asm;

/// Generic address of a tensor map living in the kernel's `.param` space.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct TensorMap(pub u64);

/// Generic address of the kernel's first parameter (the TMA descriptor block), taken
/// without copying it: the PTX names parameters `<kernel>_param_<i>`, and `cvta.param`
/// (PTX 7.7+) turns the `.param` address into a generic one the TMA unit accepts. Taking
/// `&param` in Rust instead would copy it to local memory, where tensor maps may not live.
/// `$symbol`: the kernel's exported name, a string literal (`stringify!(name)`).
#[macro_export]
macro_rules! kernel_param0_address {
    ($symbol:expr) => {{
        let addr: u64;
        // SAFETY: reads the address of this kernel's own parameter.
        unsafe {
            core::arch::asm!(
                concat!("mov.b64 {0}, ", $symbol, "_param_0;"),
                "cvta.param.u64 {0}, {0};",
                out(reg64) addr,
                options(pure, nomem, nostack)
            )
        };
        addr
    }};
}

impl TensorMap {
    /// Brings the descriptor into the TMA unit's cache ahead of the first copy.
    #[inline(always)]
    pub fn prefetch(self) {
        // SAFETY: a hint.
        unsafe { asm!("prefetch.tensormap [{0}];", in(reg64) self.0, options(nostack)) };
    }

    /// Loads the box at element coordinates `c` (innermost first) into `dst`; the bytes
    /// count toward `bar`'s transaction. Out-of-bounds elements are zero-filled. Only
    /// threads with `leader` set issue it (a predicate, as for
    /// [`Mbarrier::arrive_expect_tx`]).
    ///
    /// # Safety
    /// `dst` must hold the whole box, 1024 B aligned for swizzled maps; `bar` must expect
    /// the bytes.
    #[inline(always)]
    pub unsafe fn load_5d(self, dst: SmemAddr, bar: Mbarrier, c: [i32; 5], leader: bool) {
        unsafe {
            asm!("{{ .reg .pred p; setp.ne.b32 p, {8}, 0; @p cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [{0}], [{1}, {{{3}, {4}, {5}, {6}, {7}}}], [{2}]; }}",
                 in(reg32) dst.0, in(reg64) self.0, in(reg32) bar.0.0,
                 in(reg32) c[0], in(reg32) c[1], in(reg32) c[2], in(reg32) c[3], in(reg32) c[4], in(reg32) leader as u32,
                 options(nostack))
        };
    }

    /// As [`Self::load_5d`], but the box lands at `dst` in every CTA of the cluster named
    /// in `cta_mask`, and completes on the barrier at `bar`'s offset in each of them.
    ///
    /// # Safety
    /// As [`Self::load_5d`], in every destination CTA.
    #[inline(always)]
    pub unsafe fn load_5d_multicast(self, dst: SmemAddr, bar: Mbarrier, c: [i32; 5], cta_mask: u16, leader: bool) {
        unsafe {
            asm!("{{ .reg .pred p; setp.ne.b32 p, {8}, 0; @p cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [{0}], [{1}, {{{3}, {4}, {5}, {6}, {7}}}], [{2}], {9}; }}",
                 in(reg32) dst.0, in(reg64) self.0, in(reg32) bar.0.0,
                 in(reg32) c[0], in(reg32) c[1], in(reg32) c[2], in(reg32) c[3], in(reg32) c[4], in(reg32) leader as u32,
                 in(reg16) cta_mask,
                 options(nostack))
        };
    }

    /// Stores the box at coordinates `c` from `src`; out-of-bounds elements are dropped.
    ///
    /// # Safety
    /// `src` was written and made visible to the async proxy ([`super::fence::proxy_async_shared`]).
    #[inline(always)]
    pub unsafe fn store_5d(self, src: SmemAddr, c: [i32; 5]) {
        unsafe {
            asm!("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [{0}, {{{2}, {3}, {4}, {5}, {6}}}], [{1}];",
                 in(reg64) self.0, in(reg32) src.0,
                 in(reg32) c[0], in(reg32) c[1], in(reg32) c[2], in(reg32) c[3], in(reg32) c[4],
                 options(nostack))
        };
    }
}

/// Copies `bytes` contiguous bytes global -> shared with the bulk-copy engine (a 1-D
/// TMA copy, no tensor map); the bytes count toward `bar`'s transaction. Only threads
/// with `leader` set issue it.
///
/// # Safety
/// `src` and `dst` must be 16-byte aligned, `bytes` a multiple of 16, the source
/// readable and the destination inside the allocation; `bar` must expect the bytes.
#[inline(always)]
pub unsafe fn bulk_load(dst: SmemAddr, src: u64, bytes: u32, bar: Mbarrier, leader: bool) {
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.b32 p, {4}, 0; @p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{0}], [{1}], {2}, [{3}]; }}",
             in(reg32) dst.0, in(reg64) src, in(reg32) bytes, in(reg32) bar.0.0, in(reg32) leader as u32,
             options(nostack))
    };
}

/// Adds `bytes` contiguous f32 of shared memory into global memory element-wise, with the
/// bulk-copy engine (the reduction happens in L2; a bulk group like the stores).
///
/// # Safety
/// `src` and `dst` must be 16-byte aligned, `bytes` a multiple of 16; `src` was written
/// and made visible to the async proxy ([`super::fence::proxy_async_shared`]); `dst`
/// must be writable global memory.
#[inline(always)]
pub unsafe fn bulk_reduce_add_f32(dst: u64, src: SmemAddr, bytes: u32) {
    unsafe {
        asm!("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [{0}], [{1}], {2};",
             in(reg64) dst, in(reg32) src.0, in(reg32) bytes, options(nostack))
    };
}

/// Waits until all but `N` bulk groups of this thread have completed: their writes (or
/// reductions) are done, not only their reads of shared memory.
#[inline(always)]
pub fn bulk_wait<const N: u32>() {
    // SAFETY: waits only.
    unsafe { asm!("cp.async.bulk.wait_group {n};", n = const N, options(nostack)) };
}

/// Closes the group of bulk stores issued since the last commit.
#[inline(always)]
pub fn store_commit() {
    // SAFETY: bookkeeping only.
    unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) };
}

/// Waits until the stores of all but `N` groups have finished reading shared memory.
#[inline(always)]
pub fn store_wait_read<const N: u32>() {
    // SAFETY: waits only.
    unsafe { asm!("cp.async.bulk.wait_group.read {n};", n = const N, options(nostack)) };
}
