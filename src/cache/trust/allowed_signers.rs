//! The OpenSSH `allowed_signers` file (ssh-keygen(1), "ALLOWED SIGNERS"):
//! its parser ([`AllowedSigners`]) and OpenSSH pattern lists
//! ([`matches_patterns`]).

use std::path::Path;

use anyhow::Result;

use super::NAMESPACE;
use crate::exit::bad_input;

/// One line of an `allowed_signers` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedSigner {
    /// The principal patterns (`*` and `?` wildcards, `!` negation), as
    /// ssh-keygen matches `-I`.
    pub principals: Vec<String>,
    /// `namespaces="..."`, when given: the patterns the namespace must match.
    pub namespaces: Option<Vec<String>>,
    /// `valid-after="..."` as seconds since the epoch (UTC), when given.
    pub valid_after: Option<i64>,
    /// `valid-before="..."` as seconds since the epoch (UTC), when given.
    pub valid_before: Option<i64>,
    /// The public key.
    pub key: ssh_key::PublicKey,
    /// The 1-based line number in the file.
    pub line: usize,
}

impl AllowedSigner {
    /// Why this line (of the file `origin`) does not admit a signature by
    /// `principal` in the namespace [`NAMESPACE`] at `now` (seconds since
    /// the epoch, UTC), or `None` when it does: the principal matches the
    /// line's patterns, its `namespaces` option (if any) admits the
    /// namespace, and `now` lies within `valid-after` / `valid-before`
    /// (ssh-keygen(1), "ALLOWED SIGNERS"). The signature itself is not
    /// checked here.
    pub fn refusal(&self, origin: &str, principal: &str, now: i64) -> Option<String> {
        if !matches_patterns(principal, &self.principals) {
            return Some(format!(
                "{origin} line {}: builder `{principal}` is not one of its principals ({})",
                self.line,
                self.principals.join(",")
            ));
        }
        if let Some(ns) = &self.namespaces
            && !matches_patterns(NAMESPACE, ns)
        {
            return Some(format!(
                "{origin} line {}: namespaces=\"{}\" does not admit `{NAMESPACE}`",
                self.line,
                ns.join(",")
            ));
        }
        if self.valid_after.is_some_and(|t| now < t) || self.valid_before.is_some_and(|t| now > t) {
            return Some(format!(
                "{origin} line {}: the key is not valid now (valid-after / valid-before)",
                self.line
            ));
        }
        None
    }
}

/// The trusted keys of an `allowed_signers` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedSigners {
    /// The lines, in file order.
    pub signers: Vec<AllowedSigner>,
    /// The file they came from (for messages).
    pub origin: String,
}

impl AllowedSigners {
    /// The signers of file `path`.
    ///
    /// Errors: exit 2 naming the path and line for a line that cannot be
    /// parsed (unknown option, `cert-authority`, which is not supported, a
    /// key type other than `ssh-ed25519`, a bad key or time); 1 when it
    /// cannot be read.
    pub fn load(path: &Path) -> Result<AllowedSigners> {
        let shown = path.display().to_string();
        let text = crate::cache::keyfile::read(
            path,
            &shown,
            crate::cache::keyfile::KeyKind::AllowedSigners,
        )?;
        AllowedSigners::parse(&text, &shown)
    }

    /// The signers of `text` read from `origin` (as [`AllowedSigners::load`]).
    pub fn parse(text: &str, origin: &str) -> Result<AllowedSigners> {
        let mut signers = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let body = raw.trim();
            if body.is_empty() || body.starts_with('#') {
                continue;
            }
            let signer = parse_signer_line(body, line)
                .map_err(|why| bad_input(format!("{origin}: line {line}: {why}")))?;
            signers.push(signer);
        }
        Ok(AllowedSigners {
            signers,
            origin: origin.to_string(),
        })
    }
}

/// Parses one non-comment line of an allowed_signers file.
fn parse_signer_line(body: &str, line: usize) -> std::result::Result<AllowedSigner, String> {
    let (principals, rest) = split_token(body);
    if principals.is_empty() {
        return Err("no principals".into());
    }
    let principals: Vec<String> = principals.split(',').map(str::to_string).collect();
    if principals.iter().any(String::is_empty) {
        return Err("an empty principal in the list".into());
    }
    let rest = rest.trim_start();
    let (options, key_text) = if starts_with_key_type(rest) {
        ("", rest)
    } else {
        let (opts, after) = split_token(rest);
        (opts, after.trim_start())
    };
    let mut namespaces = None;
    let mut valid_after = None;
    let mut valid_before = None;
    for opt in split_options(options)? {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(unquote(v)?)),
            None => (opt.as_str(), None),
        };
        match (name.to_ascii_lowercase().as_str(), value) {
            ("namespaces", Some(v)) => {
                namespaces = Some(v.split(',').map(str::to_string).collect())
            }
            ("valid-after", Some(v)) => valid_after = Some(parse_time(&v)?),
            ("valid-before", Some(v)) => valid_before = Some(parse_time(&v)?),
            ("cert-authority", None) => {
                return Err(
                    "cert-authority lines (certificate signers) are not supported; list the signing keys themselves"
                        .into(),
                );
            }
            _ => return Err(format!("unknown or malformed option `{opt}`")),
        }
    }
    let key_type = key_text.split_whitespace().next().unwrap_or("");
    if key_type.is_empty() {
        return Err("no public key after the principals".into());
    }
    if key_type != "ssh-ed25519" {
        return Err(format!(
            "key type `{key_type}` is not supported; oracle-build signatures are ssh-ed25519"
        ));
    }
    let key = ssh_key::PublicKey::from_openssh(key_text)
        .map_err(|e| format!("the ssh-ed25519 key does not parse ({e})"))?;
    Ok(AllowedSigner {
        principals,
        namespaces,
        valid_after,
        valid_before,
        key,
        line,
    })
}

