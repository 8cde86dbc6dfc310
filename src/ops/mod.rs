//! The command layer: one module per command, each thin, calling the stages.

pub mod activate;
pub mod advance;
pub mod build;
pub mod bundle;
pub mod doctor;
pub mod fetch;
pub mod gc;
pub mod hermetic;
pub mod lock;
pub mod plan;
pub mod preflight;
pub mod smoke;
pub mod status;
pub mod verify;

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

/// The one JSON document `--json` prints on stdout for a failure that printed
/// none: `{"error": <message with its causes>, "exit": <code>, "causes": [...]}`.
pub fn error_document(err: &anyhow::Error, exit: i32) -> serde_json::Value {
    serde_json::json!({
        "error": format!("{err:#}"),
        "exit": exit,
        "causes": err.chain().map(ToString::to_string).collect::<Vec<_>>(),
        "disk_full": crate::disk::is_disk_full(err),
    })
}

/// `s` as one shell word: unchanged when it holds only characters no POSIX
/// shell treats specially (ASCII letters, digits and `_-./:=@%+,`), else in
/// single quotes (a `'` inside written `'\''`). For the commands printed as
/// fixes, so a path with spaces or non-ASCII characters pastes as one word.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// How a printed command names the recipe `lr`: its file, absolute and
/// shell-quoted, when it was read from one (so the command runs from any
/// directory); else (a built-in recipe) its name.
pub fn recipe_arg(lr: &crate::recipe::LoadedRecipe) -> String {
    match &lr.dir {
        Some(_) => {
            let file = std::path::Path::new(&lr.origin);
            let abs = file
                .canonicalize()
                .or_else(|_| std::path::absolute(file))
                .unwrap_or_else(|_| file.to_path_buf());
            shell_quote(&abs.display().to_string())
        }
        None => shell_quote(&lr.recipe.name),
    }
}

#[cfg(test)]
mod tests {
    use super::shell_quote;

    #[test]
    fn quotes_only_what_a_shell_would_split_or_expand() {
        assert_eq!(shell_quote("/tmp/x/fx.yaml"), "/tmp/x/fx.yaml");
        assert_eq!(shell_quote("fx-a"), "fx-a");
        assert_eq!(
            shell_quote("/tmp/my pins/fx.yaml"),
            "'/tmp/my pins/fx.yaml'"
        );
        assert_eq!(shell_quote("/tmp/ü/x"), "'/tmp/ü/x'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote("$HOME"), "'$HOME'");
        assert_eq!(shell_quote(""), "''");
    }
}
