//! Per-row key ranges: FlashAttention's sliding window `window_size = (left, right)` and
//! packed documents. Query row `i` sits at key position `p = i + off`
//! (`off = seqlen_k − seqlen_q`, bottom-right as the causal mask) and sees key `j` iff
//!
//! ```text
//! p − left ≤ j ≤ p + right,   j < seqlen_k,   doc(j) = doc(p)
//! ```
//!
//! (a causal mask is `right = 0`; without documents every key is in one). The local
//! kernels (`MaskKind::Local`) read both from their parameters; the block ranges here are
//! shared by the forward's scheduler and mainloop, the backward's steps and the host's
//! tests.
//!
//! Documents are runs of consecutive keys, given per key position as their bounds
//! `[start, end)` ([`Documents`]). Both bounds of a row's range then never decrease from
//! one row to the next, and each row sees its own position: the keys some rows see form
//! one contiguous range, and the rows that see some keys as well, which is what makes
//! whole blocks skippable.
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

    /// Its ranges over `seqlen_q` rows and `seqlen_k` keys, with no documents.
    #[inline(always)]
    pub const fn ranges(self, seqlen_q: u32, seqlen_k: u32) -> KeyRanges<NoDocuments> {
        KeyRanges { window: self, seqlen_q, seqlen_k, docs: NoDocuments }
    }
}

/// A document mask as the kernels read it: device address of u32 pairs
/// `[batch, seqlen_k, 2]` (or `[seqlen_k, 2]`, shared by the batch), each key position's
/// document as `[start, end)`. `addr` 0: none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DocumentBounds {
    pub addr: u64,
    /// Positions between batches: `seqlen_k`, or 0 when the batch shares one packing.
    pub batch_stride: u32,
    pub _pad: u32,
}

impl DocumentBounds {
    /// Address of batch `batch`'s first pair (0 without documents).
    #[inline(always)]
    pub const fn batch_addr(&self, batch: u32) -> u64 {
        if self.addr == 0 { 0 } else { self.addr + 8 * batch as u64 * self.batch_stride as u64 }
    }
}

/// Where the document bounds of key positions come from: device memory in the kernels,
/// a slice in host tests, nothing for a window alone.
pub trait Documents: Copy {
    /// The keys `[start, end)` of the document holding key position `pos`
    /// (`pos < seqlen_k`; `start <= pos < end`), or `None` without documents.
    fn doc(&self, pos: u32) -> Option<(i32, i32)>;
}

/// No documents: a window alone.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDocuments;

impl Documents for NoDocuments {
    #[inline(always)]
    fn doc(&self, _: u32) -> Option<(i32, i32)> {
        None
    }
}

/// Documents from host memory, one `[start, end)` pair per key position (host tests).
impl Documents for &[[u32; 2]] {
    fn doc(&self, pos: u32) -> Option<(i32, i32)> {
        self.get(pos as usize).map(|&[s, e]| (s as i32, e as i32))
    }
}

/// Every row's key range of one call (and batch): the window and the documents
/// (see the module).
#[derive(Clone, Copy, Debug)]
pub struct KeyRanges<D> {
    pub window: KeyWindow,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub docs: D,
}

impl<D: Documents> KeyRanges<D> {
    /// `seqlen_k − seqlen_q`: row `i`'s diagonal key is `i + off`.
    #[inline(always)]
    const fn offset(&self) -> i32 {
        self.seqlen_k as i32 - self.seqlen_q as i32
    }

    /// The keys `[start, end)` of row `row`'s document, `None` without documents (its
    /// position clamped into the keys: rows before 0 or past `seqlen_q` exist only in
    /// padded tiles, whose results are never stored).
    #[inline(always)]
    pub fn row_doc(&self, row: i32) -> Option<(i32, i32)> {
        let pos = row + self.offset();
        let last = self.seqlen_k as i32 - 1;
        self.docs.doc(if pos < 0 { 0 } else if pos > last { last as u32 } else { pos as u32 })
    }

    /// Row `row`'s first visible key (may be negative: none is cut off on the left).
    #[inline(always)]
    pub fn first_key(&self, row: i32) -> i32 {
        let first = row + self.offset() - self.window.left;
        match self.row_doc(row) {
            Some((start, _)) if start > first => start,
            _ => first,
        }
    }

    /// One past row `row`'s last visible key before the `seqlen_k` cap.
    #[inline(always)]
    fn end_key_uncapped(&self, row: i32) -> i32 {
        let end = row + self.offset() + self.window.right + 1;
        match self.row_doc(row) {
            Some((_, doc_end)) if doc_end < end => doc_end,
            _ => end,
        }
    }

