//! The prompts of a smoke case that holds several (`prompts:` or
//! `prompts_file:`, docs/smoke.md): each is generated and compared on its own.
//! The file is read as the recipe's check reads it
//! ([`crate::recipe::read_prompts`]: a regular file, bounded, never blocking).

use crate::recipe::{Case, LoadedRecipe, prompts_path, read_prompts};

/// The prompts of `case`: `None` for a single-prompt case (`prompt` or
/// `prompt_token_ids`), else its `prompts` list or the prompts read from its
/// `prompts_file` ([`crate::recipe::read_prompts`]).
///
/// Errors (text for the report, naming the file): as
/// [`crate::recipe::read_prompts`] (the file changed since the recipe was
/// checked).
pub fn case_prompts(lr: &LoadedRecipe, case: &Case) -> Option<Result<Vec<String>, String>> {
    if let Some(list) = &case.prompts {
        return Some(Ok(list.clone()));
    }
    let path = prompts_path(lr, case)?;
    Some(read_prompts(&path).map_err(|why| format!("prompts_file {} {why}", path.display())))
}
