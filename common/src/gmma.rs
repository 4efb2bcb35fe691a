//! The shared-memory matrix descriptor of Hopper's `wgmma.mma_async` (PTX ISA 8.0,
//! "Matrix Descriptor Format"), encoded by one function used by the kernels and
//! unit-tested on the host.
//!
//! | bits  | field |
//! |-------|-------|
//! | 0-13  | start address >> 4 (shared window, 18-bit address) |
//! | 16-29 | leading-dimension byte offset >> 4 |
//! | 32-45 | stride-dimension byte offset >> 4 |
//! | 49-51 | base offset (0: swizzle pattern starts on its 1024 B boundary) |
//! | 62-63 | swizzle: 0 none, 1 128 B, 2 64 B, 3 32 B |
//!
//! For the 128-byte swizzle every tile here is a stack of 64-element (128 B) wide column
//! chunks, each `rows x 128 B`, 1024-byte aligned, as TMA writes them:
//! - K-major operand (Q, K): LBO unused (16), SBO = 1024 (next 8-row group); a k16 step
//!   adds 32 B inside a chunk, a chunk boundary adds `rows * 128` B.
//! - MN-major operand (V as B of P V, `imm-trans-b = 1`): LBO = `rows * 128` (next 64-wide
//!   chunk along N = hdim), SBO = 1024 (next 8 keys); a k16 step adds 16 rows = 2048 B.

/// Swizzle mode field (bits 62-63).
#[repr(u64)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swizzle {
    None = 0,
    B128 = 1,
    B64 = 2,
    B32 = 3,
}

/// Encodes a descriptor. `addr` is the shared-window byte address of the tile start (16 B
/// aligned); `lbo`, `sbo` in bytes (multiples of 16).
#[inline(always)]
pub const fn smem_desc(addr: u32, lbo: u32, sbo: u32, swizzle: Swizzle) -> u64 {
    (((addr & 0x3_FFFF) >> 4) as u64)
        | ((((lbo >> 4) & 0x3FFF) as u64) << 16)
        | ((((sbo >> 4) & 0x3FFF) as u64) << 32)
        | ((swizzle as u64) << 62)
}

/// A descriptor `bytes` further into its tile (the start address is stored >> 4; `bytes`
/// is a multiple of 16 that keeps it inside the 18-bit window).
#[inline(always)]
pub const fn desc_add(desc: u64, bytes: u32) -> u64 {
    desc + (bytes >> 4) as u64
}

/// Descriptor of a K-major 128 B-swizzled operand tile (Q, K) at `addr`.
#[inline(always)]
pub const fn k_major_sw128(addr: u32) -> u64 {
    smem_desc(addr, 16, 1024, Swizzle::B128)
}

/// Descriptor of a K-major 64 B-swizzled operand tile at `addr`: rows of 64 bytes in
/// 8-row, 512 B atoms (TMA's `SWIZZLE_64B`); the FP8 forward's transposed V of 64 keys.
#[inline(always)]
pub const fn k_major_sw64(addr: u32) -> u64 {
    smem_desc(addr, 16, 512, Swizzle::B64)
}

/// Descriptor of an MN-major 128 B-swizzled operand tile of `rows` K-rows (V with
/// `rows` keys) at `addr`.
#[inline(always)]
pub const fn mn_major_sw128(addr: u32, rows: u32) -> u64 {
    smem_desc(addr, rows * 128, 1024, Swizzle::B128)
}

/// Descriptor of a K-major tile without swizzle whose k16 step is its whole width (16
/// 16-bit elements a row): 8 x 16 B core matrices, the K-adjacent one 128 B on (LBO),
/// the next 8 rows 256 B on (SBO); [`k_major_plain_offset`] places the elements.
#[inline(always)]
pub const fn k_major_plain(addr: u32) -> u64 {
    smem_desc(addr, 128, 256, Swizzle::None)
}

/// Byte offset of 16-bit element `(row, k)` (`k < 16`) in a [`k_major_plain`] tile.
#[inline(always)]
pub const fn k_major_plain_offset(row: u32, k: u32) -> u32 {
    (row / 8) * 256 + (k / 8) * 128 + (row % 8) * 16 + (k % 8) * 2
}

/// Byte address of element `(row, col)` (16-bit elements) in a 128 B-swizzled tile of
/// `rows` rows whose 64-column chunks are stacked: chunk `col / 64` starts at
/// `chunk * rows * 128`, and inside an 8-row, 1024 B atom the 16-byte unit index is
/// XORed with `row % 8` (Swizzle<3,4,3>, as TMA's `SWIZZLE_128B` writes it when the
/// tile is 1024 B aligned).
#[inline(always)]
pub const fn sw128_offset(rows: u32, row: u32, col: u32) -> u32 {
    let chunk = col / 64;
    let byte_in_row = (col % 64) * 2;
    chunk * rows * 128 + row * 128 + ((byte_in_row / 16) ^ (row % 8)) * 16 + byte_in_row % 16
}

/// Byte offset of row `row` (a multiple of 8: the start of a swizzle atom, where the
/// swizzle is the identity) of 64-column chunk `chunk`, in a tile of `rows` rows laid out
/// as for [`sw128_offset`].
#[inline(always)]
pub const fn sw128_rows(rows: u32, chunk: u32, row: u32) -> u32 {
    chunk * rows * 128 + row * 128
}

