//! A pure evaluator of CMake `if()` / `elseif()` conditions, three-valued
//! (true, false, unknown), over plain-data [`Facts`]: what the tool knows
//! of the target before CMake runs (the build platform's processor and
//! system, `VLLM_TARGET_DEVICE`, what a caller adds such as the compiler's
//! id and version). Anything the tree computes at configure time (a
//! `find_isa(...)` result, a cache variable) is unknown, and unknown
//! propagates by Kleene logic (`False AND Unknown` is false, `True OR
//! Unknown` is true).
//!
//! This is not a CMake interpreter: it reads one argument list, as CMake's
//! `if()` documents it (<https://cmake.org/cmake/help/latest/command/if.html>):
//! parentheses first, then the unary tests (`DEFINED <var>`,
//! `DEFINED ENV{<var>}`; `EXISTS`, `COMMAND`, `TARGET`, ... are unknown),
//! then the binary tests (`STREQUAL`, `MATCHES`, `EQUAL`, `LESS`,
//! `GREATER`, `LESS_EQUAL`, `GREATER_EQUAL`, `STRLESS`, `STRGREATER`,
//! `VERSION_LESS`, `VERSION_GREATER`, `VERSION_EQUAL`, `VERSION_LESS_EQUAL`,
//! `VERSION_GREATER_EQUAL`), then `NOT`, then `AND` and `OR` from left to
//! right (CMake gives them one precedence). Operands follow policy CMP0054
//! (NEW, the default since CMake 3.1): a quoted argument is a string; an
//! unquoted one names a variable when [`Facts`] knows it, is unknown when it
//! looks like a variable (upper-case letters, digits and `_`, at least one
//! letter), and is a string otherwise (`x86_64|amd64`, `12.3`, `cpu`).
//! `${VAR}` is expanded from the facts first; an unknown `VAR` makes the
//! operand unknown.

use std::collections::BTreeMap;

/// The truth of a condition as far as the facts tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Truth {
    /// The condition holds for the target.
    True,
    /// The condition does not hold for the target.
    False,
    /// The tree decides at configure time (or this evaluator cannot tell).
    Unknown,
}

impl std::ops::Not for Truth {
    type Output = Truth;

    /// Kleene negation.
    fn not(self) -> Truth {
        match self {
            Truth::True => Truth::False,
            Truth::False => Truth::True,
            Truth::Unknown => Truth::Unknown,
        }
    }
}

impl Truth {
    /// Kleene conjunction: false wins, then unknown.
    pub fn and(self, o: Truth) -> Truth {
        match (self, o) {
            (Truth::False, _) | (_, Truth::False) => Truth::False,
            (Truth::True, Truth::True) => Truth::True,
            _ => Truth::Unknown,
        }
    }

    /// Kleene disjunction: true wins, then unknown.
    pub fn or(self, o: Truth) -> Truth {
        !((!self).and(!o))
    }

    fn of(b: bool) -> Truth {
        if b { Truth::True } else { Truth::False }
    }
}

/// One argument of a CMake command as written: its text (quotes removed)
/// and whether it was quoted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    /// The text, without the quotes.
    pub text: String,
    /// Whether it was a quoted argument (`"..."`).
    pub quoted: bool,
}

impl Arg {
    /// An unquoted argument.
    pub fn bare(text: &str) -> Arg {
        Arg {
            text: text.to_string(),
            quoted: false,
        }
    }
}

/// What is known of the target before CMake runs: variables by name (with
/// their values) and, when given, the whole environment of the build
/// (`DEFINED ENV{X}` is then true or false; without it, unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// Known CMake variables: name -> value.
    pub vars: BTreeMap<String, String>,
    /// The environment the build runs with, when known in full.
    pub env: Option<BTreeMap<String, String>>,
}

impl Facts {
    /// The facts of a native build on this machine for `device`:
    /// `CMAKE_SYSTEM_PROCESSOR` and `CMAKE_HOST_SYSTEM_PROCESSOR` (this
    /// machine's, as `uname -m` gives them: `x86_64`, `aarch64`),
    /// `CMAKE_SYSTEM_NAME` (`Linux`), and `VLLM_TARGET_DEVICE` (which vLLM's
    /// `setup.py` passes as `-DVLLM_TARGET_DEVICE=<device>`).
    pub fn for_target(device: &str) -> Facts {
        Facts::for_platform(device, std::env::consts::ARCH, std::env::consts::OS)
    }

