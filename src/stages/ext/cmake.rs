//! The CMake reader of the ext stage, pure (no I/O): CMake command calls,
//! `if()` conditions, `include()` walked through a reader of
//! checkout-relative paths, `set(VAR value)` and `${VAR}` expansion, and the
//! `FetchContent_Declare` / `ExternalProject_Add` / `FetchContent_Populate`
//! calls turned into a [`Discovery`].

use std::collections::BTreeMap;

use super::condition::{self, Arg, Facts, Truth};
use super::{Decided, Discovery, ExtSource, Origin, Variable, runs_cmake};

/// [`super::discover_in_tree`] over any reader of checkout-relative paths,
/// for a native build on this machine ([`Facts::for_target`]).
pub fn discover_with(read: &dyn Fn(&str) -> Option<String>, device: &str) -> Discovery {
    discover_for(read, device, &Facts::for_target(device))
}

/// [`discover_with`] for the target `facts` describe (another processor:
/// `export --platform`).
pub fn discover_for(
    read: &dyn Fn(&str) -> Option<String>,
    device: &str,
    facts: &Facts,
) -> Discovery {
    if !runs_cmake(device) {
        return Discovery {
            no_cmake: Some(format!(
                "target_device {device} builds no extension (vLLM's setup.py runs no CMake for it): nothing is staged"
            )),
            ..Default::default()
        };
    }
    let Some(root) = read("CMakeLists.txt") else {
        return Discovery::default();
    };
    let mut w = Walk {
        read: Some(read),
        facts: facts.clone(),
        out: Vec::new(),
        notes: Vec::new(),
        visited: Vec::new(),
        module_path: Vec::new(),
    };
    w.file("CMakeLists.txt", &root, (&[], Truth::True), 0);
    let mut d = parse_calls(&w.out);
    d.unmapped.extend(w.notes);
    d
}

/// One CMake command call: its name (lowercased), arguments, whether each
/// was quoted, and the line it starts on (1-based).
pub(crate) struct Call {
    /// The command's name, lowercased.
    pub(crate) name: String,
    /// The arguments, quotes removed.
    pub(crate) args: Vec<String>,
    /// Whether each argument was quoted.
    pub(crate) quoted: Vec<bool>,
    /// The line the call starts on (1-based).
    pub(crate) line: usize,
}

impl Call {
    /// The arguments as the condition evaluator takes them.
    pub(super) fn cond_args(&self) -> Vec<Arg> {
        self.args
            .iter()
            .zip(&self.quoted)
            .map(|(a, q)| Arg {
                text: a.clone(),
                quoted: *q,
            })
            .collect()
    }
}

fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_quote = false;
        let mut prev = '\0';
        for c in line.chars() {
            if c == '"' && prev != '\\' {
                in_quote = !in_quote;
            }
            if c == '#' && !in_quote {
                break;
            }
            out.push(c);
            prev = c;
        }
        out.push('\n');
    }
    out
}

/// The command calls of CMake text `text` in order: `#` comments skipped,
/// quoted arguments unquoted, parentheses balanced (the text inside nested
/// ones kept in the arguments).
pub(crate) fn calls(text: &str) -> Vec<Call> {
    let text = strip_comments(text);
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let (mut line, mut counted) = (1, 0);
    while i < chars.len() {
        if chars[i].is_ascii_alphabetic() || chars[i] == '_' {
            let start = i;
            line += chars[counted..start].iter().filter(|c| **c == '\n').count();
            counted = start;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let name: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && (chars[j] == ' ' || chars[j] == '\t') {
                j += 1;
            }
            if j < chars.len() && chars[j] == '(' {
                // Arguments up to the matching parenthesis.
                let mut depth = 1;
                let mut k = j + 1;
                let mut in_quote = false;
                let mut args = Vec::new();
                let mut quotes = Vec::new();
                let mut cur = String::new();
                let mut quoted = false;
                while k < chars.len() && depth > 0 {
                    let c = chars[k];
                    if in_quote {
                        if c == '\\' && k + 1 < chars.len() {
                            cur.push(chars[k + 1]);
                            k += 2;
                            continue;
                        }
                        if c == '"' {
                            in_quote = false;
                        } else {
                            cur.push(c);
                        }
                    } else if c == '"' {
                        in_quote = true;
                        quoted = true;
                    } else if c == '(' {
                        depth += 1;
                        cur.push(c);
                    } else if c == ')' {
                        depth -= 1;
                        if depth > 0 {
                            cur.push(c);
                        }
                    } else if c.is_whitespace() {
                        if !cur.is_empty() || quoted {
                            args.push(std::mem::take(&mut cur));
                            quotes.push(quoted);
                            quoted = false;
                        }
                    } else {
                        cur.push(c);
                    }
                    k += 1;
                }
                if !cur.is_empty() || quoted {
                    args.push(cur);
                    quotes.push(quoted);
                }
                out.push(Call {
                    name: name.to_ascii_lowercase(),
                    args,
                    quoted: quotes,
                    line,
                });
                i = k;
                continue;
            }
        } else {
            i += 1;
        }
    }
    out
}

