//! A GPT-2-shaped decoder on `offload_kernels`' ready kernels, split into stages of
//! consecutive blocks across devices: token and position embeddings, blocks of (layer norm,
//! causal multi-head attention over a KV cache, residual, layer norm, MLP with tanh GELU,
//! residual), a final layer norm and logits against the token embedding (tied, as GPT-2's).
//! A prefill of a batch of prompts fills each block's KV cache; each greedy decoding step
//! then runs one position per sequence. Weights come from a safetensors file in
//! `nn.Linear`'s layout (`tests/fixtures/make_gpt_reference.py` makes one with PyTorch,
//! and what PyTorch computes with it).
//!
//! Every layer runs in the element type `T` (`f32`, `bf16` or `f16`: weights converted
//! once as they are loaded, activations stored in `T` between kernels, arithmetic in f32),
//! as the same model in PyTorch with `model.to(dtype)` does.

use offload::half::{bf16, f16};
use offload::weights::Weights;
use offload::{Activation, Device, DeviceBuffer, DeviceSlice, Error, Result, Runtime};
use offload_kernels::nn::{self, Attention, NnFloat};
use offload_kernels::{linear, Linear};

/// A decoder's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GptConfig {
    /// Tokens in the vocabulary: rows of `wte.weight`.
    pub vocab: usize,
    /// Positions at most (the KV caches' capacity): rows of `wpe.weight`.
    pub ctx: usize,
    /// Features per position: `wte.weight`'s columns.
    pub dim: usize,
    /// Attention heads per block (`dim` a multiple of them).
    pub heads: usize,
    /// Blocks: `h.0.*` to `h.{layers - 1}.*`.
    pub layers: usize,
    /// The layer norms' epsilon.
    pub eps: f32,
}

impl GptConfig {
    /// The shape of the model in `weights` with `heads` heads (which the file cannot say):
    /// the rest read from its tensors' shapes.
    ///
    /// # Errors
    /// [`Error::Weights`] for a missing tensor; [`Error::InvalidArgument`] for `heads` 0 or
    /// not dividing the width, or a model of no blocks.
    pub fn of(weights: &Weights, heads: usize) -> Result<Self> {
        let shape = |name: &str| weights.meta(name).map(|m| m.shape);
        let (wte, wpe) = (shape("wte.weight")?, shape("wpe.weight")?);
        let bad = |what: String| Error::InvalidArgument { routine: "GptConfig::of", what };
        let (&[vocab, dim], &[ctx, _]) = (&wte[..], &wpe[..]) else {
            return Err(bad(format!("wte.weight {wte:?} and wpe.weight {wpe:?}; expected two matrices")));
        };
        let layers = (0..).take_while(|l| shape(&format!("h.{l}.ln_1.weight")).is_ok()).count();
        if heads == 0 || dim % heads != 0 || layers == 0 {
            return Err(bad(format!("{heads} heads over a width of {dim}, {layers} blocks; expected heads dividing the width and a block at least")));
        }
        Ok(Self { vocab, ctx, dim, heads, layers, eps: 1e-5 })
    }

    fn head_dim(&self) -> usize {
        self.dim / self.heads
    }
}

/// What [`Gpt::generate`] computed.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The prefill's logits, `[batch, prompt, vocab]`, in f32.
    pub prefill_logits: Vec<f32>,
    /// The tokens chosen, `[batch, new]`.
    pub tokens: Vec<u32>,
    /// Each decoding step's logits (after the token chosen before it), `[batch, new,
    /// vocab]`, in f32.
    pub step_logits: Vec<f32>,
    /// Wall time of the prefill, its logits read back included.
    pub prefill_time: std::time::Duration,
    /// Wall time of the decoding steps, each choosing its tokens on the device and reading
    /// its logits back.
    pub decoding_time: std::time::Duration,
}

/// A layer's weight and bias (a layer norm's gain and bias).
type Params<'rt, T> = (DeviceBuffer<'rt, T>, DeviceBuffer<'rt, T>);

