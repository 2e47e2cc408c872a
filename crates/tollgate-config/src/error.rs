//! What is wrong with a policy file, and where.

use std::fmt;
use std::ops::Range;

/// A policy file that cannot be used: where (`file:line:column`, when the problem has a place) and what was
/// expected there.
///
/// ```
/// let err = tollgate_config::PolicyFile::parse("[[limiter]]\nname = 1\n", "limits.toml").unwrap_err();
/// assert_eq!(err.to_string(), "limits.toml:2:8: invalid type: integer `1`, expected a string");
/// assert_eq!((err.line(), err.column()), (Some(2), Some(8)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyFileError {
    origin: String,
    position: Option<(usize, usize)>,
    message: String,
}

impl PolicyFileError {
    /// A problem at byte offsets `span` of `text`, the contents of `origin`.
    pub(crate) fn at(
        origin: &str,
        text: &str,
        span: Option<Range<usize>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            origin: origin.to_owned(),
            position: span.map(|span| line_column(text, span.start)),
            message: message.into(),
        }
    }

    /// A problem with the file as a whole (it cannot be read).
    pub(crate) fn whole(origin: &str, message: impl Into<String>) -> Self {
        Self {
            origin: origin.to_owned(),
            position: None,
            message: message.into(),
        }
    }

    /// The file (or the name given to a string).
    #[must_use]
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The line of the problem, from 1.
    #[must_use]
    pub fn line(&self) -> Option<usize> {
        self.position.map(|(line, _)| line)
    }

    /// The column of the problem, from 1, in characters.
    #[must_use]
    pub fn column(&self) -> Option<usize> {
        self.position.map(|(_, column)| column)
    }

    /// What is wrong, without the place.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for PolicyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some((line, column)) => write!(f, "{}:{line}:{column}: {}", self.origin, self.message),
            None => write!(f, "{}: {}", self.origin, self.message),
        }
    }
}

impl std::error::Error for PolicyFileError {}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_columns_count_from_one_in_characters() {
        let text = "a = 1\nbé = 2\n";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 4), (1, 5));
        assert_eq!(line_column(text, 6), (2, 1));
        // The space after the two-byte é: the third character.
        assert_eq!(line_column(text, 9), (2, 3));
        assert_eq!(line_column(text, 999), (3, 1));
    }
}
