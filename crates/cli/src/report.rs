//! Progress on a terminal, summaries as text or JSON.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// A progress bar on stderr, drawn only when stderr is a terminal.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    pub fn new(label: &str, total: Option<u64>, enabled: bool) -> Progress {
        let enabled = enabled && std::io::stderr().is_terminal();
        let bar = match total {
            Some(n) => ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr()),
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
        };
        if !enabled {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        let template = if total.is_some() {
            "{prefix} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}"
        } else {
            "{prefix} {spinner} {bytes} {binary_bytes_per_sec} {elapsed} {msg}"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(label.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar }
    }

    /// The reader has consumed input up to `position` bytes: progress is
    /// counted where bytes enter, so a slow first block still shows motion.
    pub fn read_to(&self, position: u64) {
        self.bar.set_position(position);
    }

    /// Uncompressed and compressed bytes written so far.
    pub fn ratio(&self, raw: u64, packed: u64) {
        if raw > 0 {
            self.bar
                .set_message(format!("ratio {:.3}", packed as f64 / raw as f64));
        }
    }

    /// Free text after the figures.
    pub fn message(&self, msg: String) {
        self.bar.set_message(msg);
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// What one file's pack or unpack did.
#[derive(Serialize, Debug)]
pub struct Summary {
    pub operation: &'static str,
    pub input: String,
    pub output: String,
    pub format: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub level: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<usize>,
    pub threads: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Compressed size over uncompressed size.
    pub ratio: f64,
    pub seconds: f64,
    /// Uncompressed megabytes (10^6) per second.
    pub mb_per_s: f64,
}

impl Summary {
    #[allow(clippy::too_many_arguments)] // A plain record; a builder would add nothing.
    pub fn new(
        operation: &'static str,
        input: String,
        output: String,
        format: String,
        level: Option<i32>,
        block_size: Option<usize>,
        threads: usize,
        bytes_in: u64,
        bytes_out: u64,
        started: Instant,
    ) -> Summary {
        let seconds = started.elapsed().as_secs_f64();
        let (raw, packed) = if operation == "pack" {
            (bytes_in, bytes_out)
        } else {
            (bytes_out, bytes_in)
        };
        Summary {
            operation,
            input,
            output,
            format,
            level,
            block_size,
            threads,
            bytes_in,
            bytes_out,
            ratio: if raw == 0 {
                0.0
            } else {
                packed as f64 / raw as f64
            },
            seconds,
            mb_per_s: if seconds > 0.0 {
                raw as f64 / 1e6 / seconds
            } else {
                0.0
            },
        }
    }

    pub fn line(&self) -> String {
        format!(
            "{}: {} -> {} bytes ({:.2}% of the original) in {:.3} s, {:.1} MB/s, {} {}{} threads",
            self.input,
            self.bytes_in,
            self.bytes_out,
            self.ratio * 100.0,
            self.seconds,
            self.mb_per_s,
            self.format,
            self.level.map(|l| format!("-{l}, ")).unwrap_or_default(),
            self.threads
        )
    }
}
