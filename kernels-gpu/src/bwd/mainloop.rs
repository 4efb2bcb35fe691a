//! The consumer mainloop of the backward, one warpgroup (64 of the CTA's keys), per step
//! (one query block of one query head):
//!
//! 1. `Sᵀ = K Qᵀ` and `dPᵀ = V dOᵀ` (SS WGMMA, both operands K-major);
//! 2. `Pᵀ = exp2(Sᵀ · scale · log2 e − LSE₂)` (zero where the mask hides a pair; with
//!    soft-capping from the logits `c · tanh(Sᵀ · scale / c)`) and `dSᵀ = Pᵀ ∘ (dPᵀ − D)`
//!    (with soft-capping `Pᵀ · (1 − tanh²)` in place of `Pᵀ`), elementwise in registers;
//! 3. `dSᵀ` to shared memory (both warpgroups' rows make the block's `dSᵀ`);
//! 4. `dV += Pᵀ dO` and `dK += dSᵀ Q` (RS: `Pᵀ` and `dSᵀ` are already A fragments, dO
//!    and Q MN-major B), and this warpgroup's piece of `dQ = dS K` (SS, both MN-major);
//! 5. the dQ piece added to the fp32 accumulator in global memory by a bulk reduction
//!    ([`super::dq`]).
//!
//! Where the warpgroups split the head dimension (hdim 256, [`BwdTraits::SPLIT`]), each
//! computes `Sᵀ` and `dPᵀ` for its half of the step's queries, and both write `Pᵀ` and
//! `dSᵀ` to shared memory; then each computes dV, dK and dQ for its half of the columns
//! (SS: `Pᵀ` and `dSᵀ` K-major A from shared memory) and stages its dQ in the step's Q or
//! dO slot, which the products no longer need, for the dQ writer's bulk reduction.
use super::dq::DqStager;
use super::producer::BwdStorage;
use super::traits::{BwdTraits, DqSplit, WgTile};
use crate::element::Element;
use crate::fa3::barriers::NamedBarrier;
use crate::fa3::epilogue::{stage_swizzled, stage_swizzled_at};
use crate::fa3::gemm;
use crate::fa3::pipeline::PipelineState;
use crate::fa3::traits::{FragTile, ProbTile, ScoreTile};
use crate::ptx::compiler::{opaque_u32, opaque_u64};
use crate::ptx::wgmma::WgmmaAcc;
use crate::ptx::{fence, math, smem};
use crate::fa3::mask::DocSource;
use crate::fa3::variant::{LogitHook, VariantCall};
use common::window::Documents;
use common::bwd::{BwdParams, STAGES, step_needs_mask};
use common::gmma::{desc_add, k_major_k_step, k_major_sw128, mn_major_k_step, mn_major_sw128, sw128_rows};

/// Which (query, key) pairs of this lane's two key rows the mask hides: a pair is hidden
/// when its query is below the row's bound (`key - (seqlen_k - seqlen_q)` under a causal
/// mask; every query for a key past `seqlen_k`, whose zero-filled row must not reach
/// `P`, where `exp2(-LSE)` could overflow), or with a sliding window outside the queries
/// that see the key (`key − off − right ..= key − off + left`).
#[derive(Clone, Copy)]
struct KeyRowMask {
    /// Causal masks: each key row's first query. Local masks: the query on the diagonal
    /// of the lane's first key row, `key − (seqlen_k − seqlen_q)` (one register: the
    /// bounds are derived where the mask runs).
    min_query: [i32; 2],
}

impl KeyRowMask {
    #[inline(always)]
    fn new<K: BwdTraits>(p: &BwdParams, key_row: i32) -> Self {
        if K::LOCAL {
            return KeyRowMask { min_query: [key_row - (p.seqlen_k as i32 - p.seqlen_q as i32), 0] };
        }
        let bound = |key: i32| {
            if key >= p.seqlen_k as i32 {
                i32::MAX
            } else {
                match p.causal_offset() {
                    Some(off) => key - off,
                    None => i32::MIN,
                }
            }
        };
        KeyRowMask { min_query: [bound(key_row), bound(key_row + 8)] }
    }

    /// Local masks: the query rows `[lo, hi)` of each key row's document (every row
    /// without documents). Derived for each masked step: held across the steps they
    /// would pin four registers through every GEMM.
    #[inline(always)]
    fn doc_rows<K: BwdTraits>(&self, p: &BwdParams, batch: u32) -> [[i32; 2]; 2] {
        let docs = K::Docs::of(&p.docs, batch);
        let off = p.seqlen_k as i32 - p.seqlen_q as i32;
        let last = p.seqlen_k as i32 - 1;
        [0, 1].map(|r| {
            // Keys past `seqlen_k` hide every query anyway; clamped, they read in bounds.
            let key = self.min_query[0] + off + 8 * r;
            match docs.doc(if key < last { key as u32 } else { last as u32 }) {
                Some((start, end)) => [start - off, end - off],
                None => [i32::MIN, i32::MAX],
            }
        })
    }

