//! Passwords of encrypted repositories (where they come from) and
//! `cairn key list|add|remove|passwd`.

use crate::repo_cmd::{location, RepoArg};
use anyhow::{bail, Context, Result};
use cairn_store::KdfParams;
use cairn_store::{Password, PasswordSource};
use clap::{Args, Subcommand};
use serde_json::json;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Where the password of an encrypted repository comes from, in this
/// order: `--password-file`, `--password-command` (or their variables),
/// `CAIRN_PASSWORD`, else a prompt on the terminal.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct PasswordArgs {
    /// Read the repository's password from FILE (its first line).
    #[arg(long, env = "CAIRN_PASSWORD_FILE", value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// Run CMD with sh -c and take the first line it prints as the
    /// password (e.g. "pass show cairn").
    #[arg(long, env = "CAIRN_PASSWORD_COMMAND", value_name = "CMD")]
    pub password_command: Option<String>,
}

/// The first line of `text`, as the password; an empty one is refused.
fn first_line(text: Vec<u8>, from: &str) -> std::result::Result<Zeroizing<Vec<u8>>, String> {
    let text = Zeroizing::new(text);
    let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return Err(format!("{from} gives an empty password"));
    }
    Ok(Zeroizing::new(line.to_vec()))
}

fn from_file(path: &Path) -> std::result::Result<Zeroizing<Vec<u8>>, String> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    first_line(text, &path.display().to_string())
}

fn from_command(cmd: &str, flag: &str) -> std::result::Result<Zeroizing<Vec<u8>>, String> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("{flag} {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{flag} {cmd:?} failed ({})", out.status));
    }
    first_line(out.stdout, &format!("{flag} {cmd:?}"))
}

/// The password sources of one repository, by name: `--password-file`,
/// `--password-command` and `CAIRN_PASSWORD` for `--repo`, the same with
/// `from` for `copy --from`.
struct Sources<'a> {
    file: Option<&'a Path>,
    command: Option<&'a str>,
    file_flag: &'static str,
    command_flag: &'static str,
    var: &'static str,
    prompt: &'static str,
}

impl Sources<'_> {
    /// The password from the first source set, if any is.
    fn configured(&self) -> Option<std::result::Result<Zeroizing<Vec<u8>>, String>> {
        match (self.file, self.command) {
            (Some(_), Some(_)) => Some(Err(format!(
                "give {} or {}, not both",
                self.file_flag, self.command_flag
            ))),
            (Some(f), None) => Some(from_file(f)),
            (None, Some(c)) => Some(from_command(c, self.command_flag)),
            (None, None) => self.variable().map(|p| {
                use std::os::unix::ffi::OsStringExt;
                first_line(p.into_vec(), self.var)
            }),
        }
    }

    /// The password variable's value; an empty one counts as unset, as
    /// for the `*_FILE` and `*_COMMAND` variables (and restic's
    /// `RESTIC_PASSWORD`).
    fn variable(&self) -> Option<std::ffi::OsString> {
        std::env::var_os(self.var).filter(|v| !v.is_empty())
    }

    /// The password of an existing repository: configured, else asked.
    fn password(&self) -> std::result::Result<Zeroizing<Vec<u8>>, String> {
        match self.configured() {
            Some(p) => p,
            None => prompt(self.prompt, false),
        }
    }

    fn given(&self) -> bool {
        self.file.is_some() || self.command.is_some() || self.variable().is_some()
    }
}

/// Ask on the terminal (`confirm`: twice, for a new password).
fn prompt(what: &str, confirm: bool) -> std::result::Result<Zeroizing<Vec<u8>>, String> {
    if !std::io::stdin().is_terminal() {
        return Err("no password given and no terminal to ask on".into());
    }
    let ask = |p: &str| {
        rpassword::prompt_password(p)
            .map(|s| Zeroizing::new(s.into_bytes()))
            .map_err(|e| format!("reading the password: {e}"))
    };
    let first = ask(&format!("{what}: "))?;
    if first.is_empty() {
        return Err("empty password".into());
    }
    if confirm && ask(&format!("{what} again: "))? != first {
        return Err("the passwords differ".into());
    }
    Ok(first)
}