    /// [`Facts::for_target`] for a given processor (`x86_64`, `aarch64`)
    /// and Rust OS name (`linux` -> `Linux`, as CMake names it).
    pub fn for_platform(device: &str, processor: &str, os: &str) -> Facts {
        let system = match os {
            "linux" => "Linux",
            "macos" => "Darwin",
            "windows" => "Windows",
            other => other,
        };
        let mut f = Facts::default();
        f.set("VLLM_TARGET_DEVICE", device);
        f.set("CMAKE_SYSTEM_PROCESSOR", processor);
        f.set("CMAKE_HOST_SYSTEM_PROCESSOR", processor);
        f.set("CMAKE_SYSTEM_NAME", system);
        f.set("CMAKE_HOST_SYSTEM_NAME", system);
        f
    }

    /// Adds (or replaces) a known variable.
    pub fn set(&mut self, name: &str, value: &str) {
        self.vars.insert(name.to_string(), value.to_string());
    }
}

/// Splits a condition as written (`A OR (B AND NOT "c d")`) into arguments
/// the way CMake's parser does: whitespace separates, `"..."` is one quoted
/// argument, `(` and `)` are arguments of their own.
pub fn split(text: &str) -> Vec<Arg> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars().peekable();
    let flush = |cur: &mut String, out: &mut Vec<Arg>| {
        if !cur.is_empty() {
            out.push(Arg::bare(&std::mem::take(cur)));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                flush(&mut cur, &mut out);
                let mut s = String::new();
                while let Some(q) = chars.next() {
                    match q {
                        '\\' => s.extend(chars.next()),
                        '"' => break,
                        q => s.push(q),
                    }
                }
                out.push(Arg {
                    text: s,
                    quoted: true,
                });
            }
            '(' | ')' => {
                flush(&mut cur, &mut out);
                out.push(Arg::bare(&c.to_string()));
            }
            c if c.is_whitespace() => flush(&mut cur, &mut out),
            c => cur.push(c),
        }
    }
    flush(&mut cur, &mut out);
    out
}

/// Evaluates a condition given as text ([`split`], then [`eval`]).
pub fn eval_text(text: &str, facts: &Facts) -> Truth {
    eval(&split(text), facts)
}

/// Evaluates the argument list of an `if()` / `elseif()` against `facts`.
/// Unquoted arguments that carry `(` / `)` at their ends are split as
/// CMake's parser would. A list this evaluator cannot parse (an unbalanced
/// parenthesis, an operator without operand) is unknown, never an error:
/// CMake itself reports those.
pub fn eval(args: &[Arg], facts: &Facts) -> Truth {
    let mut toks: Vec<Arg> = Vec::new();
    for a in args {
        if a.quoted {
            toks.push(a.clone());
            continue;
        }
        let mut t = a.text.as_str();
        while let Some(r) = t.strip_prefix('(') {
            toks.push(Arg::bare("("));
            t = r;
        }
        let mut closes = 0;
        while let Some(r) = t.strip_suffix(')') {
            closes += 1;
            t = r;
        }
        if !t.is_empty() {
            toks.push(Arg::bare(t));
        }
        toks.extend((0..closes).map(|_| Arg::bare(")")));
    }
    if toks.is_empty() {
        return Truth::False;
    }
    let mut p = Parser {
        toks: &toks,
        pos: 0,
        facts,
    };
    match p.expr() {
        Some(t) if p.pos == toks.len() => t,
        _ => Truth::Unknown,
    }
}

const BINARY: &[&str] = &[
    "STREQUAL",
    "MATCHES",
    "EQUAL",
    "LESS",
    "GREATER",
    "LESS_EQUAL",
    "GREATER_EQUAL",
    "STRLESS",
    "STRGREATER",
    "STRLESS_EQUAL",
    "STRGREATER_EQUAL",
    "VERSION_LESS",
    "VERSION_GREATER",
    "VERSION_EQUAL",
    "VERSION_LESS_EQUAL",
    "VERSION_GREATER_EQUAL",
    "IN_LIST",
    "PATH_EQUAL",
    "IS_NEWER_THAN",
];

/// Unary tests this evaluator cannot answer (they ask the file system or
/// the configure state): unknown.
const UNARY_UNKNOWN: &[&str] = &[
    "EXISTS",
    "COMMAND",
    "POLICY",
    "TARGET",
    "TEST",
    "IS_DIRECTORY",
    "IS_SYMLINK",
    "IS_ABSOLUTE",
    "IS_READABLE",
    "IS_WRITABLE",
    "IS_EXECUTABLE",
];

