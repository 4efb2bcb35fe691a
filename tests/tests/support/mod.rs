//! What the GPU test binaries share: strided layouts with gaps, bit patterns, and the
//! GPU (or the reason the tests skip).
#![allow(dead_code)]
use cudarc::driver::CudaStream;
use flash_attn3::{DeviceTensor, Gpu, Layout};
use libtest_mimic::{Failed, Trial};
use std::sync::Arc;

/// Strided layouts with gaps: padded heads (+8 elements) and rows (+1 head).
pub fn padded(shape: [usize; 4]) -> (Layout, usize) {
    let [b, s, h, d] = shape;
    let head = d + 8;
    let row = (h + 1) * head;
    let batch = (s + 1) * row;
    (Layout { shape, strides: [batch, row, head, 1] }, b * batch)
}

/// `[b, h, s, d]` storage viewed as `[b, s, h, d]`.
pub fn transposed(shape: [usize; 4]) -> (Layout, usize) {
    let [b, s, h, d] = shape;
    (Layout { shape, strides: [h * s * d, d, s * d, 1] }, b * h * s * d)
}

/// The bit patterns of `v`, to compare results exactly (NaN included).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The bits of every element of `tensors`' buffers, gaps included: equal before and after
/// a call when the call modified none of them.
pub fn snapshot(tensors: &[DeviceTensor], stream: &Arc<CudaStream>) -> Result<Vec<Vec<u32>>, Failed> {
    tensors.iter().map(|t| Ok(bits(&t.raw_f32(stream)?))).collect()
}

/// GPU 0, or `None` with the reason printed (the tests then report themselves ignored);
/// `FA3_REQUIRE_GPU=1` makes a missing GPU fatal.
pub fn gpu_or_skip(what: &str) -> Option<Arc<Gpu>> {
    match Gpu::new(0) {
        Ok(g) => {
            let i = g.info();
            println!("{what} on {} (sm_{}{}, {} SMs)", i.name, i.major, i.minor, i.sm_count);
            Some(Arc::new(g))
        }
        Err(e) => {
            if std::env::var("FA3_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                eprintln!("FA3_REQUIRE_GPU=1 but no usable GPU: {e}");
                std::process::exit(1);
            }
            println!("{what} SKIPPED (reported as ignored): no usable GPU: {e}");
            None
        }
    }
}

/// A test that runs `test` on the GPU, reported as ignored without one.
pub fn gpu_trial(name: impl Into<String>, gpu: &Option<Arc<Gpu>>, test: impl FnOnce(&Gpu) -> Result<(), Failed> + Send + 'static) -> Trial {
    let gpu = gpu.clone();
    let ignored = gpu.is_none();
    Trial::test(name, move || match &gpu {
        Some(g) => test(g),
        None => Ok(()),
    })
    .with_ignored_flag(ignored)
}

/// ALiBi's standard slopes (`reference::standard_alibi_slopes`), per head, or per (batch,
/// head) with batch `b`'s scaled by `1 + b / 2`.
pub fn alibi_slopes(batch: usize, heads: usize, per_batch: bool) -> Vec<f32> {
    let standard = flash_attn3::reference::standard_alibi_slopes(heads);
    let per_head = |b: usize| standard.iter().map(move |s| s * (1.0 + 0.5 * b as f32)).collect::<Vec<_>>();
    if per_batch { (0..batch).flat_map(per_head).collect() } else { per_head(0) }
}


/// Sink logits for `heads` query heads, from below to above a row's typical logits
/// (-1, 0.5, 2, 3.5, repeating), so that the sink matters and sometimes dominates.
pub fn sink_logits(heads: usize) -> Vec<f32> {
    (0..heads).map(|h| (h % 4) as f32 * 1.5 - 1.0).collect()
}

/// The variants of a GPU case, as its name's suffix: `_softcap`, `_alibi` (per head) or
/// `_alibi_per_batch`, `_windowL-R` (`inf`: unbounded side), `_sinks`.
pub fn variant_suffix(softcap: bool, alibi: Option<bool>, window: Option<(Option<usize>, Option<usize>)>, sinks: bool) -> String {
    let side = |w: Option<usize>| w.map_or("inf".into(), |w| w.to_string());
    let alibi = match alibi {
        Some(true) => "_alibi_per_batch",
        Some(false) => "_alibi",
        None => "",
    };
    let window = window.map_or(String::new(), |(l, r)| format!("_window{}-{}", side(l), side(r)));
    format!("{}{alibi}{window}{}", if softcap { "_softcap" } else { "" }, if sinks { "_sinks" } else { "" })
}

/// A test name's suffix for packed documents (`lengths`, per batch or shared).
pub fn docs_suffix(docs: Option<(&[usize], bool)>) -> String {
    match docs {
        Some((lens, per_batch)) => {
            let lens: Vec<String> = lens.iter().map(|l| l.to_string()).collect();
            format!("_docs{}{}", lens.join("-"), if per_batch { "_perbatch" } else { "" })
        }
        None => String::new(),
    }
}

/// The document ids of a case's packed documents (`lengths` cycled over `seqlen_k` keys,
/// one packing per batch element of `batch` or one shared), for the reference and the
/// `DocumentMask`.
pub fn doc_ids(docs: Option<(&[usize], bool)>, batch: usize, seqlen_k: usize) -> Option<Vec<u32>> {
    docs.map(|(lengths, per_batch)| flash_attn3::documents::packed_doc_ids(if per_batch { batch } else { 1 }, seqlen_k, lengths))
}