    /// One past row `row`'s last visible key, `seqlen_k` at most.
    #[inline(always)]
    pub fn end_key(&self, row: i32) -> i32 {
        let end = self.end_key_uncapped(row);
        if end < self.seqlen_k as i32 { end } else { self.seqlen_k as i32 }
    }

    /// The key blocks (of `block_n` keys) that some row of `[row0, row0 + rows)` sees,
    /// counting only rows `0..seqlen_q`: one contiguous range (see the module). Empty
    /// when no row sees a key.
    #[inline(always)]
    pub fn key_blocks(&self, row0: i32, rows: u32, block_n: u32) -> Range32 {
        let first_row = if row0 > 0 { row0 } else { 0 };
        let end_row = row0 + rows as i32;
        let last_row = if end_row < self.seqlen_q as i32 { end_row } else { self.seqlen_q as i32 } - 1;
        if last_row < first_row {
            return (0, 0);
        }
        let lo = self.first_key(first_row);
        let lo = if lo > 0 { lo } else { 0 };
        let hi = self.end_key(last_row);
        if hi <= lo { (0, 0) } else { (lo as u32 / block_n, (hi as u32).div_ceil(block_n)) }
    }

    /// One past the last key block that some row of `[row0, row0 + rows)` sees, when
    /// one does ([`KeyRanges::key_blocks`]' end, in fewer operations).
    #[inline(always)]
    pub fn key_blocks_end(&self, row0: i32, rows: u32, block_n: u32) -> u32 {
        let end_row = row0 + rows as i32;
        let last_row = if end_row < self.seqlen_q as i32 { end_row } else { self.seqlen_q as i32 } - 1;
        (self.end_key(last_row) as u32).div_ceil(block_n)
    }

    /// The key blocks that every row of `[row0, row0 + rows)` sees whole (rows past
    /// `seqlen_q` included, which only narrows it): blocks outside need the mask. When
    /// `lo > hi` none does.
    #[inline(always)]
    pub fn whole_blocks(&self, row0: i32, rows: u32, block_n: u32) -> Range32 {
        let lo = self.first_key(row0 + rows as i32 - 1);
        let hi = self.end_key(row0);
        let lo = if lo > 0 { (lo as u32).div_ceil(block_n) } else { 0 };
        let hi = if hi > 0 { hi as u32 / block_n } else { 0 };
        (lo, hi)
    }

    /// The query rows that see some key of `[key0, key0 + keys)` (keys from `seqlen_k`
    /// on see nothing): `[lo, hi)`, empty when `hi <= lo`. Key `j` is seen by rows
    /// `j − off − right ..= j − off + left` of its document.
    #[inline(always)]
    pub fn query_rows(&self, key0: u32, keys: u32) -> Range32 {
        let end_key = if key0 + keys < self.seqlen_k { key0 + keys } else { self.seqlen_k };
        if end_key <= key0 {
            return (0, 0);
        }
        let off = self.offset();
        let mut lo = key0 as i32 - off - self.window.right;
        let mut hi = end_key as i32 - 1 - off + self.window.left + 1;
        if let (Some((start, _)), Some((_, end))) = (self.docs.doc(key0), self.docs.doc(end_key - 1)) {
            lo = if start - off > lo { start - off } else { lo };
            hi = if end - off < hi { end - off } else { hi };
        }
        let lo = if lo > 0 { lo as u32 } else { 0 };
        let hi = if hi <= 0 { 0 } else if hi < self.seqlen_q as i32 { hi as u32 } else { self.seqlen_q };
        (lo, hi)
    }

    /// The query blocks (of `block_m` rows) that see some key of key block `n` (of
    /// `block_n` keys); empty as `(0, 0)`.
    #[inline(always)]
    pub fn query_blocks(&self, n: u32, block_n: u32, block_m: u32) -> Range32 {
        let (lo, hi) = self.query_rows(n * block_n, block_n);
        if hi <= lo { (0, 0) } else { (lo / block_m, hi.div_ceil(block_m)) }
    }

