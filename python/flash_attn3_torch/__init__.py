"""FlashAttention for Hopper with kernels written in Rust, for PyTorch.

`flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1),
softcap=0.0, deterministic=False, return_lse=False, documents=None, variant=None)` on
CUDA tensors `[batch, seqlen, heads, head_dim]` (fp16/bf16, head_dim 64/128/256, forward
and backward), with `document_mask(ids)` for packed sequences, and user-defined variants
(FlexAttention's score_mod / mask_mod written in Rust, built into a PTX module by a
variant crate: `VariantModule(ptx, names).variant(name, data)`), with autograd and
`torch.compile` support: the forward and backward are `torch.library` custom ops
(`flash_attn3::fwd`, `flash_attn3::bwd`) with fake implementations, so compiled graphs
keep them whole.

The kernels run on PyTorch's current stream with no copies: the library
(`libflash_attn3_capi.so`, the Rust crate `python/capi`) takes the tensors' device
pointers, shapes and strides through a C ABI, loaded with ctypes (no compiler, no
PyTorch C++ ABI to match).
"""
import ctypes
import math
import os
import weakref
from typing import Optional

import torch

__all__ = ["flash_attn_func", "document_mask", "DocumentMask", "VariantModule", "Variant"]

_lib = ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "libflash_attn3_capi.so"))


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("ptr", ctypes.c_uint64),
        ("shape", ctypes.c_int64 * 4),
        ("strides", ctypes.c_int64 * 4),
        ("dtype", ctypes.c_int32),
        ("numel_in_buffer", ctypes.c_int64),
    ]


class _Options(ctypes.Structure):
    _fields_ = [
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("softcap", ctypes.c_float),
        ("deterministic", ctypes.c_int32),
        ("sinks", ctypes.c_uint64),
        ("alibi_slopes", ctypes.c_uint64),
        ("alibi_per_batch", ctypes.c_int32),
        ("doc_bounds", ctypes.c_uint64),
        ("doc_positions", ctypes.c_int64),
        ("doc_seqlen", ctypes.c_int64),
        ("doc_per_batch", ctypes.c_int32),
        ("variant_module", ctypes.c_uint64),
        ("variant_index", ctypes.c_int64),
        ("variant_data", ctypes.c_uint64),
        ("variant_words", ctypes.c_int64),
    ]


_lib.fa3_forward.argtypes = [ctypes.c_int32, ctypes.c_uint64] + [ctypes.POINTER(_Tensor)] * 4 + [ctypes.c_uint64, ctypes.c_int64, ctypes.POINTER(_Options)]
_lib.fa3_forward.restype = ctypes.c_int32
_lib.fa3_backward.argtypes = [ctypes.c_int32, ctypes.c_uint64, ctypes.POINTER(_Tensor), ctypes.c_uint64, ctypes.c_int64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64, ctypes.POINTER(_Options)]
_lib.fa3_backward.restype = ctypes.c_int32
_lib.fa3_backward_workspace_bytes.argtypes = [ctypes.c_int64] * 4
_lib.fa3_backward_workspace_bytes.restype = ctypes.c_int64
_lib.fa3_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_lib.fa3_last_error.restype = ctypes.c_size_t
_lib.fa3_variant_module_load.argtypes = [ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
                                         ctypes.POINTER(ctypes.c_uint64)]
_lib.fa3_variant_module_load.restype = ctypes.c_int32
_lib.fa3_variant_module_free.argtypes = [ctypes.c_uint64]
_lib.fa3_variant_module_free.restype = ctypes.c_int32

_DTYPES = {torch.float16: 0, torch.bfloat16: 1}


def _desc(name, t):
    if not t.is_cuda:
        raise ValueError(f"{name} must be a CUDA tensor")
    if t.dtype not in _DTYPES:
        raise ValueError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be [batch, seqlen, heads, head_dim], got shape {tuple(t.shape)}")
    in_buffer = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return _Tensor(t.data_ptr(), (ctypes.c_int64 * 4)(*t.shape), (ctypes.c_int64 * 4)(*t.stride()), _DTYPES[t.dtype], in_buffer)


def _vector(name, t, shapes):
    """A float32 CUDA vector argument (ALiBi slopes, sinks): its address, or 0."""
    if t is None:
        return 0
    if not (t.is_cuda and t.dtype == torch.float32 and t.is_contiguous() and tuple(t.shape) in shapes):
        raise ValueError(f"{name} must be a contiguous float32 CUDA tensor of shape {' or '.join(map(str, shapes))}, got {t.dtype} {tuple(t.shape)}")
    return t.data_ptr()


