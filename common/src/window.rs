//! Sliding-window (local) attention, FlashAttention's `window_size = (left, right)`:
//! query row `i` sees key `j` iff
//!
//! ```text
//! i + off − left ≤ j ≤ i + off + right,   j < seqlen_k,   off = seqlen_k − seqlen_q
//! ```
//!
//! (a causal mask is `right = 0`). The local kernels (`MaskKind::Local`) read it from
//! their parameters; the block ranges here are shared by the forward's scheduler and
//! mainloop, the backward's steps and the host's tests.
//!
//! Arithmetic is i32 with no special case for an unbounded side: the host stores one as
//! `max(seqlen_q, seqlen_k)`, which no `|i + off − j|` reaches, and limits windowed
//! calls to [`MAX_SEQLEN`] so that no sum overflows.

/// Longest sequence a windowed call takes: `row + off + right + 1` (rows up to a tile
/// past `seqlen_q`) stays far inside i32.
pub const MAX_SEQLEN: u32 = 1 << 29;

/// A call's window, as the kernels read it (see the module).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyWindow {
    /// Keys visible before a row's diagonal key.
    pub left: i32,
    /// Keys visible after it.
    pub right: i32,
}

/// Half-open ranges `[lo, hi)`; empty when `hi <= lo`.
pub type Range32 = (u32, u32);

impl KeyWindow {
    /// The window of a call: `None` is unbounded, and `causal` caps `right` at 0. The
    /// host checks `seqlen_q, seqlen_k <= MAX_SEQLEN` first.
    pub fn new(left: Option<u32>, right: Option<u32>, causal: bool, seqlen_q: u32, seqlen_k: u32) -> Self {
        let unbounded = seqlen_q.max(seqlen_k);
        let side = |w: Option<u32>| w.map_or(unbounded, |w| w.min(unbounded)) as i32;
        let right = if causal { 0 } else { side(right) };
        KeyWindow { left: side(left), right }
    }

    /// `seqlen_k − seqlen_q`: row `i`'s diagonal key is `i + off`.
    #[inline(always)]
    const fn offset(seqlen_q: u32, seqlen_k: u32) -> i32 {
        seqlen_k as i32 - seqlen_q as i32
    }

    /// Row `row`'s first visible key (may be negative: none is cut off on the left).
    #[inline(always)]
    pub const fn first_key(&self, row: i32, seqlen_q: u32, seqlen_k: u32) -> i32 {
        row + Self::offset(seqlen_q, seqlen_k) - self.left
    }

    /// One past row `row`'s last visible key, `seqlen_k` at most.
    #[inline(always)]
    pub const fn end_key(&self, row: i32, seqlen_q: u32, seqlen_k: u32) -> i32 {
        let end = row + Self::offset(seqlen_q, seqlen_k) + self.right + 1;
        if end < seqlen_k as i32 { end } else { seqlen_k as i32 }
    }

    /// The key blocks (of `block_n` keys) that some row of `[row0, row0 + rows)` sees,
    /// counting only rows `0..seqlen_q`: one contiguous range, since every row's window
    /// is its predecessor's moved one key right. Empty when no row sees a key.
    #[inline(always)]
    pub const fn key_blocks(&self, row0: i32, rows: u32, block_n: u32, seqlen_q: u32, seqlen_k: u32) -> Range32 {
        let first_row = if row0 > 0 { row0 } else { 0 };
        let end_row = row0 + rows as i32;
        let last_row = if end_row < seqlen_q as i32 { end_row } else { seqlen_q as i32 } - 1;
        if last_row < first_row {
            return (0, 0);
        }
        let lo = self.first_key(first_row, seqlen_q, seqlen_k);
        let lo = if lo > 0 { lo } else { 0 };
        let hi = self.end_key(last_row, seqlen_q, seqlen_k);
        if hi <= lo { (0, 0) } else { (lo as u32 / block_n, (hi as u32).div_ceil(block_n)) }
    }

    /// One past the last key block that some row of `[row0, row0 + rows)` sees, when
    /// one does ([`KeyWindow::key_blocks`]' end, in fewer operations).
    #[inline(always)]
    pub const fn key_blocks_end(&self, row0: i32, rows: u32, block_n: u32, seqlen_q: u32, seqlen_k: u32) -> u32 {
        let end_row = row0 + rows as i32;
        let last_row = if end_row < seqlen_q as i32 { end_row } else { seqlen_q as i32 } - 1;
        (self.end_key(last_row, seqlen_q, seqlen_k) as u32).div_ceil(block_n)
    }