const KEYWORDS: &[&str] = &[
    "GIT_REPOSITORY",
    "GIT_TAG",
    "GIT_PROGRESS",
    "GIT_SHALLOW",
    "GIT_SUBMODULES",
    "GIT_SUBMODULES_RECURSE",
    "GIT_REMOTE_UPDATE_STRATEGY",
    "URL",
    "URL_HASH",
    "URL_MD5",
    "SOURCE_DIR",
    "SOURCE_SUBDIR",
    "BINARY_DIR",
    "SUBBUILD_DIR",
    "DOWNLOAD_EXTRACT_TIMESTAMP",
    "DOWNLOAD_NO_EXTRACT",
    "UPDATE_DISCONNECTED",
    "UPDATE_COMMAND",
    "PATCH_COMMAND",
    "CONFIGURE_COMMAND",
    "BUILD_COMMAND",
    "INSTALL_COMMAND",
    "TEST_COMMAND",
    "EXCLUDE_FROM_ALL",
    "SYSTEM",
    "OVERRIDE_FIND_PACKAGE",
    "FIND_PACKAGE_ARGS",
    "TLS_VERIFY",
];

/// Keyword arguments of a FetchContent/ExternalProject call after its name.
fn keyword_args(args: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut key: Option<String> = None;
    for a in args {
        if KEYWORDS.contains(&a.as_str()) {
            out.entry(a.clone()).or_default();
            key = Some(a.clone());
        } else if let Some(k) = &key {
            out.entry(k.clone()).or_default().push(a.clone());
        }
    }
    out
}

fn expand(value: &str, vars: &BTreeMap<String, String>) -> Option<String> {
    let mut v = value.to_string();
    for _ in 0..8 {
        let Some(start) = v.find("${") else {
            return Some(v);
        };
        let end = start + v[start..].find('}')?;
        let name = &v[start + 2..end];
        let value = vars.get(name)?;
        v = format!("{}{}{}", &v[..start], value, &v[end + 1..]);
    }
    None
}

/// A reader of checkout-relative paths.
type Reader<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Walked files: each file's calls in order, with the conditions each sits
/// under that could not be evaluated and its guard (the conjunction of
/// every enclosing branch's condition, through `include()` too).
type Walked = Vec<(String, Vec<(Call, Vec<String>, Truth)>)>;

/// One open `if()` block while walking a file.
struct Frame {
    /// Whether the branch being walked is taken.
    active: Truth,
    /// Whether an earlier branch of the block was taken.
    taken: Truth,
    /// The branch as written, e.g. `if(VLLM_GPU_LANG STREQUAL CUDA)`.
    text: String,
    /// The block's `if()` as written (for `else()`).
    head: String,
}

/// Walks CMake files in the order CMake reads them: `include()` is followed
/// (when a reader is given), branches known not to be taken are skipped, and
/// a `return()` known to be reached ends the file.
struct Walk<'a> {
    read: Option<Reader<'a>>,
    /// What is known of the target (the conditions are evaluated against it).
    facts: Facts,
    /// File -> its calls in order, each with the conditions it sits under
    /// that could not be evaluated.
    out: Walked,
    notes: Vec<String>,
    visited: Vec<String>,
    module_path: Vec<String>,
}

fn show(name: &str, args: &[String]) -> String {
    format!("{name}({})", args.join(" "))
}

/// `a/./b/../c` -> `a/c`; `None` when it leaves the checkout.
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

