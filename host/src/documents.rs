//! Document masks: packed sequences whose tokens attend only within their own document
//! (FlexAttention's `document_id[q] == document_id[kv]`), with block skipping.
//!
//! Documents are runs of consecutive tokens. Query row `i` sits at key position
//! `i + seqlen_k − seqlen_q` (bottom-right, as the causal mask; with `seqlen_q == seqlen_k`
//! the same token), so a call needs `seqlen_q <= seqlen_k`. The kernels read each key
//! position's document as its bounds `[start, end)` (`common::window::DocumentBounds`),
//! which [`DocumentMask`] computes once on the host and keeps on the device: build it
//! once per packing and reuse it for every layer, forward and backward.
use crate::error::{Arg, AttnError, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, SyncOnDrop};
use std::collections::HashSet;
use std::sync::Arc;

/// Each position's document as `[start, end)`, from one document id per token (`ids`,
/// `[seqlen]`): a document's tokens must be consecutive (ids need not be sorted, but an id
/// may not come back after another one).
pub fn document_bounds(ids: &[u32]) -> Result<Vec<[u32; 2]>> {
    if ids.len() > u32::MAX as usize {
        return Err(AttnError::TooLarge(format!("{} document ids", ids.len())));
    }
    let mut bounds = Vec::with_capacity(ids.len());
    let mut closed = HashSet::new();
    let mut start = 0;
    for i in 1..=ids.len() {
        if i == ids.len() || ids[i] != ids[start] {
            if !closed.insert(ids[start]) {
                return Err(AttnError::InvalidDocuments(format!("document id {} comes back at token {start} after other documents (a document's tokens must be consecutive)", ids[start])));
            }
            bounds.extend((start..i).map(|_| [start as u32, i as u32]));
            start = i;
        }
    }
    Ok(bounds)
}

/// One document id per token for documents of these lengths, in order (`0, 0, 1, ...`).
pub fn ids_from_lengths(lengths: &[usize]) -> Result<Vec<u32>> {
    if let Some(i) = lengths.iter().position(|&l| l == 0) {
        return Err(AttnError::InvalidDocuments(format!("document {i} has length 0")));
    }
    if lengths.len() > u32::MAX as usize {
        return Err(AttnError::TooLarge(format!("{} documents", lengths.len())));
    }
    Ok(lengths.iter().enumerate().flat_map(|(d, &l)| std::iter::repeat_n(d as u32, l)).collect())
}

/// Document ids (`[batch, seqlen]`) of sequences packed with documents of `lengths`,
/// cycled and cut at the sequence's end; batch `b` starts `b` lengths in, so that each
/// packs differently (tests and benchmarks).
pub fn packed_doc_ids(batch: usize, seqlen: usize, lengths: &[usize]) -> Vec<u32> {
    assert!(!lengths.is_empty() && lengths.iter().all(|&l| l > 0), "document lengths must be positive");
    (0..batch)
        .flat_map(|b| {
            let mut lens = lengths.iter().cycle().skip(b % lengths.len());
            let (mut id, mut left) = (0u32, *lens.next().unwrap_or(&1));
            (0..seqlen).map(move |_| {
                if left == 0 {
                    id += 1;
                    left = *lens.next().unwrap_or(&1);
                }
                left -= 1;
                id
            })
        })
        .collect()
}

/// A document mask on the device, for [`AttnOptions::documents`](crate::AttnOptions):
/// one packing shared by the whole batch, or one per batch element.
pub struct DocumentMask {
    bounds: CudaSlice<u32>,
    ids: Vec<u32>,
    seqlen: usize,
    batch: Option<usize>,
}

impl std::fmt::Debug for DocumentMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DocumentMask").field("seqlen", &self.seqlen).field("batch", &self.batch).finish_non_exhaustive()
    }
}