/// Whether `text` begins with an OpenSSH public key type.
fn starts_with_key_type(text: &str) -> bool {
    let first = text.split_whitespace().next().unwrap_or("");
    first.starts_with("ssh-")
        || first.starts_with("ecdsa-sha2-")
        || first.starts_with("sk-")
        || first.contains("-cert-v01@")
}

/// The first whitespace-delimited token of `text` (double quotes protect
/// whitespace) and the rest.
fn split_token(text: &str) -> (&str, &str) {
    let mut quoted = false;
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => return (&text[..i], &text[i..]),
            _ => {}
        }
    }
    (text, "")
}

/// The comma-separated options (commas inside double quotes do not split).
fn split_options(text: &str) -> std::result::Result<Vec<String>, String> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for c in text.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                cur.push(c);
            }
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    if quoted {
        return Err(format!("unterminated quote in the options `{text}`"));
    }
    out.push(cur);
    Ok(out)
}

/// An option value without its double quotes.
fn unquote(v: &str) -> std::result::Result<String, String> {
    match v.strip_prefix('"') {
        Some(inner) => inner
            .strip_suffix('"')
            .map(str::to_string)
            .ok_or_else(|| format!("unterminated quote in `{v}`")),
        None => Ok(v.to_string()),
    }
}

/// A `valid-after` / `valid-before` time (`YYYYMMDD[HHMM[SS]]`, `Z` for
/// UTC, otherwise the system's local time, as ssh-keygen(1)) as seconds
/// since the epoch.
fn parse_time(v: &str) -> std::result::Result<i64, String> {
    let (digits, utc) = match v.strip_suffix(['Z', 'z']) {
        Some(d) => (d, true),
        None => (v, false),
    };
    let bad = || format!("time `{v}` is not YYYYMMDD[HHMM[SS]][Z]");
    if !digits.chars().all(|c| c.is_ascii_digit()) || ![8, 12, 14].contains(&digits.len()) {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| digits.get(r).and_then(|s| s.parse::<i16>().ok());
    let year = num(0..4).ok_or_else(bad)?;
    let month = num(4..6).ok_or_else(bad)?;
    let day = num(6..8).ok_or_else(bad)?;
    let hour = if digits.len() >= 12 {
        num(8..10).ok_or_else(bad)?
    } else {
        0
    };
    let minute = if digits.len() >= 12 {
        num(10..12).ok_or_else(bad)?
    } else {
        0
    };
    let second = if digits.len() == 14 {
        num(12..14).ok_or_else(bad)?
    } else {
        0
    };
    let dt = jiff::civil::DateTime::new(
        year,
        i8::try_from(month).map_err(|_| bad())?,
        i8::try_from(day).map_err(|_| bad())?,
        i8::try_from(hour).map_err(|_| bad())?,
        i8::try_from(minute).map_err(|_| bad())?,
        i8::try_from(second).map_err(|_| bad())?,
        0,
    )
    .map_err(|_| bad())?;
    let tz = if utc {
        jiff::tz::TimeZone::UTC
    } else {
        jiff::tz::TimeZone::system()
    };
    let zoned = dt.to_zoned(tz).map_err(|_| bad())?;
    Ok(zoned.timestamp().as_second())
}

/// Whether `name` matches the OpenSSH pattern list `patterns`
/// (`match_pattern_list`: `*`, `?`, and `!` negating: a negated match
/// refuses outright).
pub fn matches_patterns(name: &str, patterns: &[String]) -> bool {
    let mut matched = false;
    for p in patterns {
        if let Some(neg) = p.strip_prefix('!') {
            if glob(name.as_bytes(), neg.as_bytes()) {
                return false;
            }
        } else if glob(name.as_bytes(), p.as_bytes()) {
            matched = true;
        }
    }
    matched
}

/// OpenSSH `match_pattern`: `*` any run, `?` one character, else literal.
fn glob(s: &[u8], p: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, _) => s.is_empty(),
        (Some(b'*'), _) => (0..=s.len()).any(|i| glob(&s[i..], &p[1..])),
        (Some(b'?'), Some(_)) => glob(&s[1..], &p[1..]),
        (Some(c), Some(d)) if c == d => glob(&s[1..], &p[1..]),
        _ => false,
    }
}
