//! The README's facts against the binary (issue 18: the README said a
//! flush deadline of 5000 ms where `--help` said 2000, and named flags
//! that did not exist):
//! - every usage line of a verb (`cairn VERB ...` in a code block, with
//!   its continuation lines) names only flags that `cairn VERB --help`
//!   lists;
//! - every `` `--flag` `` the prose names exists in some verb's help;
//! - a default the prose gives for a flag ("`--flag` ... (default X)")
//!   is the one `--help` shows.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is a failure

mod common;

use common::cairn;
use std::collections::{BTreeMap, BTreeSet};

const VERBS: &[&str] = &[
    "pack", "unpack", "init", "backup", "restore", "ls", "verify", "repair", "rm", "forget", "gc",
    "stats", "unlock", "serve", "cache", "commit", "mount", "key", "diff", "copy", "tag",
];

fn readme() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    std::fs::read_to_string(path).unwrap()
}

/// `cairn ARGS --help`.
fn help(args: &[&str]) -> String {
    let out = cairn().args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "cairn {args:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// Every verb's help (and the cache subcommands').
fn helps() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for v in VERBS {
        m.insert((*v).to_string(), help(&[v]));
    }
    for (verb, sub) in [
        ("cache", "status"),
        ("cache", "drain"),
        ("cache", "detach"),
        ("key", "list"),
        ("key", "add"),
        ("key", "remove"),
        ("key", "passwd"),
    ] {
        let h = help(&[verb, sub]);
        m.entry(verb.to_string()).or_default().push_str(&h);
    }
    m
}

/// The long flags (`--name`) and short ones (`-x`) in `text`.
fn flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let starts =
            b[i] == b'-' && (i == 0 || matches!(b[i - 1], b' ' | b'[' | b'|' | b'`' | b'('));
        if starts {
            let mut j = i + 1;
            if j < b.len() && b[j] == b'-' {
                j += 1;
            }
            let name_start = j;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'-') {
                j += 1;
            }
            let name = &text[i..j];
            // Long flags by name; short ones only as `-x` (not `-19`,
            // `-1..-19` or a negative number).
            if j - name_start >= 2 && name.starts_with("--") {
                out.insert(name.trim_end_matches('-').to_string());
            } else if j - name_start == 1
                && !name.starts_with("--")
                && b[name_start].is_ascii_alphabetic()
            {
                out.insert(name.to_string());
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// Whether `help` lists `flag` (as `-x,` / `-x <` / `--name` ..., or
/// among an option's `[aliases: ...]`).
fn lists(help: &str, flag: &str) -> bool {
    help.lines().any(|l| {
        let l = l.trim_start();
        if let Some(aliases) = l.strip_prefix("[alias: ").or(l.strip_prefix("[aliases: ")) {
            return aliases.trim_end_matches(']').split(", ").any(|a| a == flag);
        }
        l.starts_with(&format!("{flag} "))
            || l.starts_with(&format!("{flag},"))
            || l.starts_with(&format!("{flag}="))
            || l.starts_with(&format!("{flag}[="))
            || l == flag
            || l.contains(&format!(", {flag} "))
            || l.contains(&format!(", {flag}="))
            || l.contains(&format!(", {flag}[="))
            || l.ends_with(&format!(", {flag}"))
    })
}

#[test]
fn usage_lines_name_only_flags_the_verb_has() {
    let text = readme();
    let helps = helps();
    let mut in_code = false;
    let mut verb: Option<String> = None;
    let mut bad = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            verb = None;
            continue;
        }
        if !in_code {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"cairn") {
            verb = words
                .get(1)
                .filter(|w| VERBS.contains(w))
                .map(|w| w.to_string());
            // A usage line, not an example command (examples chain with
            // && or pipes and are checked by running them elsewhere).
            if line.contains("&&") || line.contains(" | ") && !line.contains('[') {
                verb = None;
            }
        } else if !line.starts_with(' ') {
            verb = None;
        }
        let Some(v) = &verb else { continue };
        for f in flags(line) {
            if f == "-h" || f == "-V" {
                continue;
            }
            if !lists(&helps[v], &f) {
                bad.push(format!("cairn {v}: README names {f}, --help does not"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The pieces of the README that can name cairn's flags: code lines and
/// inline `code` spans that are a cairn command or start with a flag.
/// Other tools' commands (cargo, tar, qemu-img, nbdinfo...) are skipped.
fn cairn_snippets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            out.push(line.trim().to_string());
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let Some(span) = parts.next() {
            out.push(span.trim().to_string());
            parts.next();
        }
    }
    out.retain(|s| s.starts_with("cairn ") || s.starts_with('-'));
    out
}

#[test]
fn flags_in_the_prose_exist() {
    let text = readme();
    let helps = helps();
    let mut bad = BTreeSet::new();
    for snippet in cairn_snippets(&text) {
        for f in flags(&snippet) {
            if !f.starts_with("--") || matches!(f.as_str(), "--help" | "--version") {
                continue;
            }
            if !helps.values().any(|h| lists(h, &f)) {
                bad.insert(f);
            }
        }
    }
    assert!(bad.is_empty(), "README names flags no verb has: {bad:?}");
}

#[test]
fn defaults_in_the_prose_are_the_help_defaults() {
    let text = readme().split_whitespace().collect::<Vec<_>>().join(" ");
    let helps = helps();
    let mut checked = 0;
    let mut bad = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("`--") {
        let after = &rest[at + 1..];
        let Some(end) = after.find('`') else { break };
        let flag = after[..end]
            .split(['=', ' '])
            .next()
            .unwrap_or("")
            .to_string();
        // What follows the flag, up to its sentence's end or the next flag.
        let tail = &after[end + 1..];
        let stop = [
            tail.find(". "),
            tail.find("`--"),
            Some(160),
            Some(tail.len()),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(0);
        let sentence = &tail[..stop];
        rest = &after[end..];
        let Some(d) = sentence.find("(default ") else {
            continue;
        };
        let value: String = sentence[d + 9..]
            .chars()
            .take_while(|c| !matches!(c, ')' | ',' | ';' | ' '))
            .collect();
        let value = value.trim_end_matches(['.', ':']).to_string();
        for h in helps.values() {
            let Some(i) = h
                .find(&format!("{flag} "))
                .or_else(|| h.find(&format!("{flag}=")))
            else {
                continue;
            };
            // Joined as one line: --help wraps "[default: X]" too.
            let block: String = h[i..]
                .lines()
                .take(6)
                .flat_map(str::split_whitespace)
                .collect::<Vec<_>>()
                .join(" ");
            let Some(dd) = block.find("[default: ") else {
                continue;
            };
            let shown: String = block[dd + 10..].chars().take_while(|c| *c != ']').collect();
            checked += 1;
            if shown != value {
                bad.push(format!(
                    "{flag}: README says default {value}, --help says {shown}"
                ));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert!(checked >= 2, "only {checked} defaults were found to check");
}