impl DocumentMask {
    /// From one document id per key token: `[seqlen_k]` for a packing the batch shares
    /// (`batch: None`), or `[batch, seqlen_k]`. Each row's document's tokens must be
    /// consecutive ([`document_bounds`]).
    pub fn from_ids(stream: &Arc<CudaStream>, ids: &[u32], batch: Option<usize>) -> Result<Self> {
        let rows = batch.unwrap_or(1);
        if rows == 0 || ids.is_empty() || ids.len() % rows != 0 {
            return Err(AttnError::InvalidDocuments(format!("{} ids do not split into {rows} non-empty sequences", ids.len())));
        }
        let seqlen = ids.len() / rows;
        let mut bounds = Vec::with_capacity(2 * ids.len());
        for row in ids.chunks(seqlen) {
            bounds.extend(document_bounds(row)?.into_iter().flatten());
        }
        Ok(DocumentMask { bounds: stream.clone_htod(&bounds)?, ids: ids.to_vec(), seqlen, batch })
    }

    /// From the lengths of the packed documents, in order, shared by the batch (they add
    /// up to `seqlen_k`).
    pub fn from_lengths(stream: &Arc<CudaStream>, lengths: &[usize]) -> Result<Self> {
        Self::from_ids(stream, &ids_from_lengths(lengths)?, None)
    }

    /// Tokens per sequence (the calls' `seqlen_k`).
    pub fn seqlen(&self) -> usize {
        self.seqlen
    }

    /// The batch size of a per-batch mask, `None` when the batch shares it.
    pub fn batch(&self) -> Option<usize> {
        self.batch
    }

    /// The document ids it was built from (`[seqlen]` or `[batch, seqlen]`).
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The planners' view (for [`flash_attn_raw`](crate::flash_attn_raw) and
    /// [`BwdTensors::documents`](crate::BwdTensors)), and the guard that orders a launch
    /// on `stream` after the upload (hold it until the launch is queued).
    pub fn desc<'a>(&'a self, stream: &'a Arc<CudaStream>) -> (DocsDesc, SyncOnDrop<'a>) {
        let (addr, sync) = self.bounds.device_ptr(stream);
        (DocsDesc { addr, positions: self.bounds.len() / 2, seqlen: self.seqlen, per_batch: self.batch.is_some() }, sync)
    }
}

/// A document mask as the planners take it (see [`DocumentMask`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DocsDesc {
    /// Device address of the `[start, end)` u32 pairs, one per key position.
    pub addr: u64,
    /// Pairs in the buffer.
    pub positions: usize,
    /// Key positions per sequence.
    pub seqlen: usize,
    /// One packing per batch element (`[batch, seqlen]`) rather than one shared.
    pub per_batch: bool,
}

impl DocsDesc {
    /// Checks it against a call of `batch` sequences of `seqlen_q` queries and `seqlen_k`
    /// keys, and returns the kernels' form.
    pub(crate) fn check(&self, batch: usize, seqlen_q: usize, seqlen_k: usize) -> Result<common::window::DocumentBounds> {
        if self.seqlen != seqlen_k {
            return Err(AttnError::ShapeMismatch(format!("documents cover {} tokens, the keys are {seqlen_k}", self.seqlen)));
        }
        if seqlen_q > seqlen_k {
            return Err(AttnError::ShapeMismatch(format!(
                "documents need seqlen_q <= seqlen_k (query i sits at key i + seqlen_k - seqlen_q), got {seqlen_q} > {seqlen_k}"
            )));
        }
        let needed = if self.per_batch { batch * seqlen_k } else { seqlen_k };
        if self.positions < needed {
            return Err(AttnError::OutOfBounds { arg: Arg::Documents, needed, len: self.positions });
        }
        if self.addr == 0 {
            return Err(AttnError::Misaligned { arg: Arg::Documents, detail: "null address".into() });
        }
        if self.addr % 8 != 0 {
            return Err(AttnError::Misaligned { arg: Arg::Documents, detail: format!("address {:#x} is not 8-byte aligned", self.addr) });
        }
        Ok(common::window::DocumentBounds { addr: self.addr, batch_stride: if self.per_batch { seqlen_k as u32 } else { 0 }, _pad: 0 })
    }
}
