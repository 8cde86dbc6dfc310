//! The command layer: one module per command. Each takes its options, makes
//! one call down (into [`crate::pipeline`], a stage or the store) and renders
//! the result as text or `--json`. See `docs/architecture.md`.

pub mod activate;
pub mod advance;
pub mod build;
pub mod bundle;
pub mod cache;
pub mod contains;
pub mod demo;
pub mod doctor;
pub mod fetch;
pub mod gc;
pub mod golden;
pub mod lock;
pub mod plan;
pub mod pull;
pub mod push;
pub mod sbom;
pub mod session;
pub mod smoke;
pub mod status;
pub mod target;
pub mod verify;

pub use session::{Opened, Session};

/// Whether a command printed its JSON document (see [`print_json`]).
static JSON_PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Prints `value` as one JSON document on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    JSON_PRINTED.store(true, std::sync::atomic::Ordering::SeqCst);
    Ok(())
}

/// Whether [`print_json`] printed a document in this process: then a
/// failing command's `--json` output is that document (it says what failed,
/// e.g. `ok: false` or a `verdict`), and no error document is added.
pub fn json_printed() -> bool {
    JSON_PRINTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// The case `name` of `lr` (`smoke --case`, `golden`); exit 2 naming the
/// recipe's cases when it has none.
pub fn case_named<'a>(
    lr: &'a crate::recipe::LoadedRecipe,
    name: &str,
) -> anyhow::Result<&'a crate::recipe::Case> {
    let cases = &lr.recipe.smoke.cases;
    cases.iter().find(|c| c.name == name).ok_or_else(|| {
        crate::exit::bad_input(format!(
            "recipe {} has no case named {name:?} (its cases: {})",
            lr.recipe.name,
            cases
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// Checks, before any work, that the file a command is told to write
/// (`flag` `path`) can be made: `path` is not a directory and its directory
/// exists. `example` is a file name to suggest for a directory; `nothing`
/// says what was not done (e.g. "nothing was exported").
///
/// Errors (exit 2): `path` is a directory; its directory does not exist or
/// is not a directory.
pub fn check_output_file(
    flag: &str,
    path: &std::path::Path,
    example: &str,
    nothing: &str,
) -> anyhow::Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    if path.is_dir() {
        return Err(crate::exit::bad_input(format!(
            "{flag} {} is a directory; give a file name (e.g. {}); {nothing}",
            path.display(),
            path.join(example).display()
        )));
    }
    if !parent.is_dir() {
        return Err(crate::exit::bad_input(format!(
            "{flag} {}: the directory {} does not exist ({nothing})",
            path.display(),
            parent.display()
        )));
    }
    Ok(())
}

/// Checks, before any work, that the directory a command is told to write
/// into (`flag` `path`) is one or can be made: `path` is a directory (links
/// followed), or nothing is there and its nearest existing ancestor is a
/// directory. `nothing` says what was not done.
///
/// Errors (exit 2): `path`, or an ancestor, is a file, a device or a FIFO.
pub fn check_output_dir(flag: &str, path: &std::path::Path, nothing: &str) -> anyhow::Result<()> {
    for at in path.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        let Ok(m) = std::fs::metadata(at) else {
            continue;
        };
        if m.is_dir() {
            return Ok(());
        }
        let kind = crate::regular_file::kind_of(m.file_type());
        return Err(crate::exit::bad_input(if at == path {
            format!(
                "{flag} {}: is {kind}, not a directory; give a directory (made when missing); {nothing}",
                path.display()
            )
        } else {
            format!(
                "{flag} {}: {} is {kind}, not a directory, so it cannot be made; {nothing}",
                path.display(),
                at.display()
            )
        }));
    }
    Ok(())
}

/// The message of `err` with its causes (`{err:#}`, causes joined by
/// `: `), with no space left before a line break: a cause that is a list
/// (`\n  - ...`) follows its colon directly.
pub fn error_text(err: &anyhow::Error) -> String {
    tidy(&format!("{err:#}"))
}

/// `text` without a space before any line break.
fn tidy(text: &str) -> String {
    text.split('\n')
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The one JSON document `--json` prints on stdout for a failure that printed
/// none: `{"error": <message with its causes>, "exit": <code>, "causes": [...]}`
/// ([`error_text`]).
pub fn error_document(err: &anyhow::Error, exit: i32) -> serde_json::Value {
    serde_json::json!({
        "error": error_text(err),
        "exit": exit,
        "causes": err.chain().map(|c| tidy(&c.to_string())).collect::<Vec<_>>(),
        "disk_full": crate::host::disk::is_disk_full(err),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_document_has_no_space_before_a_line_break() {
        let err = anyhow::anyhow!("\n  - no Python 3.99\n  - no nvcc").context("cannot build fx");
        let doc = error_document(&err, 1);
        let text = doc["error"].as_str().unwrap();
        assert_eq!(text, "cannot build fx:\n  - no Python 3.99\n  - no nvcc");
        assert!(!doc.to_string().contains(": \\n"), "{doc}");
    }
}