impl Walk<'_> {
    fn file(&mut self, rel: &str, text: &str, outer: (&[String], Truth), depth: usize) {
        let (outer, outer_guard) = outer;
        self.visited.push(rel.to_string());
        let dir = rel.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        let mut stack: Vec<Frame> = Vec::new();
        let mut mine: Vec<(Call, Vec<String>, Truth)> = Vec::new();
        for c in calls(text) {
            match c.name.as_str() {
                "if" => {
                    let t = condition::eval(&c.cond_args(), &self.facts);
                    let text = show("if", &c.args);
                    stack.push(Frame {
                        active: t,
                        taken: t,
                        text: text.clone(),
                        head: text,
                    });
                    continue;
                }
                "elseif" => {
                    if let Some(f) = stack.last_mut() {
                        let t = condition::eval(&c.cond_args(), &self.facts);
                        f.active = !f.taken.and(t);
                        f.taken = f.taken.or(t);
                        f.text = format!("{} of {}", show("elseif", &c.args), f.head);
                    }
                    continue;
                }
                "else" => {
                    if let Some(f) = stack.last_mut() {
                        f.active = !f.taken;
                        f.taken = Truth::True;
                        f.text = format!("else() of {}", f.head);
                    }
                    continue;
                }
                "endif" => {
                    stack.pop();
                    continue;
                }
                _ => {}
            }
            let act = stack.iter().fold(outer_guard, |t, f| t.and(f.active));
            if act == Truth::False {
                continue;
            }
            let mut conds: Vec<String> = outer.to_vec();
            conds.extend(
                stack
                    .iter()
                    .filter(|f| f.active == Truth::Unknown)
                    .map(|f| format!("{rel}: {}", f.text)),
            );
            match c.name.as_str() {
                "return" if stack.iter().all(|f| f.active == Truth::True) => break,
                "list"
                    if c.args.len() >= 3
                        && c.args[0] == "APPEND"
                        && c.args[1] == "CMAKE_MODULE_PATH" =>
                {
                    for m in &c.args[2..] {
                        if let Some(p) = self.resolve_dir(m, &dir) {
                            self.module_path.push(p);
                        }
                    }
                }
                "set" if c.args.len() >= 2 && c.args[0] == "CMAKE_MODULE_PATH" => {
                    self.module_path = c.args[1..]
                        .iter()
                        .filter_map(|m| self.resolve_dir(m, &dir))
                        .collect();
                }
                "include" if self.read.is_some() => {
                    if let Some(arg) = c.args.first() {
                        self.out.push((rel.to_string(), std::mem::take(&mut mine)));
                        self.include(rel, arg, &dir, (&conds, act), depth);
                    }
                    continue;
                }
                _ => {}
            }
            mine.push((c, conds, act));
        }
        self.out.push((rel.to_string(), mine));
    }

    /// A directory argument (`${CMAKE_CURRENT_LIST_DIR}/cmake`) relative to the checkout.
    fn resolve_dir(&self, arg: &str, dir: &str) -> Option<String> {
        let mut vars = self.facts.vars.clone();
        vars.insert("CMAKE_CURRENT_LIST_DIR".into(), format!("/{dir}"));
        for v in [
            "CMAKE_SOURCE_DIR",
            "CMAKE_CURRENT_SOURCE_DIR",
            "PROJECT_SOURCE_DIR",
        ] {
            vars.insert(v.into(), "/".into());
        }
        normalize(&expand(arg, &vars)?)
    }

    fn include(
        &mut self,
        rel: &str,
        arg: &str,
        dir: &str,
        conds: (&[String], Truth),
        depth: usize,
    ) {
        let Some(path) = self.resolve_dir(arg, dir) else {
            self.notes.push(format!(
                "{rel}: include({arg}): the path cannot be resolved from the CMake files; its FetchContent declarations are not read"
            ));
            return;
        };
        let candidates: Vec<String> = if arg.contains('/') || arg.ends_with(".cmake") {
            vec![path]
        } else {
            // A module: searched in CMAKE_MODULE_PATH, else one of CMake's own.
            self.module_path
                .iter()
                .map(|m| normalize(&format!("{m}/{arg}.cmake")).unwrap_or_default())
                .collect()
        };
        let Some(read) = self.read else { return };
        for cand in candidates {
            if self.visited.contains(&cand) {
                return;
            }
            if let Some(text) = read(&cand) {
                if depth >= 32 {
                    self.notes
                        .push(format!("{rel}: include({arg}): nested too deeply"));
                    return;
                }
                self.file(&cand, &text, conds, depth + 1);
                return;
            }
        }
        if arg.contains('/') || arg.ends_with(".cmake") {
            self.notes.push(format!(
                "{rel}: include({arg}): {} is not in the checkout",
                normalize(&self.resolve_dir(arg, dir).unwrap_or_default()).unwrap_or_default()
            ));
        }
    }
}

/// Finds the sources declared in `files` (relative path, text), each read in
/// the order given, without following `include()` (the files are all
/// there) and without known variables: every condition is recorded.
pub fn parse(files: &[(String, String)]) -> Discovery {
    let mut w = Walk {
        read: None,
        facts: Facts::default(),
        out: Vec::new(),
        notes: Vec::new(),
        visited: Vec::new(),
        module_path: Vec::new(),
    };
    for (rel, text) in files {
        w.file(rel, text, (&[], Truth::True), 0);
    }
    let mut d = parse_calls(&w.out);
    d.unmapped.extend(w.notes);
    d
}