struct Parser<'a> {
    toks: &'a [Arg],
    pos: usize,
    facts: &'a Facts,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Arg> {
        self.toks.get(self.pos)
    }

    fn is_kw(&self, kw: &str) -> bool {
        self.peek().is_some_and(|a| !a.quoted && a.text == kw)
    }

    fn next(&mut self) -> Option<Arg> {
        let a = self.toks.get(self.pos).cloned();
        self.pos += 1;
        a
    }

    /// `not_expr ((AND | OR) not_expr)*`, left to right.
    fn expr(&mut self) -> Option<Truth> {
        let mut acc = self.not_expr()?;
        loop {
            if self.is_kw("AND") {
                self.pos += 1;
                acc = acc.and(self.not_expr()?);
            } else if self.is_kw("OR") {
                self.pos += 1;
                acc = acc.or(self.not_expr()?);
            } else {
                return Some(acc);
            }
        }
    }

    fn not_expr(&mut self) -> Option<Truth> {
        if self.is_kw("NOT") {
            self.pos += 1;
            return Some(!self.not_expr()?);
        }
        self.binary()
    }

    fn binary(&mut self) -> Option<Truth> {
        if self.is_kw("(") {
            self.pos += 1;
            let t = self.expr()?;
            if !self.is_kw(")") {
                return None;
            }
            self.pos += 1;
            return Some(t);
        }
        if self.is_kw("DEFINED") {
            self.pos += 1;
            let a = self.next()?;
            return Some(self.defined(&a.text));
        }
        if let Some(a) = self.peek()
            && !a.quoted
            && UNARY_UNKNOWN.contains(&a.text.as_str())
        {
            self.pos += 1;
            self.next()?;
            return Some(Truth::Unknown);
        }
        let lhs = self.next()?;
        if lhs.text == ")" && !lhs.quoted {
            return None;
        }
        if let Some(op) = self.peek()
            && !op.quoted
            && BINARY.contains(&op.text.as_str())
        {
            let op = op.text.clone();
            self.pos += 1;
            let rhs = self.next()?;
            let (Some(l), Some(r)) = (self.operand(&lhs), self.operand(&rhs)) else {
                return Some(Truth::Unknown);
            };
            return Some(compare(&op, &l, &r));
        }
        Some(self.truthy(&lhs))
    }

    fn defined(&self, name: &str) -> Truth {
        if let Some(var) = name.strip_prefix("ENV{").and_then(|v| v.strip_suffix('}')) {
            return match &self.facts.env {
                Some(env) => Truth::of(env.contains_key(var)),
                None => Truth::Unknown,
            };
        }
        if self.facts.vars.contains_key(name) {
            Truth::True
        } else {
            Truth::Unknown
        }
    }

    /// `${VAR}` and `$ENV{VAR}` expanded from the facts; `None` when one is unknown.
    fn expand(&self, text: &str) -> Option<String> {
        let mut out = String::new();
        let mut rest = text;
        while let Some(i) = rest.find('$') {
            out.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            let (env, body) = if let Some(b) = after.strip_prefix("ENV{") {
                (true, b)
            } else if let Some(b) = after.strip_prefix('{') {
                (false, b)
            } else {
                out.push('$');
                rest = after;
                continue;
            };
            let end = body.find('}')?;
            let name = &body[..end];
            let value = if env {
                self.facts
                    .env
                    .as_ref()?
                    .get(name)
                    .cloned()
                    .unwrap_or_default()
            } else {
                self.facts.vars.get(name)?.clone()
            };
            out.push_str(&value);
            rest = &body[end + 1..];
        }
        out.push_str(rest);
        Some(out)
    }

    /// The value of a comparison's operand (`None`: unknown).
    fn operand(&self, a: &Arg) -> Option<String> {
        let text = self.expand(&a.text)?;
        if a.quoted {
            return Some(text);
        }
        if let Some(v) = self.facts.vars.get(&text) {
            return Some(v.clone());
        }
        if looks_like_variable(&text) {
            return None;
        }
        Some(text)
    }

    /// `if(<constant>)` / `if(<variable>)`.
    fn truthy(&self, a: &Arg) -> Truth {
        let Some(text) = self.expand(&a.text) else {
            return Truth::Unknown;
        };
        if let Some(t) = constant(&text) {
            return t;
        }
        if a.quoted {
            // CMP0054: a quoted string that is no constant is false.
            return Truth::False;
        }
        match self.facts.vars.get(&text) {
            Some(v) => constant(v).unwrap_or(Truth::True),
            None => Truth::Unknown,
        }
    }
}

