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
//! `ln_f.*` as the script names them), `-heads N` (4), `-dtype f32|bf16|f16` (f32),
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

const USAGE: &str = "gpt [-weights FILE] [-heads N] [-dtype f32|bf16|f16] [-ndev N] [-new N] [-reference FILE|none] [-repeat N]";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = Options::parse(&[])?;
    o.only(&["weights", "heads", "dtype", "ndev", "new", "reference", "repeat"], USAGE)?;
    let weights = Weights::open(o.text("weights", "tests/fixtures/gpt-tiny.safetensors"))?;
    // The fixture's reference goes with the fixture's weights only.
    let default_reference =
        if o.value("weights").is_some() { "none" } else { "tests/fixtures/gpt-tiny-reference.safetensors" };
    let reference = match o.text("reference", default_reference).as_str() {
        "none" => None,
        path => Some(Weights::open(path)?),
    };
    let config = GptConfig::of(&weights, o.num("heads", 4)?)?;
    let rt = example_runtime()?;
    print!("{}", rt.device_report());
    let devices = example_devices(&rt, o.num_opt("ndev")?);
    let (new, repeat) = (o.num("new", 12usize)?, o.num("repeat", 3usize)?.max(1));
    match o.choice("dtype", &[("f32", 0), ("bf16", 1), ("f16", 2)], 0)? {
        0 => run::<f32>(&rt, &weights, reference.as_ref(), config, &devices, new, repeat, "f32"),
        1 => run::<bf16>(&rt, &weights, reference.as_ref(), config, &devices, new, repeat, "bf16"),
        _ => run::<f16>(&rt, &weights, reference.as_ref(), config, &devices, new, repeat, "f16"),
    }
}

#[allow(clippy::too_many_arguments)]
fn run<T: GptFloat>(
    rt: &Runtime,
    weights: &Weights,
    reference: Option<&Weights>,
    config: GptConfig,
    devices: &[usize],
    new: usize,
    repeat: usize,
    dtype: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    // The reference's prompts, else three prompts of eight tokens.
    let prompts: Vec<u32> = match reference.map(|r| r.meta("prompts")).transpose()? {
        Some(meta) => reference
            .expect("read above")
            .read::<f32>("prompts", &meta.shape)?
            .iter()
            .map(|&v| v as u32)
            .collect(),
        None => (0..24u32).map(|i| (i * 7 + 3) % config.vocab as u32).collect(),
    };
    let batch = reference.and_then(|r| r.meta("prompts").ok()).map_or(3, |m| m.shape[0]);
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
    let mut g = gpt.generate(&prompts, new)?; // the warm-up
    let (mut prefill, mut decoding) = (Vec::new(), Vec::new());
    for _ in 0..repeat {
        g = gpt.generate(&prompts, new)?;
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
    for (b, row) in g.tokens.chunks(new).enumerate() {
        println!("sequence {b}: {:?} -> {row:?}", &prompts[b * len..(b + 1) * len]);
    }
    if let (Some(r), true) = (reference, new <= 12) {
        let name = if dtype == "bf16" { "tokens_bf16" } else { "tokens" };
        let want: Vec<u32> = r.read::<f32>(name, &[batch, 12])?.iter().map(|&v| v as u32).collect();
        let same = g.tokens.chunks(new).zip(want.chunks(12)).all(|(a, b)| a == &b[..new]);
        println!("PyTorch's tokens ({name}): {}", if same { "the same" } else { "DIFFERENT" });
        if !same {
            return Err("tokens differ from PyTorch's".into());
        }
    }
    Ok(())
}