/// The sources declared in the walked calls, in the order CMake reads them.
fn parse_calls(per_file: &Walked) -> Discovery {
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut env_backed: Vec<String> = Vec::new();
    for (_, cs) in per_file {
        for (c, _, _) in cs {
            if c.name == "set" && c.args.len() >= 2 {
                let (name, value) = (&c.args[0], &c.args[1]);
                if value.trim() == format!("$ENV{{{name}}}") {
                    env_backed.push(name.clone());
                } else if !value.contains("$ENV{") {
                    vars.entry(name.clone()).or_insert_with(|| value.clone());
                }
            }
        }
    }
    // Overrides: FetchContent_Declare(<name> SOURCE_DIR ${X}) with X from $ENV{X}.
    let mut overrides: BTreeMap<String, (String, bool)> = BTreeMap::new();
    for (_, cs) in per_file {
        for (c, _, _) in cs
            .iter()
            .filter(|(c, _, _)| c.name == "fetchcontent_declare")
        {
            let Some(name) = c.args.first() else { continue };
            let kw = keyword_args(&c.args[1..]);
            if kw.contains_key("GIT_REPOSITORY") || kw.contains_key("URL") {
                continue;
            }
            if let Some(dir) = kw.get("SOURCE_DIR").and_then(|v| v.first()) {
                // `SOURCE_DIR $ENV{X}` (vLLM's triton_kernels) reads X directly.
                if let Some(var) = dir.strip_prefix("$ENV{").and_then(|d| d.strip_suffix('}')) {
                    overrides.insert(
                        name.clone(),
                        (var.to_string(), kw.contains_key("SOURCE_SUBDIR")),
                    );
                    continue;
                }
                let var = dir.trim_start_matches("${").trim_end_matches('}');
                if dir.starts_with("${") && env_backed.iter().any(|e| e == var) {
                    overrides.insert(
                        name.clone(),
                        (var.to_string(), kw.contains_key("SOURCE_SUBDIR")),
                    );
                }
            }
        }
    }
    let mut d = Discovery::default();
    let mut decls: Vec<Decl> = Vec::new();
    for (rel, cs) in per_file {
        for (c, conds, guard) in cs {
            let Some(name) = c.args.first() else { continue };
            let kw = keyword_args(&c.args[1..]);
            let fetches = kw.contains_key("GIT_REPOSITORY") || kw.contains_key("URL");
            let call = match c.name.as_str() {
                "externalproject_add" if fetches => "ExternalProject_Add",
                "fetchcontent_populate" if fetches => "FetchContent_Populate",
                "fetchcontent_declare" if fetches => "FetchContent_Declare",
                _ => continue,
            };
            // Neither call reads FETCHCONTENT_SOURCE_DIR_<NAME> (nor has
            // another source-dir override): the download cannot be redirected.
            if call != "FetchContent_Declare" {
                if *guard == Truth::Unknown {
                    // Under a condition the tree computes at configure time,
                    // the download is the configure's to make or not: named,
                    // not a blocker (a branch false for the target is never
                    // walked at all).
                    d.not_blocking.push(format!(
                        "{rel}:{}: {call}({name}) downloads {}, which cannot be redirected, only if the tree's configure takes {}: not staged, so an --offline build whose configure takes it fails there",
                        c.line,
                        download_of(&kw),
                        conds.join(" and ")
                    ));
                } else if call == "ExternalProject_Add" {
                    d.unmapped.push(format!(
                        "{rel}: ExternalProject_Add({name}) downloads at build time and has no source-dir override; stage it by hand"
                    ));
                } else {
                    d.unmapped.push(format!(
                        "{rel}: FetchContent_Populate({name} ...) with a download ignores FETCHCONTENT_SOURCE_DIR_*; it cannot be redirected"
                    ));
                }
                continue;
            }
            let at = format!("{rel}:{}", c.line);
            let first = |k: &str| kw.get(k).and_then(|v| v.first()).cloned();
            let unresolved = |what: String| Decl {
                name: name.clone(),
                at: at.clone(),
                guard: *guard,
                source: Err(what),
            };
            let origin = if let Some(repo) = first("GIT_REPOSITORY") {
                let tag = first("GIT_TAG").unwrap_or_else(|| "HEAD".into());
                match (expand(&repo, &vars), expand(&tag, &vars)) {
                    (Some(repo), Some(tag)) => Origin::Git { repo, tag },
                    _ => {
                        decls.push(unresolved(format!(
                            "GIT_REPOSITORY {repo} / GIT_TAG {tag}, which cannot be resolved from the CMake files"
                        )));
                        continue;
                    }
                }
            } else {
                let url = first("URL").unwrap_or_default();
                let hash = first("URL_HASH");
                let Some(url) = expand(&url, &vars) else {
                    decls.push(unresolved(format!(
                        "URL {url}, which cannot be resolved from the CMake files"
                    )));
                    continue;
                };
                let sha256 = hash
                    .and_then(|h| expand(&h, &vars))
                    .and_then(|h| h.strip_prefix("SHA256=").map(|x| x.to_ascii_lowercase()));
                Origin::Url { url, sha256 }
            };
            let submodules = kw
                .get("GIT_SUBMODULES")
                .is_none_or(|v| v.iter().any(|s| !s.is_empty()));
            let git_subdir = first("SOURCE_SUBDIR").filter(|s| !s.is_empty());
            let (variable, subdir) = match overrides.get(name) {
                Some((var, override_has_subdir)) => (
                    Variable::Env(var.clone()),
                    if *override_has_subdir {
                        None
                    } else {
                        git_subdir
                    },
                ),
                None => (
                    Variable::Cmake(format!(
                        "FETCHCONTENT_SOURCE_DIR_{}",
                        name.to_ascii_uppercase()
                    )),
                    None,
                ),
            };
            // The branch that tests the source's own override variable is
            // the redirect itself, not a condition of the build.
            let own: Vec<&str> = conds
                .iter()
                .map(String::as_str)
                .filter(|c| !c.contains(variable.name()))
                .collect();
            let src = ExtSource {
                name: name.clone(),
                file: rel.clone(),
                origin,
                submodules,
                variable,
                subdir,
                condition: (!own.is_empty()).then(|| own.join(" and ")),
                line: c.line,
                decided: Decided::Target,
            };
            decls.push(Decl {
                name: name.clone(),
                at,
                guard: *guard,
                source: Ok(src),
            });
        }
    }
    resolve(decls, &mut d);
    d
}