    /// The key blocks that every row of `[row0, row0 + rows)` sees whole (rows past
    /// `seqlen_q` included, which only narrows it): blocks outside need the mask. When
    /// `lo > hi` none does.
    #[inline(always)]
    pub const fn whole_blocks(&self, row0: i32, rows: u32, block_n: u32, seqlen_q: u32, seqlen_k: u32) -> Range32 {
        let lo = self.first_key(row0 + rows as i32 - 1, seqlen_q, seqlen_k);
        let hi = self.end_key(row0, seqlen_q, seqlen_k);
        let lo = if lo > 0 { (lo as u32).div_ceil(block_n) } else { 0 };
        let hi = if hi > 0 { hi as u32 / block_n } else { 0 };
        (lo, hi)
    }

    /// The query rows that see some key of `[key0, key0 + keys)` (keys from `seqlen_k`
    /// on see nothing): `[lo, hi)`, empty when `hi <= lo`. Key `j` is seen by rows
    /// `j − off − right ..= j − off + left`.
    #[inline(always)]
    pub const fn query_rows(&self, key0: u32, keys: u32, seqlen_q: u32, seqlen_k: u32) -> Range32 {
        let end_key = if key0 + keys < seqlen_k { key0 + keys } else { seqlen_k };
        if end_key <= key0 {
            return (0, 0);
        }
        let off = Self::offset(seqlen_q, seqlen_k);
        let lo = key0 as i32 - off - self.right;
        let hi = end_key as i32 - 1 - off + self.left + 1;
        let lo = if lo > 0 { lo as u32 } else { 0 };
        let hi = if hi <= 0 { 0 } else if hi < seqlen_q as i32 { hi as u32 } else { seqlen_q };
        (lo, hi)
    }

    /// The query blocks (of `block_m` rows) that see some key of key block `n` (of
    /// `block_n` keys); empty as `(0, 0)`.
    #[inline(always)]
    pub const fn query_blocks(&self, n: u32, block_n: u32, block_m: u32, seqlen_q: u32, seqlen_k: u32) -> Range32 {
        let (lo, hi) = self.query_rows(n * block_n, block_n, seqlen_q, seqlen_k);
        if hi <= lo { (0, 0) } else { (lo / block_m, hi.div_ceil(block_m)) }
    }