    /// Whether query `q` of key row `r` (0 or 1) is hidden (`doc_rows`: local masks'
    /// [`KeyRowMask::doc_rows`]).
    #[inline(always)]
    fn hides<K: BwdTraits>(&self, p: &BwdParams, doc_rows: &[[i32; 2]; 2], r: usize, q: i32) -> bool {
        if K::LOCAL {
            // Query q sees the key iff −right <= q − diagonal <= left and it is in the
            // key's document; keys past `seqlen_k` (diagonal past `seqlen_q`) hide every
            // query. (One unsigned comparison for both window bounds.)
            let diagonal = self.min_query[0] + 8 * r as i32;
            let from_first = (q - diagonal + p.window.right) as u32;
            diagonal >= p.seqlen_q as i32 || from_first > (p.window.left + p.window.right) as u32 || (K::Docs::DOCS && (q < doc_rows[r][0] || q >= doc_rows[r][1]))
        } else {
            q < self.min_query[r]
        }
    }
}

/// What a warpgroup keeps across its steps.
pub struct KeyBlockGrads<K: BwdTraits> {
    pub dk: K::KeyGrads,
    pub dv: K::KeyGrads,
}

/// The consumer side of one CTA: this warpgroup's coordinates and operands.
pub struct Consumer<'a, K: BwdTraits> {
    pub p: &'a BwdParams,
    pub storage: BwdStorage,
    /// This consumer warpgroup (0 or 1): its keys are `64 wg..64 wg + 64` of the block
    /// (where the warpgroups split the head dimension, its columns are: [`WgTile`]).
    pub wg: u32,
    pub thread_in_wg: u32,
    pub n_block: u32,
    pub head_k: u32,
    pub batch: u32,
    pub state: PipelineState<STAGES>,
    pub dq: DqStager,
    pub kernel: core::marker::PhantomData<K>,
}