class DocumentMask:
    """Packed documents for `flash_attn_func(..., documents=mask)`: each query row sees only
    the keys of its own document (FlexAttention's `doc[q] == doc[kv]`; query `i` sits at
    key `i + seqlen_k - seqlen_q`). Build it once per packing with `document_mask(ids)`
    and reuse it across layers, forward and backward. `bounds`: int32 `[seqlen, 2]` or
    `[batch, seqlen, 2]`, each key position's document as `[start, end)`."""

    def __init__(self, bounds):
        self.bounds = bounds

    @property
    def seqlen(self):
        return self.bounds.shape[-2]


def document_mask(ids):
    """A `DocumentMask` from document ids, one per key token: int `[seqlen]` (shared by the
    batch) or `[batch, seqlen]`, on the GPU. A document's tokens must be consecutive (an id
    may not come back after another one); raises ValueError otherwise."""
    if not (isinstance(ids, torch.Tensor) and ids.is_cuda and not ids.is_floating_point() and ids.dim() in (1, 2) and ids.shape[-1] > 0):
        raise ValueError(f"document ids must be a non-empty integer CUDA tensor [seqlen] or [batch, seqlen], got {getattr(ids, 'dtype', type(ids))} {tuple(getattr(ids, 'shape', ()))}")
    rows = ids.reshape(-1, ids.shape[-1]).to(torch.int64)
    n = rows.shape[1]
    if n >= 2 ** 31:
        raise ValueError(f"document ids: {n} tokens, at most 2^31 - 1")
    pos = torch.arange(n, device=ids.device).expand_as(rows)
    new = torch.ones_like(rows, dtype=torch.bool)
    new[:, 1:] = rows[:, 1:] != rows[:, :-1]
    # Each run's first position, carried right; its last + 1, carried left.
    start = torch.where(new, pos, torch.zeros_like(pos)).cummax(dim=1).values
    last = torch.ones_like(new)
    last[:, :-1] = new[:, 1:]
    end = torch.where(last, pos + 1, torch.full_like(pos, n)).flip(1).cummin(dim=1).values.flip(1)
    # Consecutive documents: as many runs as distinct ids, in every row.
    runs = new.sum(dim=1)
    distinct = torch.stack([torch.unique(r).numel() * torch.ones((), dtype=torch.int64, device=ids.device) for r in rows])
    if not torch.equal(runs, distinct):
        raise ValueError("document ids: a document's tokens must be consecutive (an id comes back after another document)")
    bounds = torch.stack([start, end], dim=-1).to(torch.int32).contiguous()
    return DocumentMask(bounds if ids.dim() == 2 else bounds[0])


# Variant buffers' element types: 4-byte words the variant reads as f32 or u32.
_WORD_DTYPES = (torch.float32, torch.int32) + ((torch.uint32,) if hasattr(torch, "uint32") else ())


def _words(data, device):
    """A variant buffer's address and 4-byte words (0, 0 for None or empty), after checking
    it is a contiguous float32 or int32 tensor on `device`."""
    if data is None:
        return 0, 0
    if not (isinstance(data, torch.Tensor) and data.dtype in _WORD_DTYPES and data.is_contiguous() and data.device == device):
        raise ValueError(f"variant data must be a contiguous float32 or int32 tensor on {device}, got "
                         f"{getattr(data, 'dtype', type(data))} on {getattr(data, 'device', None)}")
    return (data.data_ptr(), data.numel()) if data.numel() > 0 else (0, 0)


# The live modules by handle: the autograd context holds a call's module until its backward.
_MODULES = weakref.WeakValueDictionary()