/// Byte offset of k16 step `kk` (16 elements along K) in a K-major tile of `rows` rows:
/// +32 B inside a 128 B chunk, the next chunk after four steps.
#[inline(always)]
pub const fn k_major_k_step(rows: u32, kk: u32) -> u32 {
    (kk / 4) * rows * 128 + (kk % 4) * 32
}

/// Byte offset of k16 step `kk` in an MN-major tile: 16 rows of 128 B.
#[inline(always)]
pub const fn mn_major_k_step(kk: u32) -> u32 {
    kk * 16 * 128
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn k_major_descriptor_matches_hand_encoding() {
        // Tile at 0x1_0400: start field 0x1040; LBO 16 -> 1; SBO 1024 -> 64; swizzle 128 B -> 1.
        let d = k_major_sw128(0x1_0400);
        assert_eq!(d, 0x1040 | (1 << 16) | (64u64 << 32) | (1u64 << 62));
        assert_eq!(d, 0x4000_0040_0001_1040);
    }

    /// The core matrices the descriptor names (8 rows of 16 B each; the K-adjacent one at
    /// LBO, the next 8 rows at SBO) hold exactly the elements the offset function puts
    /// there: every element of a 128-row tile once, inside `rows * 32` bytes.
    #[test]
    fn k_major_plain_descriptor_and_offsets_agree() {
        let d = k_major_plain(0x2000);
        let (lbo, sbo) = ((((d >> 16) & 0x3FFF) << 4) as u32, (((d >> 32) & 0x3FFF) << 4) as u32);
        assert_eq!((d >> 62, lbo, sbo), (0, 128, 256));
        let mut seen = std::vec![false; 128 * 16];
        for row in 0..128 {
            for k in 0..16 {
                let off = k_major_plain_offset(row, k);
                // Core matrix (row / 8, k / 8), then row % 8 of 16 B, then element k % 8.
                assert_eq!(off, (row / 8) * sbo + (k / 8) * lbo + (row % 8) * 16 + (k % 8) * 2);
                assert!(off < 128 * 32 && off % 2 == 0);
                assert!(!std::mem::replace(&mut seen[(off / 2) as usize], true));
            }
        }
    }

    #[test]
    fn k_step_advances_start_address_by_two() {
        // +32 bytes (one k16 step of 16-bit elements) is +2 in the encoded start address.
        assert_eq!(k_major_sw128(0x2000 + 32) - k_major_sw128(0x2000), 2);
        assert_eq!(desc_add(k_major_sw128(0x2000), 32), k_major_sw128(0x2000 + 32));
        assert_eq!(desc_add(mn_major_sw128(0x4000, 64), 2048), mn_major_sw128(0x4800, 64));
    }

    #[test]
    fn mn_major_descriptor_for_a_128_key_v_tile() {
        // V tile of 128 keys: next 64-wide hdim chunk 128 * 128 = 16384 B -> LBO field 1024.
        let d = mn_major_sw128(0x4000, 128);
        assert_eq!(d & 0x3FFF, 0x400);
        assert_eq!((d >> 16) & 0x3FFF, 16384 >> 4);
        assert_eq!((d >> 32) & 0x3FFF, 64);
        assert_eq!(d >> 62, 1);
        assert_eq!((d >> 49) & 7, 0, "base offset stays 0 for 1024-aligned tiles");
    }

    #[test]
    fn sw64_descriptor_strides_8_rows_of_64_bytes() {
        let d = k_major_sw64(0x2000);
        assert_eq!((d & 0x3FFF, (d >> 32) & 0x3FFF, d >> 62), (0x200, 512 >> 4, 2));
    }

    #[test]
    fn address_wraps_to_the_18_bit_shared_window() {
        assert_eq!(smem_desc(0x4_0010, 0, 0, Swizzle::None), 1);
    }

    #[test]
    fn swizzle_permutes_16_byte_units_within_each_row() {
        // Row 0 is unswizzled; row 3 XORs the unit index with 3; units never leave their row.
        assert_eq!(sw128_offset(64, 0, 8), 16);
        assert_eq!(sw128_offset(64, 3, 0), 3 * 128 + 3 * 16);
        assert_eq!(sw128_offset(64, 3, 9), 3 * 128 + (1 ^ 3) * 16 + 2);
        // Column 64 starts the second chunk, 64 rows * 128 B later.
        assert_eq!(sw128_offset(64, 0, 64), 8192);
        for row in 0..16 {
            let mut seen = [false; 64];
            for col in 0..64 {
                let o = sw128_offset(64, row, col);
                assert_eq!(o / 128, row);
                seen[((o % 128) / 2) as usize] = true;
            }
            assert!(seen.iter().all(|&s| s));
        }
    }

    /// The step and row helpers are `sw128_offset` at the points where they are used.
    #[test]
    fn step_and_row_offsets_agree_with_the_swizzled_layout() {
        for rows in [64, 80, 128, 192] {
            for kk in 0..16 {
                assert_eq!(k_major_k_step(rows, kk), sw128_offset(rows, 0, 16 * kk), "rows {rows} kk {kk}");
            }
            for chunk in 0..4 {
                for row in (0..rows).step_by(8) {
                    assert_eq!(sw128_rows(rows, chunk, row), sw128_offset(rows, row, 64 * chunk), "rows {rows} chunk {chunk} row {row}");
                }
            }
        }
        for kk in 0..8 {
            assert_eq!(mn_major_k_step(kk), sw128_offset(128, 16 * kk, 0));
        }
    }
}
