//! Warpgroup MMA (`wgmma.mma_async`, sm_90a): 64 x N x 16 products issued by a whole
//! warpgroup (128 threads), accumulating in f32 registers, with A and B read from shared
//! memory through descriptors (SS) or A from registers (RS).
//!
//! Accumulator layout (`m64nNk16`, thread t of the warpgroup, w = t/32, l = t%32):
//! n-tile j (8 columns) is a [`Frag`] `[c0, c1, c2, c3]` = row `16w + l/4`, columns
//! `8j + 2(l%4) + {0,1}`, then row `+8`, the same columns: the `mma.sync` C layout stacked
//! over N/8 tiles, so the softmax code is shared. The RS A operand for k-step `kk` packs
//! n-tiles `2kk` and `2kk+1` of an accumulator exactly like the `mma.sync` A fragment.
//!
//! Discipline: [`fence`] before the first wgmma that reads registers written by ordinary
//! code, [`commit`] after issuing, [`wait`] before reading results. Accumulators stay
//! "in flight" between issue and wait, which LLVM cannot see: [`WgmmaAcc::fence_operand`]
//! (an empty asm that reads and writes every register) pins their uses to after the wait.
use crate::softmax::Frag;
use core::arch::asm;

/// Orders earlier register writes before the next wgmma of this warpgroup.
#[inline(always)]
pub fn fence() {
    // SAFETY: warpgroup-uniform.
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
}

/// Closes the group of wgmma issued since the last commit.
#[inline(always)]
pub fn commit() {
    // SAFETY: warpgroup-uniform.
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) };
}

/// Waits until at most `N` committed groups of this warpgroup are pending.
#[inline(always)]
pub fn wait<const N: u32>() {
    // SAFETY: warpgroup-uniform.
    unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const N, options(nostack)) };
}

/// An f32 accumulator of a `m64nNk16` wgmma: `N/8` fragments.
pub trait WgmmaAcc {
    /// D (+)= A * B, f16 operands from shared memory. `scale_d = false` ignores D.
    /// `TRANS_B = 1`: B is MN-major.
    fn ss_f16<const TRANS_B: u32>(&mut self, desc_a: u64, desc_b: u64, scale_d: bool);
    fn ss_bf16<const TRANS_B: u32>(&mut self, desc_a: u64, desc_b: u64, scale_d: bool);
    /// As [`Self::ss_f16`] with A MN-major (`imm-trans-a = 1`): A read as the transpose
    /// of a tile stored K rows by M columns.
    fn ss_f16_mn_a<const TRANS_B: u32>(&mut self, desc_a: u64, desc_b: u64, scale_d: bool);
    fn ss_bf16_mn_a<const TRANS_B: u32>(&mut self, desc_a: u64, desc_b: u64, scale_d: bool);
    /// D (+)= A * B with A (64 x 16, K-major) in registers.
    fn rs_f16<const TRANS_B: u32>(&mut self, a: [u32; 4], desc_b: u64, scale_d: bool);
    fn rs_bf16<const TRANS_B: u32>(&mut self, a: [u32; 4], desc_b: u64, scale_d: bool);
    /// D (+)= A * B with e4m3 operands (`m64nNk32`), both K-major in shared memory
    /// (8-bit wgmma has no transposed operands).
    fn ss_e4m3(&mut self, desc_a: u64, desc_b: u64, scale_d: bool);
    /// D (+)= A * B with e4m3 operands, A (64 x 32, four bytes a register) in registers
    /// and B K-major in shared memory.
    fn rs_e4m3(&mut self, a: [u32; 4], desc_b: u64, scale_d: bool);
    /// Compiler-only fence: every register is read and rewritten here.
    fn fence_operand(&mut self);
}