    /// Whether some pair of query block `m` (`block_m` rows from `m · block_m`, rows past
    /// `seqlen_q` included) and key block `n` is outside the window (keys past
    /// `seqlen_k` are the caller's to check).
    #[inline(always)]
    pub const fn step_needs_mask(&self, m: u32, n: u32, block_m: u32, block_n: u32, seqlen_q: u32, seqlen_k: u32) -> bool {
        let (row0, key0) = ((m * block_m) as i32, (n * block_n) as i32);
        self.first_key(row0 + block_m as i32 - 1, seqlen_q, seqlen_k) > key0
            || row0 + Self::offset(seqlen_q, seqlen_k) + self.right < key0 + block_n as i32 - 1
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;

    const SHAPES: [(u32, u32); 9] = [(1, 1), (5, 9), (9, 5), (17, 17), (40, 23), (23, 40), (64, 64), (70, 130), (130, 70)];
    const SIDES: [Option<u32>; 6] = [None, Some(0), Some(1), Some(5), Some(16), Some(40)];

    fn windows(sq: u32, sk: u32) -> impl Iterator<Item = (KeyWindow, std::string::String)> {
        SIDES.into_iter().flat_map(move |l| {
            SIDES.into_iter().flat_map(move |r| {
                [false, true].map(|causal| (KeyWindow::new(l, r, causal, sq, sk), format!("sq {sq} sk {sk} left {l:?} right {r:?} causal {causal}")))
            })
        })
    }

    /// FlashAttention's rule, written out with unbounded sides as `None`.
    fn sees(w: KeyWindow, sq: u32, sk: u32, i: i32, j: i32) -> bool {
        let diag = i + sk as i32 - sq as i32;
        (0..sq as i32).contains(&i) && (0..sk as i32).contains(&j) && diag - w.left <= j && j <= diag + w.right
    }

    #[test]
    fn unbounded_sides_reach_every_key_and_causal_caps_the_right() {
        for (sq, sk) in SHAPES {
            let w = KeyWindow::new(None, None, false, sq, sk);
            assert!((0..sq as i32).all(|i| (0..sk as i32).all(|j| sees(w, sq, sk, i, j))));
            let c = KeyWindow::new(None, Some(7), true, sq, sk);
            let off = sk as i32 - sq as i32;
            assert!((0..sq as i32).all(|i| (0..sk as i32).all(|j| sees(c, sq, sk, i, j) == (j <= i + off))));
        }
    }

    /// Brute force: the forward's block ranges are tight and lose no visible pair, and the
    /// whole blocks are exactly those every row sees whole.
    #[test]
    fn key_block_ranges_are_the_tight_ranges_the_rows_see() {
        for (sq, sk) in SHAPES {
            for (w, ctx) in windows(sq, sk) {
                for (row0, rows) in [(0, 1), (0, 8), (3, 5), (8, 8), (16, 16), (-5, 8), (-8, 16), (60, 64), (100, 64)] {
                    for block_n in [1u32, 4, 8, 16] {
                        let ctx = format!("{ctx} rows {row0}+{rows} block_n {block_n}");
                        let seen = |b: u32| (b * block_n..(b + 1) * block_n).any(|c| (row0..row0 + rows as i32).any(|r| sees(w, sq, sk, r, c as i32)));
                        let (lo, hi) = w.key_blocks(row0, rows, block_n, sq, sk);
                        let all: std::vec::Vec<u32> = (0..sk.div_ceil(block_n)).filter(|&b| seen(b)).collect();
                        match all.as_slice() {
                            [] => assert!(hi <= lo, "{ctx}: {lo}..{hi} but no block is seen"),
                            [first, .., last] | [first @ last] => {
                                assert_eq!((lo, hi), (*first, last + 1), "{ctx}");
                                assert_eq!(w.key_blocks_end(row0, rows, block_n, sq, sk), hi, "{ctx}");
                                assert!((lo..hi).all(seen), "{ctx}: a gap in {lo}..{hi}");
                            }
                        }
                        let (wlo, whi) = w.whole_blocks(row0, rows, block_n, sq, sk);
                        for b in 0..sk.div_ceil(block_n) + 1 {
                            let whole = (b * block_n..(b + 1) * block_n).all(|c| {
                                (row0..row0 + rows as i32).all(|r| {
                                    let diag = r + sk as i32 - sq as i32;
                                    (c as i32) < sk as i32 && diag - w.left <= c as i32 && c as i32 <= diag + w.right
                                })
                            });
                            assert_eq!(wlo <= b && b < whi, whole, "{ctx}: block {b} in whole {wlo}..{whi}");
                        }
                    }
                }
            }
        }
    }

    /// Brute force: the backward's query block ranges hold exactly the blocks with a row
    /// that sees one of the key block's keys, and a step needs the mask iff a pair of it
    /// is hidden (keys past `seqlen_k` aside).
    #[test]
    fn query_block_ranges_and_mask_rule_match_the_visible_pairs() {
        for (sq, sk) in SHAPES {
            for (w, ctx) in windows(sq, sk) {
                for (block_m, block_n) in [(1u32, 1u32), (4, 8), (8, 4), (16, 16)] {
                    for n in 0..sk.div_ceil(block_n) {
                        let ctx = format!("{ctx} block {block_m}x{block_n} key block {n}");
                        let keys = n * block_n..((n + 1) * block_n).min(sk);
                        let seen = |m: u32| (m * block_m..((m + 1) * block_m).min(sq)).any(|r| keys.clone().any(|c| sees(w, sq, sk, r as i32, c as i32)));
                        let (lo, hi) = w.query_blocks(n, block_n, block_m, sq, sk);
                        let all: std::vec::Vec<u32> = (0..sq.div_ceil(block_m)).filter(|&m| seen(m)).collect();
                        match all.as_slice() {
                            [] => assert!(hi <= lo, "{ctx}: {lo}..{hi}"),
                            [first, .., last] | [first @ last] => assert_eq!((lo, hi), (*first, last + 1), "{ctx}"),
                        }
                        for m in 0..sq.div_ceil(block_m) {
                            let hidden = (m * block_m..(m + 1) * block_m).any(|r| {
                                (n * block_n..(n + 1) * block_n).any(|c| {
                                    let diag = r as i32 + sk as i32 - sq as i32;
                                    !(diag - w.left <= c as i32 && c as i32 <= diag + w.right)
                                })
                            });
                            assert_eq!(w.step_needs_mask(m, n, block_m, block_n, sq, sk), hidden, "{ctx} query block {m}");
                        }
                    }
                }
            }
        }
    }
}
