//! `offload-trace`: an `OFFLOAD_TRACE` timeline as an SVG picture, or summed up per lane
//! (docs/GUIDE.md, "Timeline traces").
//!
//! ```text
//! cargo run -p offload-examples --bin offload-trace -- run.json --svg run.svg
//! cargo run -p offload-examples --bin offload-trace -- run.json --summary
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use offload_examples::trace_svg::{render_svg, summarize, RenderOptions, Trace};

const USAGE: &str = "\
usage: offload-trace TRACE.json [--svg OUT.svg] [--summary] [options]

  TRACE.json       a timeline written with OFFLOAD_TRACE=TRACE.json
  --svg OUT.svg    draw it: a lane per thread grouped by process, slices coloured by
                   kind, instants as ticks, counters as step lines (`-`: standard output)
  --summary        print per-lane totals (busy time, slices, bytes, GB/s) and, per
                   process, how much of the kernel time had a copy running beside it

options:
  --title T        the picture's title (default: the trace's file name)
  --from-us A      start the window at A microseconds (default: the first event)
  --to-us B        end it at B microseconds (default: the last event's end)
  --width PX       the picture's width in pixels (default 1200, at least 400)
  --no-instants    leave instants out of the picture
  --process NAME   only this process (`host`, `device 0`, or a pid); may be repeated
  -h, --help       this text";

/// What the command line asks for.
struct Args {
    trace: PathBuf,
    svg: Option<PathBuf>,
    summary: bool,
    options: RenderOptions,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut trace = None;
    let (mut svg, mut summary) = (None, false);
    let mut options = RenderOptions::default();
    while let Some(a) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--svg" => svg = Some(PathBuf::from(value("--svg")?)),
            "--summary" => summary = true,
            "--title" => options.title = Some(value("--title")?),
            "--from-us" => options.from_us = Some(number(&a, &value(&a)?)?),
            "--to-us" => options.to_us = Some(number(&a, &value(&a)?)?),
            "--width" => {
                let v = value(&a)?;
                options.width =
                    v.parse().map_err(|_| format!("--width takes a whole number of pixels, not {v:?}"))?;
            }
            "--no-instants" => options.instants = false,
            "--process" => options.processes.push(value(&a)?),
            flag if flag.starts_with('-') && flag != "-" => return Err(format!("unknown option {flag}")),
            path if trace.is_none() => trace = Some(PathBuf::from(path)),
            extra => return Err(format!("one trace at a time (and {extra:?})")),
        }
    }
    let trace = trace.ok_or("no trace file given")?;
    if svg.is_none() && !summary {
        return Err("nothing to do: give --svg OUT.svg, --summary or both".into());
    }
    Ok(Some(Args { trace, svg, summary, options }))
}

fn number(flag: &str, v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| format!("{flag} takes a number of microseconds, not {v:?}"))
}

fn run(mut args: Args) -> Result<(), String> {
    let trace = Trace::from_file(&args.trace).map_err(|e| e.to_string())?;
    if args.options.title.is_none() {
        let name = args.trace.file_name().unwrap_or(args.trace.as_os_str());
        args.options.title = Some(name.to_string_lossy().into_owned());
    }
    if let Some(out) = &args.svg {
        let svg = render_svg(&trace, &args.options).map_err(|e| e.to_string())?;
        if out == Path::new("-") {
            print!("{svg}");
        } else {
            std::fs::write(out, svg).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
        }
    }
    if args.summary {
        print!("{}", summarize(&trace, &args.options).map_err(|e| e.to_string())?);
    }
    Ok(())
}

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)) {
        Ok(None) => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("offload-trace: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Ok(Some(args)) => match run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("offload-trace: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