/// The register list `{%0, ..., %(k-1)}` and operands of one accumulator.
macro_rules! wgmma_impl {
    ($tiles:literal, $n:literal, [$first:literal $($rest:literal)*]) => {
        impl WgmmaAcc for [Frag; $tiles] {
            #[inline(always)]
            fn ss_f16<const TRANS_B: u32>(&mut self, desc_a: u64, desc_b: u64, scale_d: bool) {
                wgmma_impl!(@ss self, "f16", $n, desc_a, desc_b, scale_d, "0", TRANS_B, [$first $($rest)*]);
            }
            #[inline(always)]
            fn ss_bf16<const TRANS_B: u32>(&mut self, desc_a: u64, desc_b: u64, scale_d: bool) {
                wgmma_impl!(@ss self, "bf16", $n, desc_a, desc_b, scale_d, "0", TRANS_B, [$first $($rest)*]);
            }
            #[inline(always)]
            fn ss_f16_mn_a<const TRANS_B: u32>(&mut self, desc_a: u64, desc_b: u64, scale_d: bool) {
                wgmma_impl!(@ss self, "f16", $n, desc_a, desc_b, scale_d, "1", TRANS_B, [$first $($rest)*]);
            }
            #[inline(always)]
            fn ss_bf16_mn_a<const TRANS_B: u32>(&mut self, desc_a: u64, desc_b: u64, scale_d: bool) {
                wgmma_impl!(@ss self, "bf16", $n, desc_a, desc_b, scale_d, "1", TRANS_B, [$first $($rest)*]);
            }
            #[inline(always)]
            fn rs_f16<const TRANS_B: u32>(&mut self, a: [u32; 4], desc_b: u64, scale_d: bool) {
                wgmma_impl!(@rs self, "f16", $n, a, desc_b, scale_d, TRANS_B, [$first $($rest)*]);
            }
            #[inline(always)]
            fn rs_bf16<const TRANS_B: u32>(&mut self, a: [u32; 4], desc_b: u64, scale_d: bool) {
                wgmma_impl!(@rs self, "bf16", $n, a, desc_b, scale_d, TRANS_B, [$first $($rest)*]);
            }
            #[inline(always)]
            fn ss_e4m3(&mut self, desc_a: u64, desc_b: u64, scale_d: bool) {
                wgmma_impl!(@ss8 self, $n, desc_a, desc_b, scale_d, [$first $($rest)*]);
            }
            #[inline(always)]
            fn rs_e4m3(&mut self, a: [u32; 4], desc_b: u64, scale_d: bool) {
                wgmma_impl!(@rs8 self, $n, a, desc_b, scale_d, [$first $($rest)*]);
            }
            #[inline(always)]
            fn fence_operand(&mut self) {
                // SAFETY: a PTX comment: no instruction.
                unsafe {
                    asm!(concat!("// fence_operand {", $first, "}", $(" {", $rest, "}",)*),
                         inout(reg32) self[$first / 4][$first % 4], $(inout(reg32) self[$rest / 4][$rest % 4],)* options(nostack))
                };
            }
        }
    };
    (@ss $acc:ident, $ty:literal, $n:literal, $da:ident, $db:ident, $sd:ident, $ta:literal, $tb:ident, [$first:literal $($rest:literal)*]) => {
        // SAFETY: warpgroup-uniform; the descriptors point at operand tiles that are in
        // shared memory and visible to the async proxy.
        unsafe {
            asm!(
                concat!(
                    "{{ .reg .pred p; setp.ne.b32 p, {sd}, 0; ",
                    "wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty, " ",
                    "{{{", $first, "}", $(", {", $rest, "}",)* "}}, {da}, {db}, p, 1, 1, ", $ta, ", {tb}; }}"
                ),
                inout(reg32) $acc[$first / 4][$first % 4], $(inout(reg32) $acc[$rest / 4][$rest % 4],)*
                da = in(reg64) $da, db = in(reg64) $db, sd = in(reg32) $sd as u32, tb = const $tb,
                options(nostack)
            )
        };
    };
    (@ss8 $acc:ident, $n:literal, $da:ident, $db:ident, $sd:ident, [$first:literal $($rest:literal)*]) => {
        // SAFETY: as for the 16-bit SS form.
        unsafe {
            asm!(
                concat!(
                    "{{ .reg .pred p; setp.ne.b32 p, {sd}, 0; ",
                    "wgmma.mma_async.sync.aligned.m64n", $n, "k32.f32.e4m3.e4m3 ",
                    "{{{", $first, "}", $(", {", $rest, "}",)* "}}, {da}, {db}, p, 1, 1; }}"
                ),
                inout(reg32) $acc[$first / 4][$first % 4], $(inout(reg32) $acc[$rest / 4][$rest % 4],)*
                da = in(reg64) $da, db = in(reg64) $db, sd = in(reg32) $sd as u32,
                options(nostack)
            )
        };
    };
    (@rs8 $acc:ident, $n:literal, $a:ident, $db:ident, $sd:ident, [$first:literal $($rest:literal)*]) => {
        // SAFETY: as for the 16-bit RS form.
        unsafe {
            asm!(
                concat!(
                    "{{ .reg .pred p; setp.ne.b32 p, {sd}, 0; ",
                    "wgmma.mma_async.sync.aligned.m64n", $n, "k32.f32.e4m3.e4m3 ",
                    "{{{", $first, "}", $(", {", $rest, "}",)* "}}, {{{a0}, {a1}, {a2}, {a3}}}, {db}, p, 1, 1; }}"
                ),
                inout(reg32) $acc[$first / 4][$first % 4], $(inout(reg32) $acc[$rest / 4][$rest % 4],)*
                a0 = in(reg32) $a[0], a1 = in(reg32) $a[1], a2 = in(reg32) $a[2], a3 = in(reg32) $a[3],
                db = in(reg64) $db, sd = in(reg32) $sd as u32,
                options(nostack)
            )
        };
    };
    (@rs $acc:ident, $ty:literal, $n:literal, $a:ident, $db:ident, $sd:ident, $tb:ident, [$first:literal $($rest:literal)*]) => {
        // SAFETY: as for SS; A is in this thread's registers.
        unsafe {
            asm!(
                concat!(
                    "{{ .reg .pred p; setp.ne.b32 p, {sd}, 0; ",
                    "wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty, " ",
                    "{{{", $first, "}", $(", {", $rest, "}",)* "}}, {{{a0}, {a1}, {a2}, {a3}}}, {db}, p, 1, 1, {tb}; }}"
                ),
                inout(reg32) $acc[$first / 4][$first % 4], $(inout(reg32) $acc[$rest / 4][$rest % 4],)*
                a0 = in(reg32) $a[0], a1 = in(reg32) $a[1], a2 = in(reg32) $a[2], a3 = in(reg32) $a[3],
                db = in(reg64) $db, sd = in(reg32) $sd as u32, tb = const $tb,
                options(nostack)
            )
        };
    };
}

wgmma_impl!(4, 32, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]);
wgmma_impl!(8, 64, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31]);
wgmma_impl!(10, 80, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39]);
wgmma_impl!(16, 128, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63]);
wgmma_impl!(22, 176, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87]);
wgmma_impl!(24, 192, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95]);
wgmma_impl!(32, 256, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127]);

/// Compiler-only fence for an RS A operand (see [`WgmmaAcc::fence_operand`]).
#[inline(always)]
pub fn fence_a_operand(a: &mut [u32; 4]) {
    // SAFETY: a PTX comment: no instruction.
    unsafe {
        asm!("// fence_operand {0} {1} {2} {3}", inout(reg32) a[0], inout(reg32) a[1], inout(reg32) a[2], inout(reg32) a[3],
             options(nostack))
    };
}