impl PasswordArgs {
    fn sources(&self) -> Sources<'_> {
        Sources {
            file: self.password_file.as_deref(),
            command: self.password_command.as_deref(),
            file_flag: "--password-file",
            command_flag: "--password-command",
            var: "CAIRN_PASSWORD",
            prompt: "repository password",
        }
    }

    /// The password for a new repository (asked twice on a terminal).
    pub(crate) fn new_password(&self) -> Result<Password> {
        let p = match self.sources().configured() {
            Some(p) => p,
            None => prompt("password for the new repository", true),
        };
        Ok(Password(p.map_err(anyhow::Error::msg).context(
            "an encrypted repository needs a password (CAIRN_PASSWORD_FILE, CAIRN_PASSWORD, --password-file or --password-command; or --encryption none)",
        )?))
    }
}

impl PasswordSource for PasswordArgs {
    fn password(&self) -> std::result::Result<Zeroizing<Vec<u8>>, String> {
        self.sources().password()
    }

    fn given(&self) -> bool {
        self.sources().given()
    }
}

/// Where the password of `copy --from`'s repository comes from, in this
/// order: `--from-password-file`, `--from-password-command` (or their
/// variables), `CAIRN_FROM_PASSWORD`, else a prompt on the terminal.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct FromPasswordArgs {
    /// Read the --from repository's password from FILE (its first line).
    #[arg(long, env = "CAIRN_FROM_PASSWORD_FILE", value_name = "FILE")]
    pub from_password_file: Option<PathBuf>,
    /// Run CMD with sh -c and take the first line it prints as the --from
    /// repository's password.
    #[arg(long, env = "CAIRN_FROM_PASSWORD_COMMAND", value_name = "CMD")]
    pub from_password_command: Option<String>,
}

impl FromPasswordArgs {
    fn sources(&self) -> Sources<'_> {
        Sources {
            file: self.from_password_file.as_deref(),
            command: self.from_password_command.as_deref(),
            file_flag: "--from-password-file",
            command_flag: "--from-password-command",
            var: "CAIRN_FROM_PASSWORD",
            prompt: "password of the --from repository",
        }
    }
}

impl PasswordSource for FromPasswordArgs {
    fn password(&self) -> std::result::Result<Zeroizing<Vec<u8>>, String> {
        self.sources().password()
    }

    fn given(&self) -> bool {
        self.sources().given()
    }
}

/// Argon2id's cost for a new key.
#[derive(Args, Debug, Clone)]
pub(crate) struct KdfArgs {
    /// Memory Argon2id uses to derive the key from the password (binary
    /// units: 19M = 19MiB; the default, with 2 passes, is one of OWASP's
    /// recommended settings). More makes guessing dearer, and every
    /// command that opens the repository slower.
    #[arg(long, value_parser = crate::parse_size, default_value = "19M", value_name = "SIZE")]
    pub kdf_memory: usize,
    /// Argon2id passes over that memory.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub kdf_iterations: u32,
}