/// What a download call fetches, as written: `GIT_REPOSITORY R GIT_TAG T`
/// or `URL U`.
fn download_of(kw: &BTreeMap<String, Vec<String>>) -> String {
    let first = |k: &str| kw.get(k).and_then(|v| v.first()).cloned();
    match (first("GIT_REPOSITORY"), first("URL")) {
        (Some(repo), _) => format!(
            "GIT_REPOSITORY {repo} GIT_TAG {}",
            first("GIT_TAG").unwrap_or_else(|| "HEAD".into())
        ),
        (None, Some(url)) => format!("URL {url}"),
        (None, None) => "a download".into(),
    }
}

/// One `FetchContent_Declare` that downloads, as the walk met it: its name,
/// `file:line`, its guard for the target, and the source (or why its origin
/// cannot be read from the CMake files).
struct Decl {
    name: String,
    at: String,
    guard: Truth,
    source: Result<ExtSource, String>,
}

impl Decl {
    fn revision(&self) -> String {
        match &self.source {
            Ok(s) => super::describe(&s.origin),
            Err(why) => why.clone(),
        }
    }
}

/// The declarations of each name that the target's configure may take:
/// CMake keeps the first `FetchContent_Declare` of a name that it runs
/// (later ones are ignored, CMake docs, FetchContent), and declarations in
/// branches false for the target are never walked. So of a name's
/// declarations in order, every one up to the first whose guard is true
/// is live. One live origin: staged as decided for the target. Several,
/// all resolved: each staged, CMake's own evaluation picks one at
/// configure time through the dependency provider ([`Decided::Configure`]).
/// Several, one of them unresolved: refused, every declaration named.
fn resolve(decls: Vec<Decl>, d: &mut Discovery) {
    let mut names: Vec<String> = Vec::new();
    for x in &decls {
        if !names.iter().any(|n| n.eq_ignore_ascii_case(&x.name)) {
            names.push(x.name.clone());
        }
    }
    for name in names {
        let all: Vec<&Decl> = decls
            .iter()
            .filter(|x| x.name.eq_ignore_ascii_case(&name))
            .collect();
        let cut = all
            .iter()
            .position(|x| x.guard == Truth::True)
            .map_or(all.len(), |i| i + 1);
        let (live, dead) = all.split_at(cut);
        // One origin declared twice is one candidate.
        let mut cands: Vec<&Decl> = Vec::new();
        for x in live {
            let same = cands.iter().any(|c| match (&c.source, &x.source) {
                (Ok(a), Ok(b)) => a.origin == b.origin,
                _ => false,
            });
            if !same {
                cands.push(x);
            }
        }
        for x in dead {
            let again = cands.iter().any(|c| match (&c.source, &x.source) {
                (Ok(a), Ok(b)) => a.origin == b.origin,
                _ => false,
            });
            if !again {
                d.not_blocking.push(format!(
                    "{}: FetchContent_Declare({}) ({}) is never taken: the declaration at {} always runs first, and CMake keeps a name's first declaration",
                    x.at,
                    x.name,
                    x.revision(),
                    live.last().map_or("", |l| l.at.as_str())
                ));
            }
        }
        match cands.as_slice() {
            [] => {}
            [one] => match &one.source {
                Ok(s) => d.sources.push(s.clone()),
                Err(why) => d.unmapped.push(format!(
                    "{}: FetchContent_Declare({}): {why}",
                    one.at, one.name
                )),
            },
            many if many.iter().all(|c| c.source.is_ok()) => {
                for c in many {
                    if let Ok(s) = &c.source {
                        d.sources.push(ExtSource {
                            decided: Decided::Configure,
                            ..s.clone()
                        });
                    }
                }
            }
            many => {
                let list: Vec<String> = many
                    .iter()
                    .map(|c| format!("{} ({})", c.at, c.revision()))
                    .collect();
                d.refused.push(format!(
                    "FetchContent_Declare({name}) is declared {} times under conditions the tree decides at configure time, and not every declaration can be staged: {}; refusing rather than staging one branch for every target",
                    many.len(),
                    list.join(", ")
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: &str = r#"
cmake_minimum_required(VERSION 3.26)
# a comment with FetchContent_Declare(fake GIT_REPOSITORY nowhere)
set(CUTLASS_REVISION "v9.9.9" CACHE STRING "CUTLASS revision to use")
if (DEFINED ENV{VLLM_CUTLASS_SRC_DIR})
  set(VLLM_CUTLASS_SRC_DIR $ENV{VLLM_CUTLASS_SRC_DIR})
endif()
if(VLLM_CUTLASS_SRC_DIR)
  FetchContent_Declare(cutlass SOURCE_DIR ${VLLM_CUTLASS_SRC_DIR})
else()
  FetchContent_Declare(
      cutlass
      GIT_REPOSITORY https://example.invalid/cutlass.git
      GIT_TAG ${CUTLASS_REVISION}
      GIT_PROGRESS TRUE
      GIT_SHALLOW TRUE
  )
endif()
include(cmake/external_projects/kernels.cmake)
"#;
    const KERNELS: &str = r#"
set(DEFAULT_KERNELS_TAG "v1.2.3")
if (DEFINED ENV{KERNELS_SRC_DIR})
  set(KERNELS_SRC_DIR "$ENV{KERNELS_SRC_DIR}")
  FetchContent_Declare(kernels SOURCE_DIR ${KERNELS_SRC_DIR})
else()
  FetchContent_Declare(
      kernels
      GIT_REPOSITORY https://example.invalid/kernels.git
      GIT_TAG ${DEFAULT_KERNELS_TAG}
      SOURCE_SUBDIR python/kernels/kernels
  )
endif()
FetchContent_Declare(plain GIT_REPOSITORY "file:///tmp/plain" GIT_TAG 0123456789abcdef0123456789abcdef01234567 GIT_SUBMODULES "")
FetchContent_Declare(tarball URL https://example.invalid/t.tar.gz URL_HASH SHA256=ABCDEF)
FetchContent_Declare(unknown GIT_REPOSITORY ${NOWHERE} GIT_TAG main)
ExternalProject_Add(ep GIT_REPOSITORY https://example.invalid/ep.git)
"#;

    #[test]
    fn finds_sources_and_their_variables_in_vllm_shaped_cmake() {
        let d = parse(&[
            ("CMakeLists.txt".into(), MAIN.into()),
            (
                "cmake/external_projects/kernels.cmake".into(),
                KERNELS.into(),
            ),
        ]);
        let names: Vec<&str> = d.sources.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["cutlass", "kernels", "plain", "tarball"]);
        let c = &d.sources[0];
        assert_eq!(
            c.origin,
            Origin::Git {
                repo: "https://example.invalid/cutlass.git".into(),
                tag: "v9.9.9".into()
            }
        );
        assert_eq!(c.variable, Variable::Env("VLLM_CUTLASS_SRC_DIR".into()));
        assert!(c.submodules);
        let k = &d.sources[1];
        assert_eq!(k.variable, Variable::Env("KERNELS_SRC_DIR".into()));
        assert_eq!(k.subdir.as_deref(), Some("python/kernels/kernels"));
        let p = &d.sources[2];
        assert_eq!(
            p.variable,
            Variable::Cmake("FETCHCONTENT_SOURCE_DIR_PLAIN".into())
        );
        assert!(!p.submodules);
        assert_eq!(
            d.sources[3].origin,
            Origin::Url {
                url: "https://example.invalid/t.tar.gz".into(),
                sha256: Some("abcdef".into())
            }
        );
        assert_eq!(d.unmapped.len(), 2, "{:?}", d.unmapped);
        assert!(
            d.unmapped
                .iter()
                .any(|u| u.contains("FetchContent_Declare(unknown)"))
        );
        assert!(
            d.unmapped
                .iter()
                .any(|u| u.contains("ExternalProject_Add(ep)"))
        );
        assert!(c.entry_name().starts_with("cutlass-v9.9.9-"));
    }

    /// vLLM's layout: a device block that includes the CPU file and returns,
    /// GPU files included under a condition on a variable set at configure time.
    fn vllm_tree(rel: &str) -> Option<String> {
        let t = match rel {
            "CMakeLists.txt" => {
                r#"include(${CMAKE_CURRENT_LIST_DIR}/cmake/utils.cmake)
if (NOT VLLM_TARGET_DEVICE STREQUAL "cuda" AND
    NOT VLLM_TARGET_DEVICE STREQUAL "rocm")
    if (VLLM_TARGET_DEVICE STREQUAL "cpu")
        include(${CMAKE_CURRENT_LIST_DIR}/cmake/cpu_extension.cmake)
    else()
        return()
    endif()
    return()
endif()
include(FetchContent)
if (DEFINED ENV{VLLM_CUTLASS_SRC_DIR})
  set(VLLM_CUTLASS_SRC_DIR $ENV{VLLM_CUTLASS_SRC_DIR})
endif()
if(VLLM_CUTLASS_SRC_DIR)
  FetchContent_Declare(cutlass SOURCE_DIR ${VLLM_CUTLASS_SRC_DIR})
else()
  FetchContent_Declare(cutlass GIT_REPOSITORY https://example.invalid/cutlass.git GIT_TAG v4)
endif()
if(VLLM_GPU_LANG STREQUAL "CUDA")
    include(cmake/external_projects/flashmla.cmake)
endif()
include(cmake/external_projects/missing.cmake)
"#
            }
            "cmake/utils.cmake" => "macro(x)\nendmacro()\n",
            "cmake/cpu_extension.cmake" => {
                "include(FetchContent)\nFetchContent_Declare(oneDNN GIT_REPOSITORY https://example.invalid/onednn.git GIT_TAG v3)\n"
            }
            "cmake/external_projects/flashmla.cmake" => {
                "if (DEFINED ENV{FLASH_MLA_SRC_DIR})\n  FetchContent_Declare(flashmla SOURCE_DIR $ENV{FLASH_MLA_SRC_DIR})\nelse()\n  FetchContent_Declare(flashmla GIT_REPOSITORY https://example.invalid/flashmla.git GIT_TAG abc)\nendif()\n"
            }
            "cmake/external_projects/unused.cmake" => {
                "FetchContent_Declare(unused GIT_REPOSITORY https://example.invalid/u.git GIT_TAG a)\n"
            }
            _ => return None,
        };
        Some(t.to_string())
    }

    #[test]
    fn follows_includes_and_evaluates_the_device_conditions_it_can() {
        let names =
            |d: &Discovery| -> Vec<String> { d.sources.iter().map(|s| s.name.clone()).collect() };
        let empty = discover_with(&vllm_tree, "empty");
        assert!(
            empty.sources.is_empty() && empty.no_cmake.is_some(),
            "{empty:?}"
        );

        let cpu = discover_with(&vllm_tree, "cpu");
        assert_eq!(names(&cpu), ["oneDNN"], "{cpu:?}");
        assert_eq!(cpu.sources[0].file, "cmake/cpu_extension.cmake");
        assert_eq!(cpu.sources[0].condition, None);

        let tpu = discover_with(&vllm_tree, "tpu");
        assert!(tpu.sources.is_empty(), "{tpu:?}");

        let cuda = discover_with(&vllm_tree, "cuda");
        assert_eq!(names(&cuda), ["cutlass", "flashmla"], "{cuda:?}");
        // The override's own branch is not a condition; the GPU language is.
        assert_eq!(cuda.sources[0].condition, None);
        assert_eq!(
            cuda.sources[0].variable,
            Variable::Env("VLLM_CUTLASS_SRC_DIR".into())
        );
        assert_eq!(
            cuda.sources[1].condition.as_deref(),
            Some("CMakeLists.txt: if(VLLM_GPU_LANG STREQUAL CUDA)")
        );
        assert_eq!(
            cuda.sources[1].file,
            "cmake/external_projects/flashmla.cmake"
        );
        assert!(
            cuda.unmapped
                .iter()
                .any(|u| u.contains("missing.cmake") && u.contains("not in the checkout")),
            "{:?}",
            cuda.unmapped
        );
    }

    /// vLLM's `cmake/cpu_extension.cmake` (v0.20-era), reduced: oneDNN
    /// declared twice under a variable the tree computes (`ASIMD_FOUND`).
    fn cpu_tree(rel: &str) -> Option<String> {
        let t = match rel {
            "CMakeLists.txt" => {
                "include(FetchContent)\nif (VLLM_TARGET_DEVICE STREQUAL \"cpu\")\n  include(${CMAKE_CURRENT_LIST_DIR}/cmake/cpu_extension.cmake)\n  return()\nendif()\n"
            }
            "cmake/cpu_extension.cmake" => {
                r#"find_isa(${CPUINFO} "asimd" ASIMD_FOUND)
if (CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|amd64" OR ENABLE_X86_ISA)
    set(ENABLE_X86_ISA ON)
endif()
if (ENABLE_X86_ISA OR (ASIMD_FOUND AND NOT APPLE_SILICON_FOUND) OR POWER9_FOUND)
    set(FETCHCONTENT_SOURCE_DIR_ONEDNN "$ENV{FETCHCONTENT_SOURCE_DIR_ONEDNN}" CACHE PATH "Path to a local oneDNN source directory.")
    if(FETCHCONTENT_SOURCE_DIR_ONEDNN)
        FetchContent_Declare(oneDNN SOURCE_DIR ${FETCHCONTENT_SOURCE_DIR_ONEDNN})
    else()
        if(ASIMD_FOUND AND NOT APPLE_SILICON_FOUND)
            FetchContent_Declare(oneDNN GIT_REPOSITORY https://github.com/oneapi-src/oneDNN.git GIT_TAG 9c5be1cc59e368aebf0909e6cf20f981ea61462a GIT_PROGRESS TRUE GIT_SHALLOW FALSE)
        else()
            FetchContent_Declare(oneDNN GIT_REPOSITORY https://github.com/oneapi-src/oneDNN.git GIT_TAG v3.10 GIT_PROGRESS TRUE GIT_SHALLOW TRUE)
        endif()
    endif()
    FetchContent_MakeAvailable(oneDNN)
endif()
if(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
    FetchContent_Declare(kleidi GIT_REPOSITORY https://example.invalid/kleidi.git GIT_TAG arm)
else()
    FetchContent_Declare(kleidi GIT_REPOSITORY https://example.invalid/kleidi.git GIT_TAG x86)
endif()
FetchContent_Declare(kleidi GIT_REPOSITORY https://example.invalid/kleidi.git GIT_TAG never)
if(ASIMD_FOUND)
    if(DEFINED ENV{ACL_ROOT_DIR} AND IS_DIRECTORY "$ENV{ACL_ROOT_DIR}")
        message(STATUS "Using ACL from specified source directory: $ENV{ACL_ROOT_DIR}")
    else()
        FetchContent_Populate(arm_compute
            SUBBUILD_DIR "${FETCHCONTENT_BASE_DIR}/arm_compute-subbuild"
            GIT_REPOSITORY https://example.invalid/ComputeLibrary.git
            GIT_TAG        v52.6.0)
    endif()
endif()
if(CMAKE_SYSTEM_PROCESSOR MATCHES "s390x")
    FetchContent_Populate(zonly GIT_REPOSITORY https://example.invalid/z.git GIT_TAG z)
endif()
"#
            }
            _ => return None,
        };
        Some(t.to_string())
    }

    #[test]
    fn a_name_declared_twice_is_resolved_for_the_target_or_left_to_configure() {
        let d = discover_with(&cpu_tree, "cpu");
        assert!(d.refused.is_empty(), "{d:?}");
        let got: Vec<(String, String, usize, Decided)> = d
            .sources
            .iter()
            .map(|s| {
                let Origin::Git { tag, .. } = &s.origin else {
                    panic!()
                };
                (s.name.clone(), tag.clone(), s.line, s.decided)
            })
            .collect();
        let processor = std::env::consts::ARCH;
        let kleidi = if processor == "aarch64" { "arm" } else { "x86" };
        assert_eq!(
            got,
            [
                (
                    "oneDNN".into(),
                    "9c5be1cc59e368aebf0909e6cf20f981ea61462a".into(),
                    11,
                    Decided::Configure
                ),
                ("oneDNN".into(), "v3.10".into(), 13, Decided::Configure),
                (
                    "kleidi".into(),
                    kleidi.into(),
                    if kleidi == "arm" { 19 } else { 21 },
                    Decided::Target
                ),
            ]
        );
        assert_eq!(d.sources[0].file, "cmake/cpu_extension.cmake");
        // Another processor's build (export --platform) takes its own branch.
        for (arch, tag) in [("aarch64", "arm"), ("x86_64", "x86")] {
            let f = Facts::for_platform("cpu", arch, "linux");
            let d = discover_for(&cpu_tree, "cpu", &f);
            let k: Vec<&Origin> = d
                .sources
                .iter()
                .filter(|s| s.name == "kleidi")
                .map(|s| &s.origin)
                .collect();
            assert_eq!(
                k,
                [&Origin::Git {
                    repo: "https://example.invalid/kleidi.git".into(),
                    tag: tag.into()
                }]
            );
        }
        // The third kleidi comes after a declaration that always runs: named,
        // blocking nothing.
        assert!(
            d.not_blocking
                .iter()
                .any(|u| u.contains("cmake/cpu_extension.cmake:23") && u.contains("never taken")),
            "{:?}",
            d.not_blocking
        );
        // ACL's download under a condition the configure computes
        // (`find_isa` of /proc/cpuinfo): named with its condition, never a
        // blocker; another processor's download is not even named.
        assert!(d.unmapped.is_empty(), "{:?}", d.unmapped);
        let acl: Vec<&String> = d
            .not_blocking
            .iter()
            .filter(|u| u.contains("arm_compute"))
            .collect();
        assert_eq!(acl.len(), 1, "{:?}", d.not_blocking);
        assert!(
            acl[0].starts_with("cmake/cpu_extension.cmake:28: FetchContent_Populate(arm_compute)")
                && acl[0].contains("https://example.invalid/ComputeLibrary.git GIT_TAG v52.6.0")
                && acl[0].contains("if(ASIMD_FOUND)"),
            "{}",
            acl[0]
        );
        assert!(!format!("{d:?}").contains("zonly"), "{d:?}");
    }

    #[test]
    fn several_live_declarations_one_unresolvable_are_refused_naming_both() {
        let tree = |rel: &str| -> Option<String> {
            (rel == "CMakeLists.txt").then(|| {
                "fx_find(FX_FOUND)\nif(FX_FOUND)\n  FetchContent_Declare(lib GIT_REPOSITORY https://example.invalid/lib.git GIT_TAG ${FX_TAG})\nelse()\n  FetchContent_Declare(lib GIT_REPOSITORY https://example.invalid/lib.git GIT_TAG v2)\nendif()\n".to_string()
            })
        };
        let d = discover_with(&tree, "cpu");
        assert_eq!(d.refused.len(), 1, "{d:?}");
        let r = &d.refused[0];
        assert!(
            r.contains("CMakeLists.txt:3") && r.contains("${FX_TAG}"),
            "{r}"
        );
        assert!(
            r.contains("CMakeLists.txt:5") && r.contains("https://example.invalid/lib.git @ v2"),
            "{r}"
        );
        let err = d.check().unwrap_err().to_string();
        assert!(err.contains("FetchContent_Declare(lib)"), "{err}");
    }

    #[test]
    fn a_variable_set_in_one_file_expands_in_a_declaration_and_comments_are_ignored() {
        let d = parse(&[(
            "CMakeLists.txt".into(),
            r#"set(LIB_TAG v1.2.3)
# FetchContent_Declare(commented GIT_REPOSITORY https://example.invalid/c.git GIT_TAG x)
FetchContent_Declare(
  lib
  GIT_REPOSITORY https://example.invalid/lib.git
  GIT_TAG ${LIB_TAG}
)
"#
            .into(),
        )]);
        assert_eq!(d.sources.len(), 1, "{:?}", d.sources);
        assert_eq!(
            d.sources[0].origin,
            Origin::Git {
                repo: "https://example.invalid/lib.git".into(),
                tag: "v1.2.3".into()
            }
        );
        assert!(d.unmapped.is_empty(), "{:?}", d.unmapped);
    }

    #[test]
    fn no_cmake_files_means_no_sources() {
        let d = parse(&[]);
        assert!(d.sources.is_empty() && d.unmapped.is_empty());
        let d = parse(&[("CMakeLists.txt".into(), "project(x)\n".into())]);
        assert!(d.sources.is_empty() && d.unmapped.is_empty());
    }
}