/// One block's weights and KV cache, on its device.
struct Block<'rt, T: GptFloat> {
    dev: Device<'rt>,
    ln_1: Params<'rt, T>,
    qkv: Params<'rt, T>,
    proj: Params<'rt, T>,
    ln_2: Params<'rt, T>,
    fc: Params<'rt, T>,
    out: Params<'rt, T>,
    /// `[batch, heads, ctx, head_dim]` each.
    k_cache: DeviceBuffer<'rt, T>,
    v_cache: DeviceBuffer<'rt, T>,
}

/// A decoder on one or more devices, for `batch` sequences at once; see the module
/// documentation.
pub struct Gpt<'rt, T: GptFloat> {
    config: GptConfig,
    batch: usize,
    /// The embeddings, on the first block's device.
    wte: DeviceBuffer<'rt, T>,
    wpe: DeviceBuffer<'rt, T>,
    blocks: Vec<Block<'rt, T>>,
    /// The final norm and the (tied) output embedding, on the last block's device.
    ln_f: Params<'rt, T>,
    lm_head: DeviceBuffer<'rt, T>,
    /// Positions in the KV caches.
    filled: usize,
}

impl<T: GptFloat> std::fmt::Debug for Gpt<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let devices: Vec<usize> = self.blocks.iter().map(|b| b.dev.number()).collect();
        f.debug_struct("Gpt")
            .field("config", &self.config)
            .field("batch", &self.batch)
            .field("devices", &devices)
            .field("filled", &self.filled)
            .finish()
    }
}

