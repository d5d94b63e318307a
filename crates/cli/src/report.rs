//! Progress on a terminal, summaries as text or JSON.

use cairn_filepack::Summary;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// Standard error that is no terminal, drawn on as zstd's `--progress`
/// draws there: the line rewritten after a carriage return.
#[derive(Debug)]
struct PlainStderr;

impl indicatif::TermLike for PlainStderr {
    fn width(&self) -> u16 {
        80
    }
    fn move_cursor_up(&self, _n: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_down(&self, _n: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_right(&self, _n: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_left(&self, _n: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.write_str(s)
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        use std::io::Write;
        write!(std::io::stderr(), "\r{s}")
    }
    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        use std::io::Write;
        std::io::stderr().flush()
    }
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    pub fn new(label: &str, total: Option<u64>, enabled: bool) -> Progress {
        Progress::with_force(label, total, enabled, false)
    }

    /// As [`Progress::new`]; `force` draws it even where stderr is no
    /// terminal (zstd's `--progress`), a line rewritten after `\r`.
    pub fn with_force(label: &str, total: Option<u64>, enabled: bool, force: bool) -> Progress {
        let template = if total.is_some() {
            "{prefix} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}"
        } else {
            "{prefix} {spinner} {bytes} {binary_bytes_per_sec} {elapsed} {msg}"
        };
        Progress::drawn(label, total, enabled, force, template)
    }

    /// A spinner with the step a job is at ([`Progress::message`]), for
    /// work that counts no bytes (gc).
    pub fn steps(label: &str, enabled: bool) -> Progress {
        Progress::drawn(
            label,
            None,
            enabled,
            false,
            "{prefix} {spinner} {elapsed} {msg}",
        )
    }

    fn drawn(
        label: &str,
        total: Option<u64>,
        enabled: bool,
        force: bool,
        template: &str,
    ) -> Progress {
        let enabled = force || enabled && std::io::stderr().is_terminal();
        let target = if force && !std::io::stderr().is_terminal() {
            ProgressDrawTarget::term_like(Box::new(PlainStderr))
        } else {
            ProgressDrawTarget::stderr()
        };
        let bar = ProgressBar::with_draw_target(total, target);
        if !enabled {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
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

    /// The total is `total` bytes (known once the work has begun).
    pub fn total(&self, total: u64) {
        self.bar.set_length(total);
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

/// The file engine draws its progress on the same bar.
impl cairn_filepack::Progress for Progress {
    fn read_to(&self, position: u64) {
        Progress::read_to(self, position);
    }
    fn ratio(&self, raw: u64, packed: u64) {
        Progress::ratio(self, raw, packed);
    }
    fn finish(&self) {
        Progress::finish(self);
    }
}

/// The one-line summary `-v` prints for an input.
pub fn summary_line(s: &Summary) -> String {
    format!(
        "{}: {} -> {} bytes ({:.2}% of the original) in {:.3} s, {:.1} MB/s, {} {}{} thread{}",
        s.input,
        s.bytes_in,
        s.bytes_out,
        s.ratio * 100.0,
        s.seconds,
        s.mb_per_s,
        s.format,
        // A negative level as zstd's flag for it says it.
        s.level
            .map(|l| match l {
                l if l < 0 => format!("--fast={}, ", l.unsigned_abs()),
                l => format!("-{l}, "),
            })
            .unwrap_or_default(),
        s.threads,
        if s.threads == 1 { "" } else { "s" }
    )
}