impl<K: BwdTraits> Consumer<'_, K> {
    /// `dPᵀ` is issued after `Pᵀ` is made, so that its accumulator is not held while the
    /// tanh and its derivative are: with it in flight, hdim 128 spilled. Costs the overlap
    /// of the exponentials with `dPᵀ` (ALiBi fits without). User variants with a score
    /// function likewise (a table lookup spilled 20 bytes at hdim 128 with `dPᵀ` early).
    const LATE_DP: bool = K::SOFTCAP || K::Variant::SCORE;

    /// Each pair's `P` is packed as it is made and `P` times the logit's derivative kept
    /// for `dS` (soft-capping, and user variants whose derivative is not 1).
    const SCALED_DS: bool = K::SOFTCAP || K::Variant::GRAD;

    /// dQ's product issued before dK's, and staged while dK runs, with `dSᵀ` in the
    /// stage's slot (`common::bwd::ds_stages`) so that no barrier waits for the previous
    /// step's dQ product (+0.7% geomean, +1.5-1.9% at hdim 128 8k-16k; dK before the
    /// warpgroups meet, the other order, leaves the tensor cores idle while dQ is staged).
    /// Not with [`Self::LATE_DP`]: there dQ's accumulator beside dK's operands spilled 4-8
    /// bytes, and the second slot's address 4 (ptxas 13.1, the deterministic windowed
    /// soft-capping kernel), so those kernels keep one slot and the barrier.
    const DQ_FIRST: bool = !Self::LATE_DP;

    /// dV's product is waited for before `dSᵀ` is made, so that `Pᵀ`'s packed registers
    /// are free by then: with 128-query steps (hdim 64), where the score tiles take 64
    /// registers each, they spilled 24-112 bytes live beside `Pᵀ`, `dPᵀ` and `dSᵀ`; at
    /// hdim 128 the document kernels with soft-capping or ALiBi spilled 8 bytes (the
    /// loaded bounds beside the score modification's registers).
    const DV_BEFORE_DS: bool =
        K::BLOCK_M == 128 || (K::HDIM == 128 && <K::Docs as DocSource>::DOCS && (K::SOFTCAP || K::ALIBI));

    /// The first k-step's LSE is read before the waits for `Sᵀ` and `dPᵀ`, off the
    /// softmax's path (read after them, the LSE and D loads were the most sampled stall of
    /// the hdim-128 warps): not with 128-query steps, at hdim 256, with soft-capping or
    /// ALiBi, where the LSE and D together spilled 4-16 bytes (window backward with the
    /// LSE alone: +2.3% at hdim 64, +1.1% at hdim 128 16k). D is read after the wait for
    /// `dPᵀ`: read early too, it spilled the window kernels, and beside
    /// [`Self::MASK_PASS`] the plain ones' producer warpgroup (perf-history 136).
    const EARLY_LSE: bool = K::BLOCK_M == 64 && !K::SPLIT && !K::SOFTCAP && !K::ALIBI && !K::Variant::ACTIVE;

    /// The mask zeroes the hidden pairs' `P` in a pass of its own that only masked steps
    /// run, after every exponential of the step: evaluated per pair inside the
    /// exponentials' loop, ptxas predicated the test into every step (2-4 instructions a
    /// score without a mask's need, 8-10 with a window's two bounds). Where `P` is packed
    /// as it is made (soft-capping, [`Self::SCALED_DS`]) the pass zeroes the packed
    /// halves too. Not in user variants (their logit reads whether the step is masked),
    /// nor at hdim 128 with ALiBi and a window, or soft-capped without a window or
    /// documents (the consumers spilled 8-16 bytes).
    const MASK_PASS: bool = !K::Variant::ACTIVE
        && !(K::HDIM == 128 && K::ALIBI && K::LOCAL && !<K::Docs as DocSource>::DOCS)
        && !(Self::SCALED_DS && K::HDIM == 128 && !K::LOCAL);

    /// Every step of the CTA: the query heads of its K/V head, and for each the query
    /// blocks that see its keys. Returns this warpgroup's dK (before the softmax scale)
    /// and dV.
    #[inline(always)]
    pub fn run(&mut self) -> KeyBlockGrads<K> {
        let p = self.p;
        let mut grads = KeyBlockGrads::<K> { dk: K::KeyGrads::zeroed(), dv: K::KeyGrads::zeroed() };
        let ranges = super::local_ranges::<K>(p, self.batch);
        let steps = super::cta_steps::<K>(p, self.n_block, self.head_k, self.batch, ranges.as_ref());
        if steps.is_empty() {
            return grads;
        }
        // K and V land once.
        self.storage.k.consumer_wait(PipelineState::new());
        self.storage.v.consumer_wait(PipelineState::new());
        let key_row = self.key_row(self.thread_in_wg);
        let mut mask = KeyRowMask::new::<K>(p, key_row);
        if K::Variant::EXACT {
            // A user variant's exact key bound: each key row's first query is also the
            // first row whose bound passes it.
            let call = VariantCall::of_bwd(p);
            for r in 0..2 {
                let first = K::Variant::first_query(call, self.batch, (key_row + 8 * r as i32) as u32) as i32;
                mask.min_query[r] = mask.min_query[r].max(first);
            }
        }
        // ALiBi and user variants read each step's head from the step's index.
        steps.for_each_query_block(p, #[inline(always)] |step, m, partial| {
            let h = if K::ALIBI || K::Variant::ACTIVE { steps.head_of(step) } else { 0 };
            if K::Variant::SPARSE {
                // The list's partial blocks need the mask; its full ones none.
                let masked = math::shfl_broadcast_u32(partial as u32) != 0;
                self.step(&mut grads, &mask, h, m, masked)
            } else {
                self.visit(&mut grads, &mask, h, m)
            }
        });
        grads
    }

    /// The first of the two key rows of thread `thread_in_wg`'s accumulator fragments
    /// (the other is 8 rows down).
    #[inline(always)]
    fn key_row(&self, thread_in_wg: u32) -> i32 {
        (self.n_block * K::BLOCK_N + WgTile::of::<K>(self.wg).key0 + (thread_in_wg / 32) * 16 + thread_in_wg % 32 / 4) as i32
    }

    /// The step of query block `m` of the `h`-th query head, masked or not.
    #[inline(always)]
    fn visit(&mut self, grads: &mut KeyBlockGrads<K>, mask: &KeyRowMask, h: u32, m: u32) {
        let p = self.p;
        let window_cuts = if let Some(r) = super::local_ranges::<K>(p, self.batch) {
            r.step_needs_mask(m, self.n_block, K::BLOCK_M, K::BLOCK_N)
        } else {
            step_needs_mask(p.causal != 0, m, self.n_block, K::BLOCK_M, K::BLOCK_N, p.seqlen_q, p.seqlen_k)
        };
        // A user variant's exact bound cuts the block for the step's first row.
        let bound_cuts = K::Variant::EXACT && {
            let call = VariantCall::of_bwd(p);
            K::Variant::key_end(call, self.batch, m * K::BLOCK_M) < (self.n_block + 1) * K::BLOCK_N
        };
        let masked = window_cuts || bound_cuts || (self.n_block + 1) * K::BLOCK_N > p.seqlen_k;
        // Uniform across the CTA; the broadcast lets ptxas see it.
        let masked = math::shfl_broadcast_u32(masked as u32) != 0;
        self.step(grads, mask, h, m, masked);
    }

    /// [`Self::MASK_PASS`]: `P` (in `scores`) set to 0 at the pairs the mask hides, among
    /// this lane's two key rows and its columns (`col_2t`) of the step's queries from
    /// `query0`. Whatever the exponential gave there (a zero-filled key row past
    /// `seqlen_k` may overflow it) is replaced, not scaled.
    #[inline(always)]
    fn zero_hidden(p: &BwdParams, scores: &mut K::Scores, mask: &KeyRowMask, doc_rows: &[[i32; 2]; 2], query0: i32, col_2t: u32) {
        let steps = <<K::Scores as ScoreTile>::Probs as ProbTile>::STEPS;
        for j in 0..2 * steps {
            let col = 8 * j as u32 + col_2t;
            let sf = scores.frag_mut(j);
            for r in 0..2 {
                for c in 0..2 {
                    if mask.hides::<K>(p, doc_rows, r, query0 + (col + c as u32) as i32) {
                        sf[2 * r + c] = 0.0;
                    }
                }
            }
        }
    }

    /// [`Self::zero_hidden`] where `P` was packed as it was made ([`Self::SCALED_DS`]):
    /// the hidden pairs' halves of `probs` are cleared too, and `scores` (`dS`'s factor
    /// there) zeroed likewise. (Kept apart from `zero_hidden`: a shared body moved the
    /// plain kernels' schedule.)
    #[inline(always)]
    fn zero_hidden_packed(
        p: &BwdParams,
        scores: &mut K::Scores,
        probs: &mut <K::Scores as ScoreTile>::Probs,
        mask: &KeyRowMask,
        doc_rows: &[[i32; 2]; 2],
        query0: i32,
        col_2t: u32,
    ) {
        for j in 0..K::Scores::FRAGS {
            let col = 8 * j as u32 + col_2t;
            let sf = scores.frag_mut(j);
            // Pair (r, c) of n-tile j is half c (low first) of register 2 (j % 2) + r of
            // k-step j / 2.
            let mut a = probs.step(j / 2);
            for r in 0..2 {
                let hidden = [0, 1].map(|c| mask.hides::<K>(p, doc_rows, r, query0 + (col + c) as i32));
                for c in 0..2 {
                    sf[2 * r + c] = if hidden[c] { 0.0 } else { sf[2 * r + c] };
                }
                a[2 * (j % 2) + r] &= (if hidden[0] { 0 } else { 0xFFFF }) | (if hidden[1] { 0 } else { 0xFFFF_0000 });
            }
            probs.set_step(j / 2, a);
        }
    }

    /// `dV += Pᵀ dO` (RS: `Pᵀ` packed in registers, dO MN-major from `do_b`).
    #[inline(always)]
    fn issue_dv(grads: &mut KeyBlockGrads<K>, probs: &mut <K::Scores as ScoreTile>::Probs, do_b: u64) {
        let steps = <<K::Scores as ScoreTile>::Probs as ProbTile>::STEPS;
        probs.fence_operand();
        grads.dv.fence_operand();
        gemm::issue(|| {
            for kb in 0..steps {
                K::Element::wgmma_rs_mn(&mut grads.dv, probs.step(kb), desc_add(do_b, mn_major_k_step(kb as u32)), true);
            }
        });
    }

    /// One step: query block `m` of the CTA's `h`-th query head (the producer loaded it;
    /// only ALiBi and user variants read `h`).
    #[inline(always)]
    fn step(&mut self, grads: &mut KeyBlockGrads<K>, mask: &KeyRowMask, h: u32, m: u32, masked: bool) {
        let st = self.state;
        let s = &self.storage;
        let tile = WgTile::of::<K>(self.wg);
        let (q_slot, do_slot) = (s.q.slot(st.index()), s.dout.slot(st.index()));
        // Descriptors are derived afresh each step (through an opaque base): hoisted out
        // of the loop, the per-k-step ones would pin dozens of registers.
        let key_rows = sw128_rows(K::BLOCK_N, 0, tile.key0);
        let k_desc = opaque_u64(k_major_sw128(s.k.slot(0).add(key_rows).0));
        let v_desc = opaque_u64(k_major_sw128(s.v.slot(0).add(key_rows).0));
        let query_rows = sw128_rows(K::BLOCK_M, 0, tile.query0);
        let (q_desc, do_desc) = (k_major_sw128(q_slot.add(query_rows).0), k_major_sw128(do_slot.add(query_rows).0));

        // 1. Sᵀ = K Qᵀ, then dPᵀ = V dOᵀ, as two commit groups: Pᵀ is computed while
        // dPᵀ is still on the tensor cores.
        s.q.consumer_wait(st);
        s.dout.consumer_wait(st);
        let mut scores = K::Scores::zeroed();
        let mut dp = K::Scores::zeroed();
        scores.fence_operand();
        dp.fence_operand();
        gemm::issue(|| {
            for kk in 0..K::HDIM / 16 {
                let (key_step, q_step) = (k_major_k_step(K::BLOCK_N, kk), k_major_k_step(K::BLOCK_M, kk));
                K::Element::wgmma_ss(&mut scores, desc_add(k_desc, key_step), desc_add(q_desc, q_step), kk > 0);
            }
        });
        let issue_dp = |dp: &mut K::Scores| {
            gemm::issue(|| {
                for kk in 0..K::HDIM / 16 {
                    let (key_step, q_step) = (k_major_k_step(K::BLOCK_N, kk), k_major_k_step(K::BLOCK_M, kk));
                    K::Element::wgmma_ss(dp, desc_add(v_desc, key_step), desc_add(do_desc, q_step), kk > 0);
                }
            })
        };
        // This warpgroup's queries of the step: their LSE and D (derived after the wait:
        // held across it, they spilled the soft-capped kernels), and the first LSE.
        let vectors = || (s.lse_slot::<K>(st.index()).add(4 * tile.query0), s.dpsum_slot::<K>(st.index()).add(4 * tile.query0));
        let lse_first = if Self::EARLY_LSE { Self::vector_pair(vectors().0, 2 * (self.thread_in_wg % 4), 0) } else { [[0.0; 2]; 2] };
        // Score modifications: dPᵀ is issued after Pᵀ is made ([`Self::LATE_DP`]).
        if Self::LATE_DP {
            gemm::wait::<0>(&mut scores);
        } else {
            issue_dp(&mut dp);
            gemm::wait::<1>(&mut scores);
        }

        // 2. Pᵀ (in place of Sᵀ; the f32 values stay for dSᵀ), packed into A fragments one
        // k-step (two n-tiles) at a time, then dV += Pᵀ dO while dSᵀ is computed.
        let lane = self.thread_in_wg % 32;
        let col_2t = 2 * (lane % 4);
        let (lse, dpsum) = vectors();
        let query0 = (m * K::BLOCK_M + tile.query0) as i32;
        let steps = <<K::Scores as ScoreTile>::Probs as ProbTile>::STEPS;
        // ALiBi: this lane's two key rows' diagonal queries (query `key − seqlen_k +
        // seqlen_q` is at distance 0), and the step's head's slope.
        let (alibi_diag, slope) = if K::ALIBI {
            let key = (self.n_block * K::BLOCK_N + tile.key0 + (self.thread_in_wg / 32) * 16 + lane / 4) as i32;
            let p = self.p;
            let head = self.head_k * p.kv_group + h;
            let at = p.alibi_slopes + 4 * (self.batch as u64 * p.alibi_batch_stride as u64 + head as u64);
            // SAFETY: the host checked that the slopes array covers every (batch, head).
            let slope = f32::from_bits(unsafe { crate::ptx::global::ld_nc_u32(at) }) * p.alibi_inv_scale;
            (key - (p.seqlen_k as i32 - p.seqlen_q as i32) - query0, slope)
        } else {
            (0, 0.0)
        };
        let no_docs = [[i32::MIN, i32::MAX]; 2];
        let doc_rows = if K::Docs::DOCS && masked && !Self::MASK_PASS { mask.doc_rows::<K>(self.p, self.batch) } else { no_docs };
        // User variants: the step's head, and this lane's first key row.
        let user = K::Variant::new(self.batch, self.head_k * self.p.kv_group + h);
        let user_call = VariantCall::of_bwd(self.p);
        let user_key = self.n_block * K::BLOCK_N + tile.key0 + (self.thread_in_wg / 32) * 16 + lane / 4;
        let mut probs = <<K::Scores as ScoreTile>::Probs as ProbTile>::zeroed();
        for kb in 0..steps {
            // Soft-capping packs each pair of P as it is made, for dV, and keeps
            // P · (1 − tanh²) in its place, for dS (tanh' of the logits): both fit in the
            // registers P alone takes. User variants keep P times their derivative.
            let mut packed = [0u32; 4];
            for e in 0..2 {
                let j = 2 * kb + e;
                let col = 8 * j as u32 + col_2t;
                let lse2 = if Self::EARLY_LSE && kb == 0 { lse_first[e] } else { Self::vector_at(lse, col_2t, j) };
                let sf = scores.frag_mut(j);
                for r in 0..2 {
                    let mut pair = [0.0f32; 2];
                    for c in 0..2 {
                        let i = 2 * r + c;
                        let hidden = !Self::MASK_PASS && masked && mask.hides::<K>(self.p, &doc_rows, r, query0 + (col + c as u32) as i32);
                        // Soft-capping: the score is the tanh; `c` is in `scale_log2`.
                        // ALiBi: minus the slope times the distance from the diagonal
                        // (after the tanh when both: the slope is then in its units).
                        // User variants: the logit from `x = S · scale`, and its derivative.
                        let (t, user_grad) = if K::Variant::ACTIVE {
                            user.logit(user_call, query0 as u32 + col + c as u32, user_key + 8 * r as u32, sf[i] * self.p.softcap_scale, masked)
                        } else if K::SOFTCAP {
                            (math::tanh(sf[i] * self.p.softcap_scale), 0.0)
                        } else {
                            (sf[i], 0.0)
                        };
                        let logit = if K::ALIBI {
                            let dist = (alibi_diag + 8 * r as i32 - (col + c as u32) as i32).unsigned_abs() as f32;
                            math::fma(-slope, dist, t)
                        } else {
                            t
                        };
                        let prob = if hidden { 0.0 } else { math::exp2(math::fma(logit, self.p.scale_log2, -lse2[c])) };
                        pair[c] = prob;
                        sf[i] = if K::Variant::GRAD {
                            // Not 0 · derivative: a pair the mask hides, or a padding row
                            // or key, may have any derivative.
                            if prob == 0.0 { 0.0 } else { prob * user_grad }
                        } else if K::SOFTCAP {
                            prob * math::fma(-t, t, 1.0)
                        } else {
                            prob
                        };
                    }
                    packed[2 * e + r] = K::Element::pack2(pair[0], pair[1]);
                }
            }
            if !Self::MASK_PASS || Self::SCALED_DS {
                probs.set_step(kb, if Self::SCALED_DS { packed } else { scores.probs_step::<K::Element>(kb) });
            }
        }
        if Self::MASK_PASS {
            if masked {
                // The key rows' bounds derived here, from a thread index LLVM cannot
                // trace to the loop's entry: held across the steps, they cost a register
                // the products need (the kernels spilled). With 128-row steps the lane's
                // columns too (held, one was spilled); in the other kernels that moved
                // LLVM's schedule into spills elsewhere.
                let thread = opaque_u32(self.thread_in_wg);
                let mask = KeyRowMask::new::<K>(self.p, self.key_row(thread));
                let doc_rows = if K::Docs::DOCS { mask.doc_rows::<K>(self.p, self.batch) } else { no_docs };
                let (query0, col_2t) = if K::BLOCK_M == 128 { ((m * K::BLOCK_M + tile.query0) as i32, 2 * (thread % 4)) } else { (query0, col_2t) };
                if Self::SCALED_DS {
                    Self::zero_hidden_packed(self.p, &mut scores, &mut probs, &mask, &doc_rows, query0, col_2t);
                } else {
                    Self::zero_hidden(self.p, &mut scores, &mask, &doc_rows, query0, col_2t);
                }
            }
            if !Self::SCALED_DS {
                for kb in 0..steps {
                    probs.set_step(kb, scores.probs_step::<K::Element>(kb));
                }
            }
        }
        let do_b = mn_major_sw128(do_slot.0, K::BLOCK_M);
        if Self::LATE_DP {
            dp.fence_operand();
            issue_dp(&mut dp);
        }
        if !K::SPLIT {
            Self::issue_dv(grads, &mut probs, do_b);
        }
        // dPᵀ must land (dV may still run).
        if K::SPLIT || Self::DV_BEFORE_DS {
            gemm::wait::<0>(&mut dp);
            probs.fence_operand();
        } else {
            gemm::wait::<1>(&mut dp);
        }

        // 3. dSᵀ = Pᵀ ∘ (dPᵀ − D), in place of dPᵀ, packed likewise. With ALiBi on
        // 128-row steps D's address is derived here again: held from the step's start it
        // was spilled.
        let (dpsum, col_2t) = if K::ALIBI && K::BLOCK_M == 128 {
            (vectors().1, 2 * (opaque_u32(self.thread_in_wg) % 4))
        } else {
            (dpsum, col_2t)
        };
        let mut dsf = <<K::Scores as ScoreTile>::Probs as ProbTile>::zeroed();
        for kb in 0..steps {
            for e in 0..2 {
                let j = 2 * kb + e;
                let d = Self::vector_at(dpsum, col_2t, j);
                let (sf, dpf) = (scores.frag(j), dp.frag_mut(j));
                for i in 0..4 {
                    dpf[i] = sf[i] * (dpf[i] - d[i % 2]);
                }
            }
            dsf.set_step(kb, dp.probs_step::<K::Element>(kb));
        }

        if K::SPLIT {
            self.split_products(grads, &mut probs, &mut dsf, q_slot.0, do_slot.0);
            return;
        }

        // 4. dSᵀ to shared memory (with [`Self::DQ_FIRST`] to its slot of the stage: the
        // other slot may still feed the previous step's dQ product), then this
        // warpgroup's part of dQ = dS K once both warpgroups' rows are there. Its
        // packed pairs are the A fragments' (n-tile j is half j % 2 of k-step j / 2).
        const { assert!(K::SPLIT || common::bwd::ds_stages(K::HDIM) == STAGES) };
        let split = DqSplit::of::<K>(self.wg);
        let q_b = mn_major_sw128(q_slot.0, K::BLOCK_M);
        let issue_dk = |grads: &mut KeyBlockGrads<K>, dsf: &mut <K::Scores as ScoreTile>::Probs| {
            dsf.fence_operand();
            grads.dk.fence_operand();
            gemm::issue(|| {
                for kb in 0..steps {
                    K::Element::wgmma_rs_mn(&mut grads.dk, dsf.step(kb), desc_add(q_b, mn_major_k_step(kb as u32)), true);
                }
            });
        };
        if !Self::DQ_FIRST {
            // dK += dSᵀ Q runs while dSᵀ is stored and the warpgroups meet.
            issue_dk(grads, &mut dsf);
            // One slot: both warpgroups' previous dQ products must have read it.
            NamedBarrier::DsFree.sync(0);
        }
        let ds_stage = if Self::DQ_FIRST { st.index() } else { 0 };
        let packed = |j: usize, r: usize| dsf.step(j / 2)[2 * (j % 2) + r];
        stage_swizzled(s.ds_slot::<K>(ds_stage), K::BLOCK_N, tile.key0, self.thread_in_wg / 32, lane, <K::Scores as FragTile>::FRAGS, packed);
        // The dQ WGMMA reads dSᵀ through the async proxy.
        fence::proxy_async_shared();
        NamedBarrier::DsReady.sync(0);

        if Self::DQ_FIRST {
            // dQ, then dK: dQ is staged while dK runs.
            let mut dq = K::DqTile::zeroed();
            self.issue_dq(&mut dq, split, ds_stage);
            issue_dk(grads, &mut dsf);
            gemm::wait::<1>(&mut dq);
            self.dq.stage::<K>(&self.storage, &dq, self.wg, self.thread_in_wg);
            gemm::wait::<0>(&mut grads.dk);
            self.release_stage(grads, &mut probs, &mut dsf);
            self.state.advance();
            return;
        }

        // 5. This warpgroup's dQ piece = dS K.
        let dq = self.finish_products(grads, &mut probs, &mut dsf, split, ds_stage);
        self.state.advance();

        // 5. dQ: staged for the writer warp.
        self.dq.stage::<K>(&self.storage, &dq, self.wg, self.thread_in_wg);
    }

    /// A lane's two values of a stage's LSE or D vector (from `vector`, this warpgroup's
    /// first query) for n-tile `j`: columns `8 j + col_2t` and `+ 1`.
    #[inline(always)]
    fn vector_at(vector: smem::SmemAddr, col_2t: u32, j: usize) -> [f32; 2] {
        // SAFETY: inside this stage's vector; 8 B aligned (even column).
        unsafe { smem::ld_v2_f32(vector.add(4 * (8 * j as u32 + col_2t))) }
    }

    /// [`Self::vector_at`] for both n-tiles of k-step `kb`.
    #[inline(always)]
    fn vector_pair(vector: smem::SmemAddr, col_2t: u32, kb: usize) -> [[f32; 2]; 2] {
        core::array::from_fn(|e| Self::vector_at(vector, col_2t, 2 * kb + e))
    }

    /// `dQ = dS K` for this warpgroup's part ([`DqSplit`]) over the block's keys. dSᵀ
    /// is stored key-row by key-row: dS is its MN-major transpose. K likewise, from
    /// column `col0` (at hdim 64 the middle of a swizzled row: the swizzle acts on the
    /// address bits, so an operand may start there, as the K-major k-steps do).
    #[inline(always)]
    fn issue_dq(&self, dq: &mut K::DqTile, split: DqSplit, stage: u32) {
        let s = &self.storage;
        // dS's rows are dSᵀ's 64-column chunks.
        let ds_desc = opaque_u64(mn_major_sw128(s.ds_slot::<K>(stage).add(sw128_rows(K::BLOCK_N, split.row0 / 64, 0)).0, K::BLOCK_N));
        let k_col = sw128_rows(K::BLOCK_N, split.col0 / 64, 0) + 2 * (split.col0 % 64);
        let kt_desc = opaque_u64(mn_major_sw128(s.k.slot(0).add(k_col).0, K::BLOCK_N));
        dq.fence_operand();
        gemm::issue(|| {
            for kk in 0..K::BLOCK_N / 16 {
                K::Element::wgmma_ss_mn_mn(dq, desc_add(ds_desc, mn_major_k_step(kk)), desc_add(kt_desc, mn_major_k_step(kk)), kk > 0);
            }
        });
    }

    /// Issues this warpgroup's dQ product, waits for every product of the step, and
    /// releases the stage's Q and dO (with their LSE and D), which it has read.
    #[inline(always)]
    fn finish_products(&mut self, grads: &mut KeyBlockGrads<K>, probs: &mut <K::Scores as ScoreTile>::Probs, dsf: &mut <K::Scores as ScoreTile>::Probs, split: DqSplit, stage: u32) -> K::DqTile {
        let mut dq = K::DqTile::zeroed();
        self.issue_dq(&mut dq, split, stage);
        gemm::wait::<0>(&mut dq);
        self.release_stage(grads, probs, dsf);
        dq
    }

    /// Once every product of the step is done: releases the stage's Q and dO (with their
    /// LSE and D), which they have read.
    #[inline(always)]
    fn release_stage(&mut self, grads: &mut KeyBlockGrads<K>, probs: &mut <K::Scores as ScoreTile>::Probs, dsf: &mut <K::Scores as ScoreTile>::Probs) {
        grads.dv.fence_operand();
        grads.dk.fence_operand();
        if !Self::DV_BEFORE_DS {
            probs.fence_operand();
        }
        dsf.fence_operand();
        self.storage.q.consumer_release(self.state);
        self.storage.dout.consumer_release(self.state);
    }

    /// The rest of a step where the warpgroups split the head dimension: this
    /// warpgroup's `Pᵀ` and `dSᵀ` (its queries of the step) to shared memory, then, once
    /// both are there, dV, dK and dQ for its columns, all operands from shared memory;
    /// once both warpgroups' products are done, dQ staged in the stage's Q (warpgroup 0)
    /// or dO slot (1), which the dQ writer releases after adding it (with the consumers'
    /// own releases: the slots are free once both came).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn split_products(&mut self, grads: &mut KeyBlockGrads<K>, probs: &mut <K::Scores as ScoreTile>::Probs, dsf: &mut <K::Scores as ScoreTile>::Probs, q_slot: u32, do_slot: u32) {
        let s = &self.storage;
        let st = self.state;
        let tile = WgTile::of::<K>(self.wg);
        let (warp, lane) = (self.thread_in_wg / 32, self.thread_in_wg % 32);
        // Both warpgroups' products of the previous step have read Pᵀ and dSᵀ (the
        // barrier at its end).
        let frags = <K::Scores as FragTile>::FRAGS;
        stage_swizzled_at(s.p, K::BLOCK_N, 0, tile.query0, warp, lane, frags, |j, r| probs.step(j / 2)[2 * (j % 2) + r]);
        stage_swizzled_at(s.ds, K::BLOCK_N, 0, tile.query0, warp, lane, frags, |j, r| dsf.step(j / 2)[2 * (j % 2) + r]);
        // The WGMMAs read them through the async proxy.
        fence::proxy_async_shared();
        NamedBarrier::DsReady.sync(0);

        // dV += Pᵀ dO and dK += dSᵀ Q over the step's queries (K-major A, MN-major B from
        // this warpgroup's 64-column chunks), then dQ = dS K.
        let chunk = tile.col0 / 64;
        let p_a = k_major_sw128(s.p.0);
        let ds_a = k_major_sw128(s.ds.0);
        let do_b = opaque_u64(mn_major_sw128(do_slot + sw128_rows(K::BLOCK_M, chunk, 0), K::BLOCK_M));
        let q_b = opaque_u64(mn_major_sw128(q_slot + sw128_rows(K::BLOCK_M, chunk, 0), K::BLOCK_M));
        grads.dv.fence_operand();
        grads.dk.fence_operand();
        gemm::issue(|| {
            for kk in 0..K::BLOCK_M / 16 {
                let a_step = k_major_k_step(K::BLOCK_N, kk);
                K::Element::wgmma_ss_k_mn(&mut grads.dv, desc_add(p_a, a_step), desc_add(do_b, mn_major_k_step(kk)), true);
            }
            for kk in 0..K::BLOCK_M / 16 {
                let a_step = k_major_k_step(K::BLOCK_N, kk);
                K::Element::wgmma_ss_k_mn(&mut grads.dk, desc_add(ds_a, a_step), desc_add(q_b, mn_major_k_step(kk)), true);
            }
        });
        // (The dQ writer's release of Q and dO follows once it has added the dQ staged
        // there.)
        let dq = self.finish_products(grads, probs, dsf, DqSplit::of::<K>(self.wg), st.index());
        // Both warpgroups' products are done: Q, dO, Pᵀ and dSᵀ are read.
        NamedBarrier::DsFree.sync(0);
        self.dq.stage_split::<K>(&self.storage, &dq, st.index(), self.wg, self.thread_in_wg);
        self.state.advance();
    }
}
