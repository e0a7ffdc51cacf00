//! The GPT-2-shaped decoder of `offload_examples::gpt` against what PyTorch computes with
//! the same weights (`tests/fixtures/make_gpt_reference.py`, recorded once): a prefill of
//! three prompts and twelve greedy steps over the KV caches, its blocks split over two
//! devices where there are two, on every backend. fp32: the tokens equal PyTorch's and
//! every logit within `F32_TOL` (relative to the logits' root mean square); bf16: the
//! prefill's logits within `BF16_TOL`, and the tokens PyTorch's bf16 model chose.

use offload::weights::Weights;
use offload::Result;
use offload_examples::gpt::{Gpt, GptConfig, GptFloat};
use offload_tests::{check, check_eq, on_every_backend};

const WEIGHTS: &[u8] = include_bytes!("../../tests/fixtures/gpt-tiny.safetensors");
const REFERENCE: &[u8] = include_bytes!("../../tests/fixtures/gpt-tiny-reference.safetensors");
/// The fixture's shape: prompts, their length, tokens generated, heads, vocabulary.
const BATCH: usize = 3;
const PROMPT: usize = 8;
const NEW: usize = 12;
const HEADS: usize = 4;
const VOCAB: usize = 64;

/// fp32 logits: ours against PyTorch's, each difference over the logits' RMS (9.2e-7 seen
/// on host devices).
const F32_TOL: f64 = 1e-5;
/// bf16 logits: both rounded at every layer, in different orders (2.1e-2 seen on host
/// devices).
const BF16_TOL: f64 = 0.05;

/// An embedded file opened (the library maps files): written to a file of this thread's,
/// mapped, and removed (the mapping keeps its pages).
fn open(name: &str, bytes: &[u8]) -> Weights {
    let path = std::env::temp_dir().join(format!(
        "offload-{}-{:?}-{name}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&path, bytes).expect("a temporary file");
    let weights = Weights::open(&path).expect("the embedded fixture");
    std::fs::remove_file(&path).expect("the temporary file removed");
    weights
}

fn worst(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let rms = (want.iter().map(|&w| f64::from(w).powi(2)).sum::<f64>() / want.len() as f64).sqrt();
    got.iter().zip(want).map(|(&g, &w)| (f64::from(g) - f64::from(w)).abs() / rms).fold(0.0, f64::max)
}

fn generate<T: GptFloat>(rt: &offload::Runtime) -> Result<offload_examples::gpt::Generation> {
    let (weights, reference) =
        (open("gpt-tiny.safetensors", WEIGHTS), open("gpt-tiny-reference.safetensors", REFERENCE));
    let config = GptConfig::of(&weights, HEADS)?;
    let devices: Vec<usize> = (0..rt.num_devices().min(2)).collect();
    let prompts: Vec<u32> =
        reference.read::<f32>("prompts", &[BATCH, PROMPT])?.into_iter().map(|v| v as u32).collect();
    Gpt::<T>::new(rt, &weights, config, &devices, BATCH)?.generate(&prompts, NEW, true)
}

#[test]
fn fp32_decoding_gives_pytorchs_tokens_and_logits() {
    on_every_backend(
        "gpt fp32",
        1,
        |b| b,
        |rt| {
            let reference = open("gpt-tiny-reference.safetensors", REFERENCE);
            let g = generate::<f32>(rt)?;
            let tokens: Vec<u32> =
                reference.read::<f32>("tokens", &[BATCH, NEW])?.into_iter().map(|v| v as u32).collect();
            check_eq!(g.tokens, tokens);
            let p = reference.read::<f32>("prefill_logits", &[BATCH, PROMPT, VOCAB])?;
            let s = reference.read::<f32>("step_logits", &[BATCH, NEW, VOCAB])?;
            let (wp, ws) = (worst(&g.prefill_logits, &p), worst(&g.step_logits, &s));
            println!("fp32: worst prefill logit off by {wp:.2e}, step logit by {ws:.2e} of the RMS");
            check!(wp <= F32_TOL && ws <= F32_TOL, "{wp:.2e} {ws:.2e}");
            Ok(())
        },
    );
}

#[test]
fn bf16_decoding_stays_within_its_tolerance() {
    on_every_backend(
        "gpt bf16",
        1,
        |b| b,
        |rt| {
            let reference = open("gpt-tiny-reference.safetensors", REFERENCE);
            let g = generate::<offload::half::bf16>(rt)?;
            let p = reference.read::<f32>("prefill_logits_bf16", &[BATCH, PROMPT, VOCAB])?;
            let wp = worst(&g.prefill_logits, &p);
            let tokens: Vec<u32> =
                reference.read::<f32>("tokens_bf16", &[BATCH, NEW])?.into_iter().map(|v| v as u32).collect();
            let same = g.tokens.iter().zip(&tokens).filter(|(a, b)| a == b).count();
            println!(
                "bf16: worst prefill logit off by {wp:.2e} of the RMS; {same} of {} tokens PyTorch's",
                tokens.len()
            );
            check!(wp <= BF16_TOL, "{wp:.2e}");
            check_eq!(g.tokens, tokens);
            Ok(())
        },
    );
}

#[test]
fn every_gpt_kernel_compiles_with_nvrtc() {
    offload_tests::compile_with_nvrtc("gpt", &offload_examples::gpt::kernels());
}
