//! A small causal transformer block (RMSNorm, grouped-query attention, MLP) trained for a
//! few steps with candle's autograd, attention by `candle_flash_attn3::flash_attn`, next to
//! the same block with candle's own attention math from the same weights: the two loss
//! curves should agree to a few parts in a thousand (bf16).
//!
//! `cargo run --release --example transformer_block` (on an sm_90 GPU).
use candle::{D, DType, Device, Tensor, Var};

const BATCH: usize = 4;
const SEQ: usize = 512;
const MODEL: usize = 512;
const HEADS: usize = 8;
const KV_HEADS: usize = 2;
const HDIM: usize = MODEL / HEADS;

struct Block {
    wq: Var,
    wk: Var,
    wv: Var,
    wo: Var,
    w1: Var,
    w2: Var,
}

impl Block {
    fn new(dev: &Device) -> candle::Result<Self> {
        let w = |i: usize, o: usize| Var::from_tensor(&(Tensor::randn(0f32, 1., (i, o), dev)? / (i as f64).sqrt())?);
        Ok(Block {
            wq: w(MODEL, MODEL)?,
            wk: w(MODEL, KV_HEADS * HDIM)?,
            wv: w(MODEL, KV_HEADS * HDIM)?,
            wo: w(MODEL, MODEL)?,
            w1: w(MODEL, 4 * MODEL)?,
            w2: w(4 * MODEL, MODEL)?,
        })
    }

    fn vars(&self) -> [&Var; 6] {
        [&self.wq, &self.wk, &self.wv, &self.wo, &self.w1, &self.w2]
    }

    /// `x + attn(norm(x))`, then `+ mlp(norm(.))`; weights kept in f32, used in bf16.
    fn forward(&self, x: &Tensor, flash: bool) -> candle::Result<Tensor> {
        let lin = |t: &Tensor, w: &Var| t.broadcast_matmul(&w.as_tensor().to_dtype(DType::BF16)?);
        let h = rms_norm(x)?;
        let q = lin(&h, &self.wq)?.reshape((BATCH, SEQ, HEADS, HDIM))?;
        let k = lin(&h, &self.wk)?.reshape((BATCH, SEQ, KV_HEADS, HDIM))?;
        let v = lin(&h, &self.wv)?.reshape((BATCH, SEQ, KV_HEADS, HDIM))?;
        let scale = 1.0 / (HDIM as f32).sqrt();
        let a = if flash { candle_flash_attn3::flash_attn(&q, &k, &v, scale, true, false)? } else { math_attention(&q, &k, &v, scale)? };
        let x = (x + lin(&a.reshape((BATCH, SEQ, MODEL))?, &self.wo)?)?;
        let m = lin(&lin(&rms_norm(&x)?, &self.w1)?.gelu()?, &self.w2)?;
        x + m
    }
}

fn rms_norm(x: &Tensor) -> candle::Result<Tensor> {
    let x32 = x.to_dtype(DType::F32)?;
    let r = (x32.sqr()?.mean_keepdim(D::Minus1)? + 1e-6)?.sqrt()?;
    x32.broadcast_div(&r)?.to_dtype(DType::BF16)
}

/// Causal attention as candle math: scores and softmax in f32, K/V heads repeated.
fn math_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> candle::Result<Tensor> {
    let g = HEADS / KV_HEADS;
    let rep = |t: &Tensor| t.transpose(1, 2)?.unsqueeze(2)?.broadcast_as((BATCH, KV_HEADS, g, SEQ, HDIM))?.reshape((BATCH, HEADS, SEQ, HDIM));
    let q = q.transpose(1, 2)?.contiguous()?;
    let s = (q.matmul(&rep(k)?.t()?)?.to_dtype(DType::F32)? * scale as f64)?;
    let mask: Vec<f32> = (0..SEQ * SEQ).map(|ij| if ij % SEQ <= ij / SEQ { 0.0 } else { f32::NEG_INFINITY }).collect();
    let s = s.broadcast_add(&Tensor::from_vec(mask, (SEQ, SEQ), q.device())?)?;
    let e = s.broadcast_sub(&s.max_keepdim(D::Minus1)?.detach())?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?.to_dtype(DType::BF16)?;
    p.matmul(&rep(v)?)?.transpose(1, 2)
}

fn main() -> candle::Result<()> {
    let dev = Device::new_cuda(0)?;
    let x = Tensor::randn(0f32, 1., (BATCH, SEQ, MODEL), &dev)?.to_dtype(DType::BF16)?;
    let target = Tensor::randn(0f32, 1., (BATCH, SEQ, MODEL), &dev)?;
    let init = Block::new(&dev)?;
    let copy = |b: &Block| -> candle::Result<Block> {
        let c = |v: &Var| Var::from_tensor(&v.as_tensor().copy()?);
        Ok(Block { wq: c(&b.wq)?, wk: c(&b.wk)?, wv: c(&b.wv)?, wo: c(&b.wo)?, w1: c(&b.w1)?, w2: c(&b.w2)? })
    };
    let (flash, math) = (copy(&init)?, copy(&init)?);
    println!("step  loss (flash-attn3)  loss (candle math)");
    for step in 0..20 {
        let mut losses = [0f32; 2];
        for (i, (block, use_flash)) in [(&flash, true), (&math, false)].into_iter().enumerate() {
            let y = block.forward(&x, use_flash)?.to_dtype(DType::F32)?;
            let loss = (y - &target)?.sqr()?.mean_all()?;
            let grads = loss.backward()?;
            for v in block.vars() {
                let g = grads.get(v.as_tensor()).expect("every weight has a gradient");
                v.set(&(v.as_tensor() - (g * 0.5)?)?)?;
            }
            losses[i] = loss.to_scalar::<f32>()?;
        }
        println!("{step:>4}  {:>18.6}  {:>18.6}", losses[0], losses[1]);
    }
    Ok(())
}
