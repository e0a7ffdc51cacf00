//! A GPT-2-shaped decoder (`offload_examples::gpt`) generating greedily: a prefill of a
//! batch of prompts, then one position per sequence per step over the KV caches, its blocks
//! split into stages over the devices. By default the small model of
//! `tests/fixtures/gpt-tiny.safetensors` with the prompts PyTorch ran
//! (`tests/fixtures/make_gpt_reference.py`), whose tokens it checks against PyTorch's.
//!
//! ```text
//! cargo run --release -p offload-examples --example gpt
//! cargo run --release -p offload-examples --example gpt -- -dtype bf16 -ndev 1
//! ```
//! Options: `-weights FILE` (another model: `wte.weight`, `wpe.weight`, `h.{l}.*`,
//! `ln_f.*` as the script names them; `benches/pytorch/gpt_bench.py` writes a GPT-2-small
//! shaped one), `-heads N` (4), `-dtype f32|bf16|f16` (f32), `-batch N` and `-prompt N`
//! (prompts made up, without a reference: 3 of 8 tokens),
//! `-ndev N` (all devices), `-new N` (tokens to generate, 12), `-reference FILE` (PyTorch's
//! prompts and tokens, checked; the fixture's with the fixture's weights, else `none`),
//! `-repeat N` (timed runs after one warm-up; the medians printed, 3). Times are wall
//! clock: the prefill with its logits read back, and the decoding steps, each choosing
//! its tokens on the device and reading its logits back.

use offload::half::{bf16, f16};
use offload::weights::Weights;
use offload::Runtime;
use offload_examples::gpt::{Gpt, GptConfig, GptFloat};
use offload_examples::options::Options;
use offload_examples::{example_devices, example_runtime};

const USAGE: &str = "gpt [-weights FILE] [-heads N] [-dtype f32|bf16|f16] [-ndev N] [-new N] \
                     [-reference FILE|none] [-batch N] [-prompt N] [-repeat N]";

/// What one run generates, and where.
struct Run {
    devices: Vec<usize>,
    /// `[batch, len]`.
    prompts: Vec<u32>,
    batch: usize,
    new: usize,
    repeat: usize,
    /// PyTorch's tokens for these prompts (`[batch, 12]`), to check.
    expected: Option<Vec<u32>>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = Options::parse(&[])?;
    o.only(&["weights", "heads", "dtype", "ndev", "new", "reference", "batch", "prompt", "repeat"], USAGE)?;
    let weights = Weights::open(o.text("weights", "tests/fixtures/gpt-tiny.safetensors"))?;
    // The fixture's reference goes with the fixture's weights only.
    let default_reference =
        if o.value("weights").is_some() { "none" } else { "tests/fixtures/gpt-tiny-reference.safetensors" };
    let reference = match o.text("reference", default_reference).as_str() {
        "none" => None,
        path => Some(Weights::open(path)?),
    };
    let config = GptConfig::of(&weights, o.num("heads", 4)?)?;
    let dtype = o.choice("dtype", &[("f32", "f32"), ("bf16", "bf16"), ("f16", "f16")], "f32")?;
    let ids = |r: &Weights, name: &str| -> offload::Result<(Vec<u32>, Vec<usize>)> {
        let shape = r.meta(name)?.shape;
        Ok((r.read::<f32>(name, &shape)?.iter().map(|&v| v as u32).collect(), shape))
    };
    // The reference's prompts and tokens, else prompts of `-prompt` tokens made up.
    let (prompts, batch, expected) = match &reference {
        Some(r) => {
            let (prompts, shape) = ids(r, "prompts")?;
            let tokens = ids(r, if dtype == "bf16" { "tokens_bf16" } else { "tokens" })?.0;
            (prompts, shape[0], Some(tokens))
        }
        None => {
            let (batch, len) = (o.num("batch", 3usize)?, o.num("prompt", 8usize)?);
            ((0..batch * len).map(|i| ((i * 7 + 3) % config.vocab) as u32).collect(), batch, None)
        }
    };
    let rt = example_runtime()?;
    print!("{}", rt.device_report());
    let run = Run {
        devices: example_devices(&rt, o.num_opt("ndev")?),
        prompts,
        batch,
        new: o.num("new", 12usize)?,
        repeat: o.num("repeat", 3usize)?.max(1),
        expected,
    };
    match dtype {
        "f32" => generate::<f32>(&rt, &weights, config, &run, dtype),
        "bf16" => generate::<bf16>(&rt, &weights, config, &run, dtype),
        _ => generate::<f16>(&rt, &weights, config, &run, dtype),
    }
}

fn generate<T: GptFloat>(
    rt: &Runtime,
    weights: &Weights,
    config: GptConfig,
    run: &Run,
    dtype: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let Run { devices, prompts, batch, new, repeat, expected } = run;
    let (batch, new, repeat) = (*batch, *new, *repeat);
    let len = prompts.len() / batch;
    println!(
        "GPT {} blocks x {} wide, {} heads, vocabulary {}, in {dtype}; {batch} prompts of {len} tokens, {new} new each, \
         {} stage(s) on devices {devices:?}",
        config.layers,
        config.dim,
        config.heads,
        config.vocab,
        devices.len().min(config.layers)
    );
    let mut gpt = Gpt::<T>::new(rt, weights, config, devices, batch)?;
    let mut g = gpt.generate(prompts, new, false)?; // the warm-up
    let (mut prefill, mut decoding) = (Vec::new(), Vec::new());
    for _ in 0..repeat {
        g = gpt.generate(prompts, new, false)?;
        prefill.push(g.prefill_time.as_secs_f64());
        decoding.push(g.decoding_time.as_secs_f64());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (p, d) = (median(&mut prefill), median(&mut decoding));
    println!(
        "prefill {:.3} ms; decoding {:.1} tokens/s ({batch} sequences x {new} steps in {:.3} ms); medians of {repeat} runs",
        p * 1e3,
        (batch * new) as f64 / d,
        d * 1e3
    );
    // No tokens with `-new 0` (a prefill alone): nothing to print then.
    for (b, row) in g.tokens.chunks(new.max(1)).enumerate().take(4) {
        println!("sequence {b}: {:?} -> {row:?}", &prompts[b * len..((b + 1) * len).min(b * len + 16)]);
    }
    if let Some(want) = expected {
        let per = want.len() / batch;
        let same =
            g.tokens.chunks(new).zip(want.chunks(per)).all(|(a, b)| a.iter().zip(b).all(|(x, y)| x == y));
        println!("PyTorch's tokens: {}", if same { "the same" } else { "DIFFERENT" });
        if !same {
            return Err("tokens differ from PyTorch's".into());
        }
    }
    Ok(())
}
