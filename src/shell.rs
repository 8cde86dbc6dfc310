//! Shell words for the commands printed as fixes (a leaf utility: it imports
//! nothing of the crate).

/// `s` as one shell word: unchanged when it holds only characters no POSIX
/// shell treats specially (ASCII letters, digits and `_-./:=@%+,`), else in
/// single quotes (a `'` inside written `'\''`), per POSIX.1-2017 XCU 2.2.2
/// "Single-Quotes". For the commands printed as fixes, so a path with spaces
/// or non-ASCII characters pastes as one word.
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

/// `--store <root>`, the root absolute and quoted ([`shell_quote`]): the
/// option every printed command carries, so it acts on the store where the
/// problem is, from any directory and whatever `ORACLE_BUILD_HOME` says.
pub fn store_option(root: &std::path::Path) -> String {
    let abs = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    format!("--store {}", shell_quote(&abs.display().to_string()))
}

/// `oracle-build <words> --store <root>` ([`store_option`]); `words` are
/// shell words already quoted.
pub fn command_at(words: &str, root: &std::path::Path) -> String {
    format!("oracle-build {words} {}", store_option(root))
}

#[cfg(test)]
mod tests {
    use super::{command_at, shell_quote};

    #[test]
    fn a_printed_command_names_its_store() {
        assert_eq!(
            command_at("build /r/fx.yaml --deep", std::path::Path::new("/s/b")),
            "oracle-build build /r/fx.yaml --deep --store /s/b"
        );
        assert_eq!(
            command_at("gc", std::path::Path::new("/my store")),
            "oracle-build gc --store '/my store'"
        );
    }

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
