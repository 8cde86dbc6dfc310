//! `${VAR}` references in recipe strings (model paths): finding them and
//! expanding them from the environment.

/// The `${VAR}` references in `s`, in order.
///
/// Errors: a `${` without its `}`, or a name that is not an identifier
/// (`[A-Za-z_][A-Za-z0-9_]*`); the message shows the reference.
pub fn env_references(s: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| {
            format!("{s:?} has a `${{` without its closing `}}` (write `${{NAME}}`)")
        })?;
        let var = &after[..end];
        let ident = var.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ident {
            return Err(format!(
                "{s:?} refers to `${{{var}}}`, which is not a variable name (letters, digits and `_`, not starting with a digit)"
            ));
        }
        out.push(var);
        rest = &after[end + 1..];
    }
    Ok(out)
}

/// Expands `${VAR}` references in `s` (used only for model paths).
///
/// Errors: a malformed reference (see [`env_references`]), or a referenced
/// variable is unset; the message names it.
pub fn expand_env(s: &str) -> Result<String, String> {
    env_references(s)?;
    let mut out = String::new();
    let mut rest = s;
    // Every `${` has its `}` (checked above).
    while let Some((before, after)) = rest.split_once("${")
        && let Some((var, tail)) = after.split_once('}')
    {
        out.push_str(before);
        let value = std::env::var(var)
            .map_err(|_| format!("{s:?} refers to ${{{var}}}, which is not set"))?;
        out.push_str(&value);
        rest = tail;
    }
    out.push_str(rest);
    Ok(out)
}
