//! Block-sparse masks on the CPU: the forward algorithm run over a block mask's lists
//! (`flash_attn3::sparse::host_lists`, the rules the GPU build follows) — empty blocks
//! skipped, full blocks without asking the mask — equals the exact dense forward, on
//! random masks, shapes, head dims (the kernels' tiles), causal or not, lists per head or
//! shared; and a list that calls a partial block full is caught.
use common::sparse::split_header;
use common::variant::{Coords, Variant, VariantData};
use flash_attn3::reference::{HostTensor, HostVariantOf, Problem, Tiling, attention_f64, attention_tiled_over, max_abs_err, rng};
use flash_attn3::sparse::{PassPlan, host_lists_of, plan};
use flash_attn3::{BlockMaskShape, DType};
use proptest::prelude::*;

/// A mask of stripes and a band, shifted by word 0 and differing by head when word 1 is
/// set: blocks of every state at small sizes.
#[derive(Clone, Copy)]
struct Stripes;

impl Variant for Stripes {
    const SCORE_MOD: bool = false;
    const MASK_MOD: bool = true;
    fn visible<D: VariantData + ?Sized>(data: &D, at: Coords) -> bool {
        let shift = data.u32_at(0) + at.head * data.u32_at(1);
        (at.q / 7 + at.kv / 11 + shift) % 3 != 0 || (at.q as i64 - at.kv as i64).abs() < 20
    }
}

/// The forward over `lists` (the forward pass's, of `pass`): row `i` of head `h` visits
/// the entries of its query tile's list, masked while partial.
fn tiled_over_lists(p: &Problem<'_>, pass: &PassPlan, lists: &[u32]) -> flash_attn3::reference::AttnResult<f32> {
    let bp = &pass.params;
    let (list_heads, list_batches) = (pass.grid.1 as usize, pass.grid.2 as usize);
    let tiling = Tiling { block_m: bp.block_m as usize, block_n: bp.block_n as usize, lazy_rescale: true };
    attention_tiled_over(p, tiling, None, |b, h, i| {
        let m = ((i as u32 + bp.row_shift) / bp.block_m) as u32;
        let (b, h) = (if list_batches > 1 { b } else { 0 }, if list_heads > 1 { h } else { 0 });
        let row = (bp.lists.row(b as u32, h as u32, m) / 4) as usize;
        let (blocks, partial) = split_header(lists[row]);
        (0..blocks).map(|e| (lists[row + 1 + e as usize] as usize, e < partial)).collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn forward_over_block_lists_equals_the_dense_forward(
        b in 1usize..3, sq in 1usize..300, sk in 1usize..300, (hq, hk) in prop::sample::select(vec![(1usize, 1usize), (2, 1), (4, 2)]),
        d in prop::sample::select(vec![64usize, 128]), causal in any::<bool>(), shared in any::<bool>(),
        shift in 0u32..3, by_head in 0u32..2, seed in any::<u64>(),
    ) {
        let mut r = rng(seed);
        let q = HostTensor::randn([b, sq, hq, d], DType::BF16, 1.0, &mut r);
        let k = HostTensor::randn([b, sk, hk, d], DType::BF16, 1.0, &mut r);
        let v = HostTensor::randn([b, sk, hk, d], DType::BF16, 1.0, &mut r);
        // Lists shared by the heads only for a mask that ignores the head.
        let (by_head, shared) = (if shared { 0 } else { by_head }, shared);
        let words = vec![shift, by_head];
        let variant = HostVariantOf::<Stripes>::new(words.clone());
        let p = Problem { variant: Some(&variant), ..Problem::plain(&q, &k, &v, causal, 1.0 / (d as f32).sqrt()) };
        let mut shape = BlockMaskShape::new(b, sq, sk, hq, hk, d).causal(causal);
        if shared {
            shape = shape.same_for_every_head();
        }
        let (fwd, _) = plan(&shape).unwrap();
        let lists = host_lists_of::<Stripes>(&fwd, &words);
        let got = tiled_over_lists(&p, &fwd, &lists);
        let want = attention_f64(&p);
        prop_assert!(max_abs_err(&got.o, &want.o) < 1e-4, "O off by {}", max_abs_err(&got.o, &want.o));
        prop_assert!(max_abs_err(&got.lse, &want.lse) < 1e-4, "LSE off by {}", max_abs_err(&got.lse, &want.lse));
    }
}

/// The check above has teeth: a list whose partial block is called full (the mask not
/// asked there) gives another forward.
#[test]
fn a_partial_block_called_full_changes_the_forward() {
    let (b, sq, sk, h, d) = (1, 200, 200, 1, 64);
    let mut r = rng(5);
    let q = HostTensor::randn([b, sq, h, d], DType::BF16, 1.0, &mut r);
    let k = HostTensor::randn([b, sk, h, d], DType::BF16, 1.0, &mut r);
    let v = HostTensor::randn([b, sk, h, d], DType::BF16, 1.0, &mut r);
    let words = vec![0, 0];
    let variant = HostVariantOf::<Stripes>::new(words.clone());
    let p = Problem { variant: Some(&variant), ..Problem::plain(&q, &k, &v, false, 0.125) };
    let (fwd, _) = plan(&BlockMaskShape::new(b, sq, sk, h, h, d)).unwrap();
    let mut lists = host_lists_of::<Stripes>(&fwd, &words);
    let want = attention_f64(&p);
    assert!(max_abs_err(&tiled_over_lists(&p, &fwd, &lists).o, &want.o) < 1e-4);
    let (blocks, partial) = split_header(lists[0]);
    assert!(partial > 0, "the first tile has a partial block");
    lists[0] = common::sparse::header(blocks, 0);
    assert!(max_abs_err(&tiled_over_lists(&p, &fwd, &lists).o, &want.o) > 1e-2);
}