impl<'rt, T: GptFloat> Gpt<'rt, T> {
    /// The model of `weights` (shape `config`) for `batch` sequences, its blocks split in
    /// consecutive stages over `devices` (block `l` on `devices[l * n / layers]`), each
    /// weight converted to `T` and copied to its device once.
    ///
    /// # Errors
    /// [`Error::Weights`] for a tensor missing or of another shape;
    /// [`Error::InvalidArgument`] for no device or a batch of 0; the devices' errors.
    pub fn new(
        rt: &'rt Runtime,
        weights: &Weights,
        config: GptConfig,
        devices: &[usize],
        batch: usize,
    ) -> Result<Self> {
        if devices.is_empty() || batch == 0 {
            return Err(Error::InvalidArgument {
                routine: "Gpt::new",
                what: format!("{} devices, a batch of {batch}; expected at least one of each", devices.len()),
            });
        }
        let GptConfig { vocab, ctx, dim, heads, layers, .. } = config;
        let load = |dev: &Device<'rt>, name: &str, shape: &[usize]| weights.to_device::<T>(dev, name, shape);
        // A layer norm's (`rows` 1: weight and bias of `cols`) or a linear layer's
        // (weight `[rows, cols]`, bias of `rows`) parameters.
        let pair = |dev: &Device<'rt>, name: &str, rows: usize, cols: usize| -> Result<_> {
            let (weight, bias) = if rows == 1 { (vec![cols], cols) } else { (vec![rows, cols], rows) };
            Ok((load(dev, &format!("{name}.weight"), &weight)?, load(dev, &format!("{name}.bias"), &[bias])?))
        };
        let device_of = |l: usize| rt.device(devices[l * devices.len() / layers]);
        let cache = batch.checked_mul(ctx).and_then(|n| n.checked_mul(dim)).ok_or(Error::Overflow {
            routine: "Gpt::new",
            what: format!("a KV cache of {batch} x {heads} x {ctx} x {}", config.head_dim()),
        })?;
        let mut blocks = Vec::with_capacity(layers);
        for l in 0..layers {
            let dev = device_of(l)?;
            let h = |part: &str| format!("h.{l}.{part}");
            blocks.push(Block {
                ln_1: pair(&dev, &h("ln_1"), 1, dim)?,
                qkv: pair(&dev, &h("qkv"), 3 * dim, dim)?,
                proj: pair(&dev, &h("proj"), dim, dim)?,
                ln_2: pair(&dev, &h("ln_2"), 1, dim)?,
                fc: pair(&dev, &h("fc"), 4 * dim, dim)?,
                out: pair(&dev, &h("out"), dim, 4 * dim)?,
                k_cache: DeviceBuffer::new(&dev, cache)?,
                v_cache: DeviceBuffer::new(&dev, cache)?,
                dev,
            });
        }
        let (first, last) = (device_of(0)?, device_of(layers - 1)?);
        Ok(Self {
            wte: load(&first, "wte.weight", &[vocab, dim])?,
            wpe: load(&first, "wpe.weight", &[ctx, dim])?,
            ln_f: pair(&last, "ln_f", 1, dim)?,
            lm_head: load(&last, "wte.weight", &[vocab, dim])?,
            blocks,
            config,
            batch,
            filled: 0,
        })
    }

    /// The model's shape.
    pub fn config(&self) -> GptConfig {
        self.config
    }

    /// Empties the KV caches: the next [`Gpt::forward`] starts new sequences.
    pub fn reset(&mut self) {
        self.filled = 0;
    }

    /// Runs `ids` (`[batch, len]`: the next `len` positions of every sequence) through
    /// the model, appending to the KV caches; the logits of every position, `[batch, len,
    /// vocab]`, or with `last_only` of each sequence's last, `[batch, vocab]`, on the last
    /// block's device.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `ids` not a whole number of the batch's rows, or
    /// more positions than the caches hold; the kernels' errors.
    pub fn forward(&mut self, ids: &[u32], last_only: bool) -> Result<DeviceBuffer<'rt, T>> {
        let GptConfig { vocab, ctx, dim, heads, eps, .. } = self.config;
        let (batch, hd, p0) = (self.batch, self.config.head_dim(), self.filled);
        let len = ids.len() / batch;
        if len == 0 || !ids.len().is_multiple_of(batch) || p0 + len > ctx {
            return Err(Error::InvalidArgument {
                routine: "Gpt::forward",
                what: format!(
                    "{} ids for a batch of {batch} after {p0} positions; expected {batch} x len, len >= 1, \
                     and at most {ctx} positions in all",
                    ids.len()
                ),
            });
        }
        let rows = batch * len;
        let first = self.wte.device();
        let mut x = DeviceBuffer::<T>::new(&first, rows * dim)?;
        nn::embedding(&first, dim, ids, self.wte.view(), x.view())?;
        T::add_positions(&first, rows * dim, dim, len, p0, self.wpe.view(), x.view())?;
        // `y = act(x W^T + b)` of `rows` rows, `W` being `[out, in]`.
        let dense = |dev: &Device<'_>,
                     rows,
                     x: &DeviceBuffer<'_, T>,
                     (w, b): &Params<'_, T>,
                     y: &DeviceBuffer<'_, T>,
                     act| {
            let shape = Linear { rows, in_features: w.len() / b.len(), out_features: b.len(), tf32: false };
            linear(dev, shape, x.view(), w.view(), Some(b.view()), y.view(), act)
        };
        let norm =
            |dev: &Device<'_>, x: &DeviceBuffer<'_, T>, (g, b): &Params<'_, T>, y: &DeviceBuffer<'_, T>| {
                nn::layer_norm(dev, dim, eps, x.view(), g.view(), b.view(), y.view())
            };
        let identity = Activation::Identity;
        for block in &self.blocks {
            let dev = &block.dev;
            x = moved_to(x, dev)?;
            let scratch = |n: usize| DeviceBuffer::<T>::new(dev, n);
            let (h, qkv, q, o, f) = (
                scratch(rows * dim)?,
                scratch(rows * 3 * dim)?,
                scratch(rows * dim)?,
                scratch(rows * dim)?,
                scratch(rows * 4 * dim)?,
            );
            let scores = scratch(batch * heads * len * (p0 + len))?;
            // Attention: the new keys and values into the caches, the queries over them.
            norm(dev, &x, &block.ln_1, &h)?;
            dense(dev, rows, &h, &block.qkv, &qkv, identity)?;
            let (k, v) = (block.k_cache.view(), block.v_cache.view());
            T::split_heads(dev, (batch, len, heads, hd, ctx, p0), qkv.view(), q.view(), k, v)?;
            let attention = Attention {
                batch,
                heads,
                q_len: len,
                kv_len: p0 + len,
                head_dim: hd,
                causal: true,
                scale: None,
                kv_capacity: Some(ctx),
            };
            nn::attention(dev, attention, q.view(), k, v, scores.view(), o.view())?;
            T::merge_heads(dev, (batch, len, heads, hd), o.view(), q.view())?;
            dense(dev, rows, &q, &block.proj, &h, identity)?;
            nn::add_in_place(dev, x.view(), h.view())?;
            // The MLP.
            norm(dev, &x, &block.ln_2, &h)?;
            dense(dev, rows, &h, &block.fc, &f, Activation::Gelu)?;
            dense(dev, rows, &f, &block.out, &h, identity)?;
            nn::add_in_place(dev, x.view(), h.view())?;
        }
        let dev = self.lm_head.device();
        let mut x = moved_to(x, &dev)?;
        let mut rows = rows;
        if last_only && len > 1 {
            let last = DeviceBuffer::<T>::new(&dev, batch * dim)?;
            T::last_rows(&dev, (batch, len, dim), x.view(), last.view())?;
            (x, rows) = (last, batch);
        }
        let h = DeviceBuffer::<T>::new(&dev, rows * dim)?;
        norm(&dev, &x, &self.ln_f, &h)?;
        let logits = DeviceBuffer::<T>::new(&dev, rows * vocab)?;
        let head = Linear { rows, in_features: dim, out_features: vocab, tf32: false };
        linear(&dev, head, h.view(), self.lm_head.view(), None, logits.view(), identity)?;
        self.filled += len;
        Ok(logits)
    }

    /// A prefill of `prompts` (`[batch, len]`) into emptied caches, then `new` greedy steps
    /// (each sequence's most likely next token, the first of equals, chosen on the device
    /// and fed back in). With `keep_logits` every logit comes back to the host (the
    /// prefill's of every position); without, only each step's tokens do (the prefill
    /// computes the last positions' logits only).
    ///
    /// # Errors
    /// As [`Gpt::forward`].
    pub fn generate(&mut self, prompts: &[u32], new: usize, keep_logits: bool) -> Result<Generation> {
        self.reset();
        let (batch, vocab) = (self.batch, self.config.vocab);
        let len = prompts.len() / batch.max(1);
        let start = std::time::Instant::now();
        let (mut last, prefill_logits) = if keep_logits {
            let all = self.forward(prompts, false)?;
            let dev = all.device();
            let last = DeviceBuffer::<T>::new(&dev, batch * vocab)?;
            T::last_rows(&dev, (batch, len, vocab), all.view(), last.view())?;
            (last, to_f32(&all)?)
        } else {
            let last = self.forward(prompts, true)?;
            last.device().runtime().synchronize(last.device().number())?;
            (last, Vec::new())
        };
        let prefill_time = start.elapsed();
        let start = std::time::Instant::now();
        let (mut tokens, mut step_logits) = (vec![0u32; batch * new], Vec::new());
        let mut steps = Vec::with_capacity(new);
        for s in 0..new {
            let next = greedy(&last, vocab)?;
            for (b, &t) in next.iter().enumerate() {
                tokens[b * new + s] = t;
            }
            let logits = self.forward(&next, true)?;
            if keep_logits {
                steps.push(to_f32(&logits)?);
            }
            last = logits;
        }
        let decoding_time = start.elapsed();
        for b in 0..batch {
            for step in &steps {
                step_logits.extend_from_slice(&step[b * vocab..(b + 1) * vocab]);
            }
        }
        Ok(Generation { prefill_logits, tokens, step_logits, prefill_time, decoding_time })
    }
}