/// Whether an unquoted word reads as a variable name (`ASIMD_FOUND`, `X`).
fn looks_like_variable(s: &str) -> bool {
    s.chars().any(|c| c.is_ascii_uppercase())
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// CMake's boolean constants (case-insensitive); `None` when `s` is none.
fn constant(s: &str) -> Option<Truth> {
    let u = s.to_ascii_uppercase();
    match u.as_str() {
        "1" | "ON" | "YES" | "TRUE" | "Y" => Some(Truth::True),
        "" | "0" | "OFF" | "NO" | "FALSE" | "N" | "IGNORE" | "NOTFOUND" => Some(Truth::False),
        _ if u.ends_with("-NOTFOUND") => Some(Truth::False),
        _ => match s.parse::<f64>() {
            Ok(n) => Some(Truth::of(n != 0.0)),
            Err(_) => None,
        },
    }
}

/// The components of a version as CMake compares them: dotted integers,
/// each read up to its first non-digit, missing ones 0.
fn version(s: &str) -> Vec<u64> {
    s.split('.')
        .map(|p| {
            let d: String = p.chars().take_while(char::is_ascii_digit).collect();
            d.parse().unwrap_or(0)
        })
        .collect()
}

fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let (mut x, mut y) = (version(a), version(b));
    let n = x.len().max(y.len());
    x.resize(n, 0);
    y.resize(n, 0);
    x.cmp(&y)
}

