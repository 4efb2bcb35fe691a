//! Global -> shared tile loads of the FA2 kernel (`cp.async`, 16 bytes a thread).
use crate::ptx::smem::{self, SmemAddr};
use common::fa2::THREADS;

/// Byte offset of the 16-byte chunk `chunk` of row `row` in a `rows x D` tile of 16-bit
/// elements. Chunks are XOR-swizzled by `row % 8` so that the 8 row addresses of an
/// `ldmatrix` (same logical chunk, 8 consecutive rows) hit 8 distinct bank groups.
#[inline(always)]
pub const fn swizzled<const D: u32>(row: u32, chunk: u32) -> u32 {
    row * D * 2 + ((chunk ^ (row % 8)) * 16)
}

/// One lane's `ldmatrix` addresses into a swizzled tile, for fragments whose 16-byte
/// chunk is `2 * step + c0` in row `row + row_off` (`row_off` a multiple of 8).
///
/// With `step = 4a + b`, the swizzled chunk is `8a + ((2b + c0) ^ (row % 8))`: only `b`
/// goes through the XOR, so four per-lane bases suffice and every other address is a
/// base plus a compile-time offset (an immediate in `ldmatrix`), instead of one live
/// register per (step, row_off) pair.
#[derive(Clone, Copy)]
pub struct FragAddr {
    phase: [u32; 4],
}

impl FragAddr {
    #[inline(always)]
    pub fn new<const D: u32>(tile: SmemAddr, row: u32, c0: u32) -> Self {
        let phase = core::array::from_fn(|b| tile.add(swizzled::<D>(row, 2 * b as u32 + c0)).0);
        FragAddr { phase }
    }

    #[inline(always)]
    pub fn at<const D: u32>(&self, step: u32, row_off: u32) -> SmemAddr {
        SmemAddr(self.phase[(step % 4) as usize] + 128 * (step / 4) + row_off * D * 2)
    }
}

/// Starts copying rows `row0..row0 + ROWS` of one head (`head_addr` = address of its row 0,
/// `row_stride` in bytes) into a swizzled tile; rows at or past `seqlen` are zero-filled.
#[inline(always)]
pub fn load_tile<const ROWS: u32, const D: u32>(
    dst: SmemAddr,
    head_addr: u64,
    row_stride: u64,
    row0: u32,
    seqlen: u32,
    tid: u32,
) {
    let chunks_per_row = D / 8;
    for i in 0..ROWS * chunks_per_row / THREADS {
        let idx = tid + i * THREADS;
        let (r, c) = (idx / chunks_per_row, idx % chunks_per_row);
        let valid = row0 + r < seqlen;
        let src = if valid { head_addr + (row0 + r) as u64 * row_stride + 16 * c as u64 } else { head_addr };
        // SAFETY: the host checked that every in-range row of this head is inside the
        // tensor and 16-byte aligned; out-of-range rows read nothing.
        unsafe { smem::cp_async_16(dst.add(swizzled::<D>(r, c)), src, valid) };
    }
}
