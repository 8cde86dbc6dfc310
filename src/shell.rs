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