impl KdfArgs {
    pub(crate) fn params(&self) -> KdfParams {
        KdfParams {
            memory_kib: u32::try_from(self.kdf_memory >> 10).unwrap_or(u32::MAX),
            iterations: self.kdf_iterations,
            parallelism: 1,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct KeyArgs {
    #[command(subcommand)]
    pub command: KeyCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum KeyCommand {
    /// List the keys (each wraps the master key under one password).
    List {
        #[command(flatten)]
        repo: RepoArg,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add a key: another password that opens the repository.
    Add(NewKeyArgs),
    /// Remove a key by its id (or a unique prefix); not the one in use.
    Remove {
        #[command(flatten)]
        repo: RepoArg,
        /// The key's id, as `cairn key list` shows it.
        id: String,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change the password: add a key with the new one, remove the one
    /// in use.
    Passwd(NewKeyArgs),
}

#[derive(Args, Debug)]
pub(crate) struct NewKeyArgs {
    #[command(flatten)]
    pub repo: RepoArg,
    /// Read the new password from FILE (its first line); also
    /// CAIRN_NEW_PASSWORD_FILE, or CAIRN_NEW_PASSWORD holds it; else it
    /// is asked for on the terminal.
    #[arg(long, env = "CAIRN_NEW_PASSWORD_FILE", value_name = "FILE")]
    pub new_password_file: Option<PathBuf>,
    #[command(flatten)]
    pub kdf: KdfArgs,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

impl NewKeyArgs {
    fn new_password(&self) -> Result<Password> {
        let p = match &self.new_password_file {
            Some(f) => from_file(f),
            // (Empty counts as unset, as for the other password variables.)
            None => match std::env::var_os("CAIRN_NEW_PASSWORD").filter(|v| !v.is_empty()) {
                Some(p) => {
                    use std::os::unix::ffi::OsStringExt;
                    first_line(p.into_vec(), "CAIRN_NEW_PASSWORD")
                }
                None => prompt("new password", true),
            },
        };
        Ok(Password(p.map_err(anyhow::Error::msg).context(
            "the new key needs a password (--new-password-file, CAIRN_NEW_PASSWORD_FILE or CAIRN_NEW_PASSWORD)",
        )?))
    }
}

fn open_encrypted(r: &RepoArg) -> Result<cairn_store::Repository> {
    let repo = crate::repo_cmd::open_repo(r)?;
    if repo.encryption().is_none() {
        bail!(
            "{}: the repository is not encrypted; it has no keys",
            location(&r.repo)?
        );
    }
    Ok(repo)
}

pub(crate) fn key(a: &KeyArgs) -> Result<()> {
    match &a.command {
        KeyCommand::List { repo, json } => {
            let repo = open_encrypted(repo)?;
            let (keys, damaged) = repo.key_list()?;
            for (id, why) in &damaged {
                errln!("cairn: warning: key {id} cannot be used: {why}");
            }
            if *json {
                let damaged: Vec<_> = damaged
                    .iter()
                    .map(|(id, why)| json!({"id": id, "error": why}))
                    .collect();
                // Not the sealed master key and its salt: all an attacker
                // needs to guess the password offline, and a report ends
                // up in logs (restic's shows none either).
                let keys: Vec<serde_json::Value> = keys
                    .iter()
                    .map(|k| {
                        let mut v = json!(k);
                        if let Some(o) = v.as_object_mut() {
                            o.remove("master");
                            o.remove("salt");
                        }
                        v
                    })
                    .collect();
                crate::repo_cmd::print_json(
                    &json!({"repository": repo.location(), "keys": keys, "damaged": damaged}),
                );
            } else {
                outln!(
                    "  {:<32}  {:<19}  {:<20}  {:>8}  {:>5}",
                    "id",
                    "created",
                    "user@host",
                    "memory",
                    "iter"
                );
                for k in &keys {
                    let created = chrono::DateTime::from_timestamp(k.file.created, 0)
                        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
                        .unwrap_or_default();
                    outln!(
                        "{} {:<32}  {:<19}  {:<20}  {:>7}M  {:>5}",
                        if k.current { "*" } else { " " },
                        k.id,
                        created,
                        format!("{}@{}", k.file.user, k.file.host),
                        k.file.params.memory_kib >> 10,
                        k.file.params.iterations
                    );
                }
            }
        }
        KeyCommand::Add(n) => {
            let repo = open_encrypted(&n.repo)?;
            let id = repo.add_key(&n.new_password()?, n.kdf.params())?;
            if n.json {
                crate::repo_cmd::print_json(&json!({"repository": repo.location(), "added": id}));
            } else {
                errln!("cairn: added key {id} to {}", repo.location());
            }
        }
        KeyCommand::Remove { repo, id, json } => {
            let repo = open_encrypted(repo)?;
            let removed = repo.remove_key(id)?;
            if *json {
                crate::repo_cmd::print_json(
                    &json!({"repository": repo.location(), "removed": removed}),
                );
            } else {
                errln!("cairn: removed key {removed} from {}", repo.location());
            }
        }
        KeyCommand::Passwd(n) => {
            let repo = open_encrypted(&n.repo)?;
            let old = repo.key_id().unwrap_or_default().to_string();
            let password = n.new_password()?;
            let current = repo
                .keys()?
                .into_iter()
                .find(|k| k.current)
                .context("no key is in use")?;
            if current.file.unwrap(repo.id(), &password.0)?.is_some() {
                bail!("the new password is the one in use; nothing changed");
            }
            let id = repo.add_key(&password, n.kdf.params())?;
            // Reopen with the new key, so the old one is not in use.
            let reopened =
                cairn_store::Repository::open_location_with(location(&n.repo.repo)?, 0, &password)
                    .context("the new key does not open the repository; the old one is kept")?;
            reopened.remove_key(&old)?;
            if n.json {
                crate::repo_cmd::print_json(
                    &json!({"repository": repo.location(), "added": id, "removed": old}),
                );
            } else {
                errln!(
                    "cairn: password changed for {} (key {id} replaces {old})",
                    repo.location()
                );
            }
        }
    }
    Ok(())
}
