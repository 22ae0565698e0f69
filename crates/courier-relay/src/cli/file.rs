//! The `--config` file: TOML whose keys are the options' names without their dashes. A key the
//! settings do not name is refused, so a misspelt option is never silently ignored.

use std::path::Path;

use serde::de::DeserializeOwned;

use super::UsageError;

/// The settings in the file at `path`; without one, none.
pub(super) fn load<T: DeserializeOwned + Default>(path: Option<&Path>) -> Result<T, UsageError> {
    let Some(path) = path else {
        return Ok(T::default());
    };
    let text = super::read_file("--config", path)?;
    toml::from_str(&text).map_err(|e| {
        let at = e
            .span()
            .map(|span| format!(" line {}", line_of(&text, span.start)))
            .unwrap_or_default();
        UsageError(format!(
            "{}{at}: {}",
            path.display(),
            e.message().trim_end()
        ))
    })
}

/// The 1-based line holding byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    let before = text.get(..offset).unwrap_or(text);
    before.matches('\n').count() + 1
}