/// `x`, on `dev`: itself when it is there, else a copy.
fn moved_to<'rt, T: GptFloat>(x: DeviceBuffer<'rt, T>, dev: &Device<'rt>) -> Result<DeviceBuffer<'rt, T>> {
    if x.device().number() == dev.number() {
        return Ok(x);
    }
    let mut moved = DeviceBuffer::<T>::new(dev, x.len())?;
    moved.copy_from(&x)?;
    Ok(moved)
}

/// The most likely token of each row of `logits` (`[rows, vocab]`), chosen on the device.
fn greedy<T: GptFloat>(logits: &DeviceBuffer<'_, T>, vocab: usize) -> Result<Vec<u32>> {
    let dev = logits.device();
    let out = DeviceBuffer::<u32>::new(&dev, logits.len() / vocab)?;
    nn::argmax(&dev, vocab, logits.view(), out.view())?;
    out.to_vec()
}

fn to_f32<T: GptFloat>(x: &DeviceBuffer<'_, T>) -> Result<Vec<f32>> {
    Ok(x.to_vec()?.into_iter().map(T::widen).collect())
}

/// An element type of the decoder: the data-movement kernels of [`Gpt::forward`] that
/// `offload_kernels::nn` has no use for (sealed by `NnFloat`: `f32`, `bf16`, `f16`).
#[allow(missing_docs)]
pub trait GptFloat: NnFloat {
    fn widen(self) -> f32;
    fn add_positions(
        dev: &Device<'_>,
        n: usize,
        dim: usize,
        len: usize,
        p0: usize,
        wpe: DeviceSlice<'_, Self>,
        x: DeviceSlice<'_, Self>,
    ) -> Result<()>;
    fn split_heads(
        dev: &Device<'_>,
        shape: (usize, usize, usize, usize, usize, usize),
        qkv: DeviceSlice<'_, Self>,
        q: DeviceSlice<'_, Self>,
        k: DeviceSlice<'_, Self>,
        v: DeviceSlice<'_, Self>,
    ) -> Result<()>;
    fn merge_heads(
        dev: &Device<'_>,
        shape: (usize, usize, usize, usize),
        o: DeviceSlice<'_, Self>,
        a: DeviceSlice<'_, Self>,
    ) -> Result<()>;
    fn last_rows(
        dev: &Device<'_>,
        shape: (usize, usize, usize),
        x: DeviceSlice<'_, Self>,
        y: DeviceSlice<'_, Self>,
    ) -> Result<()>;
}

