//! `cairn generate man DIR` and `cairn generate completions SHELL`: man
//! pages and shell completions made from the same clap definitions that
//! parse the arguments, so they cannot drift from `--help`. They are
//! generated on demand (by a packager, or once by hand) rather than
//! committed: generated files in the tree go stale and weigh on it.

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, Subcommand};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct GenerateArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Write man pages into DIR: cairn.1 and one per subcommand (cairn-pack.1, ...).
    Man {
        /// Directory to write them into (created if missing).
        dir: PathBuf,
    },
    /// Print the completion script of SHELL on stdout.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

pub(crate) fn generate(args: &GenerateArgs) -> Result<()> {
    let mut cmd = crate::Cli::command();
    match &args.what {
        What::Man { dir } => {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            // One page per visible command at any depth, named as git
            // names its pages (cairn-cache-status.1).
            clap_mangen::generate_to(cmd, dir)
                .with_context(|| format!("write man pages into {}", dir.display()))?;
        }
        What::Completions { shell } => {
            // Made whole, then printed as any report (a failed write is
            // the run's error, not a panic).
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut cmd, "cairn", &mut script);
            out!("{}", String::from_utf8_lossy(&script));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;
    use clap::Command;

    /// Every visible subcommand, at any depth, as `cairn-a-b`.
    fn every_command(cmd: &Command, prefix: &str, out: &mut Vec<String>) {
        out.push(prefix.to_string());
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            every_command(sub, &format!("{prefix}-{}", sub.get_name()), out);
        }
    }

    #[test]
    fn a_man_page_for_every_command() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("man1");
        generate(&GenerateArgs {
            what: What::Man { dir: out.clone() },
        })
        .unwrap();
        let mut want = Vec::new();
        every_command(&crate::Cli::command(), "cairn", &mut want);
        assert!(want.len() > 12, "{want:?}");
        let mut got: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        got.sort();
        let mut want_files: Vec<String> = want.iter().map(|n| format!("{n}.1")).collect();
        want_files.sort();
        assert_eq!(got, want_files);
        for name in &want {
            let text = std::fs::read_to_string(out.join(format!("{name}.1"))).unwrap();
            assert!(text.contains(".TH"), "{name}");
            assert!(text.contains(".SH SYNOPSIS"), "{name}");
        }
    }

    #[test]
    fn completions_for_every_shell_name_every_subcommand() {
        use clap::ValueEnum;
        let mut cmd = crate::Cli::command();
        cmd.build();
        for shell in clap_complete::Shell::value_variants() {
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut cmd, "cairn", &mut out);
            let text = String::from_utf8(out).unwrap();
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
                assert!(text.contains(sub.get_name()), "{shell}: {}", sub.get_name());
            }
        }
    }
}