fn compare(op: &str, l: &str, r: &str) -> Truth {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let num = |s: &str| s.trim().parse::<f64>().ok();
    match op {
        "STREQUAL" => Truth::of(l == r),
        "STRLESS" => Truth::of(l < r),
        "STRGREATER" => Truth::of(l > r),
        "STRLESS_EQUAL" => Truth::of(l <= r),
        "STRGREATER_EQUAL" => Truth::of(l >= r),
        "MATCHES" => match regex::Regex::new(r) {
            Ok(re) => Truth::of(re.is_match(l)),
            Err(_) => Truth::Unknown,
        },
        "EQUAL" | "LESS" | "GREATER" | "LESS_EQUAL" | "GREATER_EQUAL" => {
            let (Some(a), Some(b)) = (num(l), num(r)) else {
                return Truth::False;
            };
            Truth::of(match op {
                "EQUAL" => a == b,
                "LESS" => a < b,
                "GREATER" => a > b,
                "LESS_EQUAL" => a <= b,
                _ => a >= b,
            })
        }
        "VERSION_LESS" => Truth::of(version_cmp(l, r) == Less),
        "VERSION_GREATER" => Truth::of(version_cmp(l, r) == Greater),
        "VERSION_EQUAL" => Truth::of(version_cmp(l, r) == Equal),
        "VERSION_LESS_EQUAL" => Truth::of(version_cmp(l, r) != Greater),
        "VERSION_GREATER_EQUAL" => Truth::of(version_cmp(l, r) != Less),
        _ => Truth::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x86() -> Facts {
        Facts::for_platform("cpu", "x86_64", "linux")
    }
    fn arm() -> Facts {
        Facts::for_platform("cpu", "aarch64", "linux")
    }

    /// vLLM's `cmake/cpu_extension.cmake` (v0.20-era) conditions.
    #[test]
    fn vllm_cpu_extension_conditions() {
        let isa = r#"CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|amd64" OR ENABLE_X86_ISA"#;
        assert_eq!(eval_text(isa, &x86()), Truth::True);
        assert_eq!(eval_text(isa, &arm()), Truth::Unknown);
        let mut arm_off = arm();
        arm_off.set("ENABLE_X86_ISA", "OFF");
        assert_eq!(eval_text(isa, &arm_off), Truth::False);

        let onednn = "ENABLE_X86_ISA OR (ASIMD_FOUND AND NOT APPLE_SILICON_FOUND) OR POWER9_FOUND";
        assert_eq!(eval_text(onednn, &x86()), Truth::Unknown);
        let mut on = x86();
        on.set("ENABLE_X86_ISA", "ON");
        assert_eq!(eval_text(onednn, &on), Truth::True);

        let asimd = "ASIMD_FOUND AND NOT APPLE_SILICON_FOUND";
        assert_eq!(eval_text(asimd, &x86()), Truth::Unknown);
        assert_eq!(eval_text(&format!("NOT ({asimd})"), &x86()), Truth::Unknown);
        let mut found = x86();
        found.set("ASIMD_FOUND", "OFF");
        assert_eq!(eval_text(asimd, &found), Truth::False);
        assert_eq!(eval_text(&format!("NOT ({asimd})"), &found), Truth::True);
        // The override branch: a variable the tree sets from the environment.
        assert_eq!(
            eval_text("FETCHCONTENT_SOURCE_DIR_ONEDNN", &x86()),
            Truth::Unknown
        );
    }

    #[test]
    fn kleene_logic_and_cmake_precedence() {
        let f = x86();
        assert_eq!(
            eval_text("UNKNOWN_X AND CMAKE_SYSTEM_PROCESSOR STREQUAL aarch64", &f),
            Truth::False
        );
        assert_eq!(
            eval_text("UNKNOWN_X OR CMAKE_SYSTEM_PROCESSOR STREQUAL x86_64", &f),
            Truth::True
        );
        assert_eq!(
            eval_text("UNKNOWN_X OR CMAKE_SYSTEM_PROCESSOR STREQUAL aarch64", &f),
            Truth::Unknown
        );
        // AND and OR share one precedence, left to right: (TRUE OR x) AND FALSE.
        assert_eq!(eval_text("TRUE OR UNKNOWN_X AND FALSE", &f), Truth::False);
        assert_eq!(eval_text("TRUE OR (UNKNOWN_X AND FALSE)", &f), Truth::True);
        // NOT binds below the binary tests.
        assert_eq!(
            eval_text("NOT VLLM_TARGET_DEVICE STREQUAL \"cpu\"", &f),
            Truth::False
        );
        assert_eq!(eval_text("NOT NOT ON", &f), Truth::True);
        assert_eq!(eval_text("(ON", &f), Truth::Unknown);
        assert_eq!(eval_text("", &f), Truth::False);
    }

    #[test]
    fn constants_variables_defined_and_expansion() {
        let mut f = x86();
        for (t, want) in [
            ("ON", Truth::True),
            ("off", Truth::False),
            ("1", Truth::True),
            ("0", Truth::False),
            ("TRUE", Truth::True),
            ("FALSE", Truth::False),
            ("FOO-NOTFOUND", Truth::False),
            ("\"hello\"", Truth::False),
        ] {
            assert_eq!(eval_text(t, &f), want, "{t}");
        }
        assert_eq!(eval_text("DEFINED VLLM_TARGET_DEVICE", &f), Truth::True);
        assert_eq!(eval_text("DEFINED SOMETHING", &f), Truth::Unknown);
        assert_eq!(eval_text("DEFINED ENV{X}", &f), Truth::Unknown);
        f.env = Some(BTreeMap::from([("X".to_string(), "1".to_string())]));
        assert_eq!(eval_text("DEFINED ENV{X}", &f), Truth::True);
        assert_eq!(eval_text("DEFINED ENV{Y}", &f), Truth::False);
        assert_eq!(
            eval_text("\"${CMAKE_SYSTEM_PROCESSOR}\" STREQUAL \"x86_64\"", &f),
            Truth::True
        );
        assert_eq!(eval_text("${NOPE} STREQUAL \"x86_64\"", &f), Truth::Unknown);
        f.set("FLAG", "OFF");
        assert_eq!(eval_text("FLAG", &f), Truth::False);
        assert_eq!(eval_text("EXISTS /x", &f), Truth::Unknown);
    }

    #[test]
    fn versions_and_numbers() {
        let mut f = x86();
        f.set("CMAKE_CXX_COMPILER_ID", "GNU");
        f.set("CMAKE_CXX_COMPILER_VERSION", "12.2.0");
        let req = "CMAKE_CXX_COMPILER_ID STREQUAL \"GNU\" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 12.3";
        assert_eq!(eval_text(req, &f), Truth::True);
        f.set("CMAKE_CXX_COMPILER_VERSION", "12.3.0");
        assert_eq!(eval_text(req, &f), Truth::False);
        assert_eq!(eval_text("1.2 VERSION_EQUAL 1.2.0", &f), Truth::True);
        assert_eq!(eval_text("1.10 VERSION_GREATER 1.9", &f), Truth::True);
        assert_eq!(eval_text("1.10 VERSION_LESS_EQUAL 1.10.0", &f), Truth::True);
        assert_eq!(eval_text("2 VERSION_GREATER_EQUAL 10", &f), Truth::False);
        assert_eq!(eval_text("3 LESS 10", &f), Truth::True);
        assert_eq!(eval_text("3 EQUAL 3.0", &f), Truth::True);
        assert_eq!(
            eval_text("CMAKE_C_COMPILER_VERSION VERSION_LESS 1", &f),
            Truth::Unknown
        );
    }
}