    /// Whether some pair of query block `m` (`block_m` rows from `m · block_m`, rows past
    /// `seqlen_q` included) and key block `n` is hidden (keys past `seqlen_k` are the
    /// caller's to check; with documents the last block may answer yes for them).
    #[inline(always)]
    pub fn step_needs_mask(&self, m: u32, n: u32, block_m: u32, block_n: u32) -> bool {
        let (row0, key0) = ((m * block_m) as i32, (n * block_n) as i32);
        self.first_key(row0 + block_m as i32 - 1) > key0 || self.end_key_uncapped(row0) < key0 + block_n as i32
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;
    use std::vec::Vec;

    const SHAPES: [(u32, u32); 9] = [(1, 1), (5, 9), (9, 5), (17, 17), (40, 23), (23, 40), (64, 64), (70, 130), (130, 70)];
    const SIDES: [Option<u32>; 6] = [None, Some(0), Some(1), Some(5), Some(16), Some(40)];

    /// Document packings of `sk` keys (as each position's bounds): none, one document,
    /// and splits with documents of one key, of a few keys and longer than a block.
    /// Documents need `seqlen_q <= seqlen_k` (every row sits at a key position).
    fn packings(sq: u32, sk: u32) -> Vec<Option<Vec<[u32; 2]>>> {
        let mut all = std::vec![None];
        if sq > sk {
            return all;
        }
        for lens in [&[][..], &[1, 2, 1, 9, 3, 30, 1], &[7, 1, 1, 20], &[33, 5]] {
            let mut bounds = Vec::new();
            let mut start = 0;
            for &len in lens.iter().chain(core::iter::repeat(&17)) {
                if start >= sk {
                    break;
                }
                let end = (start + len).min(sk);
                bounds.extend((start..end).map(|_| [start, end]));
                start = end;
            }
            all.push(Some(bounds));
        }
        all
    }

    type Case = (KeyWindow, Option<Vec<[u32; 2]>>, std::string::String);

    fn cases(sq: u32, sk: u32) -> impl Iterator<Item = Case> {
        packings(sq, sk).into_iter().flat_map(move |docs| {
            SIDES.into_iter().flat_map(move |l| {
                let docs = docs.clone();
                SIDES.into_iter().flat_map(move |r| {
                    let docs = docs.clone();
                    [false, true].map(move |causal| {
                        let ctx = format!("sq {sq} sk {sk} left {l:?} right {r:?} causal {causal} docs {}", docs.is_some());
                        (KeyWindow::new(l, r, causal, sq, sk), docs.clone(), ctx)
                    })
                })
            })
        })
    }

    /// Asks the ranges of a case (with its documents, if any).
    fn ask(w: KeyWindow, docs: &Option<Vec<[u32; 2]>>, sq: u32, sk: u32, probe: KeyRangesProbe) -> (u32, u32) {
        match docs {
            Some(d) => probe.run(&KeyRanges { window: w, seqlen_q: sq, seqlen_k: sk, docs: d.as_slice() }),
            None => probe.run(&w.ranges(sq, sk)),
        }
    }

    /// One question to a [`KeyRanges`] (object-safe over the document source).
    #[derive(Clone, Copy)]
    enum KeyRangesProbe {
        KeyBlocks(i32, u32, u32),
        KeyBlocksEnd(i32, u32, u32),
        WholeBlocks(i32, u32, u32),
        QueryBlocks(u32, u32, u32),
        NeedsMask(u32, u32, u32, u32),
    }

    impl KeyRangesProbe {
        fn run<D: Documents>(self, r: &KeyRanges<D>) -> (u32, u32) {
            match self {
                KeyRangesProbe::KeyBlocks(row0, rows, bn) => r.key_blocks(row0, rows, bn),
                KeyRangesProbe::KeyBlocksEnd(row0, rows, bn) => (r.key_blocks_end(row0, rows, bn), 0),
                KeyRangesProbe::WholeBlocks(row0, rows, bn) => r.whole_blocks(row0, rows, bn),
                KeyRangesProbe::QueryBlocks(n, bn, bm) => r.query_blocks(n, bn, bm),
                KeyRangesProbe::NeedsMask(m, n, bm, bn) => (r.step_needs_mask(m, n, bm, bn) as u32, 0),
            }
        }
    }

    /// The rule of the module, written out: the window around the diagonal (unbounded
    /// sides as wide as the lengths) and, with documents, the same document. `valid`: only
    /// rows `0..seqlen_q` and keys `0..seqlen_k` exist.
    fn sees_pair(w: KeyWindow, docs: &Option<Vec<[u32; 2]>>, sq: u32, sk: u32, i: i32, j: i32, valid: bool) -> bool {
        let diag = i + sk as i32 - sq as i32;
        let same_doc = docs.as_ref().is_none_or(|d| {
            let pos = diag.clamp(0, sk as i32 - 1) as usize;
            (j as u32) >= d[pos][0] && (j as u32) < d[pos][1]
        });
        let exists = (0..sq as i32).contains(&i) && (0..sk as i32).contains(&j);
        (exists || !valid) && diag - w.left <= j && j <= diag + w.right && same_doc
    }

    #[test]
    fn unbounded_sides_reach_every_key_and_causal_caps_the_right() {
        for (sq, sk) in SHAPES {
            let w = KeyWindow::new(None, None, false, sq, sk);
            assert!((0..sq as i32).all(|i| (0..sk as i32).all(|j| sees_pair(w, &None, sq, sk, i, j, true))));
            let c = KeyWindow::new(None, Some(7), true, sq, sk);
            let off = sk as i32 - sq as i32;
            assert!((0..sq as i32).all(|i| (0..sk as i32).all(|j| sees_pair(c, &None, sq, sk, i, j, true) == (j <= i + off))));
        }
    }

    /// Brute force: the forward's block ranges are tight and lose no visible pair, and the
    /// whole blocks are exactly those every row sees whole, with and without documents.
    #[test]
    fn key_block_ranges_are_the_tight_ranges_the_rows_see() {
        for (sq, sk) in SHAPES {
            for (w, docs, ctx) in cases(sq, sk) {
                let sees = |i: i32, j: i32| sees_pair(w, &docs, sq, sk, i, j, true);
                for (row0, rows) in [(0, 1), (0, 8), (3, 5), (8, 8), (16, 16), (-5, 8), (-8, 16), (60, 64), (100, 64)] {
                    for block_n in [1u32, 4, 8, 16] {
                        let ctx = format!("{ctx} rows {row0}+{rows} block_n {block_n}");
                        let seen = |b: u32| (b * block_n..(b + 1) * block_n).any(|c| (row0..row0 + rows as i32).any(|r| sees(r, c as i32)));
                        let ask = |probe| ask(w, &docs, sq, sk, probe);
                        let (lo, hi) = ask(KeyRangesProbe::KeyBlocks(row0, rows, block_n));
                        let all: Vec<u32> = (0..sk.div_ceil(block_n)).filter(|&b| seen(b)).collect();
                        match all.as_slice() {
                            [] => assert!(hi <= lo, "{ctx}: {lo}..{hi} but no block is seen"),
                            [first, .., last] | [first @ last] => {
                                assert_eq!((lo, hi), (*first, last + 1), "{ctx}");
                                assert_eq!(ask(KeyRangesProbe::KeyBlocksEnd(row0, rows, block_n)).0, hi, "{ctx}");
                                assert!((lo..hi).all(seen), "{ctx}: a gap in {lo}..{hi}");
                            }
                        }
                        let (wlo, whi) = ask(KeyRangesProbe::WholeBlocks(row0, rows, block_n));
                        for b in 0..sk.div_ceil(block_n) + 1 {
                            // Rows outside 0..seqlen_q count (they only narrow it).
                            let whole = (b * block_n..(b + 1) * block_n).all(|c| {
                                (row0..row0 + rows as i32).all(|r| (c as i32) < sk as i32 && sees_pair(w, &docs, sq, sk, r, c as i32, false))
                            });
                            assert_eq!(wlo <= b && b < whi, whole, "{ctx}: block {b} in whole {wlo}..{whi}");
                        }
                    }
                }
            }
        }
    }

    /// Brute force: the backward's query block ranges hold exactly the blocks with a row
    /// that sees one of the key block's keys, and a step needs the mask when a pair of it
    /// is hidden (keys past `seqlen_k` aside), and without documents only then.
    #[test]
    fn query_block_ranges_and_mask_rule_match_the_visible_pairs() {
        for (sq, sk) in SHAPES {
            for (w, docs, ctx) in cases(sq, sk) {
                for (block_m, block_n) in [(1u32, 1u32), (4, 8), (8, 4), (16, 16)] {
                    for n in 0..sk.div_ceil(block_n) {
                        let ctx = format!("{ctx} block {block_m}x{block_n} key block {n}");
                        let ask = |probe| ask(w, &docs, sq, sk, probe);
                        let keys = n * block_n..((n + 1) * block_n).min(sk);
                        let seen = |m: u32| {
                            (m * block_m..((m + 1) * block_m).min(sq)).any(|r| keys.clone().any(|c| sees_pair(w, &docs, sq, sk, r as i32, c as i32, true)))
                        };
                        let (lo, hi) = ask(KeyRangesProbe::QueryBlocks(n, block_n, block_m));
                        let all: Vec<u32> = (0..sq.div_ceil(block_m)).filter(|&m| seen(m)).collect();
                        match all.as_slice() {
                            [] => assert!(hi <= lo, "{ctx}: {lo}..{hi}"),
                            [first, .., last] | [first @ last] => assert_eq!((lo, hi), (*first, last + 1), "{ctx}"),
                        }
                        for m in 0..sq.div_ceil(block_m) {
                            let hidden = (m * block_m..(m + 1) * block_m).any(|r| {
                                keys.clone().any(|c| !sees_pair(w, &docs, sq, sk, r as i32, c as i32, false))
                            });
                            let needs = ask(KeyRangesProbe::NeedsMask(m, n, block_m, block_n)).0 != 0;
                            assert!(needs || !hidden, "{ctx} query block {m}: a hidden pair unmasked");
                            if docs.is_none() && keys.len() == block_n as usize {
                                assert_eq!(needs, hidden, "{ctx} query block {m}");
                            }
                        }
                    }
                }
            }
        }
    }
}