macro_rules! gpt_kernels {
    ($t:ty, to = [$($to:tt)*], from = [$($from:tt)*], $module:ident) => {
        #[allow(clippy::too_many_arguments)]
        mod $module {
            #[allow(unused_imports)]
            use offload::half::{bf16, f16};

            /// `x[r, j] += wpe[p0 + r % len, j]`: each row's position embedding.
            #[offload::kernel(dims = 1)]
            pub fn add_positions(i: usize, dim: usize, len: usize, p0: usize, wpe: &[$t], x: &mut [$t]) {
                let t = (i / dim) % len;
                let v = x[i]$($to)* + wpe[(p0 + t) * dim + i % dim]$($to)*;
                x[i] = $($from)*(v);
            }

            /// `[batch * len, 3 * dim]` (q, k, v side by side) to `q` `[batch, heads, len,
            /// hd]` and positions `p0..p0 + len` of the caches `[batch, heads, ctx, hd]`:
            /// over rows `r`, the `3 * heads` heads of q, k and v, and each head's `e`
            /// (three loops, so that a host device divides per head, not per element).
            #[offload::kernel(dims = 3)]
            pub fn split_heads(
                r: usize,
                j: usize,
                e: usize,
                len: usize,
                heads: usize,
                hd: usize,
                ctx: usize,
                p0: usize,
                qkv: &[$t],
                q: &mut [$t],
                k: &mut [$t],
                v: &mut [$t],
            ) {
                let part = j / heads;
                let h = j % heads;
                let b = r / len;
                let t = r % len;
                let x = qkv[(r * 3 * heads + j) * hd + e];
                if part == 0 {
                    q[((b * heads + h) * len + t) * hd + e] = x;
                } else if part == 1 {
                    k[((b * heads + h) * ctx + p0 + t) * hd + e] = x;
                } else {
                    v[((b * heads + h) * ctx + p0 + t) * hd + e] = x;
                }
            }

            /// `[batch, heads, len, hd]` back to `[batch * len, heads * hd]`, over rows,
            /// heads and each head's `e`.
            #[offload::kernel(dims = 3)]
            pub fn merge_heads(r: usize, h: usize, e: usize, len: usize, heads: usize, hd: usize, o: &[$t], a: &mut [$t]) {
                a[(r * heads + h) * hd + e] = o[((r / len * heads + h) * len + r % len) * hd + e];
            }

            /// Each sequence's last row of `x` (`[batch, len, dim]`) into `y` (`[batch, dim]`).
            #[offload::kernel(dims = 1)]
            pub fn last_rows(i: usize, len: usize, dim: usize, x: &[$t], y: &mut [$t]) {
                y[i] = x[((i / dim + 1) * len - 1) * dim + i % dim];
            }
        }

        impl GptFloat for $t {
            fn widen(self) -> f32 {
                self$($to)*
            }
            fn add_positions(dev: &Device<'_>, n: usize, dim: usize, len: usize, p0: usize, wpe: DeviceSlice<'_, Self>, x: DeviceSlice<'_, Self>) -> Result<()> {
                $module::add_positions::launch(dev, n, dim, len, p0, wpe, x)
            }
            fn split_heads(
                dev: &Device<'_>,
                (batch, len, heads, hd, ctx, p0): (usize, usize, usize, usize, usize, usize),
                qkv: DeviceSlice<'_, Self>,
                q: DeviceSlice<'_, Self>,
                k: DeviceSlice<'_, Self>,
                v: DeviceSlice<'_, Self>,
            ) -> Result<()> {
                $module::split_heads::launch(dev, (0..batch * len, 0..3 * heads, 0..hd), len, heads, hd, ctx, p0, qkv, q, k, v)
            }
            fn merge_heads(dev: &Device<'_>, (batch, len, heads, hd): (usize, usize, usize, usize), o: DeviceSlice<'_, Self>, a: DeviceSlice<'_, Self>) -> Result<()> {
                $module::merge_heads::launch(dev, (0..batch * len, 0..heads, 0..hd), len, heads, hd, o, a)
            }
            fn last_rows(dev: &Device<'_>, (batch, len, dim): (usize, usize, usize), x: DeviceSlice<'_, Self>, y: DeviceSlice<'_, Self>) -> Result<()> {
                $module::last_rows::launch(dev, batch * dim, len, dim, x, y)
            }
        }
    };
}

gpt_kernels!(f32, to = [], from = [], gpt_f32);
gpt_kernels!(bf16, to = [.to_f32()], from = [bf16::from_f32], gpt_bf16);
gpt_kernels!(f16, to = [.to_f32()], from = [f16::from_f32], gpt_f16);

/// Every kernel of this module, for NVRTC checks.
pub fn kernels() -> Vec<&'static offload::Kernel> {
    macro_rules! of {
        ($($m:ident),*) => {
            vec![$(&$m::add_positions::KERNEL, &$m::split_heads::KERNEL, &$m::merge_heads::KERNEL, &$m::last_rows::KERNEL),*]
        };
    }
    of!(gpt_f32, gpt_bf16, gpt_f16)
}