class VariantModule:
    """A user-defined variant module loaded on one CUDA device: the library's kernels
    compiled for a variant crate's `common::variant::Variant` types (FlexAttention's
    score_mod / mask_mod, written in Rust; `examples/variants` is a complete crate, whose
    `variants-ptx` binary writes its module to a file).

    `ptx`: the module's text (`str` or `bytes`), or a path to it (`os.PathLike`, or a
    `str` without a newline); `names`: the variants to load, as the crate named them in
    `variant_kernels!`; `device`: a CUDA device (default: the current one). Loading fails
    (RuntimeError) for a name the module lacks or a module built for another version of
    the library. The module stays loaded while this object lives; a call's autograd keeps
    it for its backward."""

    def __init__(self, ptx, names, device=None):
        if isinstance(ptx, os.PathLike) or (isinstance(ptx, str) and "\n" not in ptx):
            with open(ptx, "rb") as f:
                ptx = f.read()
        elif isinstance(ptx, str):
            ptx = ptx.encode()
        if not isinstance(ptx, bytes):
            raise ValueError(f"ptx must be the module's text (str or bytes) or a path, got {type(ptx)}")
        self.names = [str(n) for n in names]
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"a variant module loads on a CUDA device, got {device}")
        self.device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        self._handle = 0
        encoded = (ctypes.c_char_p * len(self.names))(*[n.encode() for n in self.names])
        handle = ctypes.c_uint64(0)
        _check(_lib.fa3_variant_module_load(self.device.index, ptx, len(ptx), encoded, len(self.names), ctypes.byref(handle)))
        self._handle = handle.value
        _MODULES[self._handle] = self

    def variant(self, name, data=None):
        """Variant `name` of this module, reading `data` (a contiguous float32 or int32
        CUDA tensor on the module's device, the words its functions read with
        `f32_at` / `u32_at`; None: every read yields 0). The buffer gets no gradient."""
        if name not in self.names:
            raise ValueError(f"no variant {name!r} in this module (loaded: {self.names})")
        _words(data, self.device)
        return Variant(self, self.names.index(name), data)

    def __del__(self):
        handle, self._handle = getattr(self, "_handle", 0), 0
        if handle:
            try:
                _lib.fa3_variant_module_free(handle)
            except (NameError, AttributeError, TypeError):
                pass  # at interpreter exit the library's globals may be gone already


class Variant:
    """One variant of a `VariantModule` with its buffer, for `flash_attn_func(...,
    variant=...)`; made by `VariantModule.variant(name, data)`."""

    def __init__(self, module, index, data):
        self.module, self.index, self.data = module, index, data

    @property
    def name(self):
        return self.module.names[self.index]


def _options(q, alibi_slopes, sinks, softmax_scale, causal, window_left, window_right, softcap, deterministic, doc_bounds=None,
             variant_data=None, variant_module=0, variant_index=0):
    b, _, h, _ = q.shape
    slopes = _vector("alibi_slopes", alibi_slopes, [(h,), (b, h)])
    per_batch = alibi_slopes is not None and alibi_slopes.dim() == 2
    docs, positions, seqlen, docs_per_batch = 0, 0, 0, 0
    if doc_bounds is not None:
        if not (doc_bounds.is_cuda and doc_bounds.dtype == torch.int32 and doc_bounds.is_contiguous() and doc_bounds.dim() in (2, 3) and doc_bounds.shape[-1] == 2):
            raise ValueError("documents must come from document_mask(ids)")
        docs, positions, seqlen, docs_per_batch = doc_bounds.data_ptr(), doc_bounds.numel() // 2, doc_bounds.shape[-2], int(doc_bounds.dim() == 3)
    data, words = _words(variant_data, q.device)
    return _Options(softmax_scale, int(causal), window_left, window_right, softcap, int(deterministic), _vector("sinks", sinks, [(h,)]), slopes, int(per_batch),
                    docs, positions, seqlen, docs_per_batch, variant_module, variant_index, data, words)


def _check(rc):
    if rc != 0:
        buf = ctypes.create_string_buffer(2048)
        _lib.fa3_last_error(buf, len(buf))
        raise RuntimeError(f"flash_attn3: {buf.value.decode()}")


def _stream(t):
    return torch.cuda.current_stream(t.device).cuda_stream


@torch.library.custom_op("flash_attn3::fwd", mutates_args=())
def _fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi_slopes: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
         doc_bounds: Optional[torch.Tensor], variant_data: Optional[torch.Tensor], softmax_scale: float, causal: bool, window_left: int,
         window_right: int, softcap: float, deterministic: bool, variant_module: int, variant_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    b, s, h, _ = q.shape
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
    descs = [_desc(n, t) for n, t in (("q", q), ("k", k), ("v", v), ("out", out))]
    opts = _options(q, alibi_slopes, sinks, softmax_scale, causal, window_left, window_right, softcap, deterministic, doc_bounds,
                    variant_data, variant_module, variant_index)
    _check(_lib.fa3_forward(q.device.index, _stream(q), *[ctypes.byref(d) for d in descs], lse.data_ptr(), lse.numel(), ctypes.byref(opts)))
    return out, lse


@_fwd.register_fake
def _(q, k, v, alibi_slopes, sinks, doc_bounds, variant_data, softmax_scale, causal, window_left, window_right, softcap, deterministic,
      variant_module, variant_index):
    b, s, h, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((b, h, s), dtype=torch.float32)


@torch.library.custom_op("flash_attn3::bwd", mutates_args=())
def _bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
         alibi_slopes: Optional[torch.Tensor], sinks: Optional[torch.Tensor], doc_bounds: Optional[torch.Tensor],
         variant_data: Optional[torch.Tensor], softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
         deterministic: bool, variant_module: int, variant_index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dout = dout.contiguous()
    dq, dk, dv = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    b, s, h, d = q.shape
    ws = torch.empty(max(1, _lib.fa3_backward_workspace_bytes(b, s, h, d)), dtype=torch.uint8, device=q.device)
    tensors = (_Tensor * 8)(*[_desc(n, t) for n, t in (("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv))])
    opts = _options(q, alibi_slopes, sinks, softmax_scale, causal, window_left, window_right, softcap, deterministic, doc_bounds,
                    variant_data, variant_module, variant_index)
    # The sinks' gradient, or an empty tensor without sinks.
    dsinks = torch.empty(h if sinks is not None else 0, dtype=torch.float32, device=q.device)
    _check(_lib.fa3_backward(q.device.index, _stream(q), tensors, lse.data_ptr(), lse.numel(), dsinks.data_ptr() if sinks is not None else 0,
                             ws.data_ptr(), ws.numel(), ctypes.byref(opts)))
    return dq, dk, dv, dsinks


@_bwd.register_fake
def _(dout, q, k, v, out, lse, alibi_slopes, sinks, doc_bounds, variant_data, softmax_scale, causal, window_left, window_right, softcap,
      deterministic, variant_module, variant_index):
    grads = tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))
    return (*grads, q.new_empty(q.shape[2] if sinks is not None else 0, dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    q, k, v, alibi_slopes, sinks, doc_bounds, variant_data, *params = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, sinks, doc_bounds, variant_data)
    ctx.params = params
    # The variant's module stays loaded until the backward (the op holds its handle only).
    ctx.variant_module = _MODULES.get(params[-2])


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, alibi_slopes, sinks, doc_bounds, variant_data = ctx.saved_tensors
    dq, dk, dv, dsinks = _bwd(dout, q, k, v, out, lse, alibi_slopes, sinks, doc_bounds, variant_data, *ctx.params)
    # No gradient for the masks, the variant's buffer or the scalars.
    return (dq, dk, dv, None, (dsinks if sinks is not None else None), None, None) + (None,) * len(ctx.params)


_fwd.register_autograd(_backward, setup_context=_setup_context)


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                    deterministic=False, return_lse=False, sinks=None, documents=None, variant=None):
    """Attention of `q` `[batch, seqlen_q, heads_q, head_dim]` over `k`, `v` `[batch,
    seqlen_k, heads_k, head_dim]` (heads_q a multiple of heads_k: MQA/GQA), as
    FlashAttention's `flash_attn_func`: `softmax_scale` (default `1/sqrt(head_dim)`),
    bottom-right `causal` mask, `window_size=(left, right)` (-1: unbounded), `softcap`
    (0: none), `alibi_slopes` (float32 `[heads_q]` or `[batch, heads_q]`, the bias
    `-slope * |i + seqlen_k - seqlen_q - j|`); `deterministic` makes the backward's dQ
    bit-identical across runs; `sinks` (float32 `[heads_q]` logits that join each row's
    softmax denominator; differentiable); `documents` (a `DocumentMask` from
    `document_mask(ids)`: packed sequences attend within their own document; needs
    seqlen_q <= seqlen_k, not with ALiBi); `variant` (a `Variant` of a `VariantModule`
    loaded on q's device: its score and mask functions applied to the scaled scores,
    forward and backward; combines with `causal` and `sinks`, a window, documents,
    soft-capping or ALiBi go into the variant's own functions). Returns O (and the
    natural-log LSE `[batch, heads_q, seqlen_q]` f32 with `return_lse`)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    if documents is not None and not isinstance(documents, DocumentMask):
        raise ValueError("documents must be a DocumentMask (document_mask(ids))")
    doc_bounds = documents.bounds if documents is not None else None
    if variant is not None and not isinstance(variant, Variant):
        raise ValueError("variant must be a Variant (VariantModule(...).variant(name, data))")
    data, module, index = (variant.data, variant.module._handle, variant.index) if variant is not None else (None, 0, 0)
    out, lse = _fwd(q, k, v, alibi_slopes, sinks, doc_bounds, data, scale, bool(causal), int(window_size[0]), int(window_size[1]), float(softcap),
                    bool(deterministic), module, index)
    return (out, lse) if return_lse else out
